"""The coordinator's fault paths on a real asyncio loop with stand-in actor handles (no Ray
calls are made): an error on the coordinator's side (the scheduler or a scorer raising while
a request's completions are handled) drops the prompt with a counted reason and frees its
slots; an exception in any task the coordinator spawned is recorded for the watchdog; a
request that times out is aborted in its engine, and its generator is used again only once
that abort has been answered."""
from __future__ import annotations

import asyncio

from actors.coordinator import Coordinator, CoordinatorConfig
from actors.scheduler import SchedulerConfig
from common.records import DropCounts, ScoringCounts
from common.types import Rollout
from estimator import make_estimator
from tasks import TaskConfig


class Remote:
    def __init__(self, fn):
        self.remote = fn


async def until(cond, what: str, turns: int = 2000, pause_s: float = 0.0) -> None:
    """Let the loop run until ``cond()`` holds (a bounded number of turns of ``pause_s``)."""
    for _ in range(turns):
        if cond():
            return
        await asyncio.sleep(pause_s)
    raise AssertionError(f"still waiting for {what} after {turns} turns of the loop")


def rollout(req, cancelled: bool = False) -> Rollout:
    return Rollout(request_id=req.request_id, prompt_id=req.prompt_id, prompt_token_ids=[1],
                   token_ids=[2, 3], logprobs=[-0.5, -0.5], text="3", finish_reason="stop",
                   version=0, incarnation="g0-life1", cancelled=cancelled)


class FirstAnswerGenerator:
    """Answers its first request with ``answer(req)``; holds every later one (never answers),
    so that the prompt admitted after a drop stays in flight and the test ends."""

    def __init__(self, answer):
        self.answer, self.requests = answer, []
        self.generate = Remote(self._generate)

    def _generate(self, req):
        self.requests.append(req)
        fut = asyncio.get_running_loop().create_future()
        if len(self.requests) == 1:
            fut.set_result(self.answer(req))
        return fut


class RaisingScorer:
    counts = ScoringCounts()

    async def score(self, problem, text, n_tokens):
        raise RuntimeError("scorer bug")

    def close(self) -> None:
        pass


def coordinator(gen) -> Coordinator:
    return Coordinator([gen], None, make_estimator("grpo"),
                       CoordinatorConfig(TaskConfig(), SchedulerConfig(
                           batch_prompts=1, max_staleness=0, slots_per_generator=4)))


async def first_prompt_fails(c: Coordinator, gen) -> None:
    await c.start()
    await until(lambda: c.sched.drops.total, "the first prompt to be dropped")
    await until(lambda: len(gen.requests) == 2, "the next prompt to be admitted")
    s = c.sched
    assert [uid for uid, _ in s.dropped] == ["s0"] and s.drops.total == 1
    assert set(s.inflight) == {"s1"}                 # the next prompt runs; s0 is nowhere
    assert [r.dispatch.uid for r in s.requests.values()] == ["s1"]  # s0's request is gone
    assert s.load == [4]                             # only s1's 4 rollouts hold slots
    a = s.accounting()
    assert a.scheduler.prompts_admitted == (a.scheduler.prompts_handed + a.prompts_dropped
                                     + s.in_flight())
    assert c.faults.counts.coordinator_error == 1
    assert c.waiting_on().last_error == c.faults.last_error and "s0/" in c.faults.last_error
    assert [e[1] for e in c.faults.events] == ["coordinator_error"]
    await c.stop()


def test_a_scheduler_error_on_a_requests_completions_drops_the_prompt_and_frees_its_slots():
    # A completion that comes back cancelled although the scheduler never cancelled it:
    # Scheduler.on_rollouts raises ValueError.
    async def main():
        gen = FirstAnswerGenerator(lambda req: [rollout(req, cancelled=i == 0)
                                                for i in range(req.n)])
        c = coordinator(gen)
        await first_prompt_fails(c, gen)
        assert c.sched.drops == DropCounts(coordinator_error=1)
        assert c.sched.dropped == [("s0", "coordinator_error: ValueError")]
        assert "ValueError" in c.faults.last_error

    asyncio.run(main())


def test_a_scorer_error_drops_the_prompt_with_its_reason():
    async def main():
        gen = FirstAnswerGenerator(lambda req: [rollout(req) for _ in range(req.n)])
        c = coordinator(gen)
        c.scorer = RaisingScorer()
        await first_prompt_fails(c, gen)
        assert c.sched.drops == DropCounts(coordinator_error=1)
        assert c.sched.dropped == [("s0", "coordinator_error: RuntimeError")]
        assert "RuntimeError: scorer bug" in c.faults.last_error

    asyncio.run(main())


def test_an_exception_in_a_spawned_task_is_recorded_once_per_kind():
    async def main():
        c = coordinator(FirstAnswerGenerator(lambda req: []))

        async def broken():
            raise KeyError("lost track")

        for _ in range(3):
            c._spawn(broken())
        await until(lambda: not c._tasks, "the tasks to end")
        assert c.faults.counts.task_error == 3
        assert "broken: KeyError" in c.faults.last_error and c.waiting_on().last_error == c.faults.last_error
        assert [e[1] for e in c.faults.events] == ["task_error"]  # one event, not one per failure
        await c.stop()

    asyncio.run(main())


