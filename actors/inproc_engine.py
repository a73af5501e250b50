"""A vLLM engine inside the generator's own process, behind the part of ``AsyncLLM``'s API the
generator uses (``generate``, ``abort``, ``pause_generation``/``resume_generation``,
``reset_prefix_cache``, ``collective_rpc``, ``shutdown``).

Why: vLLM 0.32's ``AsyncLLM`` always runs its engine core in a process of its own, spawned
(never forked) from a Ray actor, so each generator imports torch and vLLM twice on start-up
(about 9 s of the generators' 33 s on 2 cores, docs/benchmarks.md). Its synchronous
``LLMEngine`` can keep the core in-process (``InprocClient``); this class drives that engine.

How: one thread owns the engine. It builds it (vLLM-CPU binds the OpenMP threads of the thread
that initialises its worker), runs every ``step()`` and every call into it (add, abort,
weight loads, cache resets), in order, so the engine is never entered twice at once. The
asyncio side never blocks: it hands calls to that thread and awaits them. A step loop on the
actor's event loop steps the engine while it has requests and is not paused, and routes each
step's outputs to the queue of the ``generate`` call that owns them.

Semantics kept from ``AsyncLLM`` (what ``actors/generator.py`` relies on):
- outputs are cumulative; a request aborted by ``abort`` (or by cancelling its ``generate``)
  ends with a final output whose ``finish_reason`` is ``"abort"`` and carries no tokens;
- ``pause_generation(mode="keep")`` returns once no step is running and the outputs of the
  last one have reached their queues; requests stay in the engine, and none is stepped until
  ``resume_generation``;
- weight loads (``collective_rpc``) take the same call into the same worker extension as with
  a spawned engine core (``common/weight_sync``): the path a GPU run takes;
- when a step raises, every request in flight and every later call fails with the error
  (``AsyncLLM``'s ``EngineDeadError``).
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable

ABORT = "abort"


class EngineDead(RuntimeError):
    """The in-process engine raised in a step; it serves nothing more."""


def abort_output(request_id: str, last: Any | None):
    """The final output of an aborted request: ``finished``, ``finish_reason`` "abort", no
    tokens (as ``AsyncLLM``'s); the prompt's token ids from ``last`` when there was one."""
    from vllm.outputs import CompletionOutput, RequestOutput

    done = CompletionOutput(index=0, text="", token_ids=[], cumulative_logprob=None,
                            logprobs=None, finish_reason=ABORT)
    if last is not None:
        out = dataclasses.replace(last.outputs[0], text="", token_ids=[], logprobs=None,
                                  cumulative_logprob=None, finish_reason=ABORT)
        return RequestOutput(request_id=request_id, prompt=last.prompt,
                             prompt_token_ids=last.prompt_token_ids, prompt_logprobs=None,
                             outputs=[out], finished=True)
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[],
                         prompt_logprobs=None, outputs=[done], finished=True)


class InprocEngine:
    """See the module docstring. ``build`` runs on the engine thread and returns the
    ``LLMEngine``; ``cores`` (optional) pins that thread, and so every OpenMP thread it
    starts, to those cores before the engine is built."""

    def __init__(self, build: Callable[[], Any], cores: list[int] | None = None):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="vllm-engine")
        self._cores = list(cores or [])
        self._engine = self._pool.submit(self._build, build).result()
        self._queues: dict[str, asyncio.Queue] = {}  # request id -> its generate's queue
        self._last: dict[str, Any] = {}  # request id -> its latest output
        self._paused = False
        self._dead: BaseException | None = None
        self._wake: asyncio.Event | None = None  # made on the event loop, on first use
        self._idle: asyncio.Event | None = None  # set while no step runs
        self._runner: asyncio.Task | None = None
        self._closed = False

    def _build(self, build: Callable[[], Any]):
        if self._cores:
            import torch

            os.sched_setaffinity(0, self._cores)  # this thread; its OpenMP team inherits it
            torch.set_num_threads(len(self._cores))  # before vLLM's worker forbids it
        return build()

    # ------------------------------------------------------------------ AsyncLLM's API
    @property
    def errored(self) -> bool:
        """Whether the engine died (a step raised): as ``AsyncLLM.errored``."""
        return self._dead is not None

    async def generate(self, prompt, sampling_params, request_id: str,
                       priority: int = 0) -> AsyncIterator[Any]:
        """Cumulative outputs of one request, the last one ``finished``. Cancelling the
        consumer aborts the request in the engine."""
        self._start()
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already running")
        q: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = q
        done = False
        try:
            await self._call(self._engine.add_request, request_id, prompt, sampling_params,
                             priority=priority)
            self._wake.set()
            while True:
                out = await q.get()
                if isinstance(out, BaseException):
                    raise out
                done = out.finished
                yield out
                if done:
                    return
        finally:
            if self._queues.pop(request_id, None) is not None and not done and self._dead is None:
                # The consumer stopped early (cancelled, or an error): free the engine's slot.
                self._pool.submit(self._engine.abort_request, [request_id])
            self._last.pop(request_id, None)

    async def abort(self, request_ids) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        await self._call(self._engine.abort_request, ids)
        # After the engine forgot them (any output of the step before reached its queue).
        for rid in ids:
            q = self._queues.pop(rid, None)
            if q is not None:
                q.put_nowait(abort_output(rid, self._last.pop(rid, None)))

    async def pause_generation(self, mode: str = "keep", clear_cache: bool = False) -> None:
        if mode != "keep":
            raise ValueError(f"in-process engine: pause mode {mode!r} is not supported "
                             "(only 'keep')")
        self._start()
        self._paused = True
        await self._idle.wait()  # the running step ended and its outputs were routed
        if clear_cache:
            await self.reset_prefix_cache()

    async def resume_generation(self) -> None:
        self._start()
        self._paused = False
        self._wake.set()

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return await self._call(self._engine.reset_prefix_cache, reset_running_requests)

    async def collective_rpc(self, method, timeout: float | None = None, args: tuple = (),
                             kwargs: dict | None = None) -> list:
        return await self._call(self._engine.collective_rpc, method, timeout, args, kwargs)

    async def release_free_memory(self) -> bool:
        """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``), on the
        engine thread. A weight load frees hundreds of MiB of temporaries, and glibc keeps
        free memory of a thread's own arena (the engine thread's, here) mapped: the probe saw
        the process grow ~1.7 MiB per update with the memory in use flat. Returns whether
        anything was released (False off glibc)."""
        return await self._call(trim_heap)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            self._runner.cancel()
        core = getattr(self._engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            try:
                self._pool.submit(core.shutdown).result(timeout=30)
            except Exception:  # shutting down anyway: the process may be exiting
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ internals
    def _start(self) -> None:
        if self._dead is not None:
            raise EngineDead(f"vLLM engine died: {type(self._dead).__name__}: {self._dead}")
        if self._closed:
            raise EngineDead("vLLM engine was shut down")
        if self._runner is None:
            self._wake, self._idle = asyncio.Event(), asyncio.Event()
            self._idle.set()
            self._runner = asyncio.get_running_loop().create_task(self._run())

    async def _call(self, fn, *args, **kwargs):
        self._start()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._paused or not self._queues:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._idle.clear()
            try:
                outs = await loop.run_in_executor(self._pool, self._engine.step)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # the engine is gone: fail everyone, now and later
                self._dead = e
                err = EngineDead(f"vLLM engine died in a step: {type(e).__name__}: {e}")
                for q in self._queues.values():
                    q.put_nowait(err)
                self._queues.clear()
                self._idle.set()
                return
            for out in outs:
                q = self._queues.get(out.request_id)
                if q is None:  # aborted meanwhile: its final output was already sent
                    continue
                q.put_nowait(out)
                if out.finished:
                    self._queues.pop(out.request_id, None)
                    self._last.pop(out.request_id, None)
                else:
                    self._last[out.request_id] = out
            self._idle.set()
            if not outs:
                await asyncio.sleep(0)  # let calls queued on the loop reach the engine


def trim_heap() -> bool:
    """glibc's ``malloc_trim(0)``: free memory of every arena back to the system."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):  # not glibc
        return False
