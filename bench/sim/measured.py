"""The simulator's inputs that come from measurements, each with the name of its source.

- The prior's error: the standard deviation of (prior p - true success probability), on the
  probability scale, from ``bench/results/prior_truth.json`` (the prior checked against
  many-sample truths on the stepwise task, at several snapshots of training).
- GRPO's best group size: ``bench/results/learning.json``, ``summary.controlled.<start>.
  best_grpo_G`` (the G that learned best per unit of compute in the controlled comparison).

Pure: json and math, and studies.prior_truth's error arithmetic for a repeated snapshot. Every
resolver returns (value, source string) and falls back to the old assumption, saying so, when
its file is absent.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

PRIOR_TRUTH = Path("bench/results/prior_truth.json")
LEARNING = Path("bench/results/learning.json")
ASSUMED_PRIOR_ERROR_SD = 0.2   # the simulator's old middle guess (never measured)
DEFAULT_BEST_GRPO_G = 4
PRIOR_TASK = "stepwise"


def prior_error_from_truth(data: dict, task: str = PRIOR_TASK, recurring: bool = False) -> dict:
    """The conservative prior error of ``task`` in a prior_truth.json document, in the setting
    where train prompts recur (``recurring``) or not (the default: prompts never seen).

    Per snapshot, the prior's own error is sqrt(error_sd^2 - truth_noise_sd^2): the measured
    error against a k-sample truth holds the truth's sampling noise too (independent of the
    prior's error, so the variances add). The bias is added in quadrature (the simulator's
    error is zero-mean and the estimator sees each prompt's whole (V - mu)^2; a bias of b adds
    b^2 to it). A snapshot measured on repeated runs (its ``repeats``, each run's points) counts
    with the mean over the runs of each run's figure: one run's snapshot moves with its
    training. The largest over the task's snapshots is returned: the policy moves during
    training and the prior's worst moment is the one to plan for.
    -> {"error_sd", "snapshot", "per_snapshot": [{snapshot, error_sd, noise_removed, bias,
    prior_error_sd, runs}, ...]}"""
    snaps = [s for s in data.get("snapshots", []) if s.get("task") == task
             and bool(s.get("recurring")) == recurring]
    if not snaps:
        raise ValueError(f"prior_truth has no snapshot of task {task!r} "
                         f"(tasks: {sorted({s.get('task') for s in data.get('snapshots', [])})})")
    rows = []
    for s in snaps:
        runs = [_points_figures(pts, int(s["samples_per_prompt"]))
                for pts in s["repeats"]["points"]] if s.get("repeats") else \
            [(float(s["error_sd"]), float(s.get("truth_noise_sd") or 0.0),
              float(s.get("bias") or 0.0))]
        figures = []
        for err, noise, bias in runs:
            clean = math.sqrt(max(0.0, err * err - noise * noise))
            figures.append((err, noise, clean, bias, math.sqrt(clean * clean + bias * bias)))
        err, noise, clean, bias, total = (sum(f[i] for f in figures) / len(figures)
                                          for i in range(5))
        rows.append(dict(snapshot=s.get("snapshot"), error_sd=err, truth_noise_sd=noise,
                         noise_removed=clean, bias=bias, prior_error_sd=total, runs=len(runs)))
    worst = max(rows, key=lambda r: r["prior_error_sd"])
    return dict(error_sd=worst["prior_error_sd"], snapshot=worst["snapshot"], runs=worst["runs"],
                per_snapshot=rows)


def _points_figures(points: dict, n: int) -> tuple[float, float, float]:
    """(error sd, the truth's sampling noise sd, bias) of one run's {p, truth} on n samples,
    as studies.prior_truth computed its figures."""
    from studies.prior_truth.analysis import error_stats

    e = error_stats(points["p"], points["truth"], n)
    return e["error_sd"], e["truth_noise_sd"], e["bias"]


def resolve_prior_error_sd(cli: float | None = None, path: Path | str = PRIOR_TRUTH,
                           task: str = PRIOR_TASK) -> tuple[float, str, dict | None]:
    """-> (error sd, source, detail). ``cli`` (``--prior-error-sd``) wins; else the file;
    else the old assumption."""
    if cli is not None:
        if not 0 <= cli <= 1:
            raise ValueError(f"--prior-error-sd must be in [0, 1], got {cli}")
        return float(cli), "--prior-error-sd", None
    path = Path(path)
    if not path.is_file():
        return ASSUMED_PRIOR_ERROR_SD, "assumed", None
    got = prior_error_from_truth(json.loads(path.read_text()), task)
    runs = f", the mean of {got['runs']} runs" if got["runs"] > 1 else ""
    return (got["error_sd"], f"{path} (task {task}, snapshot {got['snapshot']}{runs}: the "
            "largest of its snapshots, sqrt(error_sd^2 - truth_noise_sd^2 + bias^2))", got)


def resolve_best_grpo_g(cli: int | None = None,
                        path: Path | str = LEARNING) -> tuple[int, str]:
    """-> (G, source). ``cli`` (``--best-grpo-g``) wins; else the first start of
    ``summary.controlled`` in learning.json that names a ``best_grpo_G``; else 4."""
    if cli is not None:
        if cli < 1:
            raise ValueError(f"--best-grpo-g must be >= 1, got {cli}")
        return int(cli), "--best-grpo-g"
    path = Path(path)
    if path.is_file():
        controlled = (json.loads(path.read_text()).get("summary") or {}).get("controlled") or {}
        for start, entry in controlled.items():
            if isinstance(entry, dict) and entry.get("best_grpo_G") is not None:
                return int(entry["best_grpo_G"]), \
                    f"{path} summary.controlled.{start}.best_grpo_G"
    return DEFAULT_BEST_GRPO_G, f"default {DEFAULT_BEST_GRPO_G} ({path} has no " \
        "summary.controlled.<start>.best_grpo_G)"
