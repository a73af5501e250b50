"""The cluster's nodes as a run sees them between its steps: which are alive, which of the run's
roles each one holds (its placement groups' bundles), and what changed since the last look: a
node lost, with the roles that were on it, or a node that joined. The trainer looks after
every step and says each change on the console, in metrics.jsonl (``nodes_alive``) and in
summary.json (``node_events``, and ``role_nodes``: where each role was at the start).

What a lost node costs is the roles' business: a generator's is replaced by the run once a
node has room (``cluster.nodes.replace``), and the coordinator re-issues its work meanwhile;
the learner's loss stops the run (``cluster.run.trainer``), resumable from the last
whole checkpoint."""
from __future__ import annotations

import time


def _alive_nodes() -> dict[str, str]:
    """Node id -> its address, for the alive nodes."""
    import ray

    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}


def role_nodes(groups: dict) -> dict[str, list[str]]:
    """Each role actor's node id as its placement group places it now (``groups``: key ->
    placement group, as ``cluster.nodes.placement.reserve`` names them): generator-<i> for
    generator i's own group, learner-<j> for the learner's j-th bundle (one per node it
    spans), prior, coordinator. A bundle waiting for room (its node lost, none free yet)
    has no node: it is left out."""
    from ray.util.placement_group import placement_group_table

    out: dict[str, list[str]] = {}
    for role, pg in groups.items():
        where = placement_group_table(pg)["bundles_to_node_id"]
        for i in sorted(where):
            if where[i]:
                name = f"{role}-{i}" if role == "learner" else role
                out.setdefault(where[i], []).append(name)
    return out


class NodeWatch:
    def __init__(self, groups: dict, t0: float | None = None):
        self.groups, self.t0 = groups, time.time() if t0 is None else t0
        self.alive = _alive_nodes()
        self.where = role_nodes(groups)
        # Role actor -> "<node id prefix> (<address>)": where each was placed at the start.
        self.at_start = {role: f"{node[:8]} ({self.alive.get(node, '?')})"
                         for node, roles in self.where.items() for role in roles}
        self.events: list[dict] = []   # every change: {t, step, event, node, address, roles}

    def look(self, step: int) -> list[str]:
        """What changed since the last look, one line each (also kept in ``events``)."""
        now = _alive_nodes()
        lines = []
        for event, nodes, addresses in (("lost", self.alive.keys() - now.keys(), self.alive),
                                        ("joined", now.keys() - self.alive.keys(), now)):
            for node in sorted(nodes):
                roles = self.where.get(node, []) if event == "lost" else []
                self.events.append({"t": round(time.time() - self.t0, 1), "step": step,
                                    "event": event, "node": node,
                                    "address": addresses[node], "roles": roles})
                held = (f": it held {', '.join(roles)}" if roles else
                        ": it held no role of this run" if event == "lost" else "")
                lines.append(f"node {node[:8]} ({addresses[node]}) {event} after step "
                             f"{step}{held}")
        self.alive = now
        self.where = role_nodes(self.groups)
        return lines
