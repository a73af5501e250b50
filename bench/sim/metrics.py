"""Metrics of one simulated run, measured over the steady-state window, and each mode's
physical limit.

Units: prompts, rollouts and trained tokens per hour over the window from the end of the
first ``cfg.warmup`` learner steps (max_staleness + 2 by default) to the end of the last one.
The physical limit of a mode is the slower of its two resources for that mode's own tokens
per prompt, at the best generator:learner split of the same GPUs: generators at their peak
decode throughput (every sequence slot busy), the learner at its modelled tokens/s.
"""
from __future__ import annotations

import numpy as np

from bench.sim.core import SimResult


def window(res: SimResult) -> tuple[float, float]:
    """[end of the last warm-up step, end of the last step]: the pipeline is full in between."""
    ends = [s["t_end"] for s in res.steps]
    w = res.cfg.warmup
    if len(ends) <= w:  # budget ran out during warm-up: measure what there is
        return 0.0, max(res.t_stop, 1e-9)
    return (ends[w - 1] if w > 0 else 0.0), ends[-1]


def _overlap(t0, t1, w0, w1) -> np.ndarray:
    return np.clip(np.minimum(t1, w1) - np.maximum(t0, w0), 0.0, None)


def _slowdown(res: SimResult) -> float:
    return res.cfg.overlap_slowdown if res.mode.startswith("async") else 1.0


def generator_stats(res: SimResult, w0: float, w1: float) -> dict:
    """Time fractions of engine time in [w0, w1]: decoding (>= 1 sequence), paused for a weight
    sync, idle; slot occupancy (mean running sequences / max_num_seqs) and decode throughput
    against the engine's peak (every slot busy)."""
    seg, cfg = res.engine_segments, res.cfg
    E, span = res.n_engines, (w1 - w0)
    ov = _overlap(seg[:, 1], seg[:, 2], w0, w1)
    dec = seg[:, 4] == 0
    n = seg[:, 3].astype(int)
    times = cfg.decode.step_times() * _slowdown(res)
    tokens = float(np.sum(np.where(dec, ov * n / np.where(n > 0, times[np.maximum(n, 1)], 1.0), 0.0)))
    busy = float(ov[dec].sum()) / (E * span)
    sync = float(ov[~dec].sum()) / (E * span)
    occ = float((ov[dec] * n[dec]).sum()) / (E * span * cfg.decode.max_num_seqs)
    peak = cfg.decode.peak_tokens_per_s() / _slowdown(res)
    return dict(generator_busy_fraction=busy, generator_sync_fraction=sync,
                generator_idle_fraction=max(0.0, 1.0 - busy - sync),
                generator_slot_occupancy=occ,
                generator_throughput_efficiency=tokens / (E * span * peak),
                decode_tokens_per_s_per_gpu=tokens / (E * span),
                generated_tokens=tokens)


def staleness_stats(st: np.ndarray) -> dict:
    if st.size == 0:
        return dict(mean=0.0, max=0, p99=0.0, histogram={})
    hist = np.bincount(st)
    return dict(mean=float(st.mean()), max=int(st.max()), p99=float(np.percentile(st, 99)),
                histogram={str(i): int(c) for i, c in enumerate(hist) if c})


def physical_limit(cfg, gen_tokens_per_prompt: float, train_tokens_per_prompt: float,
                   n_gpus: int | None = None) -> dict:
    """Prompts/hour the GPUs could sustain for these tokens per prompt, and the split.

    Generators: ``peak`` tokens/s each; learner: 1 / s_per_token_gpu tokens/s per GPU. With g
    generator GPUs of N: min(g * peak / gen, (N - g) / (train * s)) prompts/s, best integer g.
    ``n_gpus``: the GPUs that generate or train (default: all of ``cfg.n_gpus``)."""
    N = cfg.n_gpus if n_gpus is None else n_gpus
    peak = cfg.decode.peak_tokens_per_s()
    best = (0.0, 1)
    for g in range(1, N):
        rate = min(g * peak / max(gen_tokens_per_prompt, 1e-9),
                   (N - g) / max(train_tokens_per_prompt * cfg.learner.s_per_token_gpu, 1e-12))
        best = max(best, (rate, g))
    return dict(prompts_per_hour=best[0] * 3600.0, best_generator_gpus=best[1])


