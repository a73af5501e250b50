"""Estimator benchmark: baseline MSE against rollouts, GRPO-G versus V0.5, per prior quality, and
the batched against the sequential budget plan under an arrival model.

    python -m studies.estimator_mse            # full run (a few minutes on 2 cores)
    python -m studies.estimator_mse --quick    # small sizes, seconds
    python -m studies.estimator_mse --rewards 0,1 --out bench/results/estimator_mse_r01

Writes ``<out>.json`` and ``<out>.png``. Modules:

- ``montecarlo``: population, prior qualities, Monte Carlo and exact (dynamic programme) runs;
- ``arrivals``: the arrival model (random rollout durations) driving the estimator's budget rule;
- ``plans``: batched against sequential plans under that model;
- ``scenarios``: every scenario and the result dict; ``plot``: the figure; ``cli``: the CLI.
"""
from studies.estimator_mse.cli import main
from studies.estimator_mse.scenarios import (QUICK, V05_VARIANTS, BenchConfig, est_config,
                                           run_benchmark)

__all__ = ["QUICK", "V05_VARIANTS", "BenchConfig", "est_config", "main", "run_benchmark"]
