"""Scoring off the coordinator's loop: worker processes with a per-answer deadline (a hung
verifier is killed and its answer gets the low reward, counted), a raising verifier, and
DAPO's overlong shaping. Real processes, no mocks."""
import asyncio
import dataclasses
import functools

import pytest

from actors.scoring import Overlong, Scorer, shaped_range
from tasks import ArithmeticTask
from tasks.base import Problem


class Moody(ArithmeticTask):
    """Arithmetic whose verifier hangs on "hang" and raises on "boom"."""

    def score(self, problem, completion):
        if completion == "hang":
            import threading
            threading.Event().wait()  # forever: only a kill ends it
        if completion == "boom":
            raise RuntimeError("verifier bug")
        return super().score(problem, completion)


class SlowStart(ArithmeticTask):
    """Arithmetic whose construction takes 2 s: a verifier's imports in a fresh worker process
    on a loaded node."""

    def __init__(self):
        import time
        time.sleep(2.0)
        super().__init__()


P = Problem(id="arith/1+2", prompt="1+2=", answer="3", difficulty=1)


def run(coro):
    return asyncio.run(coro)


def test_inline_scoring_and_a_raising_verifier():
    s = Scorer(Moody())
    assert run(s.score(P, "3", 1)).reward == 1.0
    assert run(s.score(P, "4", 1)).reward == -1.0
    v = run(s.score(P, "boom", 1))
    assert v.reward == -1.0 and not v.parsed and s.counts.score_error == 1


def test_a_hung_answer_times_out_in_its_worker_and_the_pool_recovers():
    async def go():
        s = Scorer(Moody(), functools.partial(Moody), workers=1, timeout_s=2.0)
        try:
            hung, ok, boom = await asyncio.gather(s.score(P, "hang", 1), s.score(P, "3", 1),
                                                  s.score(P, "boom", 1))
            after = await s.score(P, "3", 1)  # the replacement worker answers
        finally:
            s.close()
        return s, hung, ok, boom, after

    s, hung, ok, boom, after = run(go())
    assert hung.reward == -1.0 and s.counts.score_timeout == 1
    assert ok.reward == 1.0 and after.reward == 1.0
    assert boom.reward == -1.0 and s.counts.score_error == 1


class Unpicklable(Problem):
    """A problem that cannot be sent to a worker: ``ask`` raises RuntimeError (neither
    OSError nor EOFError) from inside the pooled call."""

    def __reduce__(self):
        raise RuntimeError("cannot pickle")


def test_an_unexpected_error_in_a_workers_call_still_puts_a_worker_back():
    """Whatever ``ask`` raises, the pool gets a worker back (a replacement): else the pool is
    empty and every later score waits forever."""
    async def go():
        s = Scorer(ArithmeticTask(), functools.partial(ArithmeticTask), workers=1, timeout_s=5.0)
        try:
            with pytest.raises(RuntimeError, match="cannot pickle"):
                await s.score(Unpicklable(**dataclasses.asdict(P)), "3", 1)
            assert s._free.qsize() == 1  # a worker is back in the pool
            return (await asyncio.wait_for(s.score(P, "3", 1), 120)).reward
        finally:
            s.close()

    assert run(go()) == 1.0


def test_a_workers_start_up_does_not_count_against_the_answers_deadline():
    """The deadline is the answer's: a worker still starting (first use, or the replacement
    of a killed one) does not time out the answers it is handed."""
    async def go():
        s = Scorer(ArithmeticTask(), functools.partial(SlowStart), workers=1, timeout_s=1.0)
        try:
            return s, [(await s.score(P, text, 1)).reward for text in ("3", "4", "3")]
        finally:
            s.close()

    s, got = run(go())
    assert got == [1.0, -1.0, 1.0] and s.counts.score_timeout == 0


def test_overlong_shaping_is_linear_in_the_buffer():
    o = Overlong(max_tokens=100, buffer=20, penalty=1.0)
    assert [o(n) for n in (50, 80, 90, 100, 120)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert Overlong(max_tokens=100).__call__(100) == 0.0          # off by default
    assert shaped_range((-1.0, 1.0), o) == (-2.0, 1.0)
    s = Scorer(ArithmeticTask(), overlong=o)
    assert run(s.score(P, "3", 90)).reward == pytest.approx(0.5)
    assert s.counts.overlong_shaped == 1


def test_workers_need_a_factory():
    with pytest.raises(ValueError, match="factory"):
        Scorer(ArithmeticTask(), workers=1)


def test_injected_faults_every_nth_answer():
    s = Scorer(ArithmeticTask(), fault="raise", fault_every=2)
    rewards = [run(s.score(P, "3", 1)).reward for _ in range(4)]
    assert rewards == [1.0, -1.0, 1.0, -1.0]
    assert s.counts.faults_injected == 2 == s.counts.score_error
    with pytest.raises(ValueError, match="needs scoring workers"):
        Scorer(ArithmeticTask(), fault="hang", fault_every=1)

    async def go():
        h = Scorer(ArithmeticTask(), functools.partial(ArithmeticTask), workers=1,
                   timeout_s=1.0, fault="hang", fault_every=2)
        try:
            return h, [(await h.score(P, "3", 1)).reward for _ in range(3)]
        finally:
            h.close()

    h, got = run(go())
    assert got == [1.0, -1.0, 1.0] and h.counts.score_timeout == 1
