"""How a generator fans one request out into its completions (``gather_or_cancel``): when one
completion fails, the others are cancelled (vLLM aborts a cancelled ``generate``) and have
finished unwinding before the error reaches the caller, so a failed request holds no engine
slots. Plain coroutines stand in for the engine's completions; no vLLM."""
from __future__ import annotations

import asyncio

import pytest

from actors.generator import gather_or_cancel


class Completion:
    """One engine completion: finishes after ``turns`` loop turns (None: never), or raises."""

    def __init__(self, log: list, i: int, turns: int | None, error: Exception | None = None):
        self.log, self.i, self.turns, self.error = log, i, turns, error

    async def run(self) -> int:
        try:
            n = 0
            while self.turns is None or n < self.turns:
                await asyncio.sleep(0)
                n += 1
            if self.error is not None:
                raise self.error
            return self.i
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # an abort takes a turn of the loop, like engine.abort
            self.log.append(("aborted", self.i))
            raise


def test_results_in_order_when_every_completion_finishes():
    log: list = []
    out = asyncio.run(gather_or_cancel([Completion(log, i, 3 - i).run() for i in range(3)]))
    assert out == [0, 1, 2] and log == []


def test_one_failing_completion_aborts_the_others_before_the_error_is_raised():
    async def main():
        log: list = []
        done = Completion(log, 0, 0)
        failing = Completion(log, 1, 2, RuntimeError("vLLM failed"))
        running = [Completion(log, i, None) for i in (2, 3)]
        with pytest.raises(RuntimeError, match="vLLM failed"):
            await gather_or_cancel([c.run() for c in (done, failing, *running)])
        # Already unwound when the caller sees the error: nothing is left in the engine.
        assert sorted(log) == [("aborted", 2), ("aborted", 3)]
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())


def test_cancelling_the_request_aborts_every_completion():
    async def main():
        log: list = []
        outer = asyncio.ensure_future(gather_or_cancel(
            [Completion(log, i, None).run() for i in range(3)]))
        for _ in range(3):
            await asyncio.sleep(0)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        assert sorted(log) == [("aborted", i) for i in range(3)]

    asyncio.run(main())