def summarise(res: SimResult) -> dict:
    w0, w1 = window(res)
    hours = (w1 - w0) / 3600.0
    steps = [s for s in res.steps if s["t_end"] > w0 + 1e-9 and s["t_end"] <= w1 + 1e-9]
    lseg = res.learner_segments
    train = float(_overlap(lseg[:, 0], lseg[:, 1], w0, w1)[lseg[:, 2] == 0].sum())
    fin = res.finish_times
    prompts = sum(s["prompts"] for s in steps)
    ev = res.token_events
    spent = float(ev[(ev[:, 0] > w0) & (ev[:, 0] <= w1), 1].sum()) if len(ev) else 0.0
    out = dict(
        window_s=[w0, w1], steps_in_window=len(steps),
        prompts_per_hour=prompts / hours,
        rollouts_per_hour=float(((fin > w0) & (fin <= w1)).sum()) / hours,
        trained_rollouts_per_hour=sum(s["rollouts"] for s in steps) / hours,
        # trained rollouts of prompts with some nonzero advantage / with rewards not all equal
        nonzero_trained_rollouts_per_hour=sum(s["nonzero_rollouts"] for s in steps) / hours,
        mixed_trained_rollouts_per_hour=sum(s["mixed_rollouts"] for s in steps) / hours,
        trained_tokens_per_hour=sum(s["tokens"] for s in steps) / hours,
        learner_busy_fraction=train / (w1 - w0),
        mean_step_s=(w1 - w0) / max(1, len(steps)),
        mean_k=float(res.k_trained.mean()) if res.k_trained.size else 0.0,
        k_histogram={str(k): int(c) for k, c in enumerate(np.bincount(res.k_trained)) if c},
        rounds_mean=float(res.rounds_trained.mean()) if res.rounds_trained.size else 0.0,
        rounds_p99=float(np.percentile(res.rounds_trained, 99)) if res.rounds_trained.size else 0.0,
        baseline_mse=float(res.baseline_sq_err.mean()) if res.baseline_sq_err.size else 0.0,
        cancelled_token_fraction=res.cancelled_tokens / max(1, res.cancelled_tokens + res.gen_tokens_done),
        aborted_prompts=res.aborted_prompts,
        staleness=staleness_stats(res.staleness),
        sample_age_max=int(res.staleness.max()) if res.staleness.size else 0,
        n_engines=res.n_engines, learner_gpus=res.learner_gpus,
    )
    gen = generator_stats(res, w0, w1)
    gen.pop("generated_tokens")
    out["decode_tokens_per_hour"] = spent / hours  # finished + cancelled: all spent compute
    out.update(gen)
    # Tokens per trained prompt, over the window, with cancelled tokens charged to the prompts.
    gen_per_prompt = spent / max(1, prompts)
    train_per_prompt = sum(s["tokens"] for s in steps) / max(1, prompts)
    usable = res.learner_gpus if res.n_engines == res.learner_gpus else \
        res.n_engines + res.learner_gpus  # colocated: the same GPUs do both
    lim = physical_limit(res.cfg, gen_per_prompt, train_per_prompt, usable)
    out["gen_tokens_per_prompt"], out["train_tokens_per_prompt"] = gen_per_prompt, train_per_prompt
    # Generated tokens never trained (cancelled, cut, aborted with their prompt), over the window.
    trained_gen = sum(s["tokens"] - s["rollouts"] * res.cfg.length.prompt_tokens for s in steps)
    out["untrained_generated_fraction"] = max(0.0, 1.0 - trained_gen / spent) if spent else 0.0
    out["limit_prompts_per_hour"] = lim["prompts_per_hour"]
    out["limit_best_generator_gpus"] = lim["best_generator_gpus"]
    out["fraction_of_limit"] = out["prompts_per_hour"] / max(lim["prompts_per_hour"], 1e-9)
    return out


