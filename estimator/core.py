"""The V0.5 baseline estimator: shrinkage fusion, real-time test and OSLA budget.

Implements the contract restated in ``docs/estimator.md`` to the letter. Pure NumPy, vectorised: every
function takes scalars or arrays of one (broadcastable) shape and returns the same shape.
Notation (per prompt): ``vbar`` empirical mean of ``k`` rewards, ``prior`` the V0 prior on the
reward scale, ``sigma2`` the per-reward noise variance (bound: (r_hi - r_lo)^2 / 4).
"""
from __future__ import annotations

from functools import lru_cache
from math import comb
from typing import NamedTuple

import numpy as np

DEFAULT_REWARDS = (-1.0, 1.0)
DEFAULT_K_MAX = 16     # most rollouts per prompt (the adaptive budget's cap)
DEFAULT_COST = 0.0039  # ~1/256: pairs with k_max = 16 (see docs/estimator.md, "sanity facts")
LOOKAHEADS = ("predictive", "plugin")
NOISE_MODELS = ("bound", "bernoulli")


class Fusion(NamedTuple):
    """Result of :func:`fuse`; each field has the broadcast shape of the inputs."""

    baseline: np.ndarray  # w * vbar + (1 - w) * prior
    weight: np.ndarray    # w in [0, 1], the weight on the empirical mean
    delta2: np.ndarray    # estimated prior bias^2, 0 when the test keeps the prior
    mse: np.ndarray       # delta2 * s2 / (delta2 + s2), the fused baseline's estimated MSE


def _out(x: np.ndarray):
    """Return a Python-friendly 0-d scalar for scalar inputs, the array otherwise."""
    return x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x


