"""A continuous-batching inference engine as a discrete-event server (one per generator GPU).

The engine holds up to ``max_num_seqs`` running sequences; each decode step advances every
running sequence by one token and takes ``step_times[n]`` seconds for n running sequences;
a sequence finishes on the step that produces its last token; waiting sequences join at step
boundaries (vLLM's scheduler admits new requests between steps). Between two changes of the
running set every step takes the same time, so the engine only needs an event at the next
change: the next finish, a join at the next boundary, or the end of a weight-sync pause.

Progress is counted in steps: ``S`` steps done at time ``t`` (both at a boundary); a sequence
that joins at step S with L tokens finishes at step S + L (heap ``running``).
"""
from __future__ import annotations

import heapq
import math
from collections import deque


class Rollout:
    __slots__ = ("prompt", "index", "length", "reward", "version", "t_start", "t_end")

    def __init__(self, prompt, index: int, length: int, reward: float):
        self.prompt, self.index, self.length, self.reward = prompt, index, length, reward
        self.version = -1          # policy version of the engine when the rollout started
        self.t_start = self.t_end = math.nan


DECODE, SYNC = 0, 1  # segment kinds


class Engine:
    def __init__(self, idx: int, step_times, max_num_seqs: int, sync_s: float, sim):
        self.idx, self.step_times, self.max = idx, step_times, max_num_seqs
        self.sync_s, self.sim = sync_s, sim
        self.running: list = []       # heap of (finish_step, seq_no, Rollout)
        self.waiting: deque = deque()
        self.outstanding = 0          # running + waiting (kept as a plain int: the hot path)
        self.S, self.t = 0, 0.0       # steps done at the last boundary, and its time
        self.version = 0
        self.pending_version: int | None = None
        self.paused_until: float | None = None
        self.next_t: float | None = None
        self.token = 0                # bumps invalidate scheduled events
        self.in_boundary = False
        self.seg_start, self.seg_n, self.seg_kind = 0.0, 0, DECODE
        self.segments: list = []      # (t0, t1, n, kind); idle time is not recorded
        self._seq = 0

    # -- the coordinator's side --------------------------------------------------------------
    def submit(self, r: Rollout, now: float, delay: float = 0.0) -> None:
        """Hand a rollout to this engine; it arrives ``delay`` seconds later (the RPC)."""
        self.outstanding += 1  # counted at once, so the balancer sees it in transit
        if delay > 0:
            self.sim.schedule(now + delay, self._arrive, r)
        else:
            self._arrive(r, now)

    def _arrive(self, r: Rollout, now: float | None = None) -> None:
        self.waiting.append(r)
        self._wake(self.sim.now if now is None else now)

    def request_sync(self, version: int, now: float) -> None:
        """Load weights ``version`` at the next step boundary, pausing ``sync_s``."""
        self.pending_version = version
        self._wake(now, force=True)

    # -- the event side ----------------------------------------------------------------------
    def _dt(self) -> float:
        return self.step_times[len(self.running)]

    def _next_boundary(self, now: float) -> float:
        dt = self._dt()
        return self.t + math.ceil((now - self.t) / dt - 1e-9) * dt

    def _wake(self, now: float, force: bool = False) -> None:
        """Make sure an event happens at the first boundary >= now (where joins can occur)."""
        if self.in_boundary or self.paused_until is not None:
            return  # handled at the end of the boundary / when the pause ends
        if self.running:
            if len(self.running) >= self.max and not force:
                return  # full: the next finish frees a slot and is already scheduled
            tb = self._next_boundary(now)
        else:
            tb = now
        if self.next_t is None or tb < self.next_t - 1e-12:
            self._schedule(tb)

    def _schedule(self, t: float) -> None:
        self.token += 1
        self.next_t = t
        self.sim.schedule(t, self.on_event, self.token)

    def _close_segment(self, now: float) -> None:
        if now > self.seg_start and (self.seg_n > 0 or self.seg_kind == SYNC):
            self.segments.append((self.seg_start, now, self.seg_n, self.seg_kind))
        self.seg_start = now

    def on_event(self, token: int) -> None:
        if token != self.token:
            return  # superseded by an earlier wake-up
        now = self.sim.now
        self.next_t = None
        self._close_segment(now)
        finished = []
        if self.paused_until is not None:
            self.paused_until = None
        elif self.running:
            self.S += round((now - self.t) / self._dt())
            while self.running and self.running[0][0] <= self.S:
                finished.append(heapq.heappop(self.running)[2])
            self.outstanding -= len(finished)
        self.t = now
        if finished:
            self.in_boundary = True
            self.sim.on_finished(self, finished)
            self.in_boundary = False
        if self.pending_version is not None:  # weights load between steps; sequences stall
            self.version, self.pending_version = self.pending_version, None
            self.paused_until = now + self.sync_s
            self.seg_n, self.seg_kind = len(self.running), SYNC
            self._schedule(self.paused_until)
            return
        self._admit(now)

    def _admit(self, now: float) -> None:
        while self.waiting and len(self.running) < self.max:
            r = self.waiting.popleft()
            r.version, r.t_start = self.version, now
            self._seq += 1
            heapq.heappush(self.running, (self.S + r.length, self._seq, r))
        self.seg_n, self.seg_kind = len(self.running), DECODE
        if self.running:
            self._schedule(self.t + (self.running[0][0] - self.S) * self._dt())

    def close(self, now: float) -> None:
        """Close the open segment at the end of the simulation."""
        self._close_segment(now)
