"""How much each observation of the prior's window counts: its age (``base.recency_weights``,
halving every ``halflife`` policy versions; the time-decay kernel T between two observations)
and the rollouts behind its score.

With ``counts`` (N,), the rollouts behind each score (a rate of k rollouts has
variance p (1 - p) / k about its prompt's own rate), a score weighs its recency weight times
its rollout weight: in the mean, the fit and the leave-one-out criterion, not in T. By
``weighting="count"`` that is its count over the window's mean; by ``"variance"``
(``score_weights``; the embedded prior's default), the inverse of the score's variance about
the window's mean, tau^2 + p (1 - p) / k, where tau^2, the spread of the prompts' own rates,
is the window's variance less its sampling noise: a score of 16 rollouts then outweighs one
of 4 by less than 4x when prompts differ more than their samples do. Measured side by side
in studies.prior_truth (variant ``count_weighted``, docs/prior.md item 10). A prompt's own
history (history.py) counts its earlier scores by their rollouts.
"""
from __future__ import annotations

import numpy as np

from actors.priors.base import recency_weights


def window_weights(ages: np.ndarray, halflife: float | None, counts: np.ndarray | None):
    """The context's weights: (recency decay (N,), the time-decay kernel T (N, N) or None
    without a halflife, the rollout weights (N,)); a score's weight is decay x rollout weight."""
    decay = recency_weights(ages, halflife)
    T = None if halflife is None else \
        np.power(0.5, np.abs(ages[:, None] - ages[None, :]) / halflife)
    return decay, T, rollout_weights(counts, len(ages))


def fit_weights(rw: np.ndarray, counts: np.ndarray | None, y: np.ndarray,
                weighting: str) -> np.ndarray:
    """The scores' rollout weights in the fit: ``rw`` (``window_weights``' count weights) by
    ``weighting`` "count", ``score_weights`` by "variance" (``rw`` without counts). (N,)"""
    if weighting not in ("count", "variance"):
        raise ValueError(f"weighting must be 'count' or 'variance', got {weighting!r}")
    return score_weights(counts, y) if weighting == "variance" and counts is not None else rw


def score_weights(counts: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each score's inverse variance about the window's mean, 1 / (tau^2 + p (1 - p) / k),
    relative to the window's mean weight: p the window's mean score, tau^2 the window's
    variance less its mean sampling variance (0 when the scores vary no more than their
    sampling does: then the weights are the counts'). (N,)"""
    c = rollout_weights(counts, len(y)) * np.mean(counts)  # checked, as counts
    p = float(np.mean(y))
    noise = p * (1.0 - p) / c
    tau2 = max(float(np.var(y)) - float(noise.mean()), 0.0)
    if tau2 + noise.min() <= 0.0:  # every score 0, or every score 1: nothing to weigh
        return np.ones(len(y))
    w = 1.0 / (tau2 + noise)
    return w / w.mean()


def rollout_weights(counts: np.ndarray | None, n: int) -> np.ndarray:
    """Each score's weight for the rollouts behind it, relative to the window's mean (a score
    of k rollouts has variance p(1 - p) / k): ones when the counts are not known. (n,)"""
    if counts is None:
        return np.ones(n)
    c = np.asarray(counts, dtype=np.float64)
    if c.shape != (n,) or not np.all(c >= 1):
        raise ValueError(f"counts must be {n} rollout counts >= 1, got {counts!r}")
    return c / c.mean()


def sampling_noise(y: np.ndarray, counts: np.ndarray | None, fw: np.ndarray) -> float | None:
    """The scores' sampling noise in the fit's scale: a score of k rollouts has variance
    p (1 - p) / k about its prompt's own rate p; weighed by ``fw`` (mean 1) it is
    fw p (1 - p) / k, the same for every score under count weights. With m the mean score,
    q = m (1 - m) and c the mean of 1 / k, the window's variance V = tau^2 + (q - tau^2) c
    tells the prompts' own spread tau^2 (at least 0), so E p (1 - p) = q - tau^2; returns the
    mean of fw (q - tau^2) / k. None when the counts are not known or every score is one
    rollout's (then no tau^2 can be told from the noise)."""
    if counts is None:
        return None
    k = np.asarray(counts, dtype=np.float64)
    c = float(np.mean(1.0 / k))
    if c >= 1.0:
        return None
    m = float(np.mean(y))
    q = m * (1.0 - m)
    tau2 = min(max((float(np.var(y)) - q * c) / (1.0 - c), 0.0), q)
    return max(float(np.mean(fw * (q - tau2) / k)), 1e-6)
