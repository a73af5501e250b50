"""The arithmetic of the prior-against-the-truth benchmark (pure: NumPy only).

The truth of a prompt is its success rate over n sampled responses of a snapshot's weights,
t = c / n; the prior's error is p - t. Its spread includes the truth's own binomial noise:
var(p - t) = var(p - mu) + E[mu (1 - mu)] / n, and E[t (1 - t) / (n - 1)] estimates the
second term without bias, so ``truth_noise_sd`` is its square root and
``error_sd_noise_removed`` = sqrt(error_sd^2 - truth_noise_sd^2) is the prior's own error.

The context of a snapshot is what the running system's prior held when the policy reached
that version: the newest ``window`` observations (``Observation``: prompt, observed success
rate, the version at which it finished, rollouts; given to the prior as
``common.types.PriorObservation``) of the run's ``prompts.jsonl`` that finished before the
version was published (``context_at``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FOLDS = 10  # the out-of-fold fits of the truth (level_cv_predictor, bounds.py)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (average ranks for ties)."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties share their mean rank
            m = x == v
            if m.sum() > 1:
                r[m] = r[m].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def truth_noise_sd(truth: np.ndarray, n: int) -> float:
    """sqrt(E[mu (1 - mu)] / n), estimated without bias from t = c / n: t (1 - t) / (n - 1)."""
    t = np.asarray(truth, dtype=float)
    return float(math.sqrt(max(0.0, float(np.mean(t * (1 - t) / (n - 1))))))


def error_stats(p: np.ndarray, truth: np.ndarray, n: int) -> dict:
    """The prior's p against the truth t (both (N,), probabilities) from n samples each.
    ``correlation_ceiling``: the largest correlation with t that any predictor can reach, the
    true rates themselves included, t's sampling noise being what it is:
    sqrt(1 - noise^2 / var(t)) (Pearson's; Spearman's sits near it)."""
    p, t = np.asarray(p, dtype=float), np.asarray(truth, dtype=float)
    e = p - t
    sd, noise, var_t = float(e.std(ddof=1)), truth_noise_sd(t, n), float(t.var(ddof=1))
    return {"error_sd": sd, "bias": float(e.mean()), "mae": float(np.abs(e).mean()),
            "rmse": float(math.sqrt(float(np.mean(e * e)))), "spearman": spearman(p, t),
            "error_sd_noise_removed": float(math.sqrt(max(0.0, sd * sd - noise * noise))),
            "truth_noise_sd": noise,
            "correlation_ceiling": float(math.sqrt(max(0.0, 1.0 - noise * noise / var_t)))
            if var_t > 0 else None}


def level_mean_predictor(truth: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The reference a prior should beat: each prompt predicted by its difficulty level's mean
    truth (a predictor told the level and the policy's exact per-level accuracy)."""
    t, lv = np.asarray(truth, dtype=float), np.asarray(levels)
    out = np.empty_like(t)
    for v in np.unique(lv):
        out[lv == v] = t[lv == v].mean()
    return out


def folds_of(n: int, folds: int = FOLDS) -> np.ndarray:
    """Fold of each prompt: interleaved, so that prompts listed level by level spread every
    level over every fold."""
    return np.arange(n) % folds


def level_cv_predictor(truth, levels, folds: int = FOLDS) -> np.ndarray:
    """Each prompt predicted by its level's mean truth over the other folds (the other folds'
    mean where they hold none of its level): the level-told predictor out of sample."""
    t, lv = np.asarray(truth, dtype=float), np.asarray(levels)
    fold, out = folds_of(len(t), folds), np.empty(len(t))
    for f in range(folds):
        train, test = fold != f, fold == f
        for i in np.flatnonzero(test):
            same = train & (lv == lv[i])
            out[i] = t[same].mean() if same.any() else t[train].mean()
    return out


def mean_se(values) -> dict:
    """{"values", "mean", "se"} of per-run figures (se: the sample sd over sqrt(n); None for
    one run)."""
    v = [float(x) for x in values]
    se = float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else None
    return {"values": v, "mean": float(np.mean(v)), "se": se}


def repeats_block(points: list[dict], samples: int, run_dirs: list[str],
                  variants: dict[str, list[float]] | None = None,
                  bounds: dict[str, list[float]] | None = None) -> dict:
    """One snapshot of R runs of a task (``points``: each run's {truth, p, level} on its own
    query prompts, ``samples`` per truth): per run and over the runs (mean, standard error),
    the prior's error sd with the truth's noise removed, the level-told predictor's, the prior
    minus the level-told (below 0: the prior predicts better), and both rank correlations;
    ``variants``: {name: each run's error sd (noise removed)} of the prior's variants, read
    the same way; ``bounds``: {name: each run's figure} of the fits to the truth itself that
    bounds.py makes, read the same way (with the level-told predictor out of fold, made here
    from the points: ``level_cv_predictor``). A run's figures move with its training (its
    snapshots differ), so an aim is read over runs."""
    prior, level, level_cv = [], [], []
    for pt in points:
        t, lv = np.asarray(pt["truth"], dtype=float), np.asarray(pt["level"])
        prior.append(error_stats(np.asarray(pt["p"], dtype=float), t, samples))
        level.append(error_stats(level_mean_predictor(t, lv), t, samples))
        level_cv.append(error_stats(level_cv_predictor(t, lv), t, samples))
    key = "error_sd_noise_removed"
    return {"runs": len(points), "run_dirs": [str(d) for d in run_dirs],
            "error_sd_noise_removed": mean_se(e[key] for e in prior),
            "level_error_sd_noise_removed": mean_se(e[key] for e in level),
            "prior_minus_level": mean_se(a[key] - b[key] for a, b in zip(prior, level)),
            "spearman": mean_se(e["spearman"] for e in prior),
            "level_spearman": mean_se(e["spearman"] for e in level),
            "correlation_ceiling": mean_se(e["correlation_ceiling"] for e in prior),
            "level_cv_error_sd_noise_removed": mean_se(e[key] for e in level_cv),
            "bounds": {name: mean_se(v) for name, v in (bounds or {}).items()},
            "variants": {name: {"error_sd_noise_removed": mean_se(errs),
                                "minus_level": mean_se(a - b[key] for a, b in zip(errs, level))}
                         for name, errs in (variants or {}).items()},
            "points": points}


