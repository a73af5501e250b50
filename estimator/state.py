"""Per-prompt state that the coordinator drives: one object per in-flight prompt.

Life of a prompt::

    st = PromptState(make_estimator("v05"), prior_p=0.3)
    st.to_request()            # -> 4 (k_init): dispatch that many rollouts
    st.add(reward, index=i)    # as each rollout's reward arrives, in any order
    st.to_request()            # -> 0 while rollouts are outstanding, 1 if the test wants
                               #    one more, 0 with st.done once it is satisfied
    st.baseline, st.advantages()

Rewards are keyed by the rollout's index (its position in dispatch order), so arrival order
never changes the result. A prompt whose prior is missing (prior server down) falls back to
the empirical mean of its k_init rewards: ``fallback`` is then True.
"""
from __future__ import annotations

import math

import numpy as np

from estimator.core import prob_to_reward
from estimator.registry import DrGRPO, Estimator


class PromptState:
    def __init__(self, estimator: Estimator, prior_p: float | None = None):
        self.est = estimator
        cfg = estimator.cfg
        self.fallback = estimator.needs_prior and prior_p is None
        if prior_p is not None and not (isinstance(prior_p, (int, float)) and 0 <= prior_p <= 1):
            raise ValueError(f"prior probability must be a number in [0, 1], got {prior_p!r}")
        self.prior_p = prior_p
        self.prior = None if prior_p is None else float(prob_to_reward(prior_p, cfg.rewards))
        self.requested = 0
        self._rewards: dict[int, float] = {}
        self._done = False

    # -- feeding ---------------------------------------------------------------------------
    def add(self, reward: float, index: int | None = None) -> None:
        """Record the reward of rollout ``index`` (default: the next unseen index)."""
        r_lo, r_hi = self.est.cfg.rewards
        if not isinstance(reward, (int, float)) or math.isnan(reward):
            raise ValueError(f"reward must be a finite number, got {reward!r}")
        if not r_lo <= reward <= r_hi:
            raise ValueError(f"reward {reward} outside the reward range [{r_lo}, {r_hi}]")
        if index is None:
            index = next(i for i in range(len(self._rewards) + 1) if i not in self._rewards)
        if index in self._rewards:
            raise ValueError(f"reward for rollout {index} was already added")
        if self.requested and not 0 <= index < self.requested:
            raise ValueError(f"rollout index {index} was never requested ({self.requested} were)")
        self._rewards[index] = float(reward)

    # -- deciding --------------------------------------------------------------------------
    @property
    def k(self) -> int:
        return len(self._rewards)

    @property
    def outstanding(self) -> int:
        return max(0, self.requested - self.k)

    @property
    def done(self) -> bool:
        return self._done

    def _wants_more(self) -> bool:
        cfg = self.est.cfg
        if self.k >= cfg.k_max:
            return False
        if self.fallback or not self.est.adaptive:
            return self.k < cfg.k_init
        return bool(self.est.wants_more(self.vbar, self.k, self.prior))

    def to_request(self) -> int:
        """How many rollouts to dispatch now (and count them as requested)."""
        if self._done:
            return 0
        k_init = self.est.cfg.k_init
        if self.requested < k_init:
            n, self.requested = k_init - self.requested, k_init
            return n
        if self.outstanding:
            return 0
        if self._wants_more():
            self.requested += 1
            return 1
        self._done = True
        return 0

    # -- reading ---------------------------------------------------------------------------
    def rewards(self) -> np.ndarray:
        """Rewards in rollout-index order, shape (k,)."""
        return np.array([self._rewards[i] for i in sorted(self._rewards)])

    @property
    def vbar(self) -> float:
        if not self._rewards:
            raise ValueError("no rewards yet")
        return float(np.mean(list(self._rewards.values())))

    def result(self):
        """The estimator's GroupResult for this prompt (rows of length k)."""
        r = self.rewards()[None, :]
        if self.fallback:  # empirical mean, no scaling: the documented fallback
            return DrGRPO(self.est.cfg).group(r)
        prior = None if self.prior is None else np.array([self.prior])
        return self.est.group(r, None, prior)

    @property
    def baseline(self) -> float:
        return float(self.result().baseline[0])

    def advantages(self) -> np.ndarray:
        """Per-response advantages in rollout-index order, shape (k,)."""
        return self.result().advantages[0]

    @property
    def keep(self) -> bool:
        return bool(self.result().keep[0])
