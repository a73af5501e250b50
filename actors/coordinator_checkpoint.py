"""The coordinator's checkpoint state: every admitted, untrained prompt (the scheduler's
snapshot), the sampler position, the counters and the fault events, written by
``snapshot_to`` and read back at start-up (``_restore``); a mixin of ``Coordinator``."""
from __future__ import annotations

import asyncio
import dataclasses

from common.atomic import write_atomic
from common.types import Rollout


class CoordinatorCheckpoint:
    async def snapshot_to(self, path: str) -> int:
        """Write every admitted, untrained prompt (estimator state, finished rollouts), the
        sampler position and the counters to ``path`` (msgpack); returns prompts written.
        Taken between two awaits: a consistent point of the scheduler."""
        import msgpack

        snap = {"scheduler": self.sched.snapshot(dataclasses.asdict, Rollout.to_dict),
                "data_pos": self.admitted_pos,
                "counts": dict(self.counts), "served": self.served, "events": list(self.events)}
        data = msgpack.packb(snap, use_bin_type=True)
        await asyncio.to_thread(write_atomic, path, data)
        return len(snap["scheduler"]["inflight"])

    @property
    def admitted_pos(self) -> int:
        """The stream position up to which prompts were admitted: prompts drawn but still
        waiting for the prior are not (a resumed run draws them again)."""
        return self.sampler.position if self._drawing_from is None else self._drawing_from

    def _restore(self, path: str) -> None:
        import msgpack

        from tasks.base import Problem

        with open(path, "rb") as f:
            snap = msgpack.unpackb(f.read(), raw=False, strict_map_key=False)
        self._restored = self.sched.restore(snap["scheduler"], lambda d: Problem(**d),
                                            lambda d: Rollout(**d))
        self.sampler.position = snap["data_pos"]
        counts = dict(snap["counts"])
        # Checkpoints written before ``served`` was a list kept it among the counts.
        self.served = snap.get("served") or [counts.pop(f"served{i}", 0) for i in range(len(self.gens))]
        old = {"prior_fallback": "prior_fallbacks", "restarts": "generator_restarts"}
        self.counts.update({old.get(k, k): n for k, n in counts.items() if not k.startswith("served")})
        self.events = [tuple(e) for e in snap["events"]]
