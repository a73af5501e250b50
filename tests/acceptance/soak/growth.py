"""Growth per hour of a sampled quantity: a robust line through the samples taken after the
warm-up, its slope per hour divided by the mean level over the same samples.

Theil-Sen (the median of the pairwise slopes) rather than least squares: one sample taken
during a checkpoint write or an evaluation must not make a flat series look like a leak.
Pure NumPy.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_SAMPLES = 4  # fewer after the warm-up: no figure


def theil_sen(t: Sequence[float], y: Sequence[float]) -> float:
    """The median of the slopes of every pair of samples with distinct times."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    i, j = np.triu_indices(len(t), k=1)
    dt = t[j] - t[i]
    keep = dt != 0
    if not keep.any():
        raise ValueError("theil_sen: every sample at the same time")
    return float(np.median((y[j] - y[i])[keep] / dt[keep]))


def after_warmup(t: Sequence[float], warmup_frac: float) -> np.ndarray:
    """A mask of the samples taken after the first ``warmup_frac`` of the span of ``t``."""
    t = np.asarray(t, float)
    if not 0 <= warmup_frac < 1:
        raise ValueError(f"warmup_frac must be in [0, 1); got {warmup_frac}")
    return t >= t.min() + warmup_frac * (t.max() - t.min()) if len(t) else t.astype(bool)


def growth_per_hour(t_s: Sequence[float], values: Sequence[float | None],
                    warmup_frac: float = 0.15) -> float | None:
    """The fraction by which ``values`` (sampled at times ``t_s``, seconds) grow per hour
    after the warm-up: Theil-Sen slope per hour / mean level. None when fewer than
    ``MIN_SAMPLES`` valid samples remain after the warm-up or the mean level is 0 (a
    quantity that stays at zero does not grow)."""
    pairs = [(t, v) for t, v in zip(t_s, values) if v is not None and np.isfinite(v)]
    if len(pairs) < MIN_SAMPLES:
        return None
    t, y = (np.asarray(a, float) for a in zip(*pairs))
    keep = after_warmup(t, warmup_frac)
    t, y = t[keep], y[keep]
    if len(t) < MIN_SAMPLES or float(np.mean(y)) == 0.0:
        return None
    return theil_sen(t / 3600.0, y) / abs(float(np.mean(y)))


def growth_table(t_s: Sequence[float], series: dict[str, Sequence[float | None]],
                 warmup_frac: float = 0.15) -> dict[str, float | None]:
    """``growth_per_hour`` of every series, rounded to 4 decimals."""
    out = {}
    for name, values in series.items():
        g = growth_per_hour(t_s, values, warmup_frac)
        out[name] = None if g is None else round(g, 4)
    return out
