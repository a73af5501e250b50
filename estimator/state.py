"""Per-prompt state that the coordinator drives: one object per in-flight prompt.

Life of a prompt::

    st = PromptState(make_estimator("v05"), prior_p=0.3)
    n = st.to_request()          # -> 4 (k_init): dispatch range(st.requested - n, st.requested)
    st.add(reward, index=i)      # as each rollout's reward arrives, in any order; then ask again:
    st.to_request()              # new rollouts wanted now (indices are never reused)
    st.to_cancel()               # outstanding rollouts the plan no longer needs: the caller
    st.cancel(j)                 #   picks which (least advanced first) and cancels each
    st.done                      # nothing outstanding and nothing more wanted
    st.baseline, st.advantages() # advantages in the order of st.indices()

Rewards are keyed by the rollout's index (its position in dispatch order), so arrival order
never changes the result. A prompt whose prior is missing (prior server down) falls back to
the empirical mean of its k_init rewards: ``fallback`` is then True.

How many rollouts to want is one vectorised rule, :func:`decide`, shared by this object and by
the benchmark that drives many prompts at once (studies/estimator_mse/arrivals.py):

- fixed-k estimators and the fallback: k_init rollouts, replacing any that ``expire``;
- ``plan="sequential"``: the one-step OSLA rule, one rollout per round, asked only once nothing
  is outstanding (with ``max_rounds=None``: today's behaviour exactly);
- ``plan="batched"``: once k_init rewards are in, the batched look-ahead m* (outstanding
  rollouts count towards it) at every arriving reward: ask for m* - outstanding when positive,
  cancel outstanding - m* when positive. Before k_init rewards are in, the initial dispatch is
  neither extended nor cancelled (**choice**: planning from the first reward cost 4-9% more
  rollouts in cancelled work for no fewer rounds; docs/estimator.md).

Rounds: the initial dispatch is round 1; a request sent after rewards arrived has round 1 + the
highest round among the rewards observed so far. With ``max_rounds``:

- the request of round max_rounds is the last one: it waits until nothing is outstanding
  (the final decision sees every reward) and, while the plan still wants rollouts (m* > 0, or
  OSLA says continue), it asks for the whole remaining budget, up to k_max; from then on a
  batched prompt only keeps its rollouts (m* > 0) or cancels all of them (m* = 0).
  **(choice)** Asking for m* alone left the exact-prior MSE 19% above sequential OSLA's
  (docs/estimator.md);
- no request gets a round above max_rounds, except one that only refills the prompt to k_init
  rewards after an ``expire`` (a prompt never ends with fewer than k_init rewards).

With re-planning at every reward and that last round, a batched prompt stops exactly at the
first k >= k_init where m* = 0 (or at k_max) whatever the arrival times and the cap: timing only
changes how many rounds it takes and how much cancelled work it costs.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import NamedTuple

import numpy as np

from estimator.core import prob_to_reward
from estimator.registry import DrGRPO, Estimator

SNAPSHOT_VERSION = 1


class Decision(NamedTuple):
    request: np.ndarray  # (N,) int: new rollouts to dispatch now
    cancel: np.ndarray   # (N,) int: outstanding rollouts the plan no longer needs


LAST_ROUND = ("budget", "plan")


def decide(est: Estimator, k, vbar, prior, outstanding, next_round, adaptive=True,
           replan_at: int | None = None, last_round: str = "budget",
           last_waits: bool = True) -> Decision:
    """The budget rule for N prompts at once (module docstring).

    k (N,) observed rewards; vbar (N,) their mean (ignored where k == 0); prior (N,) on the
    reward scale (ignored where not adaptive); outstanding (N,) rollouts in flight; next_round
    (N,) the round a request sent now would get; adaptive: scalar or (N,) bool, False for the
    fallback (and ignored for fixed-k estimators). Inputs are trusted (PromptState validates).

    The keywords are the alternatives the benchmark measured; PromptState uses the defaults.
    replan_at: observed rewards before the batched plan re-plans (None: k_init; 1: from the
    first reward). last_round: what the last allowed round asks for while the plan still wants
    rollouts: ``budget`` = up to k_max, ``plan`` = m* only. last_waits: the last allowed request
    waits until nothing is outstanding (it is the final decision: take it with every reward in).
    """
    if last_round not in LAST_ROUND:
        raise ValueError(f"last_round must be one of {LAST_ROUND}, got {last_round!r}")
    cfg = est.cfg
    k, outstanding, next_round = (np.asarray(a, np.int64) for a in (k, outstanding, next_round))
    fill = np.maximum(cfg.k_init - k, 0)              # (N,) missing to the k_init minimum
    target = np.maximum(fill, outstanding)            # default: wait, extend nothing, cancel none
    adaptive = np.broadcast_to(np.asarray(adaptive, bool) & est.adaptive, k.shape)
    cap = cfg.max_rounds
    # (N,) no request after the next one (or none at all) can be sent: the plan's last chance
    final = np.zeros(k.shape, bool) if cap is None else next_round >= cap
    if cfg.plan == "batched":
        rows = np.flatnonzero(adaptive & (k >= (replan_at or cfg.k_init)))
        m = _plan_more(est, rows, k, vbar, prior)     # the outstanding rollouts count towards m*
    else:  # sequential: one more at a time, and only once every requested reward is in
        rows = np.flatnonzero(adaptive & (k >= cfg.k_init) & (outstanding == 0))
        m = np.asarray(est.wants_more(np.asarray(vbar, float)[rows], k[rows],
                                      np.asarray(prior, float)[rows]), np.int64)
        if last_round == "plan":  # the last chance asks for the whole plan m*, not just 1
            last = np.flatnonzero((m > 0) & final[rows])
            m[last] = np.maximum(_plan_more(est, rows[last], k, vbar, prior), 1)
    if last_round == "budget":  # while the plan wants any, the last chance asks for all
        m = np.where(final[rows] & (m > 0), np.maximum(m, cfg.k_max - k[rows]), m)
    target[rows] = m
    allowed = target
    if cap is not None:
        wait = next_round > cap
        if last_waits:
            wait |= (next_round == cap) & (outstanding > 0)
        allowed = np.where(wait, np.maximum(fill, outstanding), target)
    return Decision(np.maximum(allowed - outstanding, 0), np.maximum(outstanding - target, 0))


def _plan_more(est, rows, k, vbar, prior):
    if not rows.size:
        return np.zeros(0, np.int64)
    return est.plan_more(np.asarray(vbar, float)[rows], k[rows], np.asarray(prior, float)[rows])


class PromptState:
    def __init__(self, estimator: Estimator, prior_p: float | None = None):
        self.est = estimator
        cfg = estimator.cfg
        self.fallback = estimator.needs_prior and prior_p is None
        if prior_p is not None and (isinstance(prior_p, bool) or not isinstance(prior_p, Real)
                                    or not 0 <= prior_p <= 1):
            raise ValueError(f"prior probability must be a number in [0, 1], got {prior_p!r}")
        self.prior_p = None if prior_p is None else float(prior_p)
        self.prior = None if prior_p is None else float(prob_to_reward(prior_p, cfg.rewards))
        self.requested = 0                      # rollout indices handed out: 0 .. requested-1
        self._rewards: dict[int, float] = {}    # observed (not expired), by index
        self._round: dict[int, int] = {}        # every requested index -> its round
        self._outstanding: set[int] = set()
        self._cancelled: set[int] = set()
        self._expired: set[int] = set()
        self._top_round = 0                     # highest round among rewards ever observed
        self._finished = False                  # sticky until expire(): done was reached
        self._decision: tuple[int, int] | None = None  # (request, cancel) for this state

    # -- feeding ---------------------------------------------------------------------------
    def add(self, reward: float, index: int | None = None) -> None:
        """Record the reward of outstanding rollout ``index`` (default: the lowest outstanding)."""
        r_lo, r_hi = self.est.cfg.rewards
        if isinstance(reward, bool) or not isinstance(reward, Real) or math.isnan(reward):
            raise ValueError(f"reward must be a finite number, got {reward!r}")
        if not r_lo <= reward <= r_hi:
            raise ValueError(f"reward {reward} outside the reward range [{r_lo}, {r_hi}]")
        if index is None:
            if not self._outstanding:
                raise ValueError("no rollout is outstanding: call to_request() first")
            index = min(self._outstanding)
        index = self._check_outstanding(index)
        self._outstanding.remove(index)
        self._rewards[index] = float(reward)
        self._top_round = max(self._top_round, self._round[index])
        self._changed()

    def cancel(self, index: int) -> None:
        """Outstanding rollout ``index`` will never report (the caller stopped it)."""
        index = self._check_outstanding(index)
        self._outstanding.remove(index)
        self._cancelled.add(index)
        self._changed()

    def cut(self) -> list[int]:
        """Stop here: every outstanding rollout is cancelled (returned, for the caller to
        abort) and the prompt is done with the rewards in hand. For a prompt whose deadline
        came while its last round still ran: its baseline is valid with any k >= k_init, a
        little noisier than the plan wanted. ValueError below k_init rewards."""
        if self.k < self.est.cfg.k_init:
            raise ValueError(f"cut with {self.k} rewards: at least k_init="
                             f"{self.est.cfg.k_init} are needed")
        gone = sorted(self._outstanding)
        for i in gone:
            self.cancel(i)
        self._finished = True
        return gone

    def expire(self, index: int) -> None:
        """Forget observed reward ``index`` (too stale to train on); the state re-plans, so it
        may stop being done and ask for a replacement."""
        if isinstance(index, bool) or index not in self._rewards:
            raise ValueError(f"rollout {index!r} has no observed reward to expire")
        index = int(index)
        del self._rewards[index]
        self._expired.add(index)
        self._finished = False
        self._changed()

    def _check_outstanding(self, index) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise ValueError(f"rollout index must be an integer, got {index!r}")
        if index in self._outstanding:
            return int(index)
        if index in self._rewards:
            raise ValueError(f"reward for rollout {index} was already added")
        for name, where in (("cancelled", self._cancelled), ("expired", self._expired)):
            if index in where:
                raise ValueError(f"rollout {index} was {name}")
        raise ValueError(f"rollout index {index} was never requested ({self.requested} were)")

    def _changed(self) -> None:
        self._decision = None

    # -- deciding --------------------------------------------------------------------------
    @property
    def k(self) -> int:
        return len(self._rewards)

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def outstanding_indices(self) -> list[int]:
        """Indices of the rollouts in flight (requested, neither observed nor cancelled)."""
        return sorted(self._outstanding)

    @property
    def next_round(self) -> int:
        """The round a request sent now would get."""
        return self._top_round + 1

    def _decide(self) -> tuple[int, int]:
        if self._decision is None and not self._plans_now():
            # No plan applies yet (a fixed-k estimator, the fallback, or fewer than k_init
            # rewards in): decide() would only top up to k_init. Same answer, no NumPy call
            # (this runs for every arriving reward; the simulator calls it millions of times).
            self._decision = max(self.est.cfg.k_init - self.k - self.outstanding, 0), 0
        if self._decision is None:
            d = decide(self.est, [self.k], [self.vbar if self._rewards else 0.0],
                       [0.0 if self.prior is None else self.prior], [self.outstanding],
                       [self.next_round], adaptive=not self.fallback)
            self._decision = int(d.request[0]), int(d.cancel[0])
        return self._decision

    def _plans_now(self) -> bool:
        """Whether ``decide`` would consult the plan for this state (its ``rows``)."""
        cfg = self.est.cfg
        if self.fallback or not self.est.adaptive or self.k < cfg.k_init:
            return False
        return cfg.plan == "batched" or not self._outstanding

    @property
    def done(self) -> bool:
        """Nothing outstanding and nothing more wanted (stays True until an ``expire``)."""
        if not self._finished and self.requested and not self._outstanding:
            self._finished = self._decide()[0] == 0
        return self._finished

    def to_request(self) -> int:
        """How many NEW rollouts to dispatch now; they are counted as requested, with indices
        ``range(requested - n, requested)``."""
        if self.done:
            return 0
        n = self._decide()[0]
        if n:
            new = range(self.requested, self.requested + n)
            self._round.update(dict.fromkeys(new, self.next_round))
            self._outstanding.update(new)
            self.requested += n
            self._changed()
        return n

    def to_cancel(self) -> int:
        """How many outstanding rollouts the current plan no longer needs (batched plan only).
        The caller picks which (least advanced first) and calls ``cancel`` for each."""
        return 0 if self._finished else self._decide()[1]

    # -- rounds ----------------------------------------------------------------------------
    def round_of(self, index: int) -> int:
        """The round of rollout ``index`` (any index ever requested)."""
        if index not in self._round:
            raise ValueError(f"rollout index {index} was never requested ({self.requested} were)")
        return self._round[index]

    @property
    def rounds(self) -> int:
        """Generation rounds so far: the highest round among observed, outstanding and expired
        rollouts (an expired reward was still waited for); cancelled ones do not count."""
        live = (self._round[i] for i in (*self._rewards, *self._outstanding, *self._expired))
        return max(live, default=0)

    # -- reading ---------------------------------------------------------------------------
    def indices(self) -> list[int]:
        """Observed rollout indices in increasing order: the order of ``rewards()`` and
        ``advantages()``."""
        return sorted(self._rewards)

    def rewards(self) -> np.ndarray:
        """Rewards in rollout-index order, shape (k,)."""
        return np.array([self._rewards[i] for i in self.indices()])

    @property
    def vbar(self) -> float:
        if not self._rewards:
            raise ValueError("no rewards yet")
        return float(np.mean(self.rewards()))

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

    # -- checkpoints -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-safe snapshot of everything; ``PromptState.from_dict`` restores it exactly."""
        return {"version": SNAPSHOT_VERSION, "estimator": self.est.name, "prior_p": self.prior_p,
                "requested": self.requested,
                "rewards": {str(i): r for i, r in sorted(self._rewards.items())},
                "rounds": {str(i): r for i, r in sorted(self._round.items())},
                "outstanding": sorted(self._outstanding), "cancelled": sorted(self._cancelled),
                "expired": sorted(self._expired), "top_round": self._top_round,
                "done": self._finished}

    @classmethod
    def from_dict(cls, estimator: Estimator, d: dict) -> "PromptState":
        """Restore a snapshot of ``to_dict`` onto ``estimator`` (the same kind of estimator)."""
        if d.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unknown PromptState snapshot version {d.get('version')!r}")
        if d["estimator"] != estimator.name:
            raise ValueError(f"snapshot of a {d['estimator']!r} prompt restored onto "
                             f"estimator {estimator.name!r}")
        st = cls(estimator, d["prior_p"])
        st.requested = int(d["requested"])
        st._round = {int(i): int(r) for i, r in d["rounds"].items()}
        st._rewards = {int(i): float(r) for i, r in d["rewards"].items()}
        st._outstanding, st._cancelled, st._expired = (
            {int(i) for i in d[key]} for key in ("outstanding", "cancelled", "expired"))
        st._top_round, st._finished = int(d["top_round"]), bool(d["done"])
        parts = [set(st._rewards), st._outstanding, st._cancelled, st._expired]
        if sum(map(len, parts)) != st.requested or set().union(*parts) != set(range(
                st.requested)) or set(st._round) != set(range(st.requested)):
            raise ValueError("inconsistent PromptState snapshot: every requested index must be "
                             "exactly one of observed, outstanding, cancelled or expired")
        lo, hi = estimator.cfg.rewards
        if any(not lo <= r <= hi for r in st._rewards.values()):
            raise ValueError(f"snapshot rewards outside the reward range [{lo}, {hi}]")
        return st
