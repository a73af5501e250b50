"""Baseline estimators behind one interface, keyed by name (docs/estimator.md, "reference
estimators").

Every estimator answers these questions for a group of rewards of one prompt:
- ``wants_more(vbar, k, prior)``: is one more rollout worth it? (fixed-k ones: k < k_init)
- ``plan_more(vbar, k, prior)``: how many more rollouts does the batched plan want (m*)?
- ``group(rewards, mask, prior)``: baseline, per-response advantages, keep-or-drop.
Arrays are padded: ``rewards`` (N, K) with ``mask`` (N, K) marking the observed rewards.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Callable, NamedTuple

import numpy as np

from estimator.core import (DEFAULT_COST, DEFAULT_K_MAX, DEFAULT_REWARDS, LOOKAHEADS,
                            NOISE_MODELS, _fuse, _plan, check_budget, check_rewards, noise_bound,
                            noise_sigma2, should_continue)

PLANS = ("sequential", "batched")
UNIFORM_TOL = 1e-12  # a group whose rewards' std is at most this is "all equal"


@dataclass(frozen=True)
class EstimatorConfig:
    """Settings shared by every estimator (validated here, and only here). Its defaults are
    the defaults: other configs (the run's algo section, the simulator) take them from here."""

    k_init: int = 4
    """Rollouts dispatched first; the group size of the fixed-k estimators."""
    k_max: int = DEFAULT_K_MAX
    """Most rollouts per prompt (the adaptive budget's cap)."""
    cost: float = DEFAULT_COST
    """Price of one rollout on the {-1,+1} reward scale (the paper's c = 0.0039); the estimator
    rescales it to its own reward range itself (see ``scaled_cost``)."""
    lookahead: str = "predictive"
    """Expectation of the look-ahead: ``predictive`` or ``plugin`` (docs/estimator.md)."""
    noise: str = "bound"
    """Noise model of the fusion: ``bound`` or ``bernoulli``."""
    rewards: tuple[float, float] = DEFAULT_REWARDS
    """(r_lo, r_hi): the reward range."""
    scale_by_std: bool | None = None
    """Divide advantages by the group std; None: the estimator's own convention."""
    std_eps: float = 1e-6
    """Added to the std before dividing."""
    plan: str = "batched"
    """Adaptive budget: ``sequential`` (one-step OSLA, one rollout per round) or ``batched``
    (the batched look-ahead m*, re-planned at every arriving reward; docs/estimator.md). Default
    batched: the same MSE as sequential at 3-7% more rollouts in 1.1-2.2 rounds instead of
    1.3-7.9 (docs/estimator.md)."""
    max_rounds: int | None = 3
    """Most generation rounds per prompt (the initial k_init dispatch is round 1); the last
    allowed request asks for the whole remaining budget (estimator/state.py). None: no cap.
    ``plan="sequential", max_rounds=None`` is the paper's one-at-a-time OSLA."""
    zero_uniform: bool = False
    """Give every response of a group whose observed rewards are all equal a zero advantage
    (the baseline itself is unchanged). GRPO's group mean does this by construction; V0.5's
    prior-shrunk baseline does not: a group that fails every rollout gets a negative advantage
    on every sample, with nothing positive beside it (docs/estimator.md, "Uniform groups")."""
    train_k: int | None = None
    """``oracle`` only: rollouts trained per prompt (the first ``train_k`` by index); the
    other ``k_init - train_k`` only set their baseline and are never trained on."""

    def __post_init__(self):
        check_rewards(self.rewards)
        check_budget(self.k_init, self.k_max)
        if (isinstance(self.cost, bool) or not isinstance(self.cost, Real)
                or not np.isfinite(self.cost) or self.cost < 0):
            raise ValueError(f"cost must be a finite number >= 0, got {self.cost}")
        if self.lookahead not in LOOKAHEADS:
            raise ValueError(f"lookahead must be one of {LOOKAHEADS}, got {self.lookahead!r}")
        if self.noise not in NOISE_MODELS:
            raise ValueError(f"noise must be one of {NOISE_MODELS}, got {self.noise!r}")
        if self.plan not in PLANS:
            raise ValueError(f"plan must be one of {PLANS}, got {self.plan!r}")
        if self.max_rounds is not None and (
                isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int)
                or self.max_rounds < 1):
            raise ValueError(f"max_rounds must be None or an integer >= 1, got {self.max_rounds!r}")
        if self.train_k is not None and (
                isinstance(self.train_k, bool) or not isinstance(self.train_k, int)
                or not 1 <= self.train_k < self.k_init):
            raise ValueError(f"train_k must be None or an integer in [1, k_init - 1] "
                             f"(k_init {self.k_init}), got {self.train_k!r}")

    @property
    def scaled_cost(self) -> float:
        """``cost`` on this reward range: c * ((r_hi - r_lo) / 2)^2, so that every reward
        convention takes the same decisions on the same outcomes (c/4 on {0, 1})."""
        return self.cost * noise_bound(self.rewards)


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
    needs_prior = False  # the one statement of whether the estimator reads a prior
    adaptive = False     # False: exactly k_init rollouts; True: the budget rule decides
    batch_level = False  # True: the baselines of a learner batch are taken together
                         # (``batch_group``); alone, a group gets ``group``'s
    default_scale = False

    def __init__(self, cfg: EstimatorConfig | None = None):
        self.cfg = cfg or EstimatorConfig()

    @property
    def scale(self) -> bool:
        return self.default_scale if self.cfg.scale_by_std is None else self.cfg.scale_by_std

    def wants_more(self, vbar, k, prior):
        return np.asarray(k) < self.cfg.k_init

    def plan_more(self, vbar, k, prior):
        """Rollouts wanted beyond the k observed (fixed-k: up to k_init). (N,) -> (N,) int"""
        return np.maximum(self.cfg.k_init - np.asarray(k, np.int64), 0)

    def baseline(self, rewards, mask, prior, k, mean):
        return mean

    def trained(self, k: int) -> int:
        """How many of a prompt's k rollouts the learner trains on: the first ones by index
        (all of them, but for the oracle)."""
        return k

    def group(self, rewards, mask=None, prior=None) -> GroupResult:
        rewards, mask, prior = _validate(rewards, mask, prior, self.cfg.rewards)
        if self.needs_prior and prior is None:
            raise ValueError(f"estimator {self.name!r} needs a prior")
        k, mean, std = _masked_stats(rewards, mask)
        base = self.baseline(rewards, mask, prior, k, mean)
        adv = rewards - (base if base.ndim == 2 else base[:, None])
        if self.scale:
            adv = adv / (self._scale_of(std, mean, base)[:, None] + self.cfg.std_eps)
        if self.cfg.zero_uniform:  # (N, K): no contrast within the group, no gradient
            adv = np.where((std <= UNIFORM_TOL)[:, None], 0.0, adv)
        adv = np.where(mask, adv, 0.0)
        keep = self.keep(rewards, mask, std)
        return GroupResult(base if base.ndim == 1 else mean, adv, keep)

    def keep(self, rewards, mask, std):
        return np.ones(rewards.shape[0], bool)

    def _scale_of(self, std, mean, base):
        """What ``scale_by_std`` divides a group's advantages by: its rewards' std, as GRPO
        does. A group whose rewards are all equal has std 0, and with a baseline other than
        their value (V0.5's, the prior's) its advantages are not 0: there the scale is the std
        that the baseline implies as a success rate, (r_hi - r_lo) sqrt(q (1 - q)), q = (b -
        r_lo) / (r_hi - r_lo), the std a group of binary rewards with mean b has (so a
        GRPO group, b = its mean, keeps its own), and never below |mean - b|, so such a
        group's advantages stay within +-1 (they were (r - b) / std_eps: -400,000 for
        an all-fail group with the prior at p = 0.2). (N,), (N,), (N,) or (N, K) -> (N,)"""
        r_lo, r_hi = self.cfg.rewards
        b = base if base.ndim == 1 else mean
        q = np.clip((b - r_lo) / (r_hi - r_lo), 0.0, 1.0)
        implied = np.maximum((r_hi - r_lo) * np.sqrt(q * (1.0 - q)), np.abs(mean - b))
        return np.where(std <= UNIFORM_TOL, implied, std)


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


