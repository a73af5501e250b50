"""The coordinator: one async Ray actor that drives the scheduling policy with real actors.

Every decision (admission, which generator, extra rollouts, cancellation, staleness, the
hand-over) is the pure ``actors.scheduler.Scheduler``'s; this actor only carries them out:
it draws prompts and asks the prior, sends ``RolloutRequest``s to vLLM generators, aborts
cancelled completions, scores completions with the task's verifier, and feeds the results
back. Both training modes run through it: ``mode: sync`` is the same coordinator with
``max_staleness = 0`` (see the scheduler's docstring).

    coord = ray.remote(Coordinator).options(max_concurrency=1000).remote(
        generators, prior, estimator, CoordinatorConfig(task_cfg, sched_cfg, ...))
    coord.start.remote()
    batch = ray.get(coord.next_batch.remote(B))        # TrainBatch, samples by reference
    coord.set_version.remote(v, payload)               # after each weight publish

Faults: a generator whose calls raise ``RayActorError`` (dead or restarting) is taken out of
service and its requests re-issued to the others; once Ray has restarted it (or the driver
replaced it: ``replace_generator``), it gets the newest weights and rejoins. A generator restarted without a failed call in flight is caught
by its incarnation token changing. A prior that fails, times out or answers garbage sends
its prompts to the empirical-mean fallback (counted). An error on this side while a
request's completions are handled (a scorer or the scheduler raising) drops the prompt as
``DropReason.COORDINATOR_ERROR`` (dropped.jsonl: ``coordinator_error: <type>``); an
exception in any task it spawns is recorded (``events``, ``last_error``, which
``waiting_on`` reports).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import Counter
from dataclasses import replace

from actors.fault_log import FaultLog
from actors.generator_pool import GeneratorPool
from actors.prompts import (PromptSampler, checked_priors, hand_over, prior_observation,
                            rollout_request)
from actors.scheduler import Cancel, Dispatch, Finished, Scheduler, SchedulerConfig, checkpoint
from actors.scoring import Overlong, Scorer
from common.atomic import write_atomic
from common.records import Accounting, DropReason, WaitingOn
from common.types import Rollout, SamplingConfig, TrainBatch

MAX_REQUEST_FAILURES = 3  # engine errors (not deaths) on one prompt before it is dropped


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """What a run's coordinator is told besides its peers (generators, prior) and its
    estimator: built from the run's config by ``cluster.run.start.coordinator_config``."""

    task: object                   # tasks.TaskConfig: each side builds the task from it
    sched: SchedulerConfig
    sampling: SamplingConfig = SamplingConfig()
    seed: int = 0                  # the prompt stream's
    version: int = 0               # the policy version the generators serve at the start
    prior_timeout_s: float = 10.0
    request_timeout_s: float = 600.0
    score_workers: int = 0
    score_timeout_s: float = 10.0
    overlong: Overlong | None = None
    restore: str | None = None     # a checkpoint's run_state.msgpack to continue from
    score_fault: tuple[str, int] = ("none", 0)
    log_path: str | None = None
    # The learner's ranks: each batch's samples go to them by reference, one shard each,
    # put in the object store here (common.sharding); 0: inline in the batch (in-process use)
    learner_ranks: int = 0


