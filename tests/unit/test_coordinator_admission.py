"""The coordinator's admission on a real asyncio loop with stand-in actor handles (a prior
whose answers we release by hand, generators that never answer): the stream of prompts is
admitted in order, each prompt once, even when many rollouts finishing in one turn of the
loop each ask for admission and the room shrinks while the prior is thinking."""
from __future__ import annotations

import asyncio

from actors.coordinator import Coordinator, CoordinatorConfig
from actors.scheduler import SchedulerConfig
from estimator import make_estimator
from tasks import TaskConfig


class Remote:
    def __init__(self, fn):
        self.remote = fn


class HeldPrior:
    """predict() answers only when the test releases it; observe() is a no-op."""

    def __init__(self):
        self.asked: list[asyncio.Future] = []
        self.predict = Remote(self._predict)
        self.observe = Remote(lambda *a: None)

    def _predict(self, prompts):
        fut = asyncio.get_running_loop().create_future()
        self.asked.append((fut, len(prompts)))
        return fut


class SilentGenerator:
    """Takes requests and never answers (rollouts stay outstanding)."""

    def __init__(self):
        self.generate = Remote(lambda req: asyncio.get_running_loop().create_future())


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_many_kicks_in_one_turn_start_one_admitter_and_nothing_is_skipped():
    async def main():
        prior = HeldPrior()
        c = Coordinator([SilentGenerator(), SilentGenerator()], prior, make_estimator("v05"),
                       CoordinatorConfig(TaskConfig(), SchedulerConfig(
                           batch_prompts=4, max_staleness=1, slots_per_generator=8)))
        for _ in range(3):       # rollouts finishing together each kick admission
            c._kick()
        await settle()
        assert len(prior.asked) == 1, "one admitter at a time"
        fut, n = prior.asked[0]
        c.sched.mark_lost(1)     # the room shrinks while the prior answers
        fut.set_result([0.5] * n)
        await settle()
        for _ in range(3):
            c._kick()
        await settle()
        while prior.asked[-1][0].done() is False:
            f, k = prior.asked[-1]
            f.set_result([0.5] * k)
            await settle()
        admitted = sorted(int(u[1:]) for u in c.sched.inflight)
        assert admitted == list(range(len(admitted))) and admitted, admitted
        assert c.admitted_pos == c.sched.counts.prompts_admitted == len(admitted)
        c._stopped = True
        for t in list(c._tasks):
            t.cancel()
        c.scorer.close()

    asyncio.run(main())
