"""The cluster simulator: the shipped scheduler on simulated engines (docs/simulator.md).

    python -m bench.sim [--quick]            # writes bench/results/sim.json and plots

Public API, used by bench.throughput and the tests: ``simulate``, ``run_modes``, ``MODES``,
``SimConfig`` and its models, ``summarise``, ``ratios`` (and ``RATIOS``, their stems), ``calibration_config``,
``predict_ratio``.
"""
from bench.sim.calibration import calibration_config, predict_ratio
from bench.sim.core import MODES, Sim, SimResult, simulate
from bench.sim.engine import Engine, Rollout
from bench.sim.metrics import RATIOS, physical_limit, ratios, summarise, window
from bench.sim.models import (DecodeModel, LearnerModel, LengthModel, PromptModel, SimConfig,
                              from_dict, load_file, parse_overrides)
from bench.sim.study import run_modes, run_sweeps

__all__ = ["MODES", "RATIOS", "DecodeModel", "Engine", "LearnerModel", "LengthModel", "PromptModel",
           "Rollout", "Sim", "SimConfig", "SimResult", "calibration_config", "from_dict",
           "load_file", "parse_overrides", "physical_limit", "predict_ratio", "ratios",
           "run_modes", "run_sweeps", "simulate", "summarise", "window"]
