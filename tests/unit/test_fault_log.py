"""The coordinator's fault log: its counts are a ``FaultCounts`` record written as attributes
(``note`` takes only the kinds it has a field for), and a checkpoint's counts restore, this
code's and older ones' (a dict under older names)."""
from __future__ import annotations

from dataclasses import fields

import msgpack
import pytest

from actors.fault_log import NOTED_KINDS, FaultCounts, FaultLog


def test_noted_kinds_are_counted_as_fields_and_an_unknown_kind_is_refused():
    assert set(NOTED_KINDS) <= {f.name for f in fields(FaultCounts)}
    log = FaultLog(t_start=0.0)
    log.note("coordinator_error", -1, ValueError("x"))
    log.note("task_error", 2, KeyError("y"))
    log.note("task_error", 2, KeyError("y"))
    log.prior_failed(5, TimeoutError("slow"))
    assert log.counts == FaultCounts(coordinator_error=1, task_error=2, prior_fallbacks=5)
    assert [e[1:3] for e in log.events] == [("coordinator_error", -1), ("task_error", 2)]
    with pytest.raises(ValueError, match="unknown fault kind 'prior_fallbacks'"):
        log.note("prior_fallbacks", -1, ValueError("x"))
    assert log.counts.prior_fallbacks == 5


def test_a_snapshot_restores_through_msgpack():
    log = FaultLog(t_start=0.0)
    log.note("task_error", -1, RuntimeError("boom"))
    log.prior_failed(3, TimeoutError())
    snap = msgpack.unpackb(msgpack.packb(log.snapshot(), use_bin_type=True), raw=False)
    assert snap["counts"] == {"coordinator_error": 0, "task_error": 1, "prior_fallbacks": 3}
    again = FaultLog()
    again.restore(snap["counts"], snap["events"])
    assert again.counts == log.counts and again.events == log.events


def test_an_older_checkpoints_counts_dict_restores():
    """Written by a Counter: only the kinds that happened, ``prior_fallback`` before it was
    plural, a generator restart among them (now the scheduler's ``generator_losses``) and the
    requests each generator served (now the pool's ``served``)."""
    old = {"prior_fallback": 4, "restarts": 2, "generator_restarts": 1, "served0": 17,
           "task_error": 1}
    log = FaultLog()
    log.restore(old, [[1.5, "lost", 0, "RayActorError"]])
    assert log.counts == FaultCounts(task_error=1, prior_fallbacks=4)
    assert log.events == [(1.5, "lost", 0, "RayActorError")]