def in_sample_fit(features: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Least squares of the truth on ``features`` (N, d) and an intercept, fitted to the truth
    itself and returned at the same prompts: not a predictor, a bound. No linear model on
    those features predicts these prompts better (by squared error) than this fit does."""
    A = np.concatenate([np.ones((len(truth), 1)), np.asarray(features, dtype=float)], axis=1)
    coef = np.linalg.lstsq(A, np.asarray(truth, dtype=float), rcond=None)[0]
    return A @ coef


def level_window_predictor(levels: np.ndarray, ctx_levels: list, ctx_scores: list) -> np.ndarray:
    """What a prior that reads each prompt's level perfectly can learn from its window: each
    prompt predicted by the mean observed score of the window's prompts of its level (the
    window's mean where it holds none of that level). The level-told predictor above knows
    the truth's level means; this one only the window's noisy, older observations, so it
    says how much of a prior's gap to the level-told one any window-fitted predictor keeps."""
    lv = np.asarray(levels)
    by: dict = {}
    for level, score in zip(ctx_levels, ctx_scores):
        by.setdefault(level, []).append(float(score))
    overall = float(np.mean(ctx_scores)) if len(ctx_scores) else 0.5
    return np.array([np.mean(by[v]) if v in by else overall for v in lv.tolist()])


def own_history_predictor(prompts: list[str], ctx: list, halflife: float | None = 8.0
                          ) -> np.ndarray:
    """Where prompts recur: each prompt predicted by its own observations in the window
    alone, weighed by their rollouts and by ``recency_weights`` over the versions before the
    newest (the signal history.py fuses with the model); the window's mean for a prompt it
    does not hold."""
    from actors.priors.base import recency_weights

    if not ctx:
        return np.full(len(prompts), 0.5)
    versions = np.array([o.version for o in ctx], dtype=float)
    w = recency_weights(versions.max() - versions, halflife) * [o.rollouts for o in ctx]
    by: dict = {}
    for o, wi in zip(ctx, w):
        got = by.setdefault(o.prompt, [0.0, 0.0])
        got[0], got[1] = got[0] + wi * o.score, got[1] + wi
    overall = float(np.mean([o.score for o in ctx]))
    return np.array([by[p][0] / by[p][1] if by.get(p, (0, 0))[1] > 0 else overall
                     for p in prompts])


def reliability(p: np.ndarray, truth: np.ndarray, bins: int = 5) -> list[dict]:
    """Mean p and mean truth per bin of p (equal-width bins on [0, 1]), with counts."""
    p, t = np.asarray(p, dtype=float), np.asarray(truth, dtype=float)
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    return [{"bin": [float(edges[b]), float(edges[b + 1])], "count": int((which == b).sum()),
             "p_mean": float(p[which == b].mean()) if (which == b).any() else None,
             "truth_mean": float(t[which == b].mean()) if (which == b).any() else None}
            for b in range(bins)]


@dataclass(frozen=True)
class Observation:
    """One finished prompt as the coordinator told the prior: its text, its observed success
    rate, the version at which it finished, when, and the rollouts behind the rate."""

    prompt: str
    score: float
    version: int
    t_done: float
    rollouts: int = 1


def observations(prompt_rows: list[dict], rewards: tuple[float, float]) -> list[Observation]:
    """The run's observations from ``prompts.jsonl`` rows, in the order they finished. The
    version an observation was reported at is the scheduler's version when it finished: the
    number of steps whose batch was taken before then (``t_trained``), as the coordinator
    reports it (``actors/coordinator.py``: observe ... sched.version)."""
    lo, hi = rewards
    taken = sorted({(r["step"], r["t_trained"]) for r in prompt_rows})
    times = np.array([t for _, t in taken])
    out = []
    for r in sorted(prompt_rows, key=lambda r: r["t_done"]):
        score = (float(np.mean(r["rewards"])) - lo) / (hi - lo)
        version = int(np.searchsorted(times, r["t_done"], side="right"))
        out.append(Observation(r["prompt"], min(1.0, max(0.0, score)), version, r["t_done"],
                               len(r["rewards"])))
    return out


def published_at(prompt_rows: list[dict], version: int) -> float:
    """When ``version`` was published: the learner took the batch of step ``version + 1``
    after publishing it (inf: the run ended first, everything it observed counts)."""
    after = [r["t_trained"] for r in prompt_rows if r["step"] == version + 1]
    return min(after) if after else math.inf


def context_at(obs: list[Observation], t: float, window: int,
               min_items: int = 0) -> list[Observation]:
    """The prior's window at time t: the newest ``window`` observations finished by then. With
    ``min_items``, at least that many (the first ones of the run) even if they finished later:
    the start snapshot's prior would otherwise be empty (then it answers its prior mean)."""
    done = [o for o in obs if o.t_done <= t]
    if len(done) < min_items:
        done = obs[:min_items]
    return done[-window:]
