"""Graceful preemption: SIGTERM or SIGINT -> a lossless checkpoint -> exit ``PREEMPTED``.

SLURM, Kubernetes, spot instances and ``ray job stop`` end a job with SIGTERM, then SIGKILL
after a grace period. The launcher installs ``Preemption``'s handlers in the driver's main
thread once Ray is up (``ray.init`` installs its own SIGTERM handler, a bare ``sys.exit``, which
these replace). The first signal only sets a flag; the step loop (``cluster.run.trainer``) reads it
between steps and while it waits for a batch (``wait_batch`` cancels that wait: the
coordinator hands a batch over atomically, so a cancelled wait hands over nothing), then:

    pause admission -> checkpoint now (learner state + every admitted, untrained prompt,
    as a periodic checkpoint) -> stop the run's roles -> exit PREEMPTED (4), printing
    "preempted: checkpoint step N written in X s; resume with run.resume=true"

A second signal, or ``run.preempt_grace_s`` passing first, ends the process at once
(``os._exit``): with ``PREEMPTED`` when the new checkpoint is already whole, else with
128 + the signal's number (143 for SIGTERM, 130 for SIGINT); the checkpoint's atomic commit
(``cluster.records.checkpoints``) leaves the last whole checkpoint as ``latest`` either way.

Pure standard library: the Ray calls are lazy.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

PREEMPTED = 4           # exit status: stopped on a signal, a fresh whole checkpoint written
SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL_S = 0.2            # how often a wait for a batch looks at the flag


class Interrupted(Exception):
    """A wait for a batch ended by a preemption request (the coordinator handed nothing over)."""


class Preempted(Exception):
    """The run stopped on a signal after writing a whole checkpoint (``line`` says which)."""

    def __init__(self, line: str, step: int, save_s: float):
        super().__init__(line)
        self.line, self.step, self.save_s = line, step, save_s


def _hard_exit(code: int) -> None:
    os._exit(code)


class Preemption:
    """The flag a signal sets, and the deadline that follows it. ``hard_exit(code)`` ends the
    process (``os._exit``; tests pass their own)."""

    def __init__(self, grace_s: float, hard_exit=_hard_exit, out=None):
        self.grace_s, self.hard_exit, self.out = grace_s, hard_exit, out
        self.requested = threading.Event()
        self.signum: int | None = None
        self.t_signal: float | None = None
        self.saved_step: int | None = None   # set once the preemption checkpoint is whole
        self.cancelled_wait: bool | None = None  # a batch wait cancelled (True: nothing came)
        self._old: dict = {}
        self._timer: threading.Timer | None = None

    def install(self) -> bool:
        """Handle SIGTERM and SIGINT from here on (main thread only; returns whether it did)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        global _installed
        for s in SIGNALS:
            self._old[s] = signal.signal(s, self.handle)
        _installed = self
        return True

    def uninstall(self) -> None:
        """The handlers from before ``install``; the grace timer is stopped."""
        global _installed
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}
        if self._timer is not None:
            self._timer.cancel()
        if _installed is self:
            _installed = None

    def handle(self, signum: int, frame=None) -> None:
        """The signal handler: the first signal asks the run to stop (and starts the grace
        period's clock); a second one ends the process now."""
        name = signal.Signals(signum).name
        if self.requested.is_set():
            self.exit_now(f"a second signal ({name})")
            return
        self.signum, self.t_signal = signum, time.time()
        self.requested.set()
        self.say(f"preempting: {name} received; checkpointing within run.preempt_grace_s="
                 f"{self.grace_s:g}s, then stopping (a second signal exits at once)")
        if math.isfinite(self.grace_s):
            self._timer = threading.Timer(self.grace_s, self.exit_now,
                                          (f"the grace period ({self.grace_s:g} s) ended",))
            self._timer.daemon = True
            self._timer.start()

    def exit_now(self, why: str) -> None:
        """End the process at once: ``PREEMPTED`` if the preemption checkpoint is whole, else
        128 + the signal's number; the last whole checkpoint stays ``latest``."""
        if self.saved_step is not None:
            code, what = PREEMPTED, f"checkpoint step {self.saved_step} is whole"
        else:
            code = 128 + (self.signum or signal.SIGTERM)
            what = "no new checkpoint; the last whole one is kept"
        self.say(f"preempted: {why}: exiting now ({what}; exit {code}); resume with "
                 "run.resume=true")
        self.hard_exit(code)

    def say(self, line: str) -> None:
        out = self.out or sys.stderr
        try:
            print(line, file=out, flush=True)
        except (OSError, ValueError):  # a closed or broken stream: the exit status says it
            pass

    def saved(self, step: int, save_s: float) -> Preempted:
        """The preemption checkpoint of ``step`` is whole (``save_s`` seconds): the exception
        the trainer raises to end the run, its line said."""
        self.saved_step = step
        line = (f"preempted: checkpoint step {step} written in {save_s:.1f} s; resume with "
                "run.resume=true")
        return Preempted(line, step, save_s)


_installed: Preemption | None = None


def installed() -> Preemption:
    """The process's installed ``Preemption``, or one that no signal reaches (its flag is
    set only by calling ``handle``: in-process tests and benchmarks)."""
    return _installed if _installed is not None else Preemption(float("inf"))


def wait_batch(dog, coord, n: int, stop: Preemption):
    """``coord.next_batch(n)`` under the watchdog, given up when ``stop`` is requested first:
    the call is cancelled and ``Interrupted`` raised, unless the coordinator had already
    handed the batch over (then it is returned, and the step trains it as usual)."""
    if stop.requested.is_set():
        raise Interrupted()
    ref = coord.next_batch.remote(n)
    if dog.ready("coordinator", ref, stop.requested, POLL_S):
        return dog.get("coordinator", ref)
    import ray

    ray.cancel(ref)
    try:
        batch = dog.get("coordinator", ref)  # handed over before the cancel reached it
    except ray.exceptions.TaskCancelledError:
        stop.cancelled_wait = True
        raise Interrupted() from None
    stop.cancelled_wait = False
    return batch