def _finite(name: str, x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if np.isnan(a).any():
        raise ValueError(f"{name} contains NaN")
    if np.isinf(a).any():
        raise ValueError(f"{name} contains an infinite value")
    return a


def check_rewards(rewards: tuple[float, float]) -> tuple[float, float]:
    r_lo, r_hi = (float(r) for r in rewards)
    if not (np.isfinite(r_lo) and np.isfinite(r_hi)) or r_lo >= r_hi:
        raise ValueError(f"reward range must be finite with r_lo < r_hi, got ({r_lo}, {r_hi})")
    return r_lo, r_hi


def noise_bound(rewards: tuple[float, float] = DEFAULT_REWARDS) -> float:
    """Largest variance of a reward in [r_lo, r_hi]: 1 for {-1,+1}, 1/4 for {0,1}."""
    r_lo, r_hi = check_rewards(rewards)
    return (r_hi - r_lo) ** 2 / 4.0


def prob_to_reward(p, rewards: tuple[float, float] = DEFAULT_REWARDS):
    """Success probability -> reward scale: V = r_lo + p (r_hi - r_lo)."""
    r_lo, r_hi = check_rewards(rewards)
    p = _finite("prior probability", p)
    if ((p < 0) | (p > 1)).any():
        raise ValueError(f"prior probability must lie in [0, 1], got {p[(p < 0) | (p > 1)].ravel()[:3]}")
    return _out(r_lo + p * (r_hi - r_lo))


def reward_to_prob(v, rewards: tuple[float, float] = DEFAULT_REWARDS):
    """Reward scale -> success probability, clipped to [0, 1]."""
    r_lo, r_hi = check_rewards(rewards)
    return _out(np.clip((_finite("value", v) - r_lo) / (r_hi - r_lo), 0.0, 1.0))


def check_budget(k_init: int, k_max: int) -> tuple[int, int]:
    """The one statement of a valid rollout budget: integers with 1 <= k_init <= k_max."""
    for name, x in (("k_init", k_init), ("k_max", k_max)):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {x!r}")
    if k_init < 1:
        raise ValueError(f"k_init must be >= 1, got {k_init}")
    if k_init > k_max:
        raise ValueError(f"k_init ({k_init}) must be <= k_max ({k_max})")
    return int(k_init), int(k_max)


def _check_k(k) -> np.ndarray:
    k = _finite("k", k)
    if (k < 1).any():
        raise ValueError(f"k must be >= 1 (rollouts observed), got {k[k < 1].ravel()[:3]}")
    return k


def _check_sigma2(sigma2) -> np.ndarray:
    s = _finite("sigma2", sigma2)
    if (s <= 0).any():
        raise ValueError(f"sigma2 must be > 0, got {s[s <= 0].ravel()[:3]}")
    return s


def _fuse(vbar, k, prior, sigma2):
    """Unchecked fusion on float arrays (the hot path of the look-ahead)."""
    s2 = sigma2 / k
    delta2 = np.maximum(0.0, (vbar - prior) ** 2 - s2)
    w = delta2 / (delta2 + s2)
    baseline = w * vbar + (1.0 - w) * prior
    # delta2 * s2 / (delta2 + s2) == w^2 s2 + (1-w)^2 delta2, but exactly 0 when delta2 == 0.
    mse = delta2 * s2 / (delta2 + s2)
    return baseline, w, delta2, mse


def fuse(vbar, k, prior, sigma2=1.0) -> Fusion:
    """Shrinkage fusion of the empirical mean ``vbar`` of ``k`` rewards with the ``prior``.

    ``prior`` is on the reward scale (see :func:`prob_to_reward`). When the real-time test
    keeps the prior ((vbar - prior)^2 <= sigma2 / k) the weight is 0 and the baseline equals
    the prior exactly.
    """
    vbar, prior = _finite("vbar", vbar), _finite("prior", prior)
    k, sigma2 = _check_k(k), _check_sigma2(sigma2)
    return Fusion(*(_out(np.asarray(x)) for x in _fuse(vbar, k, prior, sigma2)))


def bernoulli_sigma2(q, rewards: tuple[float, float] = DEFAULT_REWARDS, q_clip: float = 0.05):
    """**(choice)** noise model ``bernoulli``: (r_hi - r_lo)^2 q (1 - q), q clipped to
    [q_clip, 1 - q_clip] so that a confident estimate never claims zero noise."""
    r_lo, r_hi = check_rewards(rewards)
    q = np.clip(np.asarray(q, dtype=np.float64), q_clip, 1.0 - q_clip)
    return _out((r_hi - r_lo) ** 2 * q * (1.0 - q))


def noise_sigma2(vbar, k, prior, rewards=DEFAULT_REWARDS, noise: str = "bound"):
    """sigma2 under the chosen noise model. ``bernoulli`` uses q from the bound-model fusion."""
    bound = noise_bound(rewards)
    if noise == "bound":
        return bound
    if noise == "bernoulli":
        baseline = _fuse(vbar, k, prior, bound)[0]
        return bernoulli_sigma2(reward_to_prob(baseline, rewards), rewards)
    raise ValueError(f"noise must be one of {NOISE_MODELS}, got {noise!r}")


def expected_next_mse(vbar, k, prior, sigma2, rewards=DEFAULT_REWARDS, lookahead="predictive"):
    """E[mse(k + 1)] under the chosen look-ahead (arrays already validated).

    predictive: the next reward is r_hi with probability q = (baseline - r_lo)/(r_hi - r_lo)
    (clipped to [0, 1]), else r_lo; re-fuse for each outcome and average.
    plugin: hold delta2 fixed and shrink s2 to sigma2 / (k + 1).
    """
    r_lo, r_hi = rewards
    if lookahead == "plugin":
        _, _, delta2, _ = _fuse(vbar, k, prior, sigma2)
        s2_next = sigma2 / (k + 1.0)
        return delta2 * s2_next / (delta2 + s2_next)
    if lookahead == "predictive":
        baseline = _fuse(vbar, k, prior, sigma2)[0]
        q = np.clip((baseline - r_lo) / (r_hi - r_lo), 0.0, 1.0)
        mse_hi = _fuse((k * vbar + r_hi) / (k + 1.0), k + 1.0, prior, sigma2)[3]
        mse_lo = _fuse((k * vbar + r_lo) / (k + 1.0), k + 1.0, prior, sigma2)[3]
        return q * mse_hi + (1.0 - q) * mse_lo
    raise ValueError(f"lookahead must be one of {LOOKAHEADS}, got {lookahead!r}")


def _decision_inputs(vbar, k, prior, cost, k_max, sigma2, rewards, noise, lookahead):
    """Validation shared by the budget rules. -> rewards, vbar, k, prior, sigma2 (float arrays)"""
    if lookahead not in LOOKAHEADS:
        raise ValueError(f"lookahead must be one of {LOOKAHEADS}, got {lookahead!r}")
    if noise not in NOISE_MODELS:
        raise ValueError(f"noise must be one of {NOISE_MODELS}, got {noise!r}")
    rewards = check_rewards(rewards)
    vbar, prior = _finite("vbar", vbar), _finite("prior", prior)
    k = _check_k(k)
    r_lo, r_hi = rewards
    for name, x in (("vbar", vbar), ("prior", prior)):
        if ((x < r_lo - 1e-12) | (x > r_hi + 1e-12)).any():
            raise ValueError(f"{name} must lie in the reward range [{r_lo}, {r_hi}]")
    if not np.isfinite(cost) or cost < 0:
        raise ValueError(f"cost must be a finite number >= 0, got {cost}")
    check_budget(1, k_max)
    if sigma2 is None:
        sigma2 = noise_sigma2(vbar, k, prior, rewards, noise)
    return rewards, vbar, k, prior, _check_sigma2(sigma2)


def should_continue(vbar, k, prior, cost=DEFAULT_COST, k_max=DEFAULT_K_MAX, sigma2=None,
                    lookahead="predictive", rewards=DEFAULT_REWARDS, noise="bound"):
    """OSLA: one more rollout iff k < k_max and mse(k) - E[mse(k+1)] > cost.

    ``cost`` is in the units of ``rewards`` squared (the registry rescales its configured cost).
    ``sigma2=None`` takes the noise model's value for ``rewards`` (1.0 for the default
    {-1, +1} bound, 1/4 for {0, 1}); pass a number to fix it. Array in, boolean array out.
    """
    rewards, vbar, k, prior, sigma2 = _decision_inputs(vbar, k, prior, cost, k_max, sigma2,
                                                       rewards, noise, lookahead)
    mse_now = _fuse(vbar, k, prior, sigma2)[3]
    gain = mse_now - expected_next_mse(vbar, k, prior, sigma2, rewards, lookahead)
    return _out(np.asarray((k < k_max) & (gain > cost)))


# -- batched look-ahead (docs/estimator.md, "Batched look-ahead") -----------------------
@lru_cache(maxsize=None)
def _outcome_table(m_max: int):
    """Every (m, j) with 0 <= j <= m <= m_max, m-major: j successes among m more rewards.
    -> m (P,), j (P,), binomial coefficient (P,), start of each m's block (m_max + 1,)"""
    m = np.repeat(np.arange(m_max + 1), np.arange(1, m_max + 2))
    j = np.concatenate([np.arange(i + 1) for i in range(m_max + 1)])
    coef = np.array([comb(int(a), int(b)) for a, b in zip(m, j)], dtype=np.float64)
    starts = np.concatenate([[0], np.cumsum(np.arange(1, m_max + 1))])
    for a in (m, j, coef, starts):
        a.flags.writeable = False  # shared by every call through the cache
    return m, j, coef, starts


def expected_mse_ahead(vbar, k, prior, sigma2, m_max: int, rewards=DEFAULT_REWARDS,
                       lookahead="predictive"):
    """E[mse(k + m)] for m = 0..m_max under the chosen look-ahead (inputs already validated).

    vbar, k, prior, sigma2: (N,) float arrays. -> (N, m_max + 1); column 0 is mse(k) itself.
    predictive: j ~ Binomial(m, q) successes among the next m rewards, q from the current fused
    baseline; plugin: delta2 held fixed, s2 = sigma2 / (k + m). sigma2 is held at its current
    value in both (the same convention as the one-step rule).
    """
    r_lo, r_hi = rewards
    base, _, delta2, mse_now = _fuse(vbar, k, prior, sigma2)  # (N,) each
    if lookahead == "plugin":
        s2 = sigma2[:, None] / (k[:, None] + np.arange(m_max + 1))  # (N, M+1)
        out = delta2[:, None] * s2 / (delta2[:, None] + s2)
    elif lookahead == "predictive":
        m, j, coef, starts = _outcome_table(m_max)                     # (P,) each
        q = np.clip((base - r_lo) / (r_hi - r_lo), 0.0, 1.0)[:, None]  # (N, 1)
        k_next = k[:, None] + m                                        # (N, P)
        vbar_next = (k[:, None] * vbar[:, None] + (j * r_hi + (m - j) * r_lo)) / k_next
        mse = _fuse(vbar_next, k_next, prior[:, None], sigma2[:, None])[3]
        pmf = coef * q ** j * (1.0 - q) ** (m - j)                     # (N, P); 0**0 == 1
        out = np.add.reduceat(pmf * mse, starts, axis=1)               # (N, M+1)
    else:
        raise ValueError(f"lookahead must be one of {LOOKAHEADS}, got {lookahead!r}")
    out[:, 0] = mse_now  # exactly, not (k vbar) / k re-fused
    return out


def plan_batched(vbar, k, prior, cost=DEFAULT_COST, k_max=DEFAULT_K_MAX, sigma2=None,
                 lookahead="predictive", rewards=DEFAULT_REWARDS, noise="bound"):
    """Batched look-ahead: m* = the smallest m in 0..k_max-k minimising E[mse(k+m)] + cost * m.

    Same inputs and validation as :func:`should_continue` (``k`` must be whole numbers; k >=
    k_max plans 0). Array in, int array out; scalars in, an int out. With k_max = k + 1 the plan
    is 1 exactly when :func:`should_continue` says continue (the risk is compared as
    cost * m - (mse(k) - E[mse(k+m)]), the one-step rule's own expression at m = 1).
    """
    rewards, vbar, k, prior, sigma2 = _decision_inputs(vbar, k, prior, cost, k_max, sigma2,
                                                       rewards, noise, lookahead)
    if (k != np.round(k)).any():
        raise ValueError("k must be a whole number of rollouts")
    vbar, k, prior, sigma2 = np.broadcast_arrays(vbar, k, prior, sigma2)
    flat = (np.ravel(a) for a in (vbar, k, prior, sigma2))  # (N,) each
    return _out(_plan(*flat, cost, k_max, rewards, lookahead).reshape(vbar.shape))


def _plan(vbar, k, prior, sigma2, cost, k_max, rewards, lookahead):
    """:func:`plan_batched` on validated (N,) float arrays. -> m* (N,) int64"""
    plan = np.zeros(vbar.shape, np.int64)
    room = np.clip(k_max - k, 0, None).astype(np.int64)  # (N,) most rollouts still allowed
    # R(m) - R(0) = cost * m - (mse(k) - E[mse(k+m)]) >= cost - mse(k) since mse >= 0: where
    # mse(k) <= cost (every accepted prior: mse = 0) the plan is 0 without looking ahead.
    mse_now = _fuse(vbar, k, prior, sigma2)[3]
    live = np.flatnonzero((room > 0) & (mse_now > cost))
    if live.size == 0:
        return plan
    m_max = int(room[live].max())
    ahead = expected_mse_ahead(vbar[live], k[live], prior[live], sigma2[live], m_max, rewards,
                               lookahead)  # (L, M+1)
    steps = np.arange(m_max + 1)
    risk = cost * steps - (ahead[:, :1] - ahead)  # R(m) - R(0); exactly 0 at m = 0
    risk[steps > room[live, None]] = np.inf
    plan[live] = np.argmin(risk, axis=1)  # argmin: the first (smallest) minimiser
    return plan
