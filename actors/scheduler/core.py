"""The scheduling policy: admission, dispatch, cancellation, staleness and hand-over.

One pure object (no Ray, no asyncio, no clock of its own) that three drivers call: the
``Coordinator`` actor with real vLLM generators, the unit tests with fake generators and a
fake clock, and the cluster simulator (``bench.sim``) with simulated engines. The simulator
therefore predicts the scheduler we ship.

The driver feeds events and carries out the actions the scheduler returns::

    sched = Scheduler(SchedulerConfig(...), estimator, n_generators=2)
    n = sched.room()                          # how many new prompts fit now
    acts = sched.admit(problems, priors)      # -> [Dispatch, ...]
    acts = sched.on_rollouts(request_id, [Finished(...), ...])   # rewards arrive
    acts = sched.on_request_failed(request_id, generator_lost=True)
    acts = sched.set_version(v)               # a learner step published version v
    batch = sched.take_batch(B)               # PromptInFlights to train on now, or None: wait

Rules (docs/pipeline.md, "The scheduler"):
- **Capacity in sequence slots.** Each generator holds at most ``slots_per_generator``
  running sequences (vLLM's ``max_num_seqs``); new prompts are admitted only into free slots,
  all k_init rollouts of a prompt on one generator (they share the prompt's prefix).
- **Extra rollouts first.** A prompt's further rollouts (planned in batches by its
  ``PromptState``) go to the generator that holds its prefix when it has a free slot, else
  to the least loaded one; they are never held back for capacity, so a prompt in flight
  always makes progress. Engine priority is earliest deadline first, and extra rollouts go
  before new prompts due at the same version.
- **Cancellation.** When a prompt's plan shrinks, its least advanced outstanding rollouts
  (the most recently dispatched) are cancelled in the engine; their tokens are counted.
- **Staleness by deadline.** Every admitted prompt takes a *deadline*: the policy version at
  which it must be trained, at most ``max_staleness`` versions after its admission. Each
  deadline has a quota of B admissions (a calendar; B is ``batch_prompts``, or with
  ``batch_samples`` S the prompts that S samples make at the recent mean k), taken by the
  earliest deadline in the window with quota left; a prompt trained early does not give its quota
  back (a prompt admitted into it now would have little slack before the learner must wait
  for it), a dropped one does (DAPO's refill). Every sample of a prompt starts at or after its
  admission version, so a sample trained by its deadline is at most ``max_staleness``
  versions old. The hand-over at version V is earliest deadline first: it waits for every
  prompt due at V (at most B by the quota) and fills the batch with the finished prompts of
  the earliest deadlines (streaming: a prompt due later can be trained as soon as it is
  finished). In the steady state a new prompt is due ``max_staleness`` versions after its
  admission. A prompt due now whose later rounds still run is cut there (its outstanding
  rollouts cancelled, its baseline taken from the k >= k_init rewards in hand, counted as
  ``deadline_cuts``): only a prompt's first round is ever waited for. A sample older than the bound anyway (only after a resume or a lost generator)
  is re-generated, and after ``max_regenerations`` the prompt is dropped (both counted).
- **Synchronous mode is the same policy with a barrier**: ``max_staleness = 0`` leaves one
  deadline (the current version), so B prompts are admitted at a version boundary, the
  learner trains when all of them are finished, and nothing is admitted until the next
  version is published. DAPO's filtered prompts free their place and are refilled.
- **Accounting.** Every admitted prompt ends exactly once: handed to the learner, dropped
  with a counted reason, or still in flight (or finished, waiting) at the end.
"""
from __future__ import annotations

import itertools
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from estimator.state import PromptState

RECENT_K = 64  # finished prompts whose mean k sizes the quota under ``batch_samples``


def priority(deadline: int, first: bool) -> int:
    """Engine priority of a request (vLLM runs lower values first): earliest deadline first,
    and among prompts due at the same version, extra rollouts before new prompts."""
    return 2 * deadline + int(first)


