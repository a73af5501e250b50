"""Runs of the simulator: the modes side by side, sensitivity sweeps, the aims.

``run_modes`` runs ``async_v05`` before ``async_grpo_equal_mse`` so that the latter's group
size comes from V0.5's measured baseline MSE in the same run (same prompts, same prior).
"""
from __future__ import annotations

import time
from dataclasses import replace

from bench.sim.core import MODES, simulate
from bench.sim.metrics import equal_mse_group, ratios, summarise
from bench.sim.models import SimConfig, from_dict


def bottleneck(mode: str, s: dict) -> str:
    """What limits a mode's prompts/hour (a reading of its utilisation, see docs/simulator.md)."""
    if mode.startswith("sync"):
        return "serial phases (generate, then train, then sync)"
    if s["learner_busy_fraction"] >= 0.85:
        return "learner"
    if s["generator_throughput_efficiency"] >= 0.8:
        return "generators"
    return "scheduler (engines under-filled: staleness deadlines or admission)"


def ordered(modes) -> list[str]:
    modes = list(modes)
    if "async_grpo_equal_mse" in modes and "async_v05" in modes:
        modes.remove("async_grpo_equal_mse")
        modes.insert(modes.index("async_v05") + 1, "async_grpo_equal_mse")
    return modes


def run_modes(cfg: SimConfig, modes=tuple(MODES), keep: bool = False, progress=None):
    """-> ({mode: summary}, {mode: SimResult} if keep else {}). ``progress(line)``, if given,
    hears of each mode as it ends (a mode of the full benchmark takes minutes)."""
    summaries, results = {}, {}
    todo = ordered(modes)
    t0 = time.time()
    for i, m in enumerate(todo, 1):
        c = cfg
        if m == "async_grpo_equal_mse" and cfg.equal_mse_group is None:
            if "async_v05" not in summaries:
                raise ValueError("async_grpo_equal_mse needs async_v05 in the same run "
                                 "(or SimConfig.equal_mse_group)")
            c = replace(cfg, equal_mse_group=summaries["async_v05"]["equal_mse_group"])
        res = simulate(c, m)
        s = summarise(res)
        s["bottleneck"] = bottleneck(m, s)
        s["checks"] = res.checks
        if m == "async_v05":
            s["equal_mse_group"] = equal_mse_group(res)
        if m == "async_grpo_equal_mse":
            s["group_size"] = c.equal_mse_group
        if m == "async_grpo_best_g":
            s["group_size"] = c.best_grpo_group
        summaries[m] = s
        if keep:
            results[m] = res
        if progress is not None:
            progress(f"[sim] {i}/{len(todo)} {m} done, {time.time() - t0:.0f} s so far")
    return summaries, results


def set_param(cfg: SimConfig, dotted: str, value) -> SimConfig:
    node: dict = {}
    cur = node
    *parents, leaf = dotted.split(".")
    for p in parents:
        cur = cur.setdefault(p, {})
    cur[leaf] = value
    return from_dict(node, cfg)


