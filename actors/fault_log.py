"""What went wrong on the coordinator's side, for the run's summary and the watchdog: the
counts by kind (``FaultCounts``: ``coordinator_error``, ``task_error``, ``prior_fallbacks``;
a generator lost is the scheduler's ``generator_losses``), the events
(``(t, kind, generator, detail)``, seconds since the coordinator started), the last error
and the prior's last error. Pure standard library."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from typing import Literal, get_args


@dataclass
class FaultCounts:
    """The fault log's counters (``FaultLog.counts``), read by attribute; a checkpoint keeps
    them under these names."""

    coordinator_error: int = 0  # exceptions handling a request's completions (prompt dropped)
    task_error: int = 0         # exceptions in a task the coordinator spawned
    prior_fallbacks: int = 0    # prompts admitted without the prior's score (it failed)

    # Names older checkpoints wrote: renamed, or counted elsewhere now (``restarts`` and
    # ``generator_restarts`` are the scheduler's ``generator_losses``; ``served{i}`` the pool's)
    OLD_NAMES = {"prior_fallback": "prior_fallbacks"}

    @classmethod
    def of(cls, d: dict) -> FaultCounts:
        """From a checkpoint's counts (old names mapped, names no longer counted here
        ignored)."""
        names = {f.name for f in fields(cls)}
        out = cls()
        for k, n in d.items():
            k = cls.OLD_NAMES.get(k, k)
            if k in names:
                setattr(out, k, getattr(out, k) + n)
        return out


# The kinds ``FaultLog.note`` counts: each a ``FaultCounts`` field
NotedKind = Literal["coordinator_error", "task_error"]
NOTED_KINDS: tuple[str, ...] = get_args(NotedKind)


class FaultLog:
    def __init__(self, t_start: float | None = None):
        self.t_start = time.time() if t_start is None else t_start
        self.counts = FaultCounts()
        self.events: list[tuple] = []
        self.last_error = ""         # the last exception on the coordinator's side
        self.last_prior_error = ""   # why the prior last failed (its prompts fell back)
        self._noted: set[tuple] = set()  # (kind, generator, type) already in events

    def event(self, kind: str, generator: int, detail) -> None:
        self.events.append((round(time.time() - self.t_start, 3), kind, generator, detail))

    def note(self, kind: NotedKind, generator: int, err: BaseException, where: str = "") -> None:
        """Record an error: counted (the ``counts`` field of its kind, one of
        ``NOTED_KINDS``: another is a ValueError), kept as ``last_error``, and put in
        ``events`` once per (kind, generator, exception type), so that a fault repeating
        every second does not flood the summary (``generator`` -1: none)."""
        if kind not in NOTED_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}: one of {NOTED_KINDS}")
        text = f"{where}{type(err).__name__}: {str(err)[:300]}"
        setattr(self.counts, kind, getattr(self.counts, kind) + 1)
        self.last_error = (f"{kind} (generator {generator}): {text}" if generator >= 0
                           else f"{kind}: {text}")
        key = (kind, generator, type(err).__name__)
        if key not in self._noted:
            self._noted.add(key)
            self.event(kind, generator, text)

    def prior_failed(self, prompts: int, err: BaseException) -> None:
        """The prior failed (timeout, dead actor, garbage): its prompts fell back."""
        self.counts.prior_fallbacks += prompts
        self.last_prior_error = f"{type(err).__name__}: {err}"

    def lost(self, generator: int, why: str) -> None:
        self.event("lost", generator, why)

    def snapshot(self) -> dict:
        """What a checkpoint keeps of it (msgpack-able: the counts as a dict of their names)."""
        return {"counts": asdict(self.counts), "events": [list(e) for e in self.events]}

    def restore(self, counts: dict, events: list) -> None:
        """A checkpoint's ``snapshot``, this code's or an older one's (``FaultCounts.of``)."""
        self.counts = FaultCounts.of(counts)
        self.events = [tuple(e) for e in events]

    def sizes(self) -> dict[str, int]:
        return {"events": len(self.events), "noted": len(self._noted)}
