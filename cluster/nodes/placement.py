"""Resource placement: which GPUs/CPUs each role gets, through Ray placement groups.

``plan(cfg)`` is pure (tests compute the 32-GPU plan on a laptop): what each role asks for.
``layout(plan, nodes)`` is pure as well: each role's placement group (bundles, strategy, which
bundle each actor uses) for a cluster of the given node shapes. ``reserve(plan)`` asks Ray for
those groups, most constrained first, and fails with a clear error, before any actor starts,
when the cluster cannot hold the plan.

The rules (docs/cluster.md):
- learner: the ranks talk through NCCL/gloo collectives every step, so they share a node when
  they fit on one (STRICT_PACK, one bundle per rank). When they do not, the ranks are split
  as evenly as possible over the fewest nodes that hold them: one bundle per node holding
  that node's ranks, on distinct nodes (STRICT_SPREAD); rank 0's node hosts the rendezvous.
- prior and coordinator: one bundle each (the coordinator asks for no GPU).
- generators: one bundle per engine (an engine's GPUs always share a node), each in a group of
  its own, reserved after the learner and the prior (they take what those leave). A group of
  its own, because a node is lost one at a time: the lost engine's group is removed and a new
  one asked for (``cluster.nodes.replace``) while the others serve on. A group that lost its
  node is one Ray keeps trying to place again, and on Ray 2.60 that retry loop holds the
  head's GCS at a whole core until a node returns (tests.acceptance.chaos ``node_lost_generators``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from learner.bundles import fill_bundles, holds


COORDINATOR_CPUS = 0.1


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class RolePlan:
    role: str
    count: int          # actors of this role
    cpus: float         # logical CPUs per actor
    gpus: float         # GPUs per actor
    custom: tuple[tuple[str, float], ...] = ()  # custom resources per actor (node labels)

    @property
    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.cpus}
        if self.gpus:
            b["GPU"] = self.gpus
        return {**b, **dict(self.custom)}


@dataclass(frozen=True)
class Plan:
    roles: tuple[RolePlan, ...]

    def __getitem__(self, role: str) -> RolePlan:
        return next(r for r in self.roles if r.role == role)

    @property
    def total_gpus(self) -> float:
        return sum(r.count * r.gpus for r in self.roles)

    @property
    def total_cpus(self) -> float:
        return sum(r.count * r.cpus for r in self.roles)

    @property
    def total_custom(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.roles:
            for name, amount in r.custom:
                out[name] = out.get(name, 0.0) + r.count * amount
        return out

    def describe(self) -> str:
        return ", ".join(f"{r.role} {r.count}x{r.bundle}" for r in self.roles)


def plan(cfg) -> Plan:
    """The resources each role asks for, from the config's placement sections."""
    def custom(role: str) -> tuple:  # the nodes a role may use (cluster.resources)
        return tuple(sorted(cfg.cluster.resources.get(role, {}).items()))

    roles = (
        RolePlan("generator", cfg.generators.count, cfg.generators.cpus, cfg.generators.gpus,
                 custom("generator")),
        RolePlan("learner", cfg.learner.ranks, cfg.learner.cpus, cfg.learner.gpus,
                 custom("learner")),
        # A prior server only for an estimator that reads a prior (the registry says which).
        RolePlan("prior", 1 if cfg.needs_prior else 0,
                 cfg.prior.cpus, cfg.prior.gpus, custom("prior")),
        # The coordinator is light (asyncio bookkeeping, reward checks): a sliver of a CPU.
        # Both modes run through it (sync is its scheduler with a barrier).
        RolePlan("coordinator", 1, COORDINATOR_CPUS, 0, custom("coordinator")),
    )
    for r in roles:
        if r.gpus > 1 and not float(r.gpus).is_integer():
            raise PlacementError(f"{r.role}: a GPU count above 1 must be whole, got {r.gpus}")
    nccl = cfg.cluster.weight_sync_config.type == "nccl"
    if nccl and (cfg.generators.gpus == 0 or cfg.learner.gpus == 0):
        raise PlacementError("cluster.weight_sync=nccl needs GPUs for generators and learner; "
                             "use object_store on CPU machines")
    shared = [f"{ {'generator': 'generators'}.get(r.role, r.role)}.gpus={r.gpus:g}" for r in roles
              if r.role in ("generator", "learner") and 0 < r.gpus < 1]
    if nccl and shared:
        raise PlacementError(
            f"cluster.weight_sync=nccl needs each generator and learner rank on a GPU of its own, "
            f"but {' and '.join(shared)} share a device (NCCL refuses two ranks on one GPU): "
            "use cluster.weight_sync=object_store (through host memory) where roles share GPUs")
    return Plan(tuple(r for r in roles if r.count > 0))


