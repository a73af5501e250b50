"""The ``Scheduler``: the policy of the package docstring (``actors.scheduler``), one pure
object that the coordinator, the unit tests and the simulator drive."""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Sequence

from actors.scheduler.admission import AdmissionCalendar
from actors.scheduler.messages import Cancel, Dispatch, Finished, SchedulerConfig, priority
from actors.scheduler.selection import Candidate, Selector, sizes
from actors.scheduler.state import PromptInFlight, Request, up_to_samples
from common.records import Accounting, DropCounts, DropReason, SchedulerCounts
from estimator.core import reward_to_prob
from estimator.state import PromptState


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
        self.calendar = AdmissionCalendar(cfg)   # the deadlines' quotas (``room``)
        self.unfinished: Counter = Counter()      # deadline -> live prompts not finished yet
        self._recheck: set[str] = set()           # finished prompts whose age to check
        self.requests: dict[str, Request] = {}
        self.parked: list[Dispatch] = []          # waiting for a live generator
        self.counts = SchedulerCounts()
        self.drops = DropCounts()
        self._ids = itertools.count()
        self._finished: list[PromptInFlight] = []    # finished since the last drain_finished()
        self.dropped: list[tuple[str, str]] = []  # (uid, reason) of every drop, in order
        self.paused = False
        # Admission by selection (``algo.select``): the candidate window and its rule
        self.selector = None if cfg.selection is None else Selector(cfg.selection)
        self.deferred: list[tuple] = []  # (uid, p, admission probability) of each deferral

    # -- admission -------------------------------------------------------------------------
    def room(self) -> int:
        """How many new prompts may be admitted now: in free engine slots and in the
        deadlines' quotas (``AdmissionCalendar``)."""
        if self.paused or self.parked or not any(self.alive):
            return 0
        n = min(self._slot_room(), self.calendar.room(self.version))
        if self.cfg.max_inflight_prompts is not None:
            n = min(n, self.cfg.max_inflight_prompts - len(self.inflight))
        return max(0, n)

    def _slot_room(self) -> int:
        """Prompts whose k_init rollouts fit in free slots (all on one generator each)."""
        s = self.cfg.slots_per_generator
        need = min(self.k_init, s)  # k_init above an engine's slots: one per empty engine
        return sum(max(0, s - load) // need for load, a in zip(self.load, self.alive) if a)

    def admit(self, problems: Sequence[Any], priors: Sequence[float | None],
              uids: Sequence[str] | None = None) -> list:
        """Admit prompts (with their prior probabilities; None: no prior) and dispatch their
        first rollouts. Admitting more than ``room()`` is a driver bug. With a selector the
        driver offers candidates instead (``offer``, ``score``, ``admit_selected``)."""
        if self.selector is not None:
            raise ValueError("this scheduler admits by selection: offer candidates instead")
        return self._admit(problems, priors, uids)

    # -- admission by selection (``actors.scheduler.selection``) -------------------------------
    def to_draw(self) -> int:
        """Candidates the driver should draw from its stream now (0: no room to admit)."""
        return self.selector.to_draw(self.room())

    def offer(self, problems: Sequence[Any], uids: Sequence[str]) -> None:
        """Prompts drawn from the stream join the candidate window (each uid once)."""
        self.selector.offer([Candidate(u, p) for p, u in zip(problems, uids, strict=True)])

    def waiting(self) -> list:
        """The candidates' problems, in the order ``score`` takes their priors."""
        return [c.problem for c in self.selector.waiting]

    def score(self, priors: Sequence[float | None]) -> None:
        """The prior's p for every waiting candidate (None: no score: the data order)."""
        self.selector.score(list(priors))

    def admit_selected(self) -> list:
        """Admit from the window, in draw order, each candidate with its probability, until
        ``room()`` is filled or the window is walked; the others are deferred or wait."""
        chosen, deferred = self.selector.choose(self.room())
        self.deferred += [(c.uid, c.p, c.a) for c in deferred]
        return self._admit([c.problem for c in chosen], [c.p for c in chosen],
                           [c.uid for c in chosen])

    def _admit(self, problems: Sequence[Any], priors: Sequence[float | None],
               uids: Sequence[str] | None) -> list:
        if len(problems) != len(priors):
            raise ValueError(f"{len(problems)} problems but {len(priors)} priors")
        if len(problems) > self.room():
            raise ValueError(f"admitting {len(problems)} prompts with room for {self.room()}")
        actions = []
        for i, (problem, prior) in enumerate(zip(problems, priors)):
            d = self.calendar.admit(self.version)
            uid = uids[i] if uids is not None else f"p{next(self._ids)}"
            if uid in self.inflight:
                raise ValueError(f"prompt uid {uid!r} is already in flight")
            pif = PromptInFlight(uid, problem, PromptState(self.est, prior), self.version, d, -1,
                                 self.clock())
            self.inflight[uid] = pif
            self.unfinished[d] += 1
            self.counts.prompts_admitted += 1
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
                self.counts.extra_rollouts_requested += n
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
        self.requests[d.request_id] = Request(d, set(range(len(d.indices))))
        self.inflight[d.uid].requests.add(d.request_id)
        self.load[d.generator] += len(d.indices)
        self.counts.rollouts_dispatched += len(d.indices)
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
        self.counts.rollouts_cancelled += n
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
            self.counts.cancelled_tokens += sum(f.tokens for f in finished)
            return []
        actions: list = []
        pif = self.inflight.get(req.dispatch.uid)
        for f in finished:
            if f.position in req.cancelled or f.position not in req.live:
                # Cancelled by the plan (even if it finished before the abort landed):
                # its tokens are spent compute, its reward is not used.
                req.cancelled.discard(f.position)
                self.counts.cancelled_tokens += f.tokens
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
            self.counts.rollouts_finished += 1
        self._retire(request_id)
        if pif is not None and pif.uid not in self.ready:
            actions += self._plan(pif)
        return actions

    def on_request_failed(self, request_id: str, generator_lost: bool = False,
                          drop_reason: DropReason | None = None, detail: str = "") -> list:
        """A request raised. ``generator_lost``: its generator died (its other requests will
        fail too); the live completions are re-issued elsewhere. ``drop_reason``: give up on
        the prompt instead (e.g. repeated engine errors; ``detail``: the exception's type)."""
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
            return self.drop(pif.uid, drop_reason, detail=detail)
        self.counts.reissued_requests += 1
        indices = tuple(d.indices[p] for p in sorted(req.live))
        out = self._dispatch(pif, indices, d.priority, d.round, prefer_home=False)
        return [out] if out is not None else []

    def mark_lost(self, g: int) -> None:
        if self.alive[g]:
            self.alive[g] = False
            self.counts.generator_losses += 1

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
        if self.selector is not None:
            st = pif.state
            self.selector.observe(pif.problem, st.prior_p,
                                  float(reward_to_prob(st.vbar, st.est.cfg.rewards)), st.k)
        if not pif.state.keep:
            self.drop(pif.uid, DropReason.FILTERED_ALL_EQUAL, refill=True)
            return
        self.ready[pif.uid] = pif
        self.unfinished[pif.deadline] -= 1
        self._recheck.add(pif.uid)
        self.calendar.finished(pif.trainable)

    def drop(self, uid: str, reason: DropReason, refill: bool = False, detail: str = "") -> list:
        """Drop a prompt (counted under ``reason``; ``detail`` joins it in dropped.jsonl);
        its place frees. Returns the cancels of its outstanding rollouts."""
        pif = self.inflight.pop(uid, None)
        if pif is None:
            return []
        if self.ready.pop(uid, None) is None:
            self.unfinished[pif.deadline] -= 1
        self.calendar.release(pif.deadline, refill)  # its place is free (a refill may take it)
        self.drops.add(reason)
        self.dropped.append((uid, reason.line(detail)))
        out = []
        for rid in pif.requests:
            q = self.requests.pop(rid)
            self.load[q.dispatch.generator] -= len(q.live)
            if q.live:  # their reports will find no request: counted as cancelled tokens
                out.append(Cancel(rid, uid, tuple(sorted(q.live)), q.dispatch.generator))
                self.counts.rollouts_cancelled += len(q.live)
        self.parked = [d for d in self.parked if d.uid != uid]
        return out

    # -- versions and the hand-over ------------------------------------------------------------
    def set_version(self, version: int) -> None:
        """The learner finished a step and now trains ``version`` (after a skipped step, the
        same one: admission reopens for it)."""
        if version < self.version:
            raise ValueError(f"version went back from {self.version} to {version}")
        self.calendar.new_version(version)  # the same one: the step was skipped (NaN)
        self.version = version
        self._recheck.update(self.ready)  # finished samples grew a version older

    def take_batch(self, n: int) -> tuple[list[PromptInFlight], list] | None:
        """(prompts to train on at the current version, actions that re-generate stale samples
        found on the way), or None when the learner must wait: while a prompt due now is
        unfinished, or fewer than ``n`` are finished (with ``batch_samples`` S: fewer than S
        samples; the batch is then the earliest-due prompts up to S samples, every prompt due
        now included, trimmed to S: ``up_to_samples``)."""
        V = self.version
        actions = self._regenerate_stale(V) if self._recheck else []
        if self.cfg.max_staleness and any(c for d, c in self.unfinished.items() if d <= V):
            actions += self._cut_due(V)  # not behind the barrier: there the batch waits
        wait = None if not actions else ([], actions)
        if any(c for d, c in self.unfinished.items() if d <= V):
            return wait  # a prompt due now is still in its first round
        S = self.cfg.batch_samples
        if (len(self.ready) < n if S is None else
                sum(g.trainable for g in self.ready.values()) < S):
            closed = V not in self.calendar.open_deadlines(V)  # closed: it trains short
            if (S is not None and not closed and not self.calendar.room(V)
                    and len(self.ready) == len(self.inflight)):
                # nothing more can join this sample-counted batch: more prompts at V (top_up)
                if not self.paused:
                    ready = [g.trainable for g in self.ready.values()]
                    self.calendar.top_up(V, S - sum(ready), min(ready, default=self.k_init))
                if self.room():  # else (paused, no engine slot free) it trains short
                    self.counts.batch_top_ups += 1
                    return wait
                closed = True
            if not (self.ready and closed):
                return wait
        order = sorted(self.ready.values(), key=lambda g: (g.deadline, g.t_done, g.uid))
        batch = order[:n] if S is None else up_to_samples(order, S, V)
        self.calendar.handed(V, [g.deadline for g in batch])
        for g in batch:
            del self.inflight[g.uid], self.ready[g.uid]
            self.counts.prompts_handed += 1
        for d in self.calendar.past(V, lambda d: self.unfinished[d] == 0):
            del self.unfinished[d]  # deadlines past: nothing is due there again
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
            self.counts.deadline_cuts += 1
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
                out += self.drop(pif.uid, DropReason.STALE)
                continue
            pif.regenerations += 1
            self.counts.stale_regenerated += len(stale)
            del self.ready[pif.uid]
            for i in stale:
                pif.state.expire(i)
                pif.payloads.pop(i, None)
                pif.start_version.pop(i, None)
            # Its samples now start at V or later: a fresh deadline, with all the slack.
            self.calendar.move(pif.deadline, V + self.cfg.max_staleness)
            pif.deadline = V + self.cfg.max_staleness
            self.unfinished[pif.deadline] += 1
            out += self._plan(pif)
        return out

    # -- reading -----------------------------------------------------------------------------
    def drain_finished(self) -> list[PromptInFlight]:
        """Prompts whose rollouts finished since the last call, kept or filtered (the prior
        learns from both)."""
        out, self._finished = self._finished, []
        return out

    def in_flight(self) -> int:
        """Admitted prompts not yet handed or dropped (finished-and-waiting included)."""
        return len(self.inflight)

    def sizes(self) -> dict[str, int]:
        """How many entries each of the scheduler's containers holds (tests.acceptance.soak: what a
        days-long run keeps must stay flat)."""
        return {"inflight": len(self.inflight), "ready": len(self.ready),
                **self.calendar.sizes(), "unfinished": len(self.unfinished),
                "requests": len(self.requests),
                "parked": len(self.parked), "recheck": len(self._recheck),
                "finished": len(self._finished), "dropped": len(self.dropped),
                "deferred": len(self.deferred),
                **{f"selection_{k}": n for k, n in sizes(self.selector).items()}}

    def accounting(self) -> Accounting:
        """The scheduler's part of the run's ``Accounting``: its counters, its drops, and the
        selection's draws; the coordinator adds its own (``Coordinator.accounting``)."""
        sel = self.selector  # without one, every prompt drawn was admitted
        return Accounting(scheduler=replace(self.counts),
                          prompts_drawn=sel.drawn if sel else self.counts.prompts_admitted,
                          prompts_deferred=sel.deferred if sel else 0,
                          prompts_waiting_at_end=len(sel.waiting) if sel else 0,
                          drop_reasons=replace(self.drops))

    # -- checkpoints (``actors.scheduler.checkpoint``: snapshot, restore) ------------------
    def resume(self, pif: PromptInFlight, ready: bool) -> list:
        """Take back a prompt from a checkpoint: finished (``ready``), it waits for its
        hand-over, its samples' age checked again; else the rollouts it had in flight at
        the checkpoint are asked for again. Its actions."""
        self.inflight[pif.uid] = pif
        if ready:
            self.ready[pif.uid] = pif
            self._recheck.add(pif.uid)
            return []
        self.unfinished[pif.deadline] += 1
        lost = tuple(pif.state.outstanding_indices())
        if not lost:
            return self._plan(pif)
        self.counts.reissued_requests += 1
        first = pif.state.round_of(lost[0]) == 1 and pif.regenerations == 0
        x = self._dispatch(pif, lost, priority(pif.deadline, first), pif.state.round_of(lost[0]))
        return [x] if x is not None else []
