"""The kernels' baseline in ``kernel.fit_context``: the window's weighted mean, or with
``drift`` the scores' linear trend on age when it predicts held-out scores better (both by
exact weighted leave-one-out). The constant model is always a candidate: a window whose
features carry no signal falls back to it. Pure NumPy.
"""
from __future__ import annotations

import numpy as np


def trend_on_age(y: np.ndarray, ages: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares y ~ a + b * age: (a, b, its exact weighted LOO MSE). The LOO
    residual of point i is e_i / (1 - h_ii) with h the weighted hat matrix's diagonal."""
    A = np.stack([np.ones_like(ages), ages], 1)                  # (N, 2)
    G = A.T @ (A * w[:, None])                                   # (2, 2)
    if abs(np.linalg.det(G)) < 1e-12:                            # one age only: no trend
        return float(w @ y / w.sum()), 0.0, float("inf")
    Ginv = np.linalg.inv(G)
    a, b = Ginv @ (A.T @ (w * y))
    h = w * np.einsum("ij,jk,ik->i", A, Ginv, A)                 # (N,) leverages
    loo = (y - a - b * ages) / np.maximum(1.0 - h, 1e-9)
    return float(a), float(b), float(w @ loo ** 2) / float(w.sum())


def constant_model(y, ages, w, halflife, prior_mean: float, prior_strength: float,
                    drift: bool, lead: float):
    """The kernels' baseline: the weighted mean (shrunk by ``prior_strength``
    pseudo-observations of ``prior_mean``), or with ``drift`` the scores' trend on age when it
    predicts held-out scores better than the mean. Returns (its ``kernel.Fitted`` fields, the
    scores moved to age 0 by the trend, the raw scores, their mean, the raw mean, the slope)."""
    n, wsum = len(y), float(w.sum())
    # Exact LOO of the constant model (the weighted mean without point i).
    loo_const = y - (w @ y - w * y) / np.maximum(wsum - w, 1e-12)
    const_mse = float(w @ loo_const ** 2) / wsum if n > 1 else float("inf")
    slope, y_raw = 0.0, y
    mean_raw = float((w @ y + prior_strength * prior_mean) / (wsum + prior_strength))
    if drift and n >= 8:
        _, b, trend_mse = trend_on_age(y, ages, w)
        if trend_mse < const_mse:  # the trend predicts held-out scores better than a mean
            slope, const_mse = b, trend_mse
            y = y - b * ages       # every score moved to age 0
    mean = float((w @ y + prior_strength * prior_mean) / (wsum + prior_strength))
    fields = dict(mean=mean, halflife=halflife, loo_mse=const_mse, const_loo_mse=const_mse,
                  drift=slope, lead_shift=-slope * float(lead))
    return fields, y, y_raw, mean, mean_raw, slope