def check_fits(p: Plan, available: dict[str, float], where: str = "the cluster") -> None:
    """Raise PlacementError if the plan asks for more than the cluster (``where``) has, of
    GPUs, CPUs or a custom resource (``cluster.resources``)."""
    for res, need in (("GPU", p.total_gpus), ("CPU", p.total_cpus), *p.total_custom.items()):
        have = available.get(res, 0.0)
        if need > have + 1e-9:
            fix = ("start nodes with it (ray start --resources) or change cluster.resources"
                   if res not in ("GPU", "CPU") else "lower the per-role cpus/gpus or the counts")
            raise PlacementError(
                f"placement asks for {need:g} {res} ({p.describe()}) but {where} has "
                f"{have:g}; {fix}")


# Reservation order: the most constrained role first, so that the generators' soft PACK
# fills what the learner (one node) and the prior leave, not the other way round.
ORDER = ("learner", "prior", "generator", "coordinator")


@dataclass(frozen=True)
class Reservation:
    """One role's placement group: its bundles, its strategy, the bundle of each actor."""

    role: str
    bundles: tuple[dict[str, float], ...]
    strategy: str           # Ray placement strategy
    slots: tuple[int, ...]  # slots[i]: bundle index of the role's actor i
    why: str                # the rule that chose the strategy, for people reading a report
    per_actor: bool = False  # one placement group per actor (bundle i its own group)

    def groups(self) -> list[tuple[str, tuple[dict[str, float], ...]]]:
        """(key, bundles) of each placement group ``reserve`` asks for: the role's one group
        under its name, or with ``per_actor`` one group per actor under ``group_key``."""
        if self.per_actor:
            return [(group_key(self.role, i), (b,)) for i, b in enumerate(self.bundles)]
        return [(self.role, self.bundles)]

    def where(self, actor: int) -> tuple[str, int]:
        """The key of actor ``actor``'s placement group and its bundle index there."""
        return (group_key(self.role, actor), 0) if self.per_actor else (self.role,
                                                                        self.slots[actor])

    def describe(self) -> str:
        shapes: dict[tuple, int] = {}  # bundle shape -> how many, in order
        for b in self.bundles:
            shapes[tuple(b.items())] = shapes.get(tuple(b.items()), 0) + 1
        body = " + ".join(f"{n}x{dict(sh)}" for sh, n in shapes.items())
        how = "a group each" if self.per_actor else self.strategy
        return f"{self.role}: {len(self.slots)} actor(s) in {body} {how} ({self.why})"


def group_key(role: str, actor: int) -> str:
    """The key of a per-actor placement group in ``reserve``'s answer: ``generator-3``."""
    return f"{role}-{actor}"


def _scaled(bundle: dict[str, float], n: int) -> dict[str, float]:
    return {k: v * n for k, v in bundle.items()}


def _learner(r: RolePlan, nodes: list[dict[str, float]] | None) -> Reservation:
    per_node = max(holds(n, r.bundle) for n in nodes) if nodes else r.count
    if per_node >= r.count:
        return Reservation("learner", (r.bundle,) * r.count, "STRICT_PACK",
                           tuple(range(r.count)), "all ranks on one node")
    # Fewest nodes, ranks as even as possible over them, one bundle per node.
    n = math.ceil(r.count / per_node)
    sizes = [r.count // n + (i < r.count % n) for i in range(n)]
    bundles = tuple(_scaled(r.bundle, k) for k in sizes)
    able = sum(1 for node in nodes if holds(node, bundles[0]) >= 1)
    if able < n:
        raise PlacementError(
            f"learner: {r.count} ranks of {r.bundle} need {n} nodes ({sizes} ranks each) but "
            f"only {able} node(s) hold {bundles[0]} (nodes: {_shapes(nodes)}); use fewer ranks "
            "or fewer GPUs per rank")
    slots = tuple(fill_bundles(bundles, r.bundle, r.count))  # Learner's rank -> bundle
    return Reservation("learner", bundles, "STRICT_SPREAD", slots,
                       f"{r.count} ranks exceed one node: split {sizes} over {n} nodes")


def _shapes(nodes: list[dict[str, float]]) -> str:
    return ", ".join(f"{n.get('GPU', 0):g} GPU/{n.get('CPU', 0):g} CPU" for n in nodes)


def layout(p: Plan, nodes: list[dict[str, float]] | None = None) -> tuple[Reservation, ...]:
    """Each role's placement group, most constrained first (``ORDER``). ``nodes``: every
    node's total resources ({"CPU": .., "GPU": ..}); None when unknown (the learner is then
    assumed to fit on one node). Raises PlacementError when a bundle fits on no node."""
    out = []
    for role in ORDER:
        r = next((x for x in p.roles if x.role == role), None)
        if r is None:
            continue
        if nodes and not any(holds(n, r.bundle) for n in nodes):
            raise PlacementError(f"{role}: one actor asks for {r.bundle} but no node has that "
                                 f"much (nodes: {_shapes(nodes)})")
        if role == "learner":
            out.append(_learner(r, nodes))
        elif role == "generator":
            out.append(Reservation(role, (r.bundle,) * r.count, "PACK", tuple(range(r.count)),
                                   "one bundle per engine, taking what learner and prior "
                                   "leave; a lost one is replaced alone", per_actor=True))
        else:
            out.append(Reservation(role, (r.bundle,), "STRICT_PACK", (0,), "one bundle"))
    return tuple(out)


def live_nodes() -> list[dict]:
    """The alive nodes of the connected cluster, head first: Ray's node records."""
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]
    return sorted(alive, key=lambda n: "node:__internal_head__" not in n["Resources"])


