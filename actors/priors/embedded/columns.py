"""Which columns of a few-feature view to use: greedy forward selection by leave-one-out.

A kernel ridge with one ridge strength gives every column of a view the same prior weight.
That suits a sentence embedding (hundreds of directions, none special) and fails a view of a
dozen surface magnitudes (``views.surface_features``), where one column (a step count)
may carry all the signal and the other ten only add variance: on the stepwise task's first
window, the one column alone predicted the truth with error 0.041, all eleven together 0.069.

``select_columns`` adds columns one at a time, each time the one whose weighted ridge
(intercept free, ridge strength from a small grid) has the lowest exact weighted
leave-one-out error, while that error falls by more than ``min_gain`` of itself. ``free``
columns (the scores' age: the policy's drift) may be chosen too, so that a column is not
picked for standing in for the trend, but are not returned: the kernel has its own age term.

Pure NumPy: for d chosen columns of N scores one (d, d) eigendecomposition per candidate
serves every ridge strength; all of it costs well under a millisecond per candidate.
"""
from __future__ import annotations

import numpy as np

# Ridge strengths, in units of one standardised column's weighted sum of squares.
RIDGES = tuple(float(x) for x in np.logspace(-3.0, 1.0, 9))
MIN_GAIN = 0.02     # a column must cut the leave-one-out error by at least this share


def loo_mse(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """The lowest weighted leave-one-out MSE over ``RIDGES`` of the weighted ridge
    y ~ a + X b, the intercept a unpenalised (X: (N, d), d may be 0; w > 0). Exact: the
    residual of point i without it is e_i / (1 - h_ii), h the hat matrix of the weighted fit
    (the weighted mean's leverage w_i / W plus the centred ridge's)."""
    W = float(w.sum())
    sw = np.sqrt(w)
    ys = sw * (y - float(w @ y) / W)                           # (N,)
    h_mean = w / W
    if X.shape[1] == 0:
        return float(((ys / (1.0 - h_mean)) ** 2).sum()) / W
    Xs = sw[:, None] * (X - (w @ X) / W)                       # (N, d)
    s, U = np.linalg.eigh(Xs.T @ Xs)
    P = Xs @ U                                                 # (N, d)
    inv = 1.0 / (np.maximum(s, 0.0)[:, None] + np.array(RIDGES)[None, :] * W)   # (d, R)
    fitted = P @ ((P.T @ ys)[:, None] * inv)                   # (N, R)
    h = (P * P) @ inv + h_mean[:, None]                        # (N, R)
    loo = (ys[:, None] - fitted) / np.maximum(1.0 - h, 1e-9)
    return float((loo ** 2).sum(axis=0).min()) / W


def select_columns(F: np.ndarray, y: np.ndarray, w: np.ndarray,
                   free: np.ndarray | None = None, min_gain: float = MIN_GAIN) -> np.ndarray:
    """Indices (sorted) of the columns of F (N, d) that greedy forward selection keeps, by
    ``loo_mse``; ``free`` (N, a): candidates that are not returned. At least one column of F
    is returned (the best alone), so that the caller's own choice decides whether the view
    beats a constant. Columns that do not vary are never chosen."""
    F = np.asarray(F, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    extra = np.zeros((len(y), 0)) if free is None else np.asarray(free, np.float64)
    cand = np.concatenate([F, extra.reshape(len(y), -1)], axis=1)
    varies = [j for j in range(cand.shape[1]) if np.ptp(cand[:, j]) > 1e-12]
    chosen: list[int] = []
    singles: list[tuple[float, int]] = []   # the first round: each column alone
    best = loo_mse(cand[:, []], y, w)
    while True:
        scored = [(loo_mse(cand[:, chosen + [j]], y, w), j) for j in varies if j not in chosen]
        singles = singles or scored
        if not scored:
            break
        mse, j = min(scored)
        if mse >= best * (1.0 - min_gain):
            break
        chosen.append(j)
        best = mse
    own = sorted(j for j in chosen if j < F.shape[1])
    if not own:  # nothing of F helps on its own terms: its best column, for the caller to judge
        of_f = [(mse, j) for mse, j in singles if j < F.shape[1]]
        own = [min(of_f)[1]] if of_f else list(range(min(1, F.shape[1])))
    return np.array(own, dtype=np.int64)


def narrow_views(views: dict, selected, y: np.ndarray, w: np.ndarray,
                 free: np.ndarray | None) -> tuple[dict, dict]:
    """(``views`` ({name: (N, d)}) with each view named in ``selected`` cut to its chosen
    columns, {name: those columns' indices}): ``select_columns`` on the scores ``y`` with
    weights ``w`` and the ``free`` candidates."""
    out, chosen = dict(views), {}
    for name in selected:
        if name in out:
            chosen[name] = select_columns(out[name], y, w, free)
            out[name] = out[name][:, chosen[name]]
    return out, chosen