@dataclass(frozen=True)
class SchedulerConfig:
    """The knobs of the policy (built from the run config by the coordinator)."""

    # No defaults for these three: the run config states them (rollout.batch_prompts,
    # rollout.max_staleness, generators.engine.max_num_seqs), the simulator its own.
    batch_prompts: int                # B: prompts per learner step (= prompts per deadline)
    max_staleness: int                # versions a sample may age before it is trained
    slots_per_generator: int          # engine sequence slots (vLLM max_num_seqs)
    max_inflight_prompts: int | None = None  # cap on admitted, not yet handed prompts
    max_regenerations: int = 2        # stale re-generations of one prompt before it is dropped
    max_refill_factor: int = 4        # barrier: accept a short batch after this many x B drops
    # S: samples (rollouts) per learner step, whatever each prompt's k (None: B prompts). The
    # batch closes once its prompts hold S samples; each deadline's quota is then S over the
    # recent mean k (``batch_prompts`` until prompts have finished), so that every algorithm,
    # fixed-k or not, makes one update per S rollouts.
    batch_samples: int | None = None

    def __post_init__(self):
        if self.batch_prompts < 1:
            raise ValueError(f"batch_prompts must be >= 1, got {self.batch_prompts}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.slots_per_generator < 1:
            raise ValueError(f"slots_per_generator must be >= 1, got {self.slots_per_generator}")
        if self.batch_samples is not None and self.batch_samples < 1:
            raise ValueError(f"batch_samples must be >= 1, got {self.batch_samples}")
        if self.max_inflight_prompts is not None and self.max_inflight_prompts < self.batch_prompts:
            raise ValueError(f"max_inflight_prompts ({self.max_inflight_prompts}) must be >= "
                             f"batch_prompts ({self.batch_prompts}): else no batch can form")


# -- what the driver does ------------------------------------------------------------------

@dataclass(frozen=True)
class Dispatch:
    """Generate rollouts ``indices`` of prompt ``uid`` on ``generator`` (one engine request
    of n = len(indices) completions; completion j is rollout ``indices[j]``)."""

    request_id: str
    uid: str
    indices: tuple[int, ...]
    generator: int
    priority: int
    round: int


@dataclass(frozen=True)
class Cancel:
    """Abort completions ``positions`` of request ``request_id`` in its engine."""

    request_id: str
    uid: str
    positions: tuple[int, ...]
    generator: int


@dataclass(frozen=True)
class Finished:
    """One completion of a request as the driver scored it. ``cancelled``: it was aborted
    before finishing (its ``tokens`` are spent compute, its reward is meaningless)."""

    position: int
    reward: float
    tokens: int
    start_version: int
    payload: Any = None
    cancelled: bool = False


# -- what the scheduler keeps ------------------------------------------------------------------

@dataclass
class PromptInFlight:
    """A prompt in flight: its estimator state, its rollouts by index, when and where."""

    uid: str
    problem: Any
    state: PromptState
    admitted_version: int
    deadline: int
    home: int                                   # generator holding its prefix
    t_admit: float
    payloads: dict[int, Any] = field(default_factory=dict)       # index -> rollout
    start_version: dict[int, int] = field(default_factory=dict)  # index -> version at start
    t_done: float = 0.0
    regenerations: int = 0
    cancelled_rollouts: int = 0
    cancelled_tokens: int = 0
    requests: set[str] = field(default_factory=set)             # its requests in flight

    @property
    def done(self) -> bool:
        return self.state.done

    def oldest_version(self) -> int:
        return min(self.start_version.values(), default=self.admitted_version)


@dataclass
class _Request:
    dispatch: Dispatch
    live: set[int]                                     # positions whose result is awaited
    cancelled: set[int] = field(default_factory=set)   # cancelled, their report awaited


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, estimator, n_generators: int, version: int = 0,
                 clock: Callable[[], float] = lambda: 0.0):
        if n_generators < 1:
            raise ValueError(f"n_generators must be >= 1, got {n_generators}")
        self.cfg, self.est, self.clock = cfg, estimator, clock
        self.version = version
        self.k_init = estimator.cfg.k_init
        self.alive = [True] * n_generators
        self.load = [0] * n_generators           # outstanding sequences per generator
        self.inflight: dict[str, PromptInFlight] = {}  # admitted, not yet handed or dropped
        self.ready: dict[str, PromptInFlight] = {}     # the finished subset of ``inflight``
        self.quota: Counter = Counter()           # deadline -> admissions given it (not
                                                  # returned when trained early)
        self.unfinished: Counter = Counter()      # deadline -> live prompts not finished yet
        self._last_batch: list[int] = []          # deadlines of the last hand-over
        self._recheck: set[str] = set()           # finished prompts whose age to check
        self.requests: dict[str, _Request] = {}
        self.parked: list[Dispatch] = []          # waiting for a live generator
        self.counts: Counter = Counter()
        self.drops: Counter = Counter()
        self.refills: Counter = Counter()         # deadline -> prompts dropped at it
        self._ids = itertools.count()
        self._finished: list[PromptInFlight] = []    # finished since the last drain_finished()
        self.dropped: list[tuple[str, str]] = []  # (uid, reason) of every drop, in order
        self._taken: int | None = None            # version whose batch the learner took
        self.paused = False
        self._recent_k: deque[int] = deque(maxlen=RECENT_K)  # k of the newest finished prompts

    # -- admission ---------------------------------------------------------------------------
    @property
    def quota_size(self) -> int:
        """B: prompts per deadline. With ``batch_samples`` S, S over the mean k of the newest
        finished prompts (``batch_prompts`` before any has finished)."""
        S = self.cfg.batch_samples
        if S is None or not self._recent_k:
            return self.cfg.batch_prompts
        return max(1, round(S / (sum(self._recent_k) / len(self._recent_k))))

    def _open_deadlines(self) -> list[int]:
        """Deadlines that take new prompts: the window [V, V + max_staleness], less deadline V
        once the learner took its batch there (until it reports back), less any deadline
        whose filtered-and-refilled prompts ran over ``max_refill_factor`` x B (a policy that
        solves or fails everything would refill forever; the batch then trains short)."""
        cap = self.cfg.max_refill_factor * self.quota_size
        first = self.version + (self._taken == self.version)
        return [d for d in range(first, self.version + self.cfg.max_staleness + 1)
                if self.refills[d] < cap]

    def _free_deadline(self) -> int | None:
        """The earliest open deadline with quota left (None: none)."""
        for d in self._open_deadlines():
            if self.quota[d] < self.quota_size:
                return d
        return None

    def _quota_room(self) -> int:
        B = self.quota_size
        return sum(max(0, B - self.quota[d]) for d in self._open_deadlines())

    def _slot_room(self) -> int:
        """Prompts whose k_init rollouts fit in free slots (all on one generator each)."""
        s = self.cfg.slots_per_generator
        need = min(self.k_init, s)  # k_init above an engine's slots: one per empty engine
        return sum(max(0, s - load) // need for load, a in zip(self.load, self.alive) if a)

    def room(self) -> int:
        """How many new prompts may be admitted now."""
        if self.paused or self.parked or not any(self.alive):
            return 0
        n = min(self._slot_room(), self._quota_room())
        if self.cfg.max_inflight_prompts is not None:
            n = min(n, self.cfg.max_inflight_prompts - len(self.inflight))
        return max(0, n)

    def admit(self, problems: Sequence[Any], priors: Sequence[float | None],
              uids: Sequence[str] | None = None) -> list:
        """Admit prompts (with their prior probabilities; None: no prior) and dispatch their
        first rollouts. Admitting more than ``room()`` is a driver bug."""
        if len(problems) != len(priors):
            raise ValueError(f"{len(problems)} problems but {len(priors)} priors")
        if len(problems) > self.room():
            raise ValueError(f"admitting {len(problems)} prompts with room for {self.room()}")
        actions = []
        for i, (problem, prior) in enumerate(zip(problems, priors)):
            d = self._free_deadline()
            uid = uids[i] if uids is not None else f"p{next(self._ids)}"
            if uid in self.inflight:
                raise ValueError(f"prompt uid {uid!r} is already in flight")
            pif = PromptInFlight(uid, problem, PromptState(self.est, prior), self.version, d, -1,
                                 self.clock())
            self.inflight[uid] = pif
            self.quota[d] += 1
            self.unfinished[d] += 1
            self.counts["admitted"] += 1
            actions += self._plan(pif)
        return actions

    # -- planning ----------------------------------------------------------------------------
    def _plan(self, pif: PromptInFlight) -> list:
        """Ask the prompt's state what to do now: dispatch, cancel, or finish."""
        st, actions = pif.state, []
        n = st.to_request()
        if n:
            idx = tuple(range(st.requested - n, st.requested))
            first = st.round_of(idx[0]) == 1 and pif.regenerations == 0
            if not first:
                self.counts["extra_rollouts"] += n
            actions.append(self._dispatch(pif, idx, priority(pif.deadline, first),
                                          st.round_of(idx[0]), prefer_home=not first))
        cancel = st.to_cancel()
        if cancel:
            actions += self._cancel_latest(pif, cancel)
        if st.done and st.outstanding == 0 and pif.uid not in self.ready:
            self._finish(pif)
        return [a for a in actions if a is not None]

    def _pick(self, pif: PromptInFlight, n: int, prefer_home: bool) -> int | None:
        live = [g for g, a in enumerate(self.alive) if a]
        if not live:
            return None
        s = self.cfg.slots_per_generator
        if prefer_home and pif.home >= 0 and self.alive[pif.home] and self.load[pif.home] + n <= s:
            return pif.home
        return min(live, key=lambda g: (self.load[g], g))

    def _dispatch(self, pif: PromptInFlight, indices: tuple[int, ...], priority: int, rnd: int,
                  prefer_home: bool = True) -> Dispatch | None:
        g = self._pick(pif, len(indices), prefer_home)
        d = Dispatch(f"{pif.uid}/r{next(self._ids)}", pif.uid, indices,
                     -1 if g is None else g, priority, rnd)
        if g is None:  # no live generator: park it until one comes back
            self.parked.append(d)
            return None
        if pif.home < 0:
            pif.home = g  # its first rollouts' engine holds its prefix from now on
        return self._send(d)

    def _send(self, d: Dispatch) -> Dispatch:
        self.requests[d.request_id] = _Request(d, set(range(len(d.indices))))
        self.inflight[d.uid].requests.add(d.request_id)
        self.load[d.generator] += len(d.indices)
        self.counts["rollouts_dispatched"] += len(d.indices)
        return d

    def _cancel_latest(self, pif: PromptInFlight, n: int) -> list[Cancel]:
        """Cancel the ``n`` least advanced outstanding rollouts: the latest dispatched."""
        latest = sorted(pif.state.outstanding_indices(), reverse=True)[:n]
        for index in latest:
            pif.state.cancel(index)
        return self._abort(pif, set(latest))

    def _abort(self, pif: PromptInFlight, indices: set[int]) -> list[Cancel]:
        """The engine side of cancelling rollouts ``indices`` (the state already cancelled
        them): their slots free at once, their reports are awaited as cancelled."""
        by_req: dict[str, list[int]] = {}
        for rid in pif.requests:
            req = self.requests[rid]
            for pos in [p for p in req.live if req.dispatch.indices[p] in indices]:
                req.live.discard(pos)
                req.cancelled.add(pos)
                self.load[req.dispatch.generator] -= 1  # the engine frees the slot on abort
                by_req.setdefault(rid, []).append(pos)
        n = sum(map(len, by_req.values()))
        pif.cancelled_rollouts += n
        self.counts["rollouts_cancelled"] += n
        return [Cancel(rid, pif.uid, tuple(sorted(pos)), self.requests[rid].dispatch.generator)
                for rid, pos in sorted(by_req.items())]

    def _retire(self, rid: str) -> None:
        req = self.requests[rid]
        if not req.live and not req.cancelled:
            del self.requests[rid]
            pif = self.inflight.get(req.dispatch.uid)
            if pif is not None:
                pif.requests.discard(rid)

    # -- results -----------------------------------------------------------------------------
    def on_rollouts(self, request_id: str, finished: Sequence[Finished]) -> list:
        """Completions of a request came back (all of them, or those that finished)."""
        req = self.requests.get(request_id)
        if req is None:  # its prompt was dropped (or the request failed) meanwhile
            self.counts["cancelled_tokens"] += sum(f.tokens for f in finished)
            return []
        actions: list = []
        pif = self.inflight.get(req.dispatch.uid)
        for f in finished:
            if f.position in req.cancelled or f.position not in req.live:
                # Cancelled by the plan (even if it finished before the abort landed):
                # its tokens are spent compute, its reward is not used.
                req.cancelled.discard(f.position)
                self.counts["cancelled_tokens"] += f.tokens
                if pif is not None:
                    pif.cancelled_tokens += f.tokens
                continue
            if f.cancelled:
                raise ValueError(f"request {request_id}: completion {f.position} came back "
                                 "cancelled but was never cancelled by the scheduler")
            req.live.discard(f.position)
            self.load[req.dispatch.generator] -= 1
            if pif is None:  # dropped meanwhile
                continue
            index = req.dispatch.indices[f.position]
            pif.state.add(float(f.reward), index=index)
            pif.payloads[index] = f.payload
            pif.start_version[index] = int(f.start_version)
            self.counts["rollouts_finished"] += 1
            self.counts["tokens_finished"] += f.tokens
        self._retire(request_id)
        if pif is not None and pif.uid not in self.ready:
            actions += self._plan(pif)
        return actions

    def on_request_failed(self, request_id: str, generator_lost: bool = False,
                          drop_reason: str | None = None) -> list:
        """A request raised. ``generator_lost``: its generator died (its other requests will
        fail too); the live completions are re-issued elsewhere. ``drop_reason``: give up on
        the prompt instead (e.g. repeated engine errors)."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return []
        d = req.dispatch
        self.load[d.generator] -= len(req.live)
        if d.uid in self.inflight:
            self.inflight[d.uid].requests.discard(request_id)
        if generator_lost:
            self.mark_lost(d.generator)
        pif = self.inflight.get(d.uid)
        if pif is None or not req.live:
            return []
        if drop_reason is not None:
            return self.drop(pif.uid, drop_reason)
        self.counts["reissued_requests"] += 1
        indices = tuple(d.indices[p] for p in sorted(req.live))
        out = self._dispatch(pif, indices, d.priority, d.round, prefer_home=False)
        return [out] if out is not None else []

    def mark_lost(self, g: int) -> None:
        if self.alive[g]:
            self.alive[g] = False
            self.counts["generator_losses"] += 1

    def mark_back(self, g: int) -> list:
        """Generator g serves again (restarted, newest weights loaded): parked work first."""
        self.alive[g] = True
        parked, self.parked = self.parked, []
        out = []
        for d in parked:
            pif = self.inflight.get(d.uid)
            if pif is None:
                continue
            x = self._dispatch(pif, d.indices, d.priority, d.round, prefer_home=False)
            if x is not None:
                out.append(x)
        return out

    # -- finishing and dropping --------------------------------------------------------------
    def _finish(self, pif: PromptInFlight) -> None:
        pif.t_done = self.clock()
        self._finished.append(pif)
        if not pif.state.keep:
            self.drop(pif.uid, "filtered_all_equal", refill=True)
            return
        self.ready[pif.uid] = pif
        self.unfinished[pif.deadline] -= 1
        self._recheck.add(pif.uid)
        self._recent_k.append(pif.state.k)

    def drop(self, uid: str, reason: str, refill: bool = False) -> list:
        """Drop a prompt (counted under ``reason``); its place frees. Returns the
        cancels of its outstanding rollouts."""
        pif = self.inflight.pop(uid, None)
        if pif is None:
            return []
        if self.ready.pop(uid, None) is None:
            self.unfinished[pif.deadline] -= 1
        self.quota[pif.deadline] -= 1  # its place is free again (a refill may take it)
        if refill:
            self.refills[pif.deadline] += 1
        self.drops[reason] += 1
        self.dropped.append((uid, reason))
        out = []
        for rid in pif.requests:
            q = self.requests.pop(rid)
            self.load[q.dispatch.generator] -= len(q.live)
            if q.live:  # their reports will find no request: counted as cancelled tokens
                out.append(Cancel(rid, uid, tuple(sorted(q.live)), q.dispatch.generator))
                self.counts["rollouts_cancelled"] += len(q.live)
        self.parked = [d for d in self.parked if d.uid != uid]
        return out

    # -- versions and the hand-over ------------------------------------------------------------
    def set_version(self, version: int) -> None:
        """The learner finished a step and now trains ``version`` (after a skipped step, the
        same one: admission reopens for it)."""
        if version < self.version:
            raise ValueError(f"version went back from {self.version} to {version}")
        if version == self.version and self._taken == version:
            # The learner skipped its step (NaN): that batch was not trained. Its prompts are
            # dropped by the trainer; their quota returns, so admission does not starve.
            for d in self._last_batch:
                self.quota[d] -= 1
        self._last_batch = []
        self.version = version
        self._taken = None
        self._recheck.update(self.ready)  # finished samples grew a version older

    def take_batch(self, n: int) -> tuple[list[PromptInFlight], list] | None:
        """Prompts to train on at the current version, or None when the learner must wait:
        while a prompt due now is unfinished, or fewer than ``n`` are finished (with
        ``batch_samples`` S: fewer than S samples; the batch is then the earliest-due
        prompts up to S samples, every prompt due now included). Returns (prompts, actions):
        actions re-generate stale samples found on the way."""
        V = self.version
        actions = self._regenerate_stale(V) if self._recheck else []
        if self.cfg.max_staleness and any(c for d, c in self.unfinished.items() if d <= V):
            actions += self._cut_due(V)  # not behind the barrier: there the batch waits
        wait = None if not actions else ([], actions)
        if any(c for d, c in self.unfinished.items() if d <= V):
            return wait  # a prompt due now is still in its first round
        S = self.cfg.batch_samples
        if (len(self.ready) < n if S is None else
                sum(g.state.k for g in self.ready.values()) < S):
            # A closed deadline (see _open_deadlines) with nothing due running trains short;
            # so does a sample-counted batch that nothing more can join at this version
            # (every admitted prompt finished and no quota left: S / mean k rounds down).
            closed = V not in self._open_deadlines() or (
                S is not None and not self._quota_room() and len(self.ready) == len(self.inflight))
            if not (self.ready and closed):
                return wait
        order = sorted(self.ready.values(), key=lambda g: (g.deadline, g.t_done, g.uid))
        batch = order[:n] if S is None else _up_to_samples(order, S, V)
        self._taken = V
        self._last_batch = [g.deadline for g in batch]
        for g in batch:
            del self.inflight[g.uid], self.ready[g.uid]
            self.counts["handed"] += 1
        for d in [d for d in self.quota if d < V and self.unfinished[d] == 0]:
            del self.quota[d], self.unfinished[d]  # deadlines past: nothing is due there again
        return batch, actions

    def _cut_due(self, V: int) -> list:
        """Prompts due now whose later rounds are still running: stop them with the rewards
        in hand (at least k_init) rather than keep the learner waiting; the cancelled
        rollouts are counted (``deadline_cuts``). Only a prompt's first round is waited for."""
        out = []
        for pif in [g for g in self.inflight.values()
                    if g.deadline <= V and g.uid not in self.ready
                    and g.state.k >= self.k_init and g.state.outstanding]:
            out += self._abort(pif, set(pif.state.cut()))
            self.counts["deadline_cuts"] += 1
            self._finish(pif)
        return out

    def _regenerate_stale(self, V: int) -> list:
        out = []
        check, self._recheck = self._recheck, set()
        for pif in [self.ready[u] for u in check if u in self.ready]:
            stale = [i for i, v in pif.start_version.items() if V - v > self.cfg.max_staleness]
            if not stale:
                continue
            if pif.regenerations >= self.cfg.max_regenerations:
                out += self.drop(pif.uid, "stale")
                continue
            pif.regenerations += 1
            self.counts["stale_regenerated"] += len(stale)
            del self.ready[pif.uid]
            for i in stale:
                pif.state.expire(i)
                pif.payloads.pop(i, None)
                pif.start_version.pop(i, None)
            # Its samples now start at V or later: a fresh deadline, with all the slack.
            self.quota[pif.deadline] -= 1
            pif.deadline = V + self.cfg.max_staleness
            self.quota[pif.deadline] += 1
            self.unfinished[pif.deadline] += 1
            out += self._plan(pif)
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def snapshot(self, encode_problem: Callable, encode_payload: Callable) -> dict:
        """Everything needed to continue every admitted prompt after a crash: its estimator
        state, its finished rollouts (``encode_payload``), its deadline; the counters and
        the drops not yet handed over (``dropped``). Rollouts in flight are not kept:
        ``restore`` asks for them again."""
        prompts = []
        for g in self.inflight.values():
            prompts.append({
                "uid": g.uid, "problem": encode_problem(g.problem), "state": g.state.to_dict(),
                "admitted_version": g.admitted_version, "deadline": g.deadline,
                "t_admit": g.t_admit, "t_done": g.t_done, "regenerations": g.regenerations,
                "cancelled_rollouts": g.cancelled_rollouts,
                "cancelled_tokens": g.cancelled_tokens, "ready": g.uid in self.ready,
                "rollouts": [[i, g.start_version[i], encode_payload(p)]
                             for i, p in sorted(g.payloads.items())]})
        # ``dropped``: drops not yet handed over (they reach dropped.jsonl with the next
        # batch); without them a resumed run would have those uids nowhere.
        return {"version": self.version, "counts": dict(self.counts), "drops": dict(self.drops),
                "dropped": [[uid, why] for uid, why in self.dropped],
                "refills": {str(d): n for d, n in self.refills.items()},
                "quota": {str(d): n for d, n in self.quota.items()}, "inflight": prompts}

    def restore(self, snap: dict, decode_problem: Callable, decode_payload: Callable) -> list:
        """Load a ``snapshot`` into this (fresh) scheduler; returns the dispatches that ask
        again for the rollouts that were in flight. Ages keep counting from the versions
        that started the samples, so the staleness bound still holds after a resume: a sample
        too old by the time it would be trained is re-generated (see ``take_batch``).

        The resumed learner trains the snapshot's weights, possibly under a higher number
        (generators that outlived the crashed run serve newer ones: see
        ``cluster.runtime.resume_state``); this scheduler's version is that number. Every
        version in the snapshot (starts, admissions, deadlines) moves by the difference, so
        an age counts weight updates, not renumbering: a sample started on the checkpoint's
        weights is as old after the resume as it was at the checkpoint."""
        if self.inflight:
            raise ValueError("restore into a scheduler that already has prompts")
        # Absent from checkpoints written before it was kept: no shift, as then.
        shift = self.version - snap.get("version", self.version)
        if shift < 0:
            raise ValueError(f"restore at version {self.version}, older than the snapshot's "
                             f"{snap['version']}")
        self.counts.update(snap["counts"])
        self.drops.update(snap["drops"])
        # Absent from checkpoints written before it was kept.
        self.dropped = [(uid, why) for uid, why in snap.get("dropped", [])]
        self.refills.update({int(d) + shift: n for d, n in snap["refills"].items()})
        self.quota.update({int(d) + shift: n for d, n in snap["quota"].items()})
        actions = []
        # "groups": the key of checkpoints written before the rename to "inflight".
        for d in snap["inflight"] if "inflight" in snap else snap["groups"]:
            pif = PromptInFlight(d["uid"], decode_problem(d["problem"]),
                                 PromptState.from_dict(self.est, d["state"]),
                                 d["admitted_version"] + shift, d["deadline"] + shift, -1,
                                 d["t_admit"], t_done=d["t_done"],
                                 regenerations=d["regenerations"],
                                 cancelled_rollouts=d["cancelled_rollouts"],
                                 cancelled_tokens=d["cancelled_tokens"])
            for i, v, payload in d["rollouts"]:
                pif.payloads[int(i)] = decode_payload(payload)
                pif.start_version[int(i)] = int(v) + shift
            self.inflight[pif.uid] = pif
            if d["ready"]:
                self.ready[pif.uid] = pif
                self._recheck.add(pif.uid)
                continue
            self.unfinished[pif.deadline] += 1
            lost = tuple(pif.state.outstanding_indices())
            if lost:  # in flight when the checkpoint was taken: generate them again
                self.counts["reissued_requests"] += 1
                st = pif.state
                first = st.round_of(lost[0]) == 1 and pif.regenerations == 0
                x = self._dispatch(pif, lost, priority(pif.deadline, first), st.round_of(lost[0]))
                actions += [x] if x is not None else []
            else:
                actions += self._plan(pif)
        return actions

    # -- reading -----------------------------------------------------------------------------
    def drain_finished(self) -> list[PromptInFlight]:
        """Prompts whose rollouts finished since the last call, kept or filtered (the prior
        learns from both)."""
        out, self._finished = self._finished, []
        return out

    def in_flight(self) -> int:
        """Admitted prompts not yet handed or dropped (finished-and-waiting included)."""
        return len(self.inflight)

    def accounting(self) -> dict:
        c = self.counts
        return {"prompts_admitted": c["admitted"], "prompts_handed": c["handed"],
                "prompts_dropped": sum(self.drops.values()), "drop_reasons": dict(self.drops),
                "prompts_in_flight": len(self.inflight),
                "rollouts_dispatched": c["rollouts_dispatched"],
                "rollouts_finished": c["rollouts_finished"],
                "rollouts_cancelled": c["rollouts_cancelled"],
                "cancelled_tokens": c["cancelled_tokens"],
                "extra_rollouts_requested": c["extra_rollouts"],
                "reissued_requests": c["reissued_requests"],
                "stale_regenerated": c["stale_regenerated"],
                "deadline_cuts": c["deadline_cuts"],
                "generator_losses": c["generator_losses"]}


def _up_to_samples(order: list[PromptInFlight], S: int, V: int) -> list[PromptInFlight]:
    """The first prompts of ``order`` (earliest due first) until they hold ``S`` samples;
    every prompt due at or before ``V`` is taken even past S (it must be trained now)."""
    out, total = [], 0
    for g in order:
        if total >= S and g.deadline > V:
            break
        out.append(g)
        total += g.state.k
    return out