class Coordinator:
    """Composed of the scheduler (every decision), the generator pool (health, restarts,
    rejoins, aborts), the fault log, the prompt sampler and the scorer; it owns the asyncio
    tasks that carry the decisions out."""

    def __init__(self, generators: list, prior, estimator, cfg: CoordinatorConfig):
        from common.logs import to_file
        from tasks import make_task_from_config

        to_file(cfg.log_path)
        self.pool = GeneratorPool(generators)
        self.faults = FaultLog()
        self.prior, self.prior_timeout_s = prior, cfg.prior_timeout_s
        self.request_timeout_s = cfg.request_timeout_s
        self.task = make_task_from_config(cfg.task)
        self.scorer = Scorer(self.task, functools.partial(make_task_from_config, cfg.task),
                             cfg.score_workers, cfg.score_timeout_s, cfg.overlong, *cfg.score_fault)
        self.sampling = cfg.sampling
        self.sampler = PromptSampler(self.task.train(), cfg.seed)
        self.sched = Scheduler(cfg.sched, estimator, len(self.pool), cfg.version, clock=time.time)
        sel = self.sched.selector
        # The prior is asked before admission when the estimator reads it or selection does
        self.needs_prior = estimator.needs_prior or (sel is not None and sel.needs_scores)
        self._said_unscored = False  # "admission falls back to the data order": said once
        self.notes: list[str] = []   # to say once on the run's console (next batch carries)
        self.learner_ranks = cfg.learner_ranks
        self.prior_pending_since: float | None = None
        self.failures = Counter()        # uid -> engine errors
        self._admitting = False
        self._tasks: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._stopped = False
        self._restored: list = []  # dispatches of the rollouts in flight at the checkpoint
        self._drawing_from: int | None = None  # stream position of prompts awaiting the prior
        if cfg.restore is not None:
            self._restore(cfg.restore)

    # -- control (called by the driver) --------------------------------------------------
    async def start(self) -> None:
        self._apply(self._restored)
        self._restored = []
        self._kick()

    async def next_batch(self, n: int) -> TrainBatch:
        """Wait until the scheduler hands over ``n`` prompts at the current version."""
        while True:
            self._wake.clear()
            got = self.sched.take_batch(n)
            if got is not None:
                prompts, actions = got
                self._apply(actions)
                if prompts:
                    break
            self._kick()  # a sample-counted batch short of S takes more prompts (take_batch)
            await self._wake.wait()
        self._kick()
        dropped, self.sched.dropped = self.sched.dropped, []
        notes, self.notes = self.notes, []
        deferred, self.sched.deferred = self.sched.deferred, []
        return hand_over(prompts, self.sched.version, self.sched.in_flight(), dropped,
                         self.learner_ranks, generated=self.sched.counts.rollouts_dispatched,
                         notes=notes, deferred=deferred)

    async def set_version(self, version: int, payload=None) -> None:
        """Learner published ``version`` (every live generator loaded it)."""
        self.sched.set_version(version)
        if payload is not None:
            self.pool.payload = payload
        self._kick()

    async def serving(self) -> list[bool]:
        """Which generators are in service: a lost one (dead, restarting, its node gone) is
        not until it rejoins with the newest weights, so the driver neither publishes to it
        nor waits on it."""
        return list(self.sched.alive)

    async def publish_targets(self) -> list[bool]:
        """The generators a publish goes to: those in service, and those back but waiting for
        a publish to get the newest weights (restarted under a broadcast transport: a
        restarted engine is in no group, and only the sender can take it into one)."""
        return [a or i in self.pool.awaiting_publish for i, a in enumerate(self.sched.alive)]

    async def replace_generator(self, i: int, handle) -> None:
        """Generator ``i`` is a new actor (its node was lost: ``cluster.nodes.replace``): in
        service once it has the newest weights, as one Ray restarted; the old one's work is
        re-issued now."""
        self.pool.replace(i, handle)
        self._lost(i, "replaced")
        for rid in [r for r, q in self.sched.requests.items() if q.dispatch.generator == i]:
            self._apply(self.sched.on_request_failed(rid))
        self._kick()

    async def pause(self) -> None:
        """Admit nothing new (evaluation runs on the generators); rollouts in flight go on."""
        self.sched.paused = True

    async def resume(self) -> None:
        self.sched.paused = False
        self._kick()

    async def stop(self) -> Accounting:
        self._stopped = True
        for t in list(self._tasks):
            t.cancel()
        self.scorer.close()
        return self.accounting()

    # -- checkpoints: every admitted, untrained prompt and what to continue it with ----------
    async def snapshot_to(self, path: str) -> int:
        """Write every admitted, untrained prompt (estimator state, finished rollouts), the
        sampler position, the requests each generator served and the fault log to ``path``
        (msgpack: a safe format); returns prompts written. Taken between two awaits: a
        consistent point of the scheduler."""
        import msgpack

        snap = {"scheduler": checkpoint.snapshot(self.sched, dataclasses.asdict,
                                                 Rollout.to_dict),
                "data_pos": self.admitted_pos, "served": list(self.pool.served),
                **self.faults.snapshot()}
        await asyncio.to_thread(write_atomic, path, msgpack.packb(snap, use_bin_type=True))
        return len(snap["scheduler"]["inflight"])

    def _restore(self, path: str) -> None:
        """A checkpoint's ``snapshot_to`` file into this fresh coordinator."""
        import msgpack

        from tasks.base import Problem

        with open(path, "rb") as f:
            snap = msgpack.unpackb(f.read(), raw=False, strict_map_key=False)
        try:
            self._restored = checkpoint.restore(self.sched, snap["scheduler"],
                                                lambda d: Problem(**d), lambda d: Rollout(**d))
        except (KeyError, TypeError, ValueError) as err:  # the digests refuse an edited file first
            raise ValueError(f"{path}: not a coordinator state this code wrote "
                             f"({type(err).__name__}: {err})") from None
        self.sampler.position = snap["data_pos"]
        # Checkpoints written before ``served`` was a list kept it among the counts.
        self.pool.served = snap.get("served") or [snap["counts"].get(f"served{i}", 0)
                                                  for i in range(len(self.pool))]
        self.faults.restore(snap["counts"], snap["events"])

    @property
    def admitted_pos(self) -> int:
        """The stream position up to which prompts were admitted: prompts drawn but still
        waiting for the prior are not (a resumed run draws them again)."""
        return self.sampler.position if self._drawing_from is None else self._drawing_from

    def accounting(self) -> Accounting:
        s = self.sched
        return replace(s.accounting(), prompts_in_flight_at_end=s.in_flight(),
                          # prompts run without a prior: admitted as the prior failed (a
                          # selector admits unscored candidates in data order: its fallbacks)
                          prior_fallbacks=self.faults.counts.prior_fallbacks
                          + (s.selector.fallbacks if s.selector else 0),
                          requests_per_generator=list(self.pool.served),
                          data_pos=self.admitted_pos, generator_events=list(self.faults.events),
                          scoring=replace(self.scorer.counts),
                          inflight_uids=sorted(s.inflight),
                          dropped_since_last_batch=list(s.dropped),
                          deferred_since_last_batch=list(s.deferred),
                          waiting_uids=[c.uid for c in s.selector.waiting] if s.selector else [])

    def waiting_on(self) -> WaitingOn:
        """For the trainer's watchdog: which role the hand-over is waiting for, and what that
        role last reported."""
        s, now, f = self.sched, time.time(), self.faults
        loads = {i: n for i, n in enumerate(s.load) if n}
        if self.prior_pending_since is not None:
            role = f"prior (asked {now - self.prior_pending_since:.0f}s ago)"
        elif not any(s.alive):
            role = "generators (every one lost; waiting for a restart)"
        elif loads:
            i = max(loads, key=lambda g: now - self.pool.last_heard[g])
            role = (f"generator {i} ({loads[i]} rollouts outstanding, last answer "
                    f"{now - self.pool.last_heard[i]:.0f}s ago)")
        elif s.parked:
            role = "generators (work parked until one returns)"
        else:
            role = "coordinator (nothing in flight, no room to admit)"
        return WaitingOn(
            role=role, version=s.version,
            prompts_due_unfinished=sum(c for d, c in s.unfinished.items() if d <= s.version),
            ready=len(s.ready), in_flight=s.in_flight(), room=s.room(), paused=s.paused,
            outstanding_per_generator=loads, alive=list(s.alive),
            seconds_since_generator_answered=self.pool.silent_s(now), events=f.events[-5:],
            last_prior_error=f.last_prior_error, last_error=f.last_error)

    def state_size(self) -> dict[str, int]:
        """Entries held, per container (the scheduler's, and this actor's own): tests.acceptance.soak."""
        return {**self.sched.sizes(), "tasks": len(self._tasks), "failures": len(self.failures),
                **self.faults.sizes(), **self.pool.sizes()}

    # -- carrying out the scheduler's actions ---------------------------------------------
    def _apply(self, actions) -> None:
        for a in actions:
            if isinstance(a, Dispatch):
                self._spawn(self._generate(a))
            elif isinstance(a, Cancel):
                self._spawn(self.pool.cancel(a, self.request_timeout_s))
        self._feedback()
        self._wake.set()

    def _kick(self) -> None:
        # The flag is set here, not in the task: several rollouts finishing in one turn of the
        # loop each kick, and two admitters would draw overlapping stretches of the stream
        # (the first one's given-back prompts were then skipped: lost, never admitted).
        if not self._admitting and not self._stopped:
            self._admitting = True
            self._spawn(self._admit())

    async def _admit(self) -> None:
        """Admit as many prompts as the scheduler has room for. A prompt's uid is its
        position in the sampler's stream (``s<position>``): the same prompt gets the same uid
        in a run resumed from a checkpoint, so "trained once" can be checked by uid."""
        try:
            while not self._stopped and (n := self.sched.room()) > 0:
                if self.sched.selector is not None:
                    await self._admit_selected()
                    continue
                start = self._drawing_from = self.sampler.position
                problems = self.sampler.next(n)
                priors = await self._priors(problems)  # a snapshot may be taken meanwhile
                self._drawing_from = None
                # The room may have shrunk while the prior answered (a generator lost, a stop):
                # admit what fits and give the rest back to the stream.
                m = 0 if self._stopped else min(n, self.sched.room())
                self.sampler.position = start + m
                if m == 0:
                    return
                self._apply(self.sched.admit(problems[:m], priors[:m],
                                             uids=[f"s{start + i}" for i in range(m)]))
        finally:
            self._admitting = False

    async def _admit_selected(self) -> None:
        """Admission by selection (``actors.scheduler.selection``): fill the candidate window
        from the stream, have every waiting candidate scored in one call, and admit what the
        scheduler chooses. The window is part of the checkpoint, so nothing drawn is lost."""
        s = self.sched
        start, n = self.sampler.position, s.to_draw()
        s.offer(self.sampler.next(n), [f"s{start + i}" for i in range(n)])
        if self.needs_prior:
            # nothing else changes the window meanwhile; a failure is counted by the prompts
            # it admits unscored (the selector's fallbacks), not by the candidates asked about
            priors = await self._priors(s.waiting(), count=False)
            if self._stopped:
                return
            s.score(priors)
            if any(p is None for p in priors) and not self._said_unscored:
                self._said_unscored = True
                self.notes.append("the prior did not answer: admission falls back to the data "
                                  "order meanwhile (counted: summary.json prior_fallbacks)")
        self._apply(s.admit_selected())

    async def _priors(self, problems, count: bool = True) -> list:
        if not self.needs_prior:
            return [None] * len(problems)
        self.prior_pending_since = time.time()
        try:
            ps = await asyncio.wait_for(
                self.prior.predict.remote([p.prompt for p in problems]), self.prior_timeout_s)
            return checked_priors(ps, len(problems))
        except Exception as err:  # timeout, dead actor, garbage: fall back, never wait forever
            self.faults.prior_failed(len(problems) if count else 0, err)
            return [None] * len(problems)
        finally:
            self.prior_pending_since = None

    def _feedback(self) -> None:
        """Tell the prior how the prompts that just finished went (its in-context profile)."""
        done = self.sched.drain_finished()
        if done and self.prior is not None and self.needs_prior:
            self.prior.observe.remote([prior_observation(g, self.task.rewards,
                                                         self.sched.version) for g in done])

    async def _generate(self, d: Dispatch) -> None:
        pif = self.sched.inflight.get(d.uid)
        if pif is None:
            return
        req = rollout_request(d, pif.problem, self.sampling)
        g, failed = self.pool[d.generator], None
        try:
            rollouts = await asyncio.wait_for(g.generate.remote(req), self.request_timeout_s)
        except Exception as err:
            failed = err
        if g is not self.pool[d.generator]:  # a replaced actor's answer: its work went elsewhere
            return self._apply(self.sched.on_request_failed(d.request_id))
        if failed is not None:
            return self._apply(self._request_failed(d, failed))
        try:
            actions = await self._completed(d, pif, rollouts)
        except Exception as err:  # a bug on this side: a scorer or the scheduler raised
            actions = self._coordinator_error(d, err)
        self._apply(actions)
        self._kick()

    def _request_failed(self, d: Dispatch, err: Exception) -> list:
        """The scheduler's actions for a request whose generator call raised."""
        import ray

        if isinstance(err, asyncio.TimeoutError):
            # before it is out of service: its rejoin waits for the abort
            self.pool.abort_timed_out(d, self._spawn, self.request_timeout_s)
        if isinstance(err, (ray.exceptions.RayActorError, asyncio.TimeoutError)):
            # Died, restarting (ActorUnavailableError) or hung: out of service until it
            # answers again with the newest weights; its work goes elsewhere.
            self._lost(d.generator, type(err).__name__)
            return self.sched.on_request_failed(d.request_id, generator_lost=True)
        self.failures[d.uid] += 1  # an engine error on this request
        reason = (DropReason.GENERATOR_ERROR if self.failures[d.uid] >= MAX_REQUEST_FAILURES
                  else None)
        return self.sched.on_request_failed(d.request_id, drop_reason=reason,
                                            detail=type(err).__name__)

    async def _completed(self, d: Dispatch, pif, rollouts: list[Rollout]) -> list:
        """Score a request's completions and report them to the scheduler; its actions."""
        if not self.pool.answered(d.generator, rollouts[0].incarnation if rollouts else None):
            # Restarted between two calls: it served initial weights. Discard, re-sync it.
            self._lost(d.generator, "new incarnation")
            return self.sched.on_request_failed(d.request_id, generator_lost=True)
        verdicts = await asyncio.gather(*(
            self.scorer.score(pif.problem, r.text, len(r.token_ids)) for r in rollouts
            if not r.cancelled))
        it = iter(verdicts)
        finished = []
        for pos, r in enumerate(rollouts):
            if not r.cancelled:
                v = next(it)
                r.reward, r.parsed, r.reward_extras = v.reward, v.parsed, v.extras
            finished.append(Finished(pos, r.reward if r.reward is not None else 0.0,
                                     len(r.token_ids), r.version, r, r.cancelled))
        return self.sched.on_rollouts(d.request_id, finished)

    def _coordinator_error(self, d: Dispatch, err: Exception) -> list:
        """Handling request ``d``'s completions raised here: drop its prompt with a counted
        reason (the scheduler may have taken part of the report, so the prompt cannot be
        trusted to go on) and free its slots. Nothing is lost and nothing waits forever."""
        self.faults.note("coordinator_error", -1, err, f"request {d.request_id}: ")
        why, detail = DropReason.COORDINATOR_ERROR, type(err).__name__
        actions = self.sched.on_request_failed(d.request_id, drop_reason=why, detail=detail)
        return actions + self.sched.drop(d.uid, why, detail=detail)  # [] if dropped just now

    # -- faults ------------------------------------------------------------------------------
    def _lost(self, i: int, why: str) -> None:
        if self.sched.alive[i]:
            self.sched.mark_lost(i)
            self.faults.lost(i, why)
            self._spawn(self._rejoin(i))

    async def _rejoin(self, i: int) -> None:
        """Generator i back (restarted, the newest weights loaded): use it again."""
        loaded = await self.pool.rejoin(i, lambda: self.sched.version, lambda: self._stopped,
                                        self.request_timeout_s)
        if loaded is not None:
            self.faults.event("rejoined", i, loaded)
            self._apply(self.sched.mark_back(i))
            self._kick()

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task) -> None:
        """A spawned task ended: an exception nobody awaits would vanish; record it."""
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            name = getattr(t.get_coro(), "__qualname__", "task")
            self.faults.note("task_error", -1, t.exception(), f"{name}: ")
