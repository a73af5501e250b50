"""The scale the embedded prior fits its scores on (its ``link`` option).

On the probability scale ("identity") the age term moves every prompt by the same
amount, and a linear model of a rate that saturates (a step count's survival, about s^k)
overshoots at the easy end (clipped at 1 - eps) and lags at the hard end. A policy that trains
gains most where it has most room: on the logit scale ("logit") one drift moves a prompt near
1/2 most and a saturated one least, and the fit saturates by construction. Neither scale wins
everywhere (studies.prior_truth over five runs a task, docs/prior.md): "average" (the embedded
prior's default) predicts the mean of both fits' probabilities, at twice the fitting cost.

The logit of a rate of k rollouts is taken empirically, log((c + 1/2) / (k - c + 1/2)) with
c = k y successes (finite at 0 and k), and its sampling variance is about 1 / (k p (1 - p))
(the delta method, p = (c + 1/2) / (k + 1)): the evidence's known noise on that scale.

Mapped back, a logit fit is biased: the empirical logits of 4 rollouts stop at +-2.2 (a
prompt solved 97% of the time reads as at most 90%), and the mean of sigmoids is not the
sigmoid of the mean. So a logit fit is calibrated in the large (``mean_shift``): its level
moved until its leave-one-out predictions, mapped back, average the window's scores.
Pure NumPy.
"""
from __future__ import annotations

import numpy as np

from actors.priors.embedded.weights import sampling_noise

LINKS = ("identity", "logit", "average")


def rollouts(counts: np.ndarray | None, n: int) -> np.ndarray:
    """The rollouts behind each score as floats (one each when not known). (n,)"""
    return np.ones(n) if counts is None else np.asarray(counts, dtype=np.float64)


def empirical_logits(y: np.ndarray, counts: np.ndarray | None) -> np.ndarray:
    """log((c + 1/2) / (k - c + 1/2)) of each score y of k rollouts, c = k y. (N,)"""
    k = rollouts(counts, len(y))
    c = np.asarray(y, dtype=np.float64) * k
    return np.log((c + 0.5) / (k - c + 0.5))


def logit_noise(y: np.ndarray, counts: np.ndarray | None, fw: np.ndarray) -> float | None:
    """The empirical logits' sampling noise in the fit's scale: the mean over scores of
    fw / (k p (1 - p)), p = (c + 1/2) / (k + 1) (None without counts, as
    ``weights.sampling_noise``: a score's own noise is not known then)."""
    if counts is None:
        return None
    k = rollouts(counts, len(y))
    p = (np.asarray(y, dtype=np.float64) * k + 0.5) / (k + 1.0)
    return float(np.mean(np.asarray(fw) / (k * p * (1.0 - p))))


def _check(link: str) -> None:
    if link not in ("identity", "logit"):
        raise ValueError(f"a fit's link must be 'identity' or 'logit', got {link!r}")


def to_fit_scale(link: str, y: np.ndarray, counts: np.ndarray | None,
                 prior_mean: float) -> tuple[np.ndarray, float]:
    """(the scores, the prior mean) on ``link``'s scale."""
    _check(link)
    if link == "identity":
        return y, prior_mean
    m = min(max(prior_mean, 1e-3), 1.0 - 1e-3)
    return empirical_logits(y, counts), float(np.log(m / (1.0 - m)))


def fit_scale_noise(link: str, y: np.ndarray, counts: np.ndarray | None,
                    fw: np.ndarray) -> float | None:
    """The scores' (probabilities ``y``) sampling noise on ``link``'s scale, weighed by ``fw``:
    ``weights.sampling_noise`` or ``logit_noise``."""
    _check(link)
    return (sampling_noise if link == "identity" else logit_noise)(y, counts, fw)


def from_fit_scale(link: str, f: np.ndarray) -> np.ndarray:
    """Predictions on ``link``'s scale back to probabilities (identity: as they are)."""
    return 1.0 / (1.0 + np.exp(-f)) if link == "logit" else f


def mean_shift(link: str, loo_pred: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """The shift on ``link``'s scale that makes the w-weighted mean of the leave-one-out
    predictions ``loo_pred``, mapped back, equal the scores' (probabilities ``y``):
    0 on the probability scale (a least-squares fit's own mean). Bisection: the mapped-back
    mean rises with the shift."""
    _check(link)
    if link == "identity":
        return 0.0
    wn = np.asarray(w, dtype=np.float64) / float(np.sum(w))
    target = float(np.clip(wn @ np.asarray(y, dtype=np.float64), 1e-3, 1.0 - 1e-3))
    lo, hi = -10.0, 10.0
    for _ in range(50):  # to 2e-14 on the logit scale
        mid = 0.5 * (lo + hi)
        if wn @ from_fit_scale(link, loo_pred + mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
