"""Which drawn prompts get rollouts at all: admission by the chance that a group is uniform.

A group of k rollouts whose rewards are all equal teaches a group-mean method nothing (every
advantage is 0) and V0.5 little; its k rollouts are spent all the same. Before a prompt gets
rollouts, its success rate q is predicted (``source``): by the prior's p (``prior``), or by the
prompt's own rewards when it was last trained (``history``, GRESO-style: only where prompts
recur). The chance that its first k rollouts would all be equal is

    U = E[q^k + (1 - q)^k],   q ~ Beta with mean p and variance s2

where s2 is the prediction's own uncertainty: for the prior, its error variance measured on
the prompts that finished (the observed rate's sampling noise taken out); for a prompt's own
history, the Beta(c + 1/2, n - c + 1/2) of its c successes in n rollouts. The prompt is
admitted with probability

    a = max(floor, 1 - U)

(the exploration ``floor`` keeps every kind of prompt coming, so that the prior keeps seeing
the whole distribution), or, with a ``threshold`` t, a = 1 where U < t and ``floor`` elsewhere
(sharper: studies.selection_limits reads how far each rule cuts the uniform groups), decided
by a coin that depends only on the run's seed and the prompt's uid: runs of one seed and
different algorithms take the same decision on the same prompt at the same p (common random
numbers, as ``rollout.seeded`` does for the rollouts).

The driver draws candidates ahead of need (a ``window`` of several batches), has them scored
in one call, and the selector walks them in draw order, admitting or deferring each once,
until the room it was given is filled. A deferred prompt is not lost: it stays in the
dataset, and the next epoch's shuffle draws it again. Every drawn candidate ends exactly once:
admitted, deferred, or still waiting at the end (``drawn = admitted + deferred + waiting``).

A candidate without a score (the prior failed or timed out) is admitted: admission falls back
to the data order (``fallbacks`` counts them: the run's ``prior_fallbacks``, the prompts that
ran without a prior).

Pure Python (the coins and the Beta moments by hand): the scheduler holds it, so the
coordinator, the unit tests and the simulator run the same policy.
"""
from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any

SOURCES = ("prior", "history")
# The prior's error variance before any prompt has finished (an error sd of 0.1: the embedded
# prior's on the stepwise task, bench/results/prior_truth.json, is 0.04-0.07).
PRIOR_ERROR_VAR0 = 0.01
MIN_BETA_SIZE = 1.0   # a Beta's a + b at least this: an uncertainty above p(1-p)/2 is capped
EDGE = 1e-4           # p is kept this far from 0 and 1 (a Beta needs both parameters > 0)


@dataclass(frozen=True)
class SelectionConfig:
    """The knobs of admission by selection (the run config's ``algo.select*``)."""

    source: str = "prior"   # what predicts a prompt's success rate: ``prior`` or ``history``
    floor: float = 0.1      # the least admission probability, in (0, 1]
    window: int = 64        # candidates drawn ahead (at least one batch of prompts)
    k: int = 4              # the group whose uniformity is predicted: the estimator's k_init
    seed: int = 0           # the admission coins' (the run's seed)
    error_window: int = 256  # finished prompts the prior's error variance is measured over
    threshold: float | None = None  # admit where U < threshold, else at the floor (None: 1 - U)

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"selection source must be one of {SOURCES}, got {self.source!r}")
        if not (isinstance(self.floor, (int, float)) and 0 < self.floor <= 1):
            raise ValueError(f"selection floor must lie in (0, 1], got {self.floor!r}")
        if self.threshold is not None and not (isinstance(self.threshold, (int, float))
                                               and 0 < self.threshold <= 1):
            raise ValueError(f"selection threshold must lie in (0, 1], got {self.threshold!r}")
        if self.window < 1 or self.k < 1 or self.error_window < 1:
            raise ValueError(f"selection window, k and error_window must be >= 1, got "
                             f"{self.window}, {self.k}, {self.error_window}")


@dataclass
class Candidate:
    """A prompt drawn from the stream and not yet admitted or deferred."""

    uid: str
    problem: Any
    p: float | None = None  # the prior's p when it was last scored (None: no score)
    a: float | None = None  # its admission probability when it was decided


def beta_moment(a: float, b: float, k: int) -> float:
    """E[q^k] for q ~ Beta(a, b): prod_{i<k} (a + i) / (a + b + i)."""
    out = 1.0
    for i in range(k):
        out *= (a + i) / (a + b + i)
    return out


def uniform_chance(p: float, var: float, k: int) -> float:
    """The chance that k rollouts of a prompt with predicted success rate ``p`` (uncertain by
    variance ``var``) are all right or all wrong: E[q^k + (1-q)^k] over q ~ Beta of that mean
    and variance (its size a + b at least ``MIN_BETA_SIZE``). var = 0: p^k + (1 - p)^k."""
    p = min(max(float(p), EDGE), 1.0 - EDGE)
    if var <= 0:
        return p ** k + (1.0 - p) ** k
    size = max(p * (1.0 - p) / var - 1.0, MIN_BETA_SIZE)
    return beta_moment(p * size, (1 - p) * size, k) + beta_moment((1 - p) * size, p * size, k)


def admit_given_u(u: float, floor: float, threshold: float | None = None) -> float:
    """The admission probability of a prompt whose group would be uniform with chance ``u``:
    max(floor, 1 - u), the chance that its group is informative, never below ``floor``; with a
    ``threshold``, 1 where u < threshold and ``floor`` elsewhere."""
    if threshold is None:
        return max(floor, 1.0 - u)
    return 1.0 if u < threshold else floor


