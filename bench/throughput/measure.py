"""What one run of a mode measured, over its steady-state window, in honest units.

The window drops the first ``warmup`` learner steps (the pipeline filling: max_staleness + 2)
and counts each remaining step from the moment the trainer asked for its batch to the moment
every generator held the new weights: evaluation time (after that) is never in it. Rates are
per second of that window: prompts trained, rollouts trained, trained tokens (prompt +
response), decode tokens (everything the generators produced, cancelled work included).

The physical limit on this machine: every role shares the same cores, so a prompt costs the
generators' time at their measured peak decode rate plus the learner's time at its measured
rate (in sync mode, alone on the cores); the limit is one prompt per that sum.
"""
from __future__ import annotations

import math

import numpy as np


def window_rows(rows: list[dict], warmup: int) -> list[dict]:
    return [r for r in rows if r["step"] > warmup]


def steady_state(rows: list[dict], warmup: int) -> dict:
    """Rates over the steady-state window of one run's metrics.jsonl rows."""
    w = window_rows(rows, warmup)
    if not w:
        raise ValueError(f"no steady-state window: {len(rows)} steps, warm-up {warmup}")
    span = sum(r["t_step_end"] - r["t_start"] for r in w)
    prompts = sum(r["prompts"] for r in w)
    rollouts = sum(r["rollouts"] for r in w)
    trained = sum(r["trained_tokens"] for r in w)
    train_s = sum(r["train_time_s"] for r in w)
    return {"window_steps": len(w), "window_s": span,
            "prompts_per_s": prompts / span, "rollouts_per_s": rollouts / span,
            "trained_tokens_per_s": trained / span,
            "decode_tokens_per_s": float(np.mean([r["decode_tokens_per_s"] for r in w])),
            "generator_busy_fraction": float(np.mean([r["generator_busy_fraction"] for r in w])),
            "generator_slot_occupancy": float(np.mean([r["generator_slot_occupancy"] for r in w])),
            "learner_idle_fraction": sum(r["learner_wait_s"] for r in w) / span,
            "learner_tokens_per_s": trained / train_s if train_s > 0 else math.nan,
            "k_mean": rollouts / max(1, prompts),
            "rounds_mean": float(np.mean([r["rounds_mean"] for r in w])),
            "staleness_max": max(r["staleness_max"] for r in w),
            "gen_tokens_per_prompt": sum(r["tokens_generated"] for r in w) / max(1, prompts),
            "train_tokens_per_prompt": trained / max(1, prompts)}


def cpu_limit(gen_tokens_per_prompt: float, train_tokens_per_prompt: float,
              peak_decode_tokens_per_s: float, learner_tokens_per_s: float) -> float:
    """Prompts/s the shared cores could sustain: generation at peak plus training, serially."""
    t = gen_tokens_per_prompt / peak_decode_tokens_per_s + \
        train_tokens_per_prompt / learner_tokens_per_s
    return 1.0 / t if t > 0 else math.nan


def spread(values: list[float]) -> dict:
    """Mean, standard deviation (ddof 1), min and max over repeats."""
    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], float)
    if a.size == 0:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if a.size > 1 else 0.0,
            "min": float(a.min()), "max": float(a.max()), "n": int(a.size)}
