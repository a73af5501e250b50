"""Graceful preemption's pure parts (cluster/run/preempt.py): the flag a signal sets, the second
signal and the grace period that end the process at once with the right status, the handlers
installed and restored. The process's real exit is replaced by a recorder (``hard_exit``);
the real signal is sent to this process with ``os.kill``. The step loop's side is in
test_trainer_loop.py; a real run stopped in its batch wait, then resumed, in
tests/integration/test_pipeline.py; a real launch under ``ray job stop`` in test_job_submit.py."""
from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest

from cluster.run.preempt import PREEMPTED, Interrupted, Preemption, installed, wait_batch


class Exits:
    def __init__(self):
        self.codes, self.done = [], threading.Event()

    def __call__(self, code):
        self.codes.append(code)
        self.done.set()


def test_the_first_signal_only_asks_the_run_to_stop_and_says_so():
    out, exits = io.StringIO(), Exits()
    p = Preemption(60.0, hard_exit=exits, out=out)
    p.handle(signal.SIGTERM)
    assert p.requested.is_set() and p.signum == signal.SIGTERM and exits.codes == []
    assert "SIGTERM received; checkpointing within run.preempt_grace_s=60s" in out.getvalue()
    p.uninstall()  # stops the grace timer


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_before_the_checkpoint_exits_at_once_as_killed_by_it(sig, code):
    out, exits = io.StringIO(), Exits()
    p = Preemption(60.0, hard_exit=exits, out=out)
    p.handle(sig)
    p.handle(sig)
    assert exits.codes == [code]
    assert "a second signal" in out.getvalue() and "the last whole one is kept" in out.getvalue()
    p.uninstall()


def test_once_the_checkpoint_is_whole_any_early_exit_says_preempted():
    out, exits = io.StringIO(), Exits()
    p = Preemption(60.0, hard_exit=exits, out=out)
    p.handle(signal.SIGTERM)
    done = p.saved(7, 1.25)
    assert done.line == "preempted: checkpoint step 7 written in 1.2 s; resume with run.resume=true"
    assert done.step == 7
    p.handle(signal.SIGTERM)  # e.g. while the roles shut down
    assert exits.codes == [PREEMPTED] and "checkpoint step 7 is whole" in out.getvalue()
    p.uninstall()


def test_the_grace_period_ends_the_process_when_the_checkpoint_is_late():
    exits = Exits()
    p = Preemption(0.2, hard_exit=exits, out=io.StringIO())
    t0 = time.time()
    p.handle(signal.SIGTERM)
    assert exits.done.wait(5.0)
    assert exits.codes == [143] and time.time() - t0 >= 0.2


def test_a_run_that_ends_before_the_grace_period_is_not_killed_by_it():
    exits = Exits()
    p = Preemption(0.2, hard_exit=exits, out=io.StringIO())
    p.handle(signal.SIGTERM)
    p.uninstall()
    assert not exits.done.wait(0.5)


def test_installed_handlers_catch_a_real_sigterm_and_are_restored_after():
    exits = Exits()
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    p = Preemption(60.0, hard_exit=exits, out=io.StringIO())
    assert p.install() and installed() is p
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.time() + 5
        while not p.requested.is_set() and time.time() < deadline:
            time.sleep(0.01)  # the handler runs in this (main) thread between bytecodes
        assert p.requested.is_set() and exits.codes == []
    finally:
        p.uninstall()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert installed() is not p and not installed().requested.is_set()


def test_installing_from_another_thread_is_refused():
    p, got = Preemption(60.0), []
    t = threading.Thread(target=lambda: got.append(p.install()))
    t.start()
    t.join()
    assert got == [False] and installed() is not p


class Coord:
    class _Next:
        def __init__(self):
            self.calls = 0

        def remote(self, n):
            self.calls += 1
            return "batch"

    def __init__(self):
        self.next_batch = self._Next()


def test_a_wait_for_a_batch_asked_to_stop_first_asks_the_coordinator_for_nothing():
    p, coord = Preemption(60.0, hard_exit=Exits(), out=io.StringIO()), Coord()
    p.requested.set()
    with pytest.raises(Interrupted):
        wait_batch(object(), coord, 4, p)
    assert coord.next_batch.calls == 0


class Ref:
    """Stands in for an object ref: ``ray.wait`` is replaced below."""


def test_a_batch_wait_past_the_watchdog_deadline_is_a_stall_not_a_preemption(monkeypatch):
    import ray

    from cluster.run.watchdog import Stalled, Watchdog

    monkeypatch.setattr(ray, "wait", lambda refs, timeout=None: ([], refs))  # never ready
    dog = Watchdog(0.3, lambda role, waited, step: (role, {"waited": waited}))
    halt = threading.Event()
    with pytest.raises(Stalled) as stall:
        dog.ready("coordinator", Ref(), halt, poll_s=0.05)
    assert stall.value.role == "coordinator" and not halt.is_set()
    dog.close()


def test_a_batch_wait_halted_by_the_flag_returns_not_ready(monkeypatch):
    import ray

    from cluster.run.watchdog import Watchdog

    monkeypatch.setattr(ray, "wait", lambda refs, timeout=None: ([], refs))
    dog = Watchdog(60.0, lambda role, waited, step: (role, {}))
    halt = threading.Event()
    threading.Timer(0.2, halt.set).start()
    assert dog.ready("coordinator", Ref(), halt, poll_s=0.05) is False
    dog.close()