class HungGenerator:
    """generate() never answers; cancel() answers when the test says so; ready, version and
    incarnation answer at once. Every call is logged, in order."""

    def __init__(self):
        self.log: list[tuple] = []
        self.abort_answer: asyncio.Future | None = None
        for name in ("generate", "cancel", "ready", "version", "incarnation"):
            setattr(self, name, Remote(getattr(self, f"_{name}")))

    def _future(self, value=None, answer: bool = True):
        fut = asyncio.get_running_loop().create_future()
        if answer:
            fut.set_result(value)
        return fut

    def _generate(self, req):
        self.log.append(("generate", req.request_id))
        return self._future(answer=False)

    def _cancel(self, request_id, positions):
        self.log.append(("cancel", request_id, positions))
        self.abort_answer = self._future(answer=False)
        return self.abort_answer

    def _ready(self):
        self.log.append(("ready",))
        return self._future(True)

    def _version(self):
        return self._future(0)

    def _incarnation(self):
        self.log.append(("incarnation",))
        return self._future("g0-life1")


def test_a_timed_out_request_is_aborted_in_the_engine_before_the_generator_is_used_again():
    async def main():
        gen = HungGenerator()
        c = Coordinator([gen], None, make_estimator("grpo"),
                       CoordinatorConfig(TaskConfig(), SchedulerConfig(
                           batch_prompts=1, max_staleness=0, slots_per_generator=4),
                           request_timeout_s=1.0))
        await c.start()
        await until(lambda: ("incarnation",) in gen.log, "the generator to be asked to rejoin",
                    turns=1000, pause_s=0.01)
        first = gen.log[0][1]
        # The whole timed-out request was aborted, and asked before the rejoin began.
        assert gen.log[1:3] == [("cancel", first, [0, 1, 2, 3]), ("ready",)]
        assert [e[1:] for e in c.faults.events] == [("lost", 0, "TimeoutError")]
        for _ in range(20):  # it answers again, but its abort has not been answered yet
            await asyncio.sleep(0)
        assert c.sched.alive == [False] and len(gen.log) == 4
        gen.abort_answer.set_result(4)
        gen.log.append(("abort answered",))
        await until(lambda: c.sched.alive == [True], "the generator to rejoin")
        await until(lambda: gen.log[-1][0] == "generate", "the work to be re-issued")
        assert gen.log[-2:] == [("abort answered",), ("generate", gen.log[-1][1])]
        assert gen.log[-1][1] != first and c.sched.counts.reissued_requests == 1
        await c.stop()

    asyncio.run(main())


def test_a_replaced_generator_takes_over_its_slot_and_the_old_ones_work_is_reissued():
    """The driver replaced generator 0 (its node was lost: cluster.nodes.replace): the old
    actor's request still in flight is re-issued at once (not at its timeout), the new actor
    is brought in with the newest weights before it gets work, and nothing is sent to it on
    the old actor's behalf (no abort of the old request)."""
    async def main():
        old, new = HungGenerator(), HungGenerator()
        c = Coordinator([old], None, make_estimator("grpo"),
                        CoordinatorConfig(TaskConfig(), SchedulerConfig(
                            batch_prompts=1, max_staleness=0, slots_per_generator=4),
                            request_timeout_s=60.0))
        await c.start()
        await until(lambda: old.log, "the first request", turns=1000, pause_s=0.01)
        first = old.log[0][1]
        await c.replace_generator(0, new)
        await until(lambda: new.log and new.log[-1][0] == "generate", "the re-issued request",
                    turns=1000, pause_s=0.01)
        assert old.log == [("generate", first)]
        assert new.log == [("ready",), ("incarnation",), ("generate", new.log[-1][1])]
        assert new.log[-1][1] != first and c.sched.counts.reissued_requests == 1
        assert c.sched.alive == [True]
        assert [e[1:] for e in c.faults.events][:2] == [("lost", 0, "replaced"),
                                                        ("rejoined", 0, 0)]
        await c.stop()

    asyncio.run(main())


class RestartedGenerator(HungGenerator):
    """Back from a restart at version 0, unable to load the newest weights on its own (a
    broadcast it was not in refuses it, as NotInGroupError does), until a publish that
    includes it loads them (``published``)."""

    def __init__(self):
        super().__init__()
        self.loaded = 0
        self.update_weights = Remote(self._update)

    def _version(self):
        return self._future(self.loaded)

    def _update(self, payload, version):
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(RuntimeError("NotInGroupError: joined none"))
        return fut


def test_a_generator_back_from_a_restart_under_a_broadcast_is_a_publish_target_until_loaded():
    """Under a collective transport a restarted engine is in no group, so it cannot load the
    newest weights by itself: it is a publish target while out of service (so the sender takes
    it into its group), and back in service once a publish has loaded them. Before
    2026-12-06 publishes went only to generators in service, and it never came back."""
    async def main():
        gen = RestartedGenerator()
        c = Coordinator([gen], None, make_estimator("grpo"),
                        CoordinatorConfig(TaskConfig(), SchedulerConfig(
                            batch_prompts=1, max_staleness=0, slots_per_generator=4)))
        await c.set_version(3, payload="broadcast-of-v3")
        c._lost(0, "restarted")
        await until(lambda: 0 in c.pool.awaiting_publish, "the rejoin to find it cannot load",
                    turns=1000, pause_s=0.01)
        assert await c.serving() == [False] and await c.publish_targets() == [True]
        gen.loaded = 3  # the publish that included it
        await until(lambda: c.sched.alive == [True], "it to be back in service",
                    turns=1000, pause_s=0.01)
        assert await c.publish_targets() == [True] and not c.pool.awaiting_publish
        await c.stop()

    asyncio.run(main())
