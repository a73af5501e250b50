"""A prompt seen before: the kernel model's prediction fused with the prompt's own history.

When the window holds a prompt more than once (a fixed training set swept for epochs), the
chosen model's prediction f for a prompt in the window is fused with that prompt's own earlier
outcomes by shrinkage (as GRESO and SPO track a prompt's history across epochs):
p = (n h + kappa f) / (n + kappa), h the prompt's mean observed score and n its observation
count, each observation discounted by ``0.5 ** (age / halflife)`` and counted by its rollout
weight; kappa (pseudo-observations of f) is chosen by leave-one-out on the window's repeated
prompts (each point's model prediction without it against its other observations), or no
history when that predicts worse or the window holds fewer than ``MIN_REPEATED`` such
observations. A prompt never seen gets f alone (its cold start).

**Level or offset.** The level form above takes a prompt's old scores at face value, so while
the policy improves it lags by what the policy gained since. The offset form fuses what the
history says about the prompt *relative to the model*: p = f + n r / (n + kappa), r the
prompt's mean leave-one-out residual (its score minus the model's prediction of it then, each
discounted and counted as above): a prompt harder than its neighbours stays harder by that
much while the model's f follows the policy. The form and kappa are chosen together by the
same leave-one-out.
Pure NumPy; ``kernel.fit_context`` and ``kernel.predict_fitted`` call it.
"""
from __future__ import annotations

import numpy as np

# kappa of the history fusion: pseudo-observations of the model's prediction.
KAPPAS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
# Observations of prompts seen more than once that kappa's leave-one-out choice needs: on
# fewer it chooses by chance (a recurring run's first 64-item window held 2 such, chose
# kappa 0.25, and its error doubled: 0.133 against 0.065 without the history).
MIN_REPEATED = 16
# The history's forms (module docstring) that leave-one-out chooses from.
FORMS = ("level", "offset")


def fit_history(fit, ids, y, loo_pred, T: np.ndarray | None, w, rw,
                forms: tuple[str, ...] = FORMS) -> None:
    """Choose the form and kappa of the history fusion (module docstring) by weighted
    leave-one-out on the window's repeated prompts: point i's model prediction without it
    (``loo_pred``) fused with its prompt's other observations (each counted by its rollout
    weight ``rw``) in each of ``forms``, against its score. Sets ``fit.history_form`` and
    ``fit.kappa`` (None where none beats the model alone), ``fit.ids``, ``fit.y``,
    ``fit.counts``, ``fit.resid``."""
    same = ids[:, None] == ids[None, :]
    np.fill_diagonal(same, False)
    if not same.any():
        return
    # the kernel's own time decay between observations, and their rollouts
    Tm = (same if T is None else same * T) * rw[None, :]
    n = Tm.sum(axis=1)
    has = n > 0
    if has.sum() < MIN_REPEATED:
        return
    resid = y - loo_pred
    n, f, yy, ww = n[has], loo_pred[has], y[has], w[has]
    mean_of = {"level": y, "offset": resid}
    best, best_e = (None, None), float(ww @ (yy - f) ** 2)
    for form in forms:
        h = (Tm @ mean_of[form])[has] / n
        for k in KAPPAS:
            e = float(ww @ (yy - fused(form, f, n, h, k)) ** 2)
            if e < best_e * (1.0 - 1e-9):  # strictly better: a tie keeps the model alone
                best, best_e = (form, k), e
    fit.history_form, fit.kappa = best
    fit.ids, fit.y, fit.counts, fit.resid = ids, y, rw, resid


def fused(form: str, f: np.ndarray, n: np.ndarray, h: np.ndarray, kappa: float) -> np.ndarray:
    """The model's f fused with a history of n (discounted, rollout-counted) observations
    whose mean is h: their scores (``level``) or their residuals about the model
    (``offset``)."""
    if form == "level":
        return (n * h + kappa * f) / (n + kappa)
    return f + n * h / (n + kappa)


def fuse_history(fit, f: np.ndarray, ids) -> np.ndarray:
    """The model's predictions ``f`` (M,) of queries with context ids ``ids`` (M,) fused with
    each query's own earlier outcomes in the fit's window (a query never seen keeps f)."""
    if ids is None:
        raise ValueError("this fit uses the prompts' history: pass ids for the queries")
    # A query is at age 0: each earlier observation of it counts 0.5 ** (age / halflife).
    S = (np.asarray(ids)[:, None] == fit.ids[None, :]) * (fit.decay * fit.counts)[None, :]
    n = S.sum(axis=1)
    h = (S @ (fit.y if fit.history_form == "level" else fit.resid)) / np.maximum(n, 1e-12)
    return fused(fit.history_form, f, n, h, fit.kappa)