def reserve(p: Plan, timeout_s: float = 60.0) -> dict:
    """The placement groups of ``layout`` on the live nodes, each ready before the next is
    asked for; returns {key: placement_group}, a key per group (``Reservation.groups``: the
    role, or ``generator-<i>`` for each generator's own). A cluster that cannot hold the plan,
    in all (``check_fits``) or some role's actor on any node (``layout``), is refused with
    the numbers before any group is asked for (a plan that can never fit would otherwise wait
    on its groups); on a later failure the groups made so far are removed and PlacementError
    says which role did not fit and what was left."""
    import ray
    from ray.util.placement_group import placement_group

    check_fits(p, ray.cluster_resources())
    nodes = live_nodes()
    groups = {}
    try:
        for res in layout(p, [n["Resources"] for n in nodes]):
            for key, bundles in res.groups():
                groups[key] = placement_group(list(bundles), strategy=res.strategy)
                _wait_ready(groups, key, res, nodes, timeout_s)
    except BaseException:
        release(groups)
        raise
    return groups


def release(groups: dict) -> None:
    """Remove ``reserve``'s placement groups (Ray ends any actor still in one)."""
    from ray.util.placement_group import remove_placement_group

    for pg in groups.values():
        remove_placement_group(pg)


def _wait_ready(groups: dict, key: str, res: Reservation, nodes: list[dict],
                timeout_s: float) -> None:
    import time

    import ray
    from ray.util.placement_group import placement_group_table

    pg = groups[key]
    ready = pg.ready()
    deadline = time.monotonic() + timeout_s
    while not ray.wait([ready], timeout=0.5)[0]:
        # Ray marks a group INFEASIBLE when no set of nodes could ever hold it; on a fixed
        # cluster (ray start on every node) waiting longer cannot help.
        infeasible = placement_group_table(pg)["stats"]["scheduling_state"] == "INFEASIBLE"
        if infeasible or time.monotonic() > deadline:
            why = "no set of this cluster's nodes can hold it" if infeasible else (
                f"not ready after {timeout_s:g}s; is the cluster busy?")
            raise PlacementError(f"{res.describe()}: {key} {why}. Free per node after "
                                 f"{[r for r in groups if r != key] or 'nothing'}: "
                                 f"{free_per_node(groups, nodes, skip=key)}")


def free_per_node(groups: dict, nodes: list[dict], skip: str = "") -> str:
    """Each node's GPUs/CPUs minus the bundles of ``groups`` (our groups only: other jobs'
    use is not counted), as text for error messages."""
    from ray.util.placement_group import placement_group_table

    free = {n["NodeID"]: dict(n["Resources"]) for n in nodes}
    for role, pg in groups.items():
        if role == skip:
            continue
        where = placement_group_table(pg)["bundles_to_node_id"]
        for i, b in enumerate(pg.bundle_specs):
            for k, v in b.items():
                free[where[i]][k] = free[where[i]].get(k, 0.0) - v
    left = [free[n["NodeID"]] for n in nodes]
    return "; ".join(f"node {i + 1} ({n['NodeManagerAddress']}): {f.get('GPU', 0):g} GPU, "
                     f"{f.get('CPU', 0):g} CPU" for i, (n, f) in enumerate(zip(nodes, left)))
