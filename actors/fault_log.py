"""What went wrong on the coordinator's side, for the run's summary and the watchdog: counts
by kind (``prior_fallbacks``, ``task_error``, ...; a generator lost is the scheduler's
``generator_losses``), the events
(``(t, kind, generator, detail)``, seconds since the coordinator started), the last error
and the prior's last error. Pure standard library."""
from __future__ import annotations

import time
from collections import Counter


class FaultLog:
    def __init__(self, t_start: float | None = None):
        self.t_start = time.time() if t_start is None else t_start
        self.counts: Counter = Counter()
        self.events: list[tuple] = []
        self.last_error = ""         # the last exception on the coordinator's side
        self.last_prior_error = ""   # why the prior last failed (its prompts fell back)
        self._noted: set[tuple] = set()  # (kind, generator, type) already in events

    def event(self, kind: str, generator: int, detail) -> None:
        self.events.append((round(time.time() - self.t_start, 3), kind, generator, detail))

    def note(self, kind: str, generator: int, err: BaseException, where: str = "") -> None:
        """Record an error: counted (``counts[kind]``), kept as ``last_error``, and put in
        ``events`` once per (kind, generator, exception type), so that a fault repeating
        every second does not flood the summary (``generator`` -1: none)."""
        text = f"{where}{type(err).__name__}: {str(err)[:300]}"
        self.counts[kind] += 1
        self.last_error = (f"{kind} (generator {generator}): {text}" if generator >= 0
                           else f"{kind}: {text}")
        key = (kind, generator, type(err).__name__)
        if key not in self._noted:
            self._noted.add(key)
            self.event(kind, generator, text)

    def prior_failed(self, prompts: int, err: BaseException) -> None:
        """The prior failed (timeout, dead actor, garbage): its prompts fell back."""
        self.counts["prior_fallbacks"] += prompts
        self.last_prior_error = f"{type(err).__name__}: {err}"

    def lost(self, generator: int, why: str) -> None:
        self.event("lost", generator, why)

    def snapshot(self) -> dict:
        """What a checkpoint keeps of it (msgpack-able)."""
        return {"counts": dict(self.counts), "events": [list(e) for e in self.events]}

    def restore(self, counts: dict, events: list) -> None:
        """A checkpoint's ``snapshot`` (older checkpoints' counter names mapped)."""
        old = {"prior_fallback": "prior_fallbacks", "restarts": "generator_restarts"}
        self.counts.update({old.get(k, k): n for k, n in counts.items()
                            if not k.startswith("served")})
        self.events = [tuple(e) for e in events]

    def sizes(self) -> dict[str, int]:
        return {"events": len(self.events), "noted": len(self._noted)}
