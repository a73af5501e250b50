"""The coordinator's generators and what it knows of their health: each one's incarnation
token (a Ray restart changes it), when each last answered, the requests each completed,
the aborts of its timed-out requests still running, and the newest weights (``payload``) a
rejoining one loads. Which generator serves what is the scheduler's; this pool only keeps
them honest."""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from actors.scheduler import Cancel


class GeneratorPool:
    def __init__(self, generators: list):
        self.handles = list(generators)
        n = len(self.handles)
        self.incarnations: list[str | None] = [None] * n
        self.last_heard = [time.time()] * n   # last answer from each generator
        self.served = [0] * n                 # requests each one completed
        self.aborts: list[set[asyncio.Task]] = [set() for _ in range(n)]  # of timed-out requests
        self.payload = None                   # the newest published weights
        # Back (restarted, ready) but unable to load ``payload`` on its own (a broadcast's:
        # a restarted engine is in no group): the next publish must include it.
        self.awaiting_publish: set[int] = set()

    def __len__(self) -> int:
        return len(self.handles)

    def __getitem__(self, i: int):
        return self.handles[i]

    def replace(self, i: int, handle) -> None:
        """Generator ``i`` is a new actor now (its node was lost; the driver started another):
        a rejoin under way waits for the new one."""
        self.handles[i] = handle

    def answered(self, i: int, incarnation: str | None) -> bool:
        """Generator ``i`` answered a request from ``incarnation``: False when that is not the
        one it had (restarted between two calls: it served initial weights)."""
        self.last_heard[i] = time.time()
        self.served[i] += 1
        if self.incarnations[i] is None:
            self.incarnations[i] = incarnation
        return incarnation == self.incarnations[i]

    async def cancel(self, c, timeout_s: float) -> None:
        """Ask generator ``c.generator`` to abort request ``c.request_id``'s ``c.positions``
        (a ``Cancel``), waiting at most ``timeout_s``; best effort: a dead generator's
        requests fail on their own."""
        try:
            await asyncio.wait_for(self.handles[c.generator].cancel.remote(
                c.request_id, list(c.positions)), timeout_s)
        except Exception:
            pass

    def abort_timed_out(self, d, spawn: Callable, timeout_s: float) -> None:
        """``wait_for`` gave up on request ``d`` (a ``Dispatch``) but does not cancel the Ray
        task: it still runs in the engine, on slots the scheduler stops counting once it
        re-issues the work. Ask the engine to abort all of it (best effort, bounded by
        ``timeout_s``) in a task ``spawn`` starts; the generator rejoins only once that has
        ended (``rejoin``)."""
        every = Cancel(d.request_id, d.uid, tuple(range(len(d.indices))), d.generator)
        task = spawn(self.cancel(every, timeout_s))
        self.aborts[d.generator].add(task)
        task.add_done_callback(self.aborts[d.generator].discard)

    async def rejoin(self, i: int, version: Callable[[], int], stopped: Callable[[], bool],
                     timeout_s: float) -> int | None:
        """Wait for generator ``i`` to be back (Ray restarted it, or ``replace`` gave a new
        one), give it the newest weights (at ``version()``, the scheduler's, read again after
        each load), wait for its aborts; returns the version it serves, or None once
        ``stopped()``."""
        while not stopped():
            g = self.handles[i]  # read each time: ``replace`` may swap it meanwhile
            try:
                await asyncio.wait_for(g.ready.remote(), timeout_s)
            except Exception:
                await asyncio.sleep(1.0)
                continue
            try:
                loaded = await g.version.remote()
                if self.payload is not None and loaded < version():
                    try:
                        await g.update_weights.remote(self.payload, version())
                    except Exception:
                        # Alive, and the newest weights are a broadcast it was not in: the
                        # next publish takes it in (the driver's publish_targets), and the
                        # version check above then finds it loaded.
                        self.awaiting_publish.add(i)
                        await asyncio.sleep(1.0)
                    continue  # re-check: a newer version may have been published meanwhile
                self.awaiting_publish.discard(i)
                self.incarnations[i] = await g.incarnation.remote()
                # Its timed-out requests are aborted first: their sequences hold slots.
                await asyncio.gather(*self.aborts[i])
                return loaded
            except Exception:
                await asyncio.sleep(1.0)
        return None

    def silent_s(self, now: float) -> list[float]:
        """Seconds since each generator last answered."""
        return [round(now - t, 1) for t in self.last_heard]

    def sizes(self) -> dict[str, int]:
        return {"aborts": sum(map(len, self.aborts))}
