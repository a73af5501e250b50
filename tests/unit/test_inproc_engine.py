"""actors.inproc_engine.InprocEngine's own rules, on a scripted stand-in for vLLM's LLMEngine
(a plain class, no mock): outputs reach the call that owns them, a paused engine is not
stepped, a cancelled consumer aborts its request, an aborted request ends with an "abort"
output holding no tokens, and a step that raises fails every request and every later call.
The real engine under it is exercised by tests/integration/test_generator.py."""
from __future__ import annotations

import asyncio
import threading

import pytest

outputs = pytest.importorskip("vllm.outputs")

from actors.inproc_engine import EngineDead, InprocEngine  # noqa: E402


class ScriptedEngine:
    """One token per step for every request it holds, ``done_after`` tokens to finish.
    Records the thread of every call: they must all be the engine thread."""

    def __init__(self, done_after: int = 3):
        self.done_after = done_after
        self.reqs: dict[str, list[int]] = {}
        self.steps = 0
        self.aborted: list[str] = []
        self.threads: set[str] = set()
        self.fail_at: int | None = None

    def _seen(self):
        self.threads.add(threading.current_thread().name)

    def add_request(self, request_id, prompt, params, priority=0):
        self._seen()
        self.reqs[request_id] = []

    def abort_request(self, ids):
        self._seen()
        for rid in ids:
            if self.reqs.pop(rid, None) is not None:
                self.aborted.append(rid)

    def step(self):
        self._seen()
        self.steps += 1
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise RuntimeError("CPU Generator does not use offset")
        out = []
        for rid, toks in list(self.reqs.items()):
            toks.append(len(toks))
            done = len(toks) >= self.done_after
            c = outputs.CompletionOutput(index=0, text="x" * len(toks), token_ids=list(toks),
                                         cumulative_logprob=None, logprobs=None,
                                         finish_reason="length" if done else None)
            out.append(outputs.RequestOutput(request_id=rid, prompt="p", prompt_token_ids=[7],
                                             prompt_logprobs=None, outputs=[c], finished=done))
            if done:
                del self.reqs[rid]
        return out

    def reset_prefix_cache(self, reset_running_requests=False):
        self._seen()
        return True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self._seen()
        return [(method, args)]


def _engine(**kw) -> tuple[InprocEngine, ScriptedEngine]:
    fake = ScriptedEngine(**kw)
    return InprocEngine(lambda: fake), fake


async def _collect(eng, rid):
    return [o async for o in eng.generate("p", None, request_id=rid)]


async def _running(eng, fake, rid: str, steps: int) -> asyncio.Future:
    """Request ``rid`` started and the engine stepped ``steps`` times."""
    task = asyncio.ensure_future(_collect(eng, rid))
    while fake.steps < steps:
        await asyncio.sleep(0.001)
    return task


def test_each_request_gets_its_own_cumulative_outputs_on_the_engine_thread():
    eng, fake = _engine(done_after=3)

    async def main():
        return await asyncio.gather(_collect(eng, "a"), _collect(eng, "b"))

    a, b = asyncio.run(main())
    assert [o.request_id for o in a] == ["a"] * 3 and [o.request_id for o in b] == ["b"] * 3
    assert a[-1].finished and list(a[-1].outputs[0].token_ids) == [0, 1, 2]
    assert fake.threads == {"vllm-engine_0"}
    eng.shutdown()


def test_a_paused_engine_is_not_stepped_and_resumes():
    eng, fake = _engine(done_after=50)

    async def main():
        task = await _running(eng, fake, "a", 3)
        await eng.pause_generation(mode="keep", clear_cache=False)
        frozen = fake.steps
        assert await eng.collective_rpc("v05_load_dir", args=("/dev/shm/x",)) == \
            [("v05_load_dir", ("/dev/shm/x",))]
        assert await eng.reset_prefix_cache(reset_running_requests=True)
        await asyncio.sleep(0.05)
        assert fake.steps == frozen  # nothing stepped while paused
        await eng.resume_generation()
        out = await task
        return frozen, out

    frozen, out = asyncio.run(main())
    assert out[-1].finished and len(out[-1].outputs[0].token_ids) == 50
    assert fake.steps > frozen
    with pytest.raises(ValueError, match="only 'keep'"):
        asyncio.run(eng.pause_generation(mode="abort"))
    eng.shutdown()


def test_abort_ends_a_request_with_an_abort_output_and_no_tokens():
    eng, fake = _engine(done_after=10**6)

    async def main():
        task = await _running(eng, fake, "a", 4)
        await eng.abort(["a"])
        return await task

    out = asyncio.run(main())
    last, final = out[-2], out[-1]
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert list(final.outputs[0].token_ids) == [] and len(last.outputs[0].token_ids) >= 3
    assert final.prompt_token_ids == [7] and fake.aborted == ["a"]
    eng.shutdown()


def test_a_cancelled_consumer_aborts_its_request_in_the_engine():
    eng, fake = _engine(done_after=10**6)

    async def main():
        task = await _running(eng, fake, "a", 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if fake.aborted:
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert fake.aborted == ["a"] and not fake.reqs
    eng.shutdown()


def test_a_step_that_raises_fails_every_request_and_every_later_call():
    eng, fake = _engine(done_after=10**6)
    fake.fail_at = 3

    async def main():
        got = await asyncio.gather(_collect(eng, "a"), _collect(eng, "b"),
                                   return_exceptions=True)
        assert all(isinstance(g, EngineDead) for g in got), got
        assert "CPU Generator does not use offset" in str(got[0])
        with pytest.raises(EngineDead, match="died"):
            await _collect(eng, "c")

    asyncio.run(main())
    eng.shutdown()