class JamesStein(Estimator):
    """Each response's baseline is its group's leave-one-out mean shrunk toward the mean of
    the batch's other groups, by a James-Stein factor estimated from the batch itself
    (arXiv 2511.03710: V0.5's shrinkage without a prior; no std division). Over a batch of N
    groups (``batch_group``), with s2 the pooled within-group variance (ddof 1) and tau2 the
    variance of the groups' means less their noise (at least 0):

        lambda_i = tau2 / (tau2 + s2 / (k_i - 1))
        b_ij     = lambda_i * mean(r_i without r_ij) + (1 - lambda_i) * mean of the other
                   groups' means

    Leave-one-out on both sides: a response's own reward is in neither mean. A group alone
    (N = 1: no batch to shrink toward) gets the leave-one-out mean, RLOO's baseline. Where
    the groups' means do not differ beyond their noise (tau2 = 0), every baseline is the
    others' mean: a uniform group then still carries signal, as with V0.5's prior."""

    name, batch_level = "james_stein", True

    def baseline(self, rewards, mask, prior, k, mean):
        if (k < 2).any():
            raise ValueError("james_stein needs k >= 2 rewards per group")
        total = np.where(mask, rewards, 0.0).sum(axis=1, keepdims=True)
        loo = (total - rewards) / (k[:, None] - 1)  # (N, K)
        n = len(k)
        if n < 2:
            return loo
        s2 = float((np.where(mask, (rewards - mean[:, None]) ** 2, 0.0).sum(axis=1)
                    / (k - 1)).mean())
        tau2 = max(0.0, float(np.var(mean, ddof=1)) - s2 * float(np.mean(1.0 / k)))
        noise = s2 / (k - 1)  # (N,) the variance of a leave-one-out mean
        lam = np.where(tau2 + noise > 0, tau2 / np.maximum(tau2 + noise, 1e-300), 1.0)
        others = (mean.sum() - mean) / (n - 1)  # (N,)
        return lam[:, None] * loo + (1.0 - lam)[:, None] * others[:, None]


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
    """The fused shrinkage baseline with the OSLA budget (docs/estimator.md)."""

    name, needs_prior, adaptive = "v05", True, True

    def _sigma2(self, vbar, k, prior):
        return noise_sigma2(vbar, k, prior, self.cfg.rewards, self.cfg.noise)

    def wants_more(self, vbar, k, prior):
        c = self.cfg
        k = np.asarray(k)
        more = should_continue(vbar, np.maximum(k, 1), prior, cost=c.scaled_cost, k_max=c.k_max,
                               lookahead=c.lookahead, rewards=c.rewards, noise=c.noise)
        return (k < c.k_init) | more

    def plan_more(self, vbar, k, prior):
        """The batched plan m* (docs/estimator.md) at k >= 1 observed rewards, at least the rollouts
        missing to k_init. Inputs (N,) on the reward scale, already validated. -> (N,) int"""
        c = self.cfg
        vbar, k, prior = (np.asarray(a, np.float64) for a in (vbar, k, prior))
        sigma2 = np.broadcast_to(self._sigma2(vbar, k, prior), vbar.shape)
        m = _plan(vbar, k, prior, sigma2, c.scaled_cost, c.k_max, c.rewards, c.lookahead)
        return np.maximum(m, c.k_init - k.astype(np.int64))

    def baseline(self, rewards, mask, prior, k, mean):
        return _fuse(mean, k, prior, self._sigma2(mean, k, prior))[0]


