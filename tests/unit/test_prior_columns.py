"""The surface view's columns chosen on each window (actors/priors/embedded/columns.py)."""
from __future__ import annotations

import numpy as np
import pytest

from actors.priors.base import Context
from actors.priors.embedded.columns import RIDGES, loo_mse, select_columns


def brute_force_loo(X, y, w) -> float:
    """The weighted leave-one-out MSE refitting without each point, at the best ridge."""
    best = float("inf")
    for c in RIDGES:
        err = 0.0
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            Xk, yk, wk = X[keep], y[keep], w[keep]
            W = wk.sum()
            mu, m = wk @ Xk / W, wk @ yk / W
            Xs = np.sqrt(wk)[:, None] * (Xk - mu)
            # the ridge in units of the full window's weight, as loo_mse scales it
            b = np.linalg.solve(Xs.T @ Xs + c * w.sum() * np.eye(X.shape[1]),
                                Xs.T @ (np.sqrt(wk) * (yk - m)))
            err += w[i] * (y[i] - m - (X[i] - mu) @ b) ** 2
        best = min(best, err / w.sum())
    return best


def test_the_leave_one_out_error_is_exact():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    y = X[:, 0] * 0.3 + rng.normal(0, 0.2, 30)
    w = rng.uniform(0.2, 2.0, 30)
    assert loo_mse(X, y, w) == pytest.approx(brute_force_loo(X, y, w), rel=1e-6)
    assert loo_mse(X[:, :0], y, w) == pytest.approx(brute_force_loo(X[:, :0], y, w), rel=1e-9)


def test_forward_selection_keeps_the_signal_and_leaves_the_noise():
    rng = np.random.default_rng(1)
    F = rng.normal(size=(120, 8))
    F[:, 5] = 1.0                                        # a column that never varies
    age = rng.uniform(0, 10, 120)
    y = 0.5 + 0.1 * F[:, 2] - 0.05 * F[:, 6] - 0.02 * age + rng.normal(0, 0.03, 120)
    w = np.ones(120)
    assert select_columns(F, y, w, free=age).tolist() == [2, 6]      # the age is not returned
    # with nothing to learn, the best column alone (the caller's choice judges it)
    assert len(select_columns(F, rng.normal(size=120), w)) == 1


class NoiseEncoder:
    """A sentence encoder that is never asked: the surface view alone is searched."""

    dim = 8

    def encode(self, texts):
        raise AssertionError("the surface view needs no encoder")


def step_window(rng, n: int):
    ks = rng.integers(1, 21, size=n)
    return [f"{rng.integers(10, 99)}+{rng.integers(2, 9)} x{k}\n" for k in ks], ks


def surface_prior(columns: str):
    from actors.priors.embedded import EmbeddedPrior

    return EmbeddedPrior(encoder=NoiseEncoder(), halflife=None, drift=False,
                         views=("surface",), columns=columns)


def test_chosen_columns_predict_a_noisy_window_better_than_all_of_them():
    """64 prompts scored from 4 rollouts each, success 0.93 ** (the step count they spell out):
    the other numbers (the start value, the step size) only add variance to a ridge that
    weighs every column alike."""
    errors = {"selected": [], "all": []}
    for seed in range(10):
        rng = np.random.default_rng(seed)
        prompts, ks = step_window(rng, 64)
        y = rng.binomial(4, 0.93 ** ks) / 4
        queries, qk = step_window(rng, 200)
        for columns, errs in errors.items():
            prior = surface_prior(columns)
            prior.set_context(Context(tuple(prompts), y, np.zeros(64), np.full(64, 4)))
            errs.append(np.sqrt(np.mean((prior.predict(queries) - 0.93 ** qk) ** 2)))
            if columns == "selected":
                assert 0 in prior._fitted().columns    # the last number's log: the step count
    assert np.mean(errors["selected"]) < 0.9 * np.mean(errors["all"])


def test_a_query_beyond_the_window_is_read_at_its_edge():
    rng = np.random.default_rng(3)
    ks = rng.integers(1, 11, size=80)
    prompts = [f"{rng.integers(10, 99)}+{rng.integers(2, 9)} x{k}\n" for k in ks]
    prior = surface_prior("selected")
    prior.set_context(Context(tuple(prompts), 0.95 - 0.05 * ks, np.zeros(80)))
    far, edge = prior.predict(["41+3 x90\n", "41+3 x10\n"])
    assert far == pytest.approx(edge)      # not extrapolated to 0.95 - 0.05 * 90
    with pytest.raises(ValueError, match="columns must be 'selected' or 'all'"):
        surface_prior("some")
