"""The simulator calibrated with what ``bench.throughput`` measured, and its prediction.

The constants: decode step time against batch size (probe), learner time per trained token
(sync GRPO-16: the learner alone on the cores), the learner's slowdown when it shares the
cores with generation (async V0.5 over sync GRPO-16), weight-sync time, response lengths,
the prompts' measured success rates and priors, the Ray call latency. Both the measured and
the predicted ratio are over steady-state windows.
"""
from __future__ import annotations


def calibration(out: dict) -> dict | None:
    """bench.sim's calibration (docs/simulator.md) from the first repeat of each mode."""
    runs = out["runs"]
    if not {"sync_grpo16", "async_v05"} <= set(runs):
        return None
    sync, av = runs["sync_grpo16"][0], runs["async_v05"][0]
    m, ma = sync["measured"], av["measured"]
    per_token = m["train_time_s"] / max(1, m["trained_tokens"])
    # Generators and learner share the cores in async mode: the learner's time per token
    # there, over its time in sync mode, is the measured slowdown of overlapping work.
    overlap = max(1.0, ma["train_time_s"] / max(1, ma["trained_tokens"]) / per_token)
    return {
        "n_generators": m["n_generators"], "max_num_seqs": m["max_num_seqs"],
        "decode_step_s": out["probe"]["decode_step_s"],
        "learner_s_per_token": per_token, "overlap_slowdown": overlap,
        "sync_s": m["sync_time_s"], "response_lengths": sync["response_lengths"],
        "prompt_tokens": m["prompt_tokens"], "batch_prompts": sync["config"]["batch_prompts"],
        "max_staleness": m["max_staleness"], "max_inflight_prompts": m["max_inflight_prompts"],
        "success_rates": av["success_rates"], "prior_probs": av["prior_probs"],
        "dispatch_latency_s": out["probe"]["dispatch_latency_s"],
        "warmup_steps": out["warmup_steps"], "steps": out["steps"],
        "source": "measured by bench.throughput on this machine",
    }


def sim_check(out: dict) -> dict | None:
    """Calibrate the simulator with this run's constants; compare its predicted async V0.5 /
    sync GRPO-16 ratio of prompts/s with the measured one (mean over repeats)."""
    from bench.sim import predict_ratio

    cal = calibration(out)
    if cal is None:
        return None
    pred = predict_ratio(cal)
    measured = out["ratios"].get("async_v05_vs_sync_grpo16_prompts_per_s")
    predicted = pred.get("async_v05_vs_sync_grpo16_prompts_per_s")
    return {"calibration": cal, "predicted_ratio": predicted, "measured_ratio": measured,
            "equal_mse_group": pred.get("equal_mse_group"),
            "relative_error": abs(predicted - measured) / measured if measured and predicted else None}
