"""The per-generated-rollout reading of a study (``python -m bench.learning --selection``):
every mode judged by what it generated, every rollout counted (pure: NumPy only).

A setting's runs are compared at the largest number of generated rollouts that every run of
every mode reached (``at_equal_rollouts``: linear between evaluations, never extrapolated), by
the area under accuracy against generated rollouts up to that point (``auc``: the mean
accuracy over it), and at the training wall-clock every run reached (``at_equal_train_s``).
Differences are paired by seed (the runs of a seed share their start, their prompts'
order, their rollouts' seeds and their held-out prompts).

The best baseline of a setting is picked after the runs: the baseline mode with the highest
mean accuracy at equal generated rollouts.
"""
from __future__ import annotations

import math

import numpy as np

from bench.learning.analysis import accuracy_at, interp, paired_difference

AXIS = "generated"


def common_end(runs: dict[str, list[dict]], axis: str) -> float:
    """The largest point on ``axis`` every run of every mode reached."""
    return min(r["points"][-1][axis] for rs in runs.values() for r in rs)


def auc(run: dict, axis: str, end: float, n: int = 400) -> float:
    """The run's mean accuracy over [0, end] on ``axis`` (linear between its evaluations)."""
    grid = np.linspace(0.0, end, n)
    return float(np.mean(interp(run["points"], axis, grid)))


def _stats(x: np.ndarray) -> dict:
    se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else None
    return {"mean": float(x.mean()), "se": se, "seeds": x.tolist()}


def paired_auc(a: list[dict], b: list[dict], axis: str, end: float) -> dict:
    """a's area minus b's over [0, end], paired by seed: mean, se, seeds."""
    by_seed = {r["seed"]: r for r in b}
    d = np.array([auc(r, axis, end) - auc(by_seed[r["seed"]], axis, end)
                  for r in a if r["seed"] in by_seed])
    return {**_stats(d), "end": float(end), "axis": axis}


def mode_figures(runs: list[dict], at: float, wall: float) -> dict:
    """One mode's figures: accuracy at equal generated rollouts and wall-clock, its area,
    where its generated rollouts went, its skip rate, updates and rollouts per update."""
    gen = [r.get("generated") or {} for r in runs]

    def mean_of(key):
        xs = [g[key] for g in gen if g.get(key) is not None]
        return float(np.mean(xs)) if xs else None

    levels = prior_vs_levels(runs)  # runs read before it was: none (their files unchanged)
    return {"accuracy_at_equal_rollouts": _stats(accuracy_at(runs, AXIS, at)),
            "accuracy_at_equal_train_s": _stats(accuracy_at(runs, "train_s", wall)),
            "auc": _stats(np.array([auc(r, AXIS, at) for r in runs])),
            "final_accuracy": _stats(np.array([r["points"][-1]["accuracy"] for r in runs])),
            "zero_advantage_share": mean_of("zero_advantage_share"),
            "uniform_share": mean_of("uniform_share"),
            "skip_rate": mean_of("skip_rate"),
            "prior_fallbacks": mean_of("prior_fallbacks"),
            "updates": float(np.mean([r["steps"] for r in runs])),
            "generated_per_update": float(np.mean([r["points"][-1][AXIS] / max(1, r["steps"])
                                                   for r in runs])),
            "train_s": float(np.mean([r["points"][-1]["train_s"] for r in runs])),
            **({"prior_vs_levels": levels} if levels else {})}


def prior_vs_levels(runs: list[dict]) -> dict | None:
    """The prior against the level-told predictor in each window of the runs
    (``bench.learning.analysis.prior_against_levels``), over the seeds: the difference of
    mean squared errors (prior minus levels; below 0, the prior predicts better) with its SE
    over seeds, and each one's error with the rollouts' noise removed, their means."""
    per_run = [r.get("prior_vs_levels") for r in runs]
    per_run = [w for w in per_run if w]
    if not per_run:
        return None
    out = {}
    for name in per_run[0]:
        ws = [w[name] for w in per_run if w.get(name)]
        if not ws:
            out[name] = None
            continue
        out[name] = {"mse_difference": _stats(np.array([w["mse_difference"]["mean"]
                                                         for w in ws])),
                     "prompts": int(sum(w["prompts"] for w in ws)),
                     **{key: float(np.mean([w[key] for w in ws]))
                        for key in ("prior_rmse_noise_removed", "levels_rmse_noise_removed")}}
    return out


def setting_summary(runs: dict[str, list[dict]], selection: str, baselines: tuple[str, ...],
                    reference: str) -> dict:
    """A setting's pinned figures: per mode (``modes``), the best baseline among
    ``baselines`` at equal generated rollouts (``best_baseline``), ``selection`` minus it
    (``selection_minus_best``: accuracy at equal generated rollouts; ``..._auc``,
    ``..._at_equal_train_s``), every mode minus ``reference`` (Dr.GRPO-4) and minus the best,
    and ``zero_advantage_share`` per mode. Mode names as the runs have them."""
    runs = {m: r for m, r in runs.items() if r}
    at, wall = common_end(runs, AXIS), common_end(runs, "train_s")
    modes = {m: mode_figures(r, at, wall) for m, r in runs.items()}
    out: dict = {"at_generated_rollouts": float(at), "at_train_s": float(wall), "modes": modes,
                 "zero_advantage_share": {m: f["zero_advantage_share"] for m, f in modes.items()}}
    present = [m for m in baselines if m in runs]
    if not present:
        return out
    best = max(present, key=lambda m: modes[m]["accuracy_at_equal_rollouts"]["mean"])
    out["best_baseline"] = best
    for m in runs:
        if m != best:
            out.setdefault("minus_best", {})[m] = paired_difference(runs[m], runs[best], AXIS, at)
        if m != reference and reference in runs:
            out.setdefault("minus_reference", {})[m] = paired_difference(
                runs[m], runs[reference], AXIS, at)
    if selection in runs:
        out["selection_mode"] = selection
        out["selection_minus_best"] = paired_difference(runs[selection], runs[best], AXIS, at)
        out["selection_minus_best_auc"] = paired_auc(runs[selection], runs[best], AXIS, at)
        out["selection_minus_best_at_equal_train_s"] = paired_difference(
            runs[selection], runs[best], "train_s", wall)
        if reference in runs:
            for key in ("zero_advantage_share", "uniform_share"):
                z = modes[selection][key], modes[reference][key]
                out[f"{key}_vs_reference"] = z[0] / z[1] if None not in z and z[1] else None
    return out


def verdict(d: dict, sigmas: float = 2.0) -> str:
    """'ahead', 'behind' or 'tie' by ``sigmas`` standard errors of a paired difference."""
    if d.get("se") is None:
        return "tie"
    if d["mean"] >= sigmas * d["se"]:
        return "ahead"
    if d["mean"] <= -sigmas * d["se"]:
        return "behind"
    return "tie"
