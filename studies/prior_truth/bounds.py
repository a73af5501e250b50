"""What the truth itself allows at a snapshot: fits to the truth, so not predictors but
bounds to read the prior's aims against (NumPy and the tasks' own parsers).

The level-told predictor of the aims is one such fit: each level's mean truth, the prompt's
own included (in sample); ``analysis.level_cv_predictor`` is the same out of fold, what the
other folds' truth says of a prompt. ``generator_variables`` are the variables a task's
generator drew each prompt from, read by the task's own parser (stepwise: level, step count,
step size, sign, start digit, carries; arithmetic: the value's sign and size, the operators
and their order, a units carry): what makes one prompt harder than another. The prior is
never given them (it is a generalist, docs/prior.md). ``cross_validated_bound`` fits the
truth on them by ridge, out of fold, on two scales, its ridge strength and scale chosen on
the very prompts it is scored on (optimistic by construction): what a linear fit in those
variables reaches with a truth of 64 samples a prompt behind it, where a prior's window
holds 4-16 rollouts a score.
"""
from __future__ import annotations

import math
import re

import numpy as np

from studies.prior_truth.analysis import FOLDS, error_stats, folds_of
from tasks import arithmetic as ar
from tasks import stepwise as sw

RIDGE_GRID = tuple(float(x) for x in np.logspace(-3, 2, 11))  # per training prompt
SCALES = ("probability", "logit")


def generator_variables(task: str, prompts: list[str], levels
                        ) -> tuple[list[str], np.ndarray] | None:
    """(names, (N, d) values) of the variables ``task``'s generator drew each prompt from,
    levels one-hot; None for a task without a generator to read (word_arithmetic)."""
    rows = {"stepwise": _stepwise, "arithmetic": _arithmetic}.get(task)
    if rows is None:
        return None
    got = [rows(p, int(lv)) for p, lv in zip(prompts, levels)]
    names = list(got[0])
    return names, np.array([[r[k] for k in names] for r in got], dtype=float)


def _carries(s) -> int:
    """How many of the steps of ``s`` (a ``tasks.stepwise.Spec``) carry (``+``) or borrow
    (``-``) in the units column."""
    a, n = s.x, 0
    for _ in range(s.k):
        n += sw.units_carry(a, s.op, s.d)
        a = sw.step_value(a, s.op, s.d)
    return n


def _stepwise(prompt: str, level: int) -> dict:
    s = sw.parse_prompt(prompt)
    carries = _carries(s)
    row = {f"level{v}": float(level == v) for v in sw.LEVELS}
    row |= {f"steps_at_level{v}": s.k * float(level == v) for v in sw.LEVELS}
    row |= {f"step_size{d}": float(s.d == d) for d in sw.STEP_SIZES}
    row |= {f"start_units{u}": float(s.x % 10 == u) for u in range(10)}
    return row | {"minus": float(s.op == "-"), "carries": float(carries),
                  "carry_share": carries / s.k}


def _arithmetic(prompt: str, level: int) -> dict:
    expr = prompt.rstrip("=")
    value = ar.evaluate(expr)
    ops = re.findall(r"[+\-*]", expr)
    numbers = [int(x) for x in re.findall(r"\d+", expr)]
    row = {f"level{v}": float(level == v) for v in ar.LEVELS}
    return row | {"negative": float(value < 0), "two_digits": float(abs(value) >= 10),
                  "three_digits": float(abs(value) >= 100), "log_value": math.log1p(abs(value)),
                  "times": float("*" in ops), "times_first": float(ops[0] == "*"),
                  "times_second": float(ops[1:2] == ["*"]), "minus": float("-" in ops),
                  "units_carry": float(sum(n % 10 for n in numbers) >= 10)}


def ridge_out_of_fold(F: np.ndarray, y: np.ndarray, lam: float, folds: int = FOLDS) -> np.ndarray:
    """Ridge of y on F's columns (standardised on each training part, intercept free), each
    prompt predicted by the fit on the other folds. ``lam`` is per training prompt."""
    X = np.asarray(F, dtype=float)
    fold, out = folds_of(len(y), folds), np.empty(len(y))
    for f in range(folds):
        train = fold != f
        mu, sd = X[train].mean(0), X[train].std(0)
        sd = np.where(sd > 1e-12, sd, 1.0)
        Z = (X[train] - mu) / sd
        ym = y[train].mean()
        coef = np.linalg.solve(Z.T @ Z + lam * len(Z) * np.eye(Z.shape[1]), Z.T @ (y[train] - ym))
        out[~train] = ym + ((X[~train] - mu) / sd) @ coef
    return out


def cross_validated_bound(F: np.ndarray, truth, samples: int, folds: int = FOLDS) -> dict:
    """The truth (c / ``samples`` a prompt) fitted on ``F`` out of fold, at every ridge
    strength of ``RIDGE_GRID`` and on both scales (the probabilities; the empirical logits
    log((c + 1/2) / (samples - c + 1/2)), mapped back): the smallest error sd with the
    truth's noise removed and the largest Spearman among them, each with where it was
    reached. Chosen on the prompts scored: optimistic."""
    t = np.asarray(truth, dtype=float)
    c = t * samples
    targets = {"probability": t, "logit": np.log((c + 0.5) / (samples - c + 0.5))}
    best_err, best_rank = None, None
    for scale in SCALES:
        for lam in RIDGE_GRID:
            f = ridge_out_of_fold(F, targets[scale], lam, folds)
            p = np.clip(f if scale == "probability" else 1.0 / (1.0 + np.exp(-f)), 0.0, 1.0)
            e = error_stats(p, t, samples)
            if best_err is None or e["error_sd_noise_removed"] < best_err[0]:
                best_err = (e["error_sd_noise_removed"], scale, lam)
            if best_rank is None or e["spearman"] > best_rank[0]:
                best_rank = (e["spearman"], scale, lam)
    return {"error_sd_noise_removed": best_err[0], "error_at": {"scale": best_err[1],
                                                                "ridge": best_err[2]},
            "spearman": best_rank[0], "spearman_at": {"scale": best_rank[1],
                                                      "ridge": best_rank[2]},
            "folds": folds}