class Oracle(Estimator):
    """A reference for studies, not a method: k_init rollouts per prompt, of which the first
    ``train_k`` are trained on with their baseline taken from the other k_init - train_k,
    which are never trained on (nearly the prompt's true success rate, at k_init / train_k
    times the rollouts). What the best baseline buys a train_k-sample group: bench.learning's
    upper reference for V0.5 (issue 29). No std division (Dr.GRPO's, V0.5's convention)."""

    name = "oracle"

    def __init__(self, cfg: EstimatorConfig | None = None):
        super().__init__(cfg)
        if self.cfg.train_k is None:
            raise ValueError("estimator 'oracle' needs train_k (rollouts trained per prompt; "
                             "the other k_init - train_k set its baseline)")

    def trained(self, k: int) -> int:
        return min(k, self.cfg.train_k)

    def baseline(self, rewards, mask, prior, k, mean):
        held = mask.copy()
        held[:, :self.cfg.train_k] = False
        n = held.sum(axis=1)
        if (n < 1).any():
            raise ValueError(f"oracle needs rewards beyond the first train_k "
                             f"({self.cfg.train_k}) to take its baseline from")
        return np.where(held, rewards, 0.0).sum(axis=1) / n

    def group(self, rewards, mask=None, prior=None) -> GroupResult:
        res = super().group(rewards, mask, prior)
        adv = res.advantages.copy()
        adv[:, self.cfg.train_k:] = 0.0  # held out: not trained on
        return GroupResult(res.baseline, adv, res.keep)


ESTIMATORS: dict[str, Callable[..., Estimator]] = {
    cls.name: cls for cls in (GRPO, DrGRPO, RLOO, JamesStein, DAPO, PriorOnly, V05, Oracle)}


def batch_group(est: Estimator, groups: list[np.ndarray], priors=None) -> GroupResult:
    """``est.group`` over a batch of groups of any sizes (padded to the largest, masked): the
    learner batch of a ``batch_level`` estimator, whose baselines depend on every group.
    ``groups``: each group's rewards (k_i,); the result's rows follow them."""
    width = max(len(g) for g in groups)
    rewards = np.zeros((len(groups), width))
    mask = np.zeros((len(groups), width), bool)
    for i, g in enumerate(groups):
        rewards[i, :len(g)], mask[i, :len(g)] = g, True
    return est.group(rewards, mask, priors)


def make_estimator(name: str, **kwargs) -> Estimator:
    """Build an estimator by name; kwargs are :class:`EstimatorConfig` fields."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; valid: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name](EstimatorConfig(**kwargs))
