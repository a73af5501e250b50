"""A generator whose node is lost is replaced by the run, not left to Ray.

Ray would restart the actor by itself once its placement group's bundle found room again. But
a group whose node was lost stays in Ray's RESCHEDULING state until then, and on Ray 2.60 the
head's GCS retries it in a tight loop: a whole core of the head, for as long as no node
has room (measured: 96-99% of a core with the run's two-node loss, `tests.acceptance.chaos`
``node_lost_generators``; 0.5% once the group is removed; a group asked for anew and waiting
for room, state PENDING, costs nothing). So each generator has a placement group of its own
(``cluster.nodes.placement``), and ``Replacer`` looks at them every ``poll_s`` seconds, from a
thread of the driver, between the steps and while a step waits for its batch:

- a generator's group that lost its node is removed (Ray ends the actor in it for good) and
  a new one with the same bundle is asked for;
- once a new group is placed (a node joined with room), a new generator starts in it the
  way the first ones did (``Roles.new_generator``); the driver's handle is swapped and the
  coordinator is told (``Coordinator.replace_generator``): it loads the newest weights into
  the new one and puts it back in service, as it does for one Ray restarted.

Meanwhile the coordinator has the lost generator out of service and its work re-issued to the
others. What happened is said on the console (``said``) and kept (``events``, summary.json's
``generators_replaced``).
"""
from __future__ import annotations

import threading
import time

from cluster.nodes.placement import group_key

POLL_S = 2.0
TELL_TIMEOUT_S = 30.0  # the coordinator answers a replace at once; a stuck one is the watchdog's


class Replacer:
    def __init__(self, roles, coord, t0: float | None = None, poll_s: float = POLL_S):
        self.roles, self.coord, self.poll_s = roles, coord, poll_s
        self.t0 = time.time() if t0 is None else t0
        self.waiting: dict[int, object] = {}   # generator -> its new group, not yet placed
        self.events: list[dict] = []           # {t, generator, event, node}
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.roles.new_generator is not None and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="generator-replacer",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + TELL_TIMEOUT_S)

    def said(self) -> list[str]:
        """What happened since the last call, a line each."""
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    def _loop(self) -> None:
        while not self._halt.wait(self.poll_s):
            try:
                self.check()
            except Exception as err:  # noqa: BLE001 - say it, look again next time
                self._say(None, "error", None, f"replacing generators failed: "
                                               f"{type(err).__name__}: {err}")

    def check(self) -> None:
        """One look at every generator's group: replace what a lost node took."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table()
        for i in range(len(self.roles.generators)):
            pg = self.roles.placement_groups.get(group_key("generator", i))
            info = table.get(pg.id.hex(), {}) if pg is not None else {}
            if i not in self.waiting and info.get("state") == "RESCHEDULING":
                self._regroup(i, pg)
            elif i in self.waiting and info.get("state") == "CREATED":
                self._restart(i, pg, info["bundles_to_node_id"].get(0))

    def _regroup(self, i: int, pg) -> None:
        """Generator ``i``'s node is lost: its group goes (the actor with it) and a new one,
        of the same bundle, waits for room."""
        from ray.util.placement_group import placement_group, remove_placement_group

        remove_placement_group(pg)
        new = placement_group(list(pg.bundle_specs), strategy="PACK")
        self.roles.placement_groups[group_key("generator", i)] = new
        self.waiting[i] = new
        self._say(i, "regrouped", None,
                  f"generator-{i}: its node is lost; its placement group is removed (Ray ends "
                  "the actor) and a new one waits for a node with room")

    def _restart(self, i: int, pg, node: str | None) -> None:
        """Generator ``i``'s new group is placed: a new generator there, in service once the
        coordinator has loaded the newest weights into it."""
        import ray

        del self.waiting[i]  # one actor per group, whatever the coordinator answers
        handle = self.roles.new_generator(i, pg)
        self.roles.generators[i] = handle
        self._say(i, "started", node,
                  f"generator-{i}: a new one is starting on node {(node or '?')[:8]}; it "
                  "serves once it has the current weights")
        # Queued on the coordinator even if this wait gives up; a dead one is the run's end.
        ray.get(self.coord.replace_generator.remote(i, handle), timeout=TELL_TIMEOUT_S)

    def _say(self, i: int | None, event: str, node: str | None, line: str) -> None:
        with self._lock:
            self.events.append({"t": round(time.time() - self.t0, 1), "generator": i,
                                "event": event, "node": node})
            self._lines.append(line)
