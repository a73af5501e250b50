"""Metrics of one simulated run, measured over the steady-state window (after warm-up steps)."""
from __future__ import annotations

import numpy as np

from bench.sim_core import SimResult


def window(res: SimResult) -> tuple[float, float]:
    """[end of the last warm-up step, end of the last step]: the pipeline is full in between."""
    ends = [s["t_end"] for s in res.steps]
    w = res.cfg.warmup_steps
    if len(ends) <= w:  # budget ran out during warm-up: measure what there is
        return 0.0, max(res.t_stop, 1e-9)
    return (ends[w - 1] if w > 0 else 0.0), ends[-1]


def _overlap(t0, t1, w0, w1) -> np.ndarray:
    return np.clip(np.minimum(t1, w1) - np.maximum(t0, w0), 0.0, None)


def generator_stats(res: SimResult, w0: float, w1: float) -> dict:
    """Time fractions of engine time in [w0, w1]: decoding (>= 1 sequence), paused for a weight
    sync, idle; plus slot occupancy and tokens generated."""
    seg, cfg = res.engine_segments, res.cfg
    E, span = cfg.n_generators, (w1 - w0)
    ov = _overlap(seg[:, 1], seg[:, 2], w0, w1)
    dec = seg[:, 4] == 0
    n = seg[:, 3].astype(int)
    times = cfg.decode.step_times() * (cfg.overlap_slowdown if res.mode.startswith("async") else 1.0)
    tokens = float(np.sum(np.where(dec, ov * n / np.where(n > 0, times[np.maximum(n, 1)], 1.0), 0.0)))
    busy = float(ov[dec].sum()) / (E * span)
    sync = float(ov[~dec].sum()) / (E * span)
    occ = float((ov[dec] * n[dec]).sum()) / (E * span * cfg.decode.max_num_seqs)
    peak = cfg.decode.peak_tokens_per_s() / (cfg.overlap_slowdown if res.mode.startswith("async") else 1.0)
    return dict(generator_busy_fraction=busy, generator_sync_fraction=sync,
                generator_idle_fraction=max(0.0, 1.0 - busy - sync),
                generator_slot_occupancy=occ,
                generator_throughput_efficiency=tokens / (E * span * peak),
                generated_tokens=tokens)


def staleness_stats(st: np.ndarray) -> dict:
    if st.size == 0:
        return dict(mean=0.0, max=0, histogram={})
    hist = np.bincount(st)
    return dict(mean=float(st.mean()), max=int(st.max()), p99=float(np.percentile(st, 99)),
                histogram={str(i): int(c) for i, c in enumerate(hist) if c})


def summarise(res: SimResult) -> dict:
    w0, w1 = window(res)
    hours = (w1 - w0) / 3600.0
    steps = [s for s in res.steps if s["t_end"] > w0 + 1e-9 and s["t_end"] <= w1 + 1e-9]
    lseg = res.learner_segments
    train = float(_overlap(lseg[:, 0], lseg[:, 1], w0, w1)[lseg[:, 2] == 0].sum())
    fin = res.finish_times
    out = dict(
        window_s=[w0, w1], steps_in_window=len(steps),
        prompts_per_hour=sum(s["prompts"] for s in steps) / hours,
        rollouts_per_hour=float(((fin > w0) & (fin <= w1)).sum()) / hours,
        trained_rollouts_per_hour=sum(s["rollouts"] for s in steps) / hours,
        trained_tokens_per_hour=sum(s["tokens"] for s in steps) / hours,
        learner_busy_fraction=train / (w1 - w0),
        mean_step_s=(w1 - w0) / max(1, len(steps)),
        mean_k=float(res.k_trained.mean()) if res.k_trained.size else 0.0,
        k_histogram={str(k): int(c) for k, c in enumerate(np.bincount(res.k_trained)) if c},
        staleness=staleness_stats(res.staleness),
    )
    gen = generator_stats(res, w0, w1)
    out["tokens_per_hour"] = gen.pop("generated_tokens") / hours
    out.update(gen)
    return out


RATIOS = [("async_v05_vs_sync_grpo16_prompts_per_hour", "async_v05", "sync_grpo16"),
          ("async_v05_vs_async_grpo16_prompts_per_hour", "async_v05", "async_grpo16"),
          ("sync_v05_vs_sync_grpo16_prompts_per_hour", "sync_v05", "sync_grpo16"),
          ("async_grpo16_vs_sync_grpo16_prompts_per_hour", "async_grpo16", "sync_grpo16")]


def ratios(per_mode: dict) -> dict:
    out = {}
    for name, a, b in RATIOS:
        if a in per_mode and b in per_mode and per_mode[b]["prompts_per_hour"] > 0:
            out[name] = per_mode[a]["prompts_per_hour"] / per_mode[b]["prompts_per_hour"]
    return out