def admission_probability(p: float, var: float, k: int, floor: float,
                          threshold: float | None = None) -> float:
    """``admit_given_u`` of the uniform chance of k rollouts at ``p`` (uncertain by ``var``)."""
    return admit_given_u(uniform_chance(p, var, k), floor, threshold)


def coin(seed: int, uid: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, uid): the admission decision's randomness."""
    digest = hashlib.blake2b(f"admit/{seed}/{uid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64


class PriorError:
    """The prior's error variance E[(q - p)^2] over the newest finished prompts: each prompt's
    (rate - p)^2 less the rate's own sampling variance rate(1 - rate) / (n - 1), an unbiased
    term; the mean over the window, at least 1e-4."""

    def __init__(self, window: int):
        self.terms: deque[float] = deque(maxlen=window)

    def add(self, p: float, rate: float, n: int) -> None:
        if n >= 2:
            self.terms.append((rate - p) ** 2 - rate * (1.0 - rate) / (n - 1))

    @property
    def var(self) -> float:
        if not self.terms:
            return PRIOR_ERROR_VAR0
        return max(sum(self.terms) / len(self.terms), 1e-4)


class Selector:
    """The candidate window and the admission rule (module docstring). Counters, read by
    attribute (``Scheduler.accounting``): ``drawn``, ``deferred``, ``fallbacks`` (admitted for
    want of a score: with the coordinator's, summary.json's ``prior_fallbacks``); the waiting
    are ``waiting``; ``admitted`` is the scheduler's ``prompts_admitted``."""

    def __init__(self, cfg: SelectionConfig):
        self.cfg = cfg
        self.waiting: list[Candidate] = []
        self.drawn = self.deferred = self.fallbacks = 0
        self.error = PriorError(cfg.error_window)
        self.history: dict[str, tuple[float, int]] = {}  # problem id -> (successes, rollouts)

    @property
    def needs_scores(self) -> bool:
        """Whether candidates must be scored by the prior before they are chosen."""
        return self.cfg.source == "prior"

    def to_draw(self, room: int) -> int:
        """Candidates to draw now so that the window holds ``window`` (and at least ``room``)."""
        return max(0, max(self.cfg.window, room) - len(self.waiting)) if room > 0 else 0

    def offer(self, candidates: list[Candidate]) -> None:
        self.waiting += candidates
        self.drawn += len(candidates)

    def score(self, priors: list[float | None]) -> None:
        """The prior's answer for every waiting candidate, in order (None: no score)."""
        if len(priors) != len(self.waiting):
            raise ValueError(f"{len(priors)} scores for {len(self.waiting)} waiting candidates")
        for c, p in zip(self.waiting, priors):
            c.p = p

    def probability(self, c: Candidate) -> float | None:
        """The admission probability of ``c`` (None: no prediction, admit in data order)."""
        cfg = self.cfg
        if cfg.source == "history":
            seen = self.history.get(_key(c.problem))
            if seen is None:
                return 1.0
            s, n = seen
            a, b = s + 0.5, n - s + 0.5
            u = beta_moment(a, b, cfg.k) + beta_moment(b, a, cfg.k)
            return admit_given_u(u, cfg.floor, cfg.threshold)
        if c.p is None:
            return None
        return admission_probability(c.p, self.error.var, cfg.k, cfg.floor, cfg.threshold)

    def choose(self, n: int) -> tuple[list[Candidate], list[Candidate]]:
        """Walk the window in draw order until ``n`` are admitted: (admitted, deferred); the
        rest wait. Each candidate walked is decided once and leaves the window."""
        admitted, deferred, walked = [], [], 0
        for c in self.waiting:
            if len(admitted) >= n:
                break
            walked += 1
            a = c.a = self.probability(c)
            if a is None:
                self.fallbacks += 1
                admitted.append(c)
            elif coin(self.cfg.seed, c.uid) < a:
                admitted.append(c)
            else:
                deferred.append(c)
        del self.waiting[:walked]
        self.deferred += len(deferred)
        return admitted, deferred

    def observe(self, problem, prior_p: float | None, rate: float, n: int) -> None:
        """A prompt finished with success rate ``rate`` over ``n`` rollouts (its prior was
        ``prior_p``): the prior's error, and the prompt's own history."""
        if prior_p is not None:
            self.error.add(prior_p, rate, n)
        if self.cfg.source == "history" and n:
            self.history[_key(problem)] = (min(max(rate, 0.0), 1.0) * n, n)

    # -- checkpoints --------------------------------------------------------------------------
    def snapshot(self, encode_problem) -> dict:
        return {"waiting": [[c.uid, encode_problem(c.problem)] for c in self.waiting],
                "drawn": self.drawn, "deferred": self.deferred, "fallbacks": self.fallbacks,
                "error_terms": list(self.error.terms),
                "history": [[k, s, n] for k, (s, n) in self.history.items()]}

    def restore(self, snap: dict, decode_problem) -> None:
        self.waiting = [Candidate(uid, decode_problem(d)) for uid, d in snap["waiting"]]
        self.drawn, self.deferred = int(snap["drawn"]), int(snap["deferred"])
        self.fallbacks = int(snap["fallbacks"])
        self.error.terms.extend(float(x) for x in snap["error_terms"])
        self.history = {k: (float(s), int(n)) for k, s, n in snap["history"]}


def _key(problem) -> str:
    """The identity of a prompt across epochs: its problem id (else its text)."""
    return str(getattr(problem, "id", None) or getattr(problem, "prompt", problem))


def sizes(sel: Selector | None) -> dict[str, int]:
    return {} if sel is None else {"waiting": len(sel.waiting), "history": len(sel.history),
                                   "error_terms": len(sel.error.terms)}