# (name stem, numerator mode, denominator mode). Every ratio is given in two units: prompts
# trained per hour (``<stem>_prompts_per_hour``) and rollouts trained per hour
# (``<stem>_rollouts_per_hour``): the second is the first times the numerator's trained rollouts
# per prompt over the denominator's (about mean k / G), so it says how much of a prompts/hour
# gain is only fewer rollouts per prompt.
RATIOS = [("async_v05_vs_sync_grpo16", "async_v05", "sync_grpo16"),
          ("async_v05_vs_sync_grpo16_colocated", "async_v05", "sync_grpo16_colocated"),
          ("async_v05_vs_sync_grpo16_colocated_oversample", "async_v05",
           "sync_grpo16_colocated_oversample"),
          ("async_v05_vs_async_grpo16", "async_v05", "async_grpo16"),
          ("async_v05_vs_async_grpo_best_g", "async_v05", "async_grpo_best_g"),
          ("async_v05_vs_async_grpo_equal_mse", "async_v05", "async_grpo_equal_mse"),
          ("sync_v05_vs_sync_grpo16", "sync_v05", "sync_grpo16"),
          ("async_grpo16_vs_sync_grpo16", "async_grpo16", "sync_grpo16"),
          ("sync_grpo16_colocated_oversample_vs_sync_grpo16_colocated",
           "sync_grpo16_colocated_oversample", "sync_grpo16_colocated"),
          ("async_v05_select_vs_async_grpo4", "async_v05_select", "async_grpo4"),
          ("async_v05_k4_select_vs_async_grpo4", "async_v05_k4_select", "async_grpo4"),
          ("async_v05_vs_async_grpo4", "async_v05", "async_grpo4")]
UNITS = {"prompts_per_hour": "prompts_per_hour", "rollouts_per_hour": "trained_rollouts_per_hour",
         "nonzero_rollouts_per_hour": "nonzero_trained_rollouts_per_hour",
         "mixed_rollouts_per_hour": "mixed_trained_rollouts_per_hour"}


def ratios(per_mode: dict) -> dict:
    out = {}
    for stem, a, b in RATIOS:
        if a not in per_mode or b not in per_mode:
            continue
        for unit, key in UNITS.items():
            if per_mode[b][key] > 0:
                out[f"{stem}_{unit}"] = per_mode[a][key] / per_mode[b][key]
    a, b = per_mode.get("async_v05"), per_mode.get("async_grpo_equal_mse")
    if a and b and b["fraction_of_limit"] > 0:
        # Does the scheduler keep what the statistics give? V0.5's share of its limit over
        # equal-MSE GRPO's share of its own (1.0: both equally close to their hardware limit).
        out["v05_vs_equal_mse_share_of_limit_ratio"] = a["fraction_of_limit"] / b["fraction_of_limit"]
    return out


def equal_mse_group(res: SimResult, g_max: int = 64) -> int:
    """GRPO's G whose baseline MSE (population variance / G) equals V0.5's in this run."""
    cfg = res.cfg
    rng = np.random.default_rng([cfg.seed, 99])
    p, _ = cfg.prompts.draw(100_000, rng, np.random.default_rng([cfg.seed, 98]))
    var = float(np.mean(4.0 * p * (1.0 - p)))  # Bernoulli variance on the {-1, +1} scale
    mse = float(res.baseline_sq_err.mean()) if res.baseline_sq_err.size else var
    return int(np.clip(round(var / max(mse, 1e-12)), 2, g_max))
