"""Fault injectors that act on the real actors of a run, and watchers that time the recovery.

Nothing here changes the system: faults are injected from outside, through the handles a run
already has (``ray.kill`` of an actor, as a crash), through the trainer's ``after_step`` hook,
or by a wrapper around the learner group's two driver-facing calls (``FaultyLearner``).
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time


def wait_for(pred, timeout_s: float, every_s: float = 0.1,
             not_yet: tuple[type[BaseException], ...] = (Exception,)) -> bool:
    """Poll ``pred()`` every ``every_s`` until it is true or ``timeout_s`` passed. A ``pred``
    that raises one of ``not_yet`` counts as false (an actor restarting); ``not_yet=()``: its
    error goes to the caller (a job-status call that fails fails the scenario)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if pred():
                return True
        except not_yet:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)


class FaultyLearner:
    """The learner group with faults on its driver-facing calls; everything else passes
    through. ``nan_at``: the n-th step (1-based) gets NaN advantages (its samples fetched
    here from their shards and sent to the ranks inline: a fault's path, not a run's).
    ``on_publish(version, refs)``: called right after ``publish_weights`` asked every
    generator for the update (the refs of their ``update_weights``), before the trainer waits
    on them."""

    def __init__(self, inner, nan_at: int | None = None, on_publish=None):
        self.inner, self.nan_at, self.on_publish = inner, nan_at, on_publish
        self.train_calls = 0
        self.nan_injected_at: float | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def train_batch(self, batch):
        from cluster.records.files import ordered_samples

        self.train_calls += 1
        if self.train_calls != self.nan_at:
            return self.inner.train_batch(batch)
        samples = [dataclasses.replace(s, advantage=math.nan) for s in ordered_samples(batch)]
        self.nan_injected_at = time.time()
        return self.inner.train_step(samples)

    def publish_weights(self, generators, version):
        payload, refs = self.inner.publish_weights(generators, version)
        if self.on_publish is not None:
            self.on_publish(version, refs)
        return payload, refs


class Watch(threading.Thread):
    """Polls a probe every ``every_s`` from the moment of a fault: ``t_down`` is when the probe
    first says the role is out, ``t_back`` when it says it is back after that. The probe
    returns True (in service), False (out), or raises (out, or not answering)."""

    def __init__(self, probe, t_fault: float, timeout_s: float, every_s: float = 0.2,
                 down_is_known: bool = False):
        super().__init__(daemon=True)
        self.probe, self.t_fault, self.every_s = probe, t_fault, every_s
        self.deadline = time.time() + timeout_s
        self.t_down = t_fault if down_is_known else None
        self.t_back: float | None = None
        self.last: object = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set() and time.time() < self.deadline:
            try:
                up = bool(self.probe())
            except Exception as err:  # noqa: BLE001 - out (dead, restarting, gone)
                up, self.last = False, f"{type(err).__name__}"
            now = time.time()
            if not up and self.t_down is None:
                self.t_down = now
            elif up and self.t_down is not None:
                self.t_back = now
                return
            self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()

    @property
    def down_after_s(self) -> float | None:
        return None if self.t_down is None else self.t_down - self.t_fault

    @property
    def back_after_s(self) -> float | None:
        return None if self.t_back is None else self.t_back - self.t_fault


def in_service(coord, index: int):
    """Probe: generator ``index`` is in the coordinator's service (alive in its scheduler)."""
    import ray

    return lambda: ray.get(coord.serving.remote(), timeout=10)[index]


def pid_of(handle, timeout_s: float = 10.0) -> int:
    """The process id of the actor behind ``handle`` (Ray's ``__ray_call__``: no method of
    the actor's own is needed)."""
    import ray

    return ray.get(handle.__ray_call__.remote(lambda actor: __import__("os").getpid()),
                   timeout=timeout_s)


def restarted(handle, old_pid: int):
    """Probe: the actor answers again from a new process (Ray restarted it)."""
    return lambda: pid_of(handle, 5.0) != old_pid


class GeneratorKill:
    """An ``after_step`` hook: at step ``at``, kill generator ``index`` while it holds work
    (Ray restarts it: ``max_restarts``); at step ``hold_at``, hold the driver until the
    coordinator has it back in service (at most ``hold_s``), so that its re-sync and its use
    afterwards happen inside the run. ``kill_now`` does the kill for other triggers."""

    def __init__(self, trainer, index: int, at: int | None, hold_at: int, hold_s: float):
        self.trainer, self.index, self.at = trainer, index, at
        self.hold_at, self.hold_s = hold_at, hold_s
        self.t_kill: float | None = None
        self.in_flight_at_kill: int | None = None
        self.watch: Watch | None = None

    def __call__(self, step: int, metrics: dict) -> None:
        if step == self.at:
            self.kill_now(wait_for_work=True)
        if step == self.hold_at and self.watch is not None:
            self.watch.join(timeout=self.hold_s)

    def kill_now(self, wait_for_work: bool = False) -> None:
        import ray

        g = self.trainer.roles.generators[self.index]
        if wait_for_work:  # mid-generation: the victim holds rollouts (a few seconds at most)
            wait_for(lambda: ray.get(g.stats.remote(), timeout=5).in_flight > 0, 5.0, 0.02)
        try:
            self.in_flight_at_kill = ray.get(g.stats.remote(), timeout=5).in_flight
        except Exception:  # noqa: BLE001 - counted as unknown
            self.in_flight_at_kill = None
        self.t_kill = time.time()
        ray.kill(g, no_restart=False)  # a crash: Ray restarts the actor (max_restarts)
        self.watch = Watch(in_service(self.trainer.coord, self.index), self.t_kill,
                           timeout_s=self.hold_s + 60)
        self.watch.start()
