"""The run's watchdog: every blocking call of the step loop runs with a deadline.

The deadline is ``run.stall_timeout_s`` after the last progress (a completed step, an
evaluation, a checkpoint: whoever makes progress says ``progress()``); past it the call
raises ``Stalled`` naming the role the run waited on, instead of waiting forever
(``summary.json`` then says ``"status": "stalled"``).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout


class Stalled(RuntimeError):
    """No learner step completed for ``run.stall_timeout_s``: ``role`` is what the run was
    waiting on, ``report`` what that role last reported."""

    def __init__(self, role: str, report: dict):
        super().__init__(f"stalled: no learner step for the watchdog's limit, waiting on {role}")
        self.role, self.report = role, report


class Watchdog:
    """``blame(role, waited_s, step)`` -> (role, report): names what a stalled call waited on
    (the coordinator says which of its roles it waits for; ``coordinator_blame``)."""

    def __init__(self, limit_s: float, blame: Callable[[str, float, int], tuple[str, dict]]):
        self.limit_s, self.blame = limit_s, blame
        self.last_progress, self.step = time.time(), 0
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="watchdog")

    def progress(self, step: int | None = None) -> float:
        """Something completed (at ``step``): the next call gets the whole limit. Returns
        the time."""
        self.last_progress = time.time()
        self.step = self.step if step is None else step
        return self.last_progress

    def time_left(self) -> float:
        """Seconds until the deadline, at least 0."""
        return max(0.0, self.limit_s - (time.time() - self.last_progress))

    def call(self, role: str, fn, *args):
        """``fn(*args)`` within the deadline; past it, ``Stalled`` naming ``role``."""
        fut = self._calls.submit(fn, *args)
        try:
            return fut.result(timeout=self.time_left())
        except FutureTimeout:
            waited = round(time.time() - self.last_progress, 1)
            raise Stalled(*self.blame(role, waited, self.step)) from None

    def get(self, role: str, ref):
        """``ray.get(ref)`` within the deadline."""
        import ray

        return self.call(role, ray.get, ref)

    def ready(self, role: str, ref, halt, poll_s: float = 0.2) -> bool:
        """Wait within the deadline until ``ref`` is ready (True) or the event ``halt`` is
        set first (False: the caller gives the call up); past the deadline, ``Stalled``."""
        import ray

        def poll() -> bool:
            while not halt.is_set() and self.time_left() > 0:
                if ray.wait([ref], timeout=poll_s)[0]:
                    return True
            return bool(ray.wait([ref], timeout=0)[0])

        done = self.call(role, poll)
        if not done and not halt.is_set():  # the deadline passed inside the poll
            raise Stalled(*self.blame(role, round(time.time() - self.last_progress, 1),
                                      self.step))
        return done

    def close(self) -> None:
        self._calls.shutdown(wait=False, cancel_futures=True)


def coordinator_blame(coord) -> Callable[[str, float, int], tuple[str, dict]]:
    """A ``blame`` for a run driven by ``coord``: a call to the coordinator is blamed on the
    role the coordinator says it waits for (``Coordinator.waiting_on``); any other on itself."""

    def blame(role: str, waited: float, step: int) -> tuple[str, dict]:
        import ray

        if role != "coordinator":
            return role, {"seconds_since_last_step": waited, "step": step}
        try:
            report = ray.get(coord.waiting_on.remote(), timeout=30)
        except Exception as err:  # noqa: BLE001 - the coordinator itself does not answer
            return "coordinator (not answering)", {"error": f"{type(err).__name__}: {err}",
                                                   "seconds_since_last_step": waited}
        return report.role, {**report.detail(), "seconds_since_last_step": waited}

    return blame
