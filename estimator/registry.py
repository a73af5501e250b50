"""Baseline estimators behind one interface, keyed by name (estimator.md, "reference estimators").

Every estimator answers two questions for a group of rewards of one prompt:
- ``wants_more(vbar, k, prior)``: is one more rollout worth it? (fixed-k ones: k < k_init)
- ``group(rewards, mask, prior)``: baseline, per-response advantages, keep-or-drop.
Arrays are padded: ``rewards`` (N, K) with ``mask`` (N, K) marking the observed rewards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from estimator.core import (DEFAULT_COST, DEFAULT_REWARDS, LOOKAHEADS, NOISE_MODELS, _fuse,
                            check_rewards, noise_sigma2, should_continue)


@dataclass(frozen=True)
class EstimatorConfig:
    """Settings shared by every estimator. ``k_init`` is the group size of fixed-k ones."""

    k_init: int = 4
    k_max: int = 16
    cost: float = DEFAULT_COST
    lookahead: str = "predictive"
    noise: str = "bound"
    rewards: tuple[float, float] = DEFAULT_REWARDS
    scale_by_std: bool | None = None  # None: the estimator's own convention (table in the spec)
    std_eps: float = 1e-6

    def __post_init__(self):
        check_rewards(self.rewards)
        if self.k_init < 1:
            raise ValueError(f"k_init must be >= 1, got {self.k_init}")
        if self.k_init > self.k_max:
            raise ValueError(f"k_init ({self.k_init}) must be <= k_max ({self.k_max})")
        if not np.isfinite(self.cost) or self.cost < 0:
            raise ValueError(f"cost must be a finite number >= 0, got {self.cost}")
        if self.lookahead not in LOOKAHEADS:
            raise ValueError(f"lookahead must be one of {LOOKAHEADS}, got {self.lookahead!r}")
        if self.noise not in NOISE_MODELS:
            raise ValueError(f"noise must be one of {NOISE_MODELS}, got {self.noise!r}")


class GroupResult(NamedTuple):
    baseline: np.ndarray    # (N,)
    advantages: np.ndarray  # (N, K), 0 where mask is False
    keep: np.ndarray        # (N,) bool; False: drop the group (dapo's filter)


def _masked_stats(rewards, mask):
    """Mean and (population) std of each row's observed rewards. (N,K),(N,K) -> (N,),(N,)"""
    k = mask.sum(axis=1)
    if (k < 1).any():
        raise ValueError("every group needs at least one observed reward (k >= 1)")
    mean = np.where(mask, rewards, 0.0).sum(axis=1) / k
    var = np.where(mask, (rewards - mean[:, None]) ** 2, 0.0).sum(axis=1) / k
    return k, mean, np.sqrt(var)


def _validate(rewards, mask, prior, rewards_range):
    rewards = np.atleast_2d(np.asarray(rewards, dtype=np.float64))
    mask = np.ones_like(rewards, bool) if mask is None else np.atleast_2d(np.asarray(mask, bool))
    if mask.shape != rewards.shape:
        raise ValueError(f"mask shape {mask.shape} != rewards shape {rewards.shape}")
    obs = rewards[mask]
    if np.isnan(obs).any():
        raise ValueError("rewards contain NaN")
    r_lo, r_hi = rewards_range
    if ((obs < r_lo) | (obs > r_hi)).any():
        bad = obs[(obs < r_lo) | (obs > r_hi)][:3]
        raise ValueError(f"rewards must lie in [{r_lo}, {r_hi}], got {bad}")
    if prior is not None:
        prior = np.broadcast_to(np.asarray(prior, dtype=np.float64), rewards.shape[:1])
        if np.isnan(prior).any():
            raise ValueError("prior contains NaN")
        if ((prior < r_lo) | (prior > r_hi)).any():
            raise ValueError(f"prior must lie in the reward range [{r_lo}, {r_hi}] (reward scale)")
    return rewards, mask, prior


class Estimator:
    """Base: fixed group size ``k_init``, group-mean baseline, optional std scaling."""

    name = "base"
    needs_prior = False
    adaptive = False
    default_scale = False

    def __init__(self, cfg: EstimatorConfig | None = None):
        self.cfg = cfg or EstimatorConfig()

    @property
    def scale(self) -> bool:
        return self.default_scale if self.cfg.scale_by_std is None else self.cfg.scale_by_std

    def wants_more(self, vbar, k, prior):
        return np.asarray(k) < self.cfg.k_init

    def baseline(self, rewards, mask, prior, k, mean):
        return mean

    def group(self, rewards, mask=None, prior=None) -> GroupResult:
        rewards, mask, prior = _validate(rewards, mask, prior, self.cfg.rewards)
        if self.needs_prior and prior is None:
            raise ValueError(f"estimator {self.name!r} needs a prior")
        k, mean, std = _masked_stats(rewards, mask)
        base = self.baseline(rewards, mask, prior, k, mean)
        adv = rewards - (base if base.ndim == 2 else base[:, None])
        if self.scale:
            adv = adv / (std[:, None] + self.cfg.std_eps)
        adv = np.where(mask, adv, 0.0)
        keep = self.keep(rewards, mask, std)
        return GroupResult(base if base.ndim == 1 else mean, adv, keep)

    def keep(self, rewards, mask, std):
        return np.ones(rewards.shape[0], bool)


class GRPO(Estimator):
    name, default_scale = "grpo", True


class DrGRPO(Estimator):
    name = "dr_grpo"


class RLOO(Estimator):
    """Leave-one-out mean of the other k - 1 rewards (needs k >= 2)."""

    name = "rloo"

    def baseline(self, rewards, mask, prior, k, mean):
        if (k < 2).any():
            raise ValueError("rloo needs k >= 2 rewards per group")
        total = np.where(mask, rewards, 0.0).sum(axis=1, keepdims=True)
        return (total - rewards) / (k[:, None] - 1)  # (N, K): one baseline per response


class DAPO(Estimator):
    """Group mean, std scaling; groups whose rewards are all equal are dropped (and refilled
    by the caller with new prompts: dynamic sampling)."""

    name, default_scale = "dapo", True

    def keep(self, rewards, mask, std):
        return std > 0


class PriorOnly(Estimator):
    name, needs_prior = "prior_only", True

    def baseline(self, rewards, mask, prior, k, mean):
        return prior.copy()


class V05(Estimator):
    """The fused shrinkage baseline with the OSLA budget (estimator.md)."""

    name, needs_prior, adaptive = "v05", True, True

    def _sigma2(self, vbar, k, prior):
        return noise_sigma2(vbar, k, prior, self.cfg.rewards, self.cfg.noise)

    def wants_more(self, vbar, k, prior):
        c = self.cfg
        k = np.asarray(k)
        more = should_continue(vbar, np.maximum(k, 1), prior, cost=c.cost, k_max=c.k_max,
                               lookahead=c.lookahead, rewards=c.rewards, noise=c.noise)
        return (k < c.k_init) | more

    def baseline(self, rewards, mask, prior, k, mean):
        return _fuse(mean, k, prior, self._sigma2(mean, k, prior))[0]


ESTIMATORS: dict[str, Callable[..., Estimator]] = {
    cls.name: cls for cls in (GRPO, DrGRPO, RLOO, DAPO, PriorOnly, V05)}


def make_estimator(name: str, **kwargs) -> Estimator:
    """Build an estimator by name; kwargs are :class:`EstimatorConfig` fields."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; valid: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name](EstimatorConfig(**kwargs))
