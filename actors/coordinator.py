"""The coordinator: owns every in-flight prompt and keeps every generator busy.

One async Ray actor. For each prompt: ask the prior, dispatch k_init rollouts, feed rewards
into the estimator's per-prompt state as they arrive, and when the sequential test asks for
more, send one more request to the least-loaded generator (up to k_max). A prompt whose test
is satisfied is finished at once and queued for the learner; the coordinator never waits
for a batch. New prompts are admitted whenever generator capacity frees, extra rollouts
first (they are dispatched the moment a reward arrives, before admission runs), and
admission holds while the learner is more than ``max_staleness`` versions behind:
prompts admitted (and not dropped) <= (version + max_staleness + 1) * batch_prompts, and
no admission while the oldest prompt in flight is more than ``max_staleness`` versions old.

Accounting: every admitted prompt ends exactly once: taken by the learner (``trained``),
dropped with a counted reason, or still in flight (or queued) when the run stops.
Faults: a request whose generator died is re-issued to the others while Ray restarts that
generator, which rejoins once it answers and has loaded the newest weights; a prior that
fails or times out sends its prompts to the empirical-mean fallback (counted).
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque

from actors.types import SamplingConfig
from cluster.rollouts import Group, PromptSampler, checked_priors
from estimator.state import PromptState

MAX_REQUEST_FAILURES = 3  # engine errors (not deaths) on one prompt before it is dropped


class Coordinator:
    def __init__(self, generators: list, prior, task_cfg, estimator, rollout_cfg, *,
                 seed: int = 0, data_pos: int = 0, version: int = 0,
                 prior_timeout_s: float = 10.0, slots_per_generator: int = 64,
                 accounting: dict | None = None):
        from tasks import make_task_from_config

        self.gens = list(generators)
        self.alive = [True] * len(self.gens)
        self.load = [0] * len(self.gens)          # outstanding rollouts per generator
        self.served = [0] * len(self.gens)        # requests served per generator
        self.prior, self.prior_timeout_s = prior, prior_timeout_s
        self.task = make_task_from_config(task_cfg)
        self.est, self.rc = estimator, rollout_cfg
        self.sampling = SamplingConfig(temperature=rollout_cfg.temperature,
                                       top_p=rollout_cfg.top_p, max_tokens=rollout_cfg.max_tokens)
        self.sampler = PromptSampler(self.task.train(), seed, data_pos)
        self.slots = slots_per_generator
        self.version, self.payload = version, None
        self.base_version = version
        self.inflight: dict[str, Group] = {}
        self.ready: deque[Group] = deque()
        self.counts = Counter()
        self.drops = Counter()
        self._ids = itertools.count()
        self._waves = itertools.count()
        self._admitting = False
        self._tasks: set[asyncio.Task] = set()
        self._ready_event = asyncio.Event()
        self._stopped = False
        self.t_start = time.time()
        self.events: list[tuple] = []  # generator faults, for the summary
        if accounting:  # resuming: prompts in flight at the checkpoint are lost, say so
            self.counts["admitted"] = accounting["prompts_admitted"]
            self.counts["handed"] = accounting.get("prompts_handed", 0)
            self.drops.update(accounting.get("drop_reasons", {}))
            lost = self.counts["admitted"] - self.counts["handed"] - sum(self.drops.values())
            if lost > 0:
                self.drops["in_flight_at_checkpoint"] += lost

    # -- control (called by the driver) --------------------------------------------------
    async def start(self) -> None:
        self._kick()

    async def next_batch(self, n: int) -> dict:
        """Wait until ``n`` finished prompts are queued, hand them over (streamed: the first
        ``n`` to finish, whatever wave they were admitted in)."""
        while len(self.ready) < n:
            self._ready_event.clear()
            await self._ready_event.wait()
        groups = [self.ready.popleft() for _ in range(n)]
        self.counts["handed"] += n
        self._kick()
        return {"groups": [g.export() for g in groups],
                "samples": [s for g in groups for s in g.samples()],
                "extra": {"inflight_prompts": len(self.inflight) + len(self.ready),
                          "prior_fallbacks": self.counts["prior_fallback"],
                          "reissued_requests": self.counts["reissued"]}}

    async def set_version(self, version: int, payload=None) -> None:
        self.version = version
        if payload is not None:
            self.payload = payload
        self._kick()

    async def stop(self) -> dict:
        self._stopped = True
        for t in list(self._tasks):
            t.cancel()
        return self.summary()

    def summary(self) -> dict:
        c = self.counts
        return {"prompts_admitted": c["admitted"], "prompts_handed": c["handed"],
                "prompts_dropped": sum(self.drops.values()),
                "prompts_in_flight_at_end": len(self.inflight) + len(self.ready),
                "drop_reasons": dict(self.drops), "prior_fallbacks": c["prior_fallback"],
                "extra_rollouts_requested": c["extra_requests"],
                "reissued_requests": c["reissued"], "generator_restarts": c["restarts"],
                "requests_per_generator": list(self.served), "data_pos": self.sampler.position,
                "generator_events": list(self.events)}

    def status(self) -> dict:
        return {"inflight": len(self.inflight), "ready": len(self.ready),
                "load": list(self.load), "alive": list(self.alive), **self.summary()}

    # -- admission -------------------------------------------------------------------------
    def _room(self) -> int:
        """How many prompts may be admitted now (capacity, in-flight cap, staleness)."""
        rc = self.rc
        capacity = self.slots * sum(self.alive) - sum(self.load)
        by_slots = capacity // self.est.cfg.k_init
        by_cap = rc.max_inflight_prompts - len(self.inflight)
        # Counted from this coordinator's start: versions may not start at 0 (resume, reuse).
        live = self.counts["admitted_here"] - self.counts["dropped_here"]
        by_staleness = ((self.version - self.base_version + rc.max_staleness + 1)
                        * rc.batch_prompts - live)
        # Per prompt too: while the oldest prompt in flight was admitted more than
        # max_staleness versions ago, admit nothing, so the generators finish it first
        # (else slow prompts, those the test keeps asking more of, would starve).
        if self.inflight and self.version - min(
                g.admitted_version for g in self.inflight.values()) > rc.max_staleness:
            return 0
        return max(0, min(by_slots, by_cap, by_staleness))

    def _kick(self) -> None:
        if not self._admitting and not self._stopped:
            self._spawn(self._admit())

    async def _admit(self) -> None:
        self._admitting = True
        try:
            while not self._stopped and (n := self._room()) > 0:
                problems = self.sampler.next(n)
                wave = next(self._waves)
                priors = await self._priors(problems)
                if self._stopped:  # stopped while asking the prior: these were never admitted
                    return
                # Counted only now, with no await until they are in `inflight`, so a stop at
                # any point leaves every admitted prompt accounted for.
                self.counts["admitted"] += n
                self.counts["admitted_here"] += n
                for p, prior in zip(problems, priors):
                    g = Group(p, PromptState(self.est, prior), wave=wave,
                              uid=f"{p.id}#{next(self._ids)}", admitted_version=self.version)
                    self.inflight[g.uid] = g
                    self._dispatch(g)
        finally:
            self._admitting = False

    async def _priors(self, problems) -> list:
        if not self.est.needs_prior:
            return [None] * len(problems)
        try:
            ps = await asyncio.wait_for(
                self.prior.predict.remote([p.prompt for p in problems]), self.prior_timeout_s)
            return checked_priors(ps, len(problems))
        except Exception as err:  # timeout, dead actor, garbage: fall back, never wait forever
            self.counts["prior_fallback"] += len(problems)
            self.counts["prior_errors"] += 1
            self.last_prior_error = f"{type(err).__name__}: {err}"
            return [None] * len(problems)

    # -- rollouts ----------------------------------------------------------------------------
    def _dispatch(self, g: Group) -> None:
        for req, base in g.requests(self, self.sampling):
            if base >= self.est.cfg.k_init:
                self.counts["extra_requests"] += req.n
            self._spawn(self._request(g, req, base))
        if g.state.done:
            self._finish(g)

    def request_id(self) -> str:  # Group.requests asks its pool for ids
        return f"c{next(self._ids)}"

    async def _pick(self) -> int:
        """The least-loaded live generator; waits while every one is restarting."""
        while not any(self.alive):
            await asyncio.sleep(0.2)
        return min((i for i, a in enumerate(self.alive) if a), key=lambda i: self.load[i])

    async def _request(self, g: Group, req, base: int, failures: int = 0) -> None:
        import ray

        i = await self._pick()
        self.load[i] += req.n
        try:
            rollouts = await self.gens[i].generate.remote(req)
        except ray.exceptions.RayActorError as err:  # died, or restarting (ActorUnavailableError)
            self.load[i] -= req.n
            self.counts["reissued"] += 1
            self._lost(i, type(err).__name__)
            return await self._request(g, req, base, failures)
        except Exception as err:
            self.load[i] -= req.n
            if failures + 1 >= MAX_REQUEST_FAILURES:
                return self._drop(g, f"generator_error: {type(err).__name__}")
            return await self._request(g, req, base, failures + 1)
        self.load[i] -= req.n
        self.served[i] += 1
        if self.version > 0 and any(r.version == 0 for r in rollouts) and self.payload is not None:
            self._lost(i, "served version 0")  # restarted on its initial weights: re-sync it
        if g.uid not in self.inflight:  # dropped meanwhile
            return
        g.add(self.task, rollouts, base)
        self._dispatch(g)  # extra rollouts go out before admission runs again
        self._kick()

    def _finish(self, g: Group) -> None:
        del self.inflight[g.uid]
        g.t_done = time.time()
        if self.prior is not None and self.est.needs_prior:
            self.prior.observe.remote(
                [(g.problem.prompt, g.success_rate(self.task.rewards), self.version)])
        if not g.state.keep:
            return self._drop(g, "filtered_all_equal", already_removed=True)
        self.ready.append(g)
        self._ready_event.set()

    def _drop(self, g: Group, reason: str, already_removed: bool = False) -> None:
        if not already_removed:
            self.inflight.pop(g.uid, None)
        self.drops[reason] += 1
        self.counts["dropped_here"] += 1
        self._kick()

    # -- faults ------------------------------------------------------------------------------
    def _lost(self, i: int, why: str) -> None:
        if self.alive[i]:
            self.alive[i] = False
            self.counts["restarts"] += 1
            self.events.append((round(time.time() - self.t_start, 3), "lost", i, why))
            self._spawn(self._rejoin(i))

    async def _rejoin(self, i: int) -> None:
        """Wait for Ray to restart generator i, give it the newest weights, use it again."""
        while not self._stopped:
            try:
                await self.gens[i].ready.remote()
                loaded = await self.gens[i].version.remote()
                if self.payload is not None and loaded < self.version:
                    await self.gens[i].update_weights.remote(self.payload, self.version)
                    continue  # re-check: a newer version may have been published meanwhile
                self.alive[i] = True
                self.events.append((round(time.time() - self.t_start, 3), "rejoined", i, loaded))
                self._kick()
                return
            except Exception:
                await asyncio.sleep(1.0)

    def _spawn(self, coro) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