def get_param(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


_KEY = "async_v05_vs_sync_grpo16_colocated_prompts_per_hour"
_LOGGED = (_KEY, "async_v05_vs_sync_grpo16_colocated_oversample_prompts_per_hour",
           "async_v05_vs_async_grpo_equal_mse_prompts_per_hour",
           "async_v05_vs_async_grpo_best_g_prompts_per_hour",
           "v05_vs_equal_mse_share_of_limit_ratio")
_COMPACT = ("prompts_per_hour", "trained_rollouts_per_hour", "fraction_of_limit", "generator_slot_occupancy",
            "generator_throughput_efficiency", "learner_busy_fraction", "mean_k", "rounds_mean",
            "baseline_mse", "sample_age_max", "bottleneck")


def run_sweeps(base: SimConfig, sweeps: dict, log=print, base_modes: dict | None = None) -> dict:
    """Vary one parameter at a time around ``base``; ``sweeps``: name -> (dotted param,
    values, modes). Modes a parameter cannot change reuse the base run (same prompts):
    ``base_modes`` (summaries of ``base``'s modes, e.g. the main run's) or run here."""
    if base_modes is None:
        base_modes, _ = run_modes(base, _needed(sweeps))
    out = {}
    for name, (param, values, modes) in sweeps.items():
        default = get_param(base, param)
        points = []
        for v in values:
            per = dict(base_modes)
            if v != default:
                per.update(run_modes(set_param(base, param, v), modes)[0])
            r = ratios(per)
            points.append(dict(value=v, ratios=r,
                               modes={m: {k: s[k] for k in _COMPACT} for m, s in per.items()}))
            log(f"  sweep {name} {param}={v}: " + ", ".join(
                f"{k.replace('_prompts_per_hour', '')} {x:.2f}" for k, x in r.items()
                if k in _LOGGED))
        out[name] = dict(param=param, default=default, points=points)
    return out


def _needed(sweeps: dict) -> list[str]:
    return ordered(sorted({m for _, _, modes in sweeps.values() for m in modes},
                          key=list(MODES).index))


SELECTION_MODE = "async_v05_k4_select"  # the selection mode bench.learning's warm start chose


def selection_summary(per: dict, rat: dict, mode: str = SELECTION_MODE) -> dict:
    """``summary.selection``: V0.5 with selection against async GRPO-4 per hour, in trained
    rollouts of groups with a nonzero advantage (the aim's unit), of groups whose rewards
    were not all equal (a group-mean method's only signal: the stricter unit), of all trained
    rollouts and of prompts; the same for V0.5 without selection; skip rates ({} when the
    modes did not run)."""
    stem = mode + "_vs_async_grpo4"
    if mode not in per or "async_grpo4" not in per:
        return {}
    out = {"mode": mode,
           "nonzero_rollouts_per_h_vs_async_grpo4": rat.get(f"{stem}_nonzero_rollouts_per_hour"),
           "mixed_rollouts_per_h_vs_async_grpo4": rat.get(f"{stem}_mixed_rollouts_per_hour"),
           "trained_rollouts_per_h_vs_async_grpo4": rat.get(f"{stem}_rollouts_per_hour"),
           "prompts_per_h_vs_async_grpo4": rat.get(f"{stem}_prompts_per_hour")}
    for m in ("async_v05", "async_v05_select", "async_v05_k4_select"):
        if m in per and "async_grpo4" in per:
            c = per[m]["checks"]
            out.setdefault("per_mode", {})[m] = {
                "nonzero_rollouts_per_h_vs_async_grpo4":
                    rat.get(f"{m}_vs_async_grpo4_nonzero_rollouts_per_hour"),
                "mixed_rollouts_per_h_vs_async_grpo4":
                    rat.get(f"{m}_vs_async_grpo4_mixed_rollouts_per_hour"),
                "skip_rate": c["deferred"] / c["drawn"] if c.get("drawn") else 0.0}
    return out


def aims(per: dict, rat: dict, cfg: SimConfig, prior_sweep: dict | None) -> dict:
    """The issue's aims at 32 GPUs, each with the number and whether it is met."""
    v = per["async_v05"]
    out = {
        # issue 18: at the measured prior, against the stronger baselines
        "async_v05_vs_async_grpo_equal_mse": dict(
            value=rat.get("async_v05_vs_async_grpo_equal_mse_prompts_per_hour"), aim=1.5),
        "async_v05_vs_sync_grpo16_colocated_oversample": dict(
            value=rat.get("async_v05_vs_sync_grpo16_colocated_oversample_prompts_per_hour"),
            aim=2.5),
        # issue 8
        "async_v05_vs_sync_grpo16_colocated": dict(value=rat.get(_KEY), aim=3.0),
        "async_v05_slot_occupancy": dict(value=v["generator_slot_occupancy"], aim=0.6),
        "async_v05_fraction_of_limit": dict(value=v["fraction_of_limit"], aim=0.8),
        "async_v05_sample_age_max": dict(value=v["sample_age_max"], aim=cfg.max_staleness,
                                         at_most=True),
    }
    sel = selection_summary(per, rat)
    if sel:  # issue 41: learning signal per hour, every trained rollout judged by its group
        out["selection_nonzero_rollouts_per_h_vs_async_grpo4"] = dict(
            value=sel["nonzero_rollouts_per_h_vs_async_grpo4"], aim=1.5)
    if prior_sweep is not None:
        vals = [p["ratios"].get("v05_vs_equal_mse_share_of_limit_ratio") for p in prior_sweep["points"]]
        vals = [x for x in vals if x is not None]
        out["v05_vs_equal_mse_share_of_limit_ratio_min"] = dict(
            value=min(vals) if vals else None, aim=0.9)
    for a in out.values():
        x = a["value"]
        a["met"] = None if x is None else bool(x <= a["aim"] if a.get("at_most") else x >= a["aim"])
    return out
