"""Calibrating the simulator with constants measured on a real machine, and its prediction.

``python -m bench.throughput`` measures decode step time against batch size, learner time per
token, sync time, response lengths, the prompts' success rates and priors and the Ray call
latency, and asks ``predict_ratio`` what the simulator expects for the same modes; the two
ratios are compared over steady-state windows (docs/simulator.md, "Calibration").
"""
from __future__ import annotations

from dataclasses import asdict

from bench.sim.models import (DecodeModel, LearnerModel, LengthModel, PromptModel, SimConfig,
                              from_dict)
from estimator import EstimatorConfig

CAL_REQUIRED = ("n_generators", "max_num_seqs", "decode_step_s", "learner_s_per_token",
                "sync_s", "response_lengths", "batch_prompts")
CAL_OPTIONAL = {"learner_step_overhead_s": 0.0, "prompt_tokens": 0, "max_staleness": 1,
                "max_inflight_prompts": None, "group_size": 16,
                # V0.5's budget: the estimator's defaults
                **{k: getattr(EstimatorConfig, k)
                   for k in ("k_init", "k_max", "cost", "plan", "max_rounds")},
                "success_beta": [0.3, 0.3],
                "prior": "sd0.2", "success_rates": None, "prior_probs": None,
                "overlap_slowdown": 1.0, "dispatch_latency_s": 0.005, "steps": 30,
                "warmup_steps": None, "seed": 0}


def calibration_config(cal: dict) -> SimConfig:
    """A measured-constants dict (schema in docs/simulator.md) -> SimConfig."""
    if not isinstance(cal, dict):
        raise ValueError(f"calibration must be a JSON object, got {type(cal).__name__}")
    missing = [k for k in CAL_REQUIRED if k not in cal]
    unknown = sorted(set(cal) - set(CAL_REQUIRED) - set(CAL_OPTIONAL) - {"comment", "source"})
    if missing:
        raise ValueError(f"calibration is missing required key(s) {missing}")
    if unknown:
        raise ValueError(f"calibration has unknown key(s) {unknown}")
    c = {**CAL_OPTIONAL, **cal}
    ds = c["decode_step_s"]
    if isinstance(ds, dict) and set(ds) == {"a", "b"}:
        decode = DecodeModel(a_s=float(ds["a"]), b_s=float(ds["b"]), max_num_seqs=int(c["max_num_seqs"]))
    elif isinstance(ds, list) and ds:
        decode = DecodeModel(max_num_seqs=int(c["max_num_seqs"]), table=tuple(tuple(p) for p in ds))
    else:
        raise ValueError("decode_step_s must be {'a': s, 'b': s} or a list of [n, seconds] pairs")
    rl = c["response_lengths"]
    if isinstance(rl, list):
        if not rl or any(not isinstance(x, int) or x < 1 for x in rl):
            raise ValueError("response_lengths must be a non-empty list of integers >= 1")
        length = LengthModel(values=tuple(rl), max_tokens=max(rl), min_tokens=1,
                             prompt_tokens=int(c["prompt_tokens"]))
    elif isinstance(rl, dict):
        length = from_dict({**rl, "prompt_tokens": int(c["prompt_tokens"])}, LengthModel(),
                           LengthModel, "response_lengths.")
    else:
        raise ValueError("response_lengths must be a list of integers or a log-normal "
                         "{median, sigma, max_tokens}")
    a, b = c["success_beta"]
    sr, pp = c["success_rates"], c["prior_probs"]
    prompts = PromptModel(beta_a=float(a), beta_b=float(b), prior=c["prior"],
                          p_values=None if sr is None else tuple(sr),
                          prior_values=None if pp is None else tuple(pp))
    learner = LearnerModel(s_per_token_gpu=float(c["learner_s_per_token"]),
                           step_overhead_s=float(c["learner_step_overhead_s"]),
                           sync_s=float(c["sync_s"]))
    n_gen = int(c["n_generators"])
    return SimConfig(n_gpus=n_gen + 1, prior_gpus=0, n_generators=n_gen, batch_prompts=int(c["batch_prompts"]),
                     group_size=int(c["group_size"]), k_init=int(c["k_init"]),
                     k_max=int(c["k_max"]), cost=float(c["cost"]), plan=str(c["plan"]),
                     max_rounds=c["max_rounds"], max_staleness=int(c["max_staleness"]),
                     max_inflight_prompts=c["max_inflight_prompts"], steps=int(c["steps"]),
                     warmup_steps=c["warmup_steps"],
                     overlap_slowdown=float(c["overlap_slowdown"]),
                     dispatch_latency_s=float(c["dispatch_latency_s"]), seed=int(c["seed"]),
                     decode=decode, length=length, prompts=prompts, learner=learner)


def predict_ratio(calibration: dict, modes=("sync_grpo16", "async_v05")) -> dict:
    """Simulate the calibrated machine. Returns {"async_v05_vs_sync_grpo16_prompts_per_s",
    "prompts_per_s": {mode: float}, "mean_k", "generator_busy_fraction",
    "learner_busy_fraction", "ratios", "config"} (rates over steady-state windows)."""
    from bench.sim.metrics import ratios
    from bench.sim.study import run_modes

    cfg = calibration_config(calibration)
    per, _ = run_modes(cfg, modes)
    pick = lambda key: {m: float(s[key]) for m, s in per.items()}  # noqa: E731
    pps = {m: float(s["prompts_per_hour"]) / 3600.0 for m, s in per.items()}
    out = dict(prompts_per_s=pps, mean_k=pick("mean_k"),
               generator_busy_fraction=pick("generator_busy_fraction"),
               learner_busy_fraction=pick("learner_busy_fraction"),
               ratios={k: float(v) for k, v in ratios(per).items()}, config=asdict(cfg))
    if "async_v05" in pps and "sync_grpo16" in pps and pps["sync_grpo16"] > 0:
        out["async_v05_vs_sync_grpo16_prompts_per_s"] = pps["async_v05"] / pps["sync_grpo16"]
    if "async_v05" in per:
        out["equal_mse_group"] = per["async_v05"]["equal_mse_group"]
    return out
