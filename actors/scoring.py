"""Scoring completions with the task's verifier, off the coordinator's event loop.

``Scorer(task, factory, workers, timeout_s, ...)``: with ``workers=0`` the verifier runs inline
(the synthetic tasks check an integer in microseconds); with ``workers >= 1`` it runs in that
many worker processes, each answer with a deadline (counted from when a started worker gets
it: a worker's start-up is not any answer's time). math-verify's own timeouts work only in a
process's main thread, and one pathological answer must not stall dispatch: a worker that
misses the deadline is killed and replaced, and the answer gets the low reward, counted as
``score_timeout``. A verifier that raises gives the low reward too, counted as ``score_error``
(``Scorer.counts``: a ``ScoringCounts``).

DAPO's overlong shaping (``overlong_buffer`` tokens before ``max_tokens``): a response whose
length L falls in the last ``buffer`` tokens loses ``penalty * (L - (max_tokens - buffer)) /
buffer``, one that reached ``max_tokens`` loses ``penalty``.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
from dataclasses import dataclass

from common.records import ScoringCounts
from tasks.base import Verdict


@dataclass(frozen=True)
class Overlong:
    max_tokens: int
    buffer: int = 0          # 0: no shaping
    penalty: float = 1.0

    def __call__(self, n_tokens: int) -> float:
        """The (non-positive) length term added to the correctness reward."""
        if self.buffer <= 0:
            return 0.0
        start = self.max_tokens - self.buffer
        return -self.penalty * min(1.0, max(0, n_tokens - start) / self.buffer)


def shaped_range(rewards: tuple[float, float], overlong: Overlong) -> tuple[float, float]:
    """The range of shaped rewards: the low end drops by the penalty when shaping is on."""
    return (rewards[0] - (overlong.penalty if overlong.buffer > 0 else 0.0), rewards[1])


FAULTS = ("none", "raise", "hang")


def _verify(task, problem, text: str, fault: str):
    """The task's verdict, or the injected fault (tests.acceptance.chaos: a verifier that raises or
    never returns)."""
    if fault == "raise":
        raise RuntimeError("injected verifier fault")
    if fault == "hang":
        import threading

        threading.Event().wait()  # never returns: only the deadline and a kill end it
    return task.score(problem, text)


def _serve(conn, factory) -> None:
    """A worker process: build the task once (``factory()``), say it is ready, then score
    (problem, text, fault) requests until the pipe closes."""
    task = factory()
    conn.send(("ready", None))
    while True:
        try:
            problem, text, fault = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", _verify(task, problem, text, fault)))
        except Exception as err:  # noqa: BLE001 - reported to the caller
            conn.send(("error", f"{type(err).__name__}: {err}"))


# Longest wait for a worker process to start and build its task (a fresh interpreter
# importing the verifier: seconds, more on a loaded node). Not part of any answer's deadline.
STARTUP_TIMEOUT_S = 120.0


class _Worker:
    def __init__(self, ctx, factory):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, factory), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def ask(self, problem, text, fault: str, timeout_s: float):
        """(status, value); status 'timeout' when no answer came within ``timeout_s`` of the
        question (the caller then kills this worker). A worker still starting is waited for
        first (up to ``STARTUP_TIMEOUT_S``, then ('error', None)): the deadline is the
        answer's, so a replacement's start-up never times out the answer after a hung one."""
        if not self.ready:
            if not self.conn.poll(STARTUP_TIMEOUT_S):
                return "error", None
            self.conn.recv()  # ("ready", None); EOFError if the factory raised
            self.ready = True
        self.conn.send((problem, text, fault))
        if not self.conn.poll(timeout_s):
            return "timeout", None
        return self.conn.recv()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class Scorer:
    """``task`` scores inline; ``factory`` (picklable, e.g. a ``functools.partial`` of
    ``tasks.make_task_from_config``) builds the same task in each worker process."""

    def __init__(self, task, factory=None, workers: int = 0, timeout_s: float = 10.0,
                 overlong: Overlong | None = None, fault: str = "none", fault_every: int = 0):
        """``fault``/``fault_every``: inject a verifier that raises or hangs on every
        ``fault_every``-th answer (fault injection for ``tests.acceptance.chaos``; off by default)."""
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers and factory is None:
            raise ValueError("scoring in worker processes needs a task factory")
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        if fault == "hang" and not workers:
            raise ValueError("an injected hang needs scoring workers (inline it would hang "
                             "the coordinator)")
        self.task, self.factory, self.timeout_s = task, factory, timeout_s
        self.fault, self.fault_every, self._n_seen = fault, fault_every, 0
        self.overlong = overlong or Overlong(max_tokens=1)
        self.counts = ScoringCounts()
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no Ray or asyncio state
        self._free: asyncio.Queue | None = None
        self._n = workers
        self._closed = False

    def _pool(self) -> asyncio.Queue:
        if self._free is None:  # started lazily, inside the event loop that uses it
            self._free = asyncio.Queue()
            for _ in range(self._n):
                self._free.put_nowait(_Worker(self._ctx, self.factory))
        return self._free

    async def score(self, problem, text: str, n_tokens: int) -> Verdict:
        """The verdict on one completion, with the overlong term added to its reward."""
        self._n_seen += 1
        fault = self.fault if self.fault_every and self._n_seen % self.fault_every == 0 \
            else "none"
        if fault != "none":
            self.counts.faults_injected += 1
        v = await (self._pooled(problem, text, fault) if self._n
                   else self._inline(problem, text, fault))
        self.counts.scored += 1
        shaped = v.reward + self.overlong(n_tokens)
        if shaped != v.reward:
            self.counts.overlong_shaped += 1
        return Verdict(shaped, v.parsed, v.extracted, v.extras)

    async def _inline(self, problem, text: str, fault: str) -> Verdict:
        try:
            return _verify(self.task, problem, text, fault)
        except Exception:  # noqa: BLE001 - a broken verifier costs the answer, not the run
            return self._failed(timed_out=False)

    async def _pooled(self, problem, text: str, fault: str) -> Verdict:
        worker = await self._pool().get()
        status, value = "error", None  # what any exception leaves: the worker is in doubt
        try:
            status, value = await asyncio.to_thread(worker.ask, problem, text, fault,
                                                    self.timeout_s)
        except (OSError, EOFError):  # the worker died under us
            pass
        finally:
            self._put_back(worker, status == "timeout" or (status == "error" and value is None))
        if status == "ok":
            return value
        return self._failed(timed_out=status == "timeout")

    def _put_back(self, worker: _Worker, replace: bool) -> None:
        """Every worker taken from the pool goes back, whatever happened (one left out for
        good would make every later ``score`` wait on an empty pool): itself, or a fresh one
        when it is hung, dead or in doubt. A scorer already closed keeps none."""
        if not (replace or self._closed):
            self._free.put_nowait(worker)
            return
        worker.kill()
        if self._closed:
            return
        try:
            worker = _Worker(self._ctx, self.factory)
        finally:  # a failed replacement leaves the killed one: replaced at its next use
            self._free.put_nowait(worker)

    def _failed(self, timed_out: bool) -> Verdict:
        """The low reward for an answer its verifier did not judge: it timed out, or it raised
        (or its worker died or never started)."""
        if timed_out:
            self.counts.score_timeout += 1
        else:
            self.counts.score_error += 1
        return Verdict(self.task.rewards[0], False, None)

    def close(self) -> None:
        self._closed = True
        if self._free is not None:
            while not self._free.empty():
                self._free.get_nowait().kill()
