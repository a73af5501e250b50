"""Check where every role of a config would run, before a real launch, starting no model:

    python -m cluster.launch CONFIG --check-placement

Joins the cluster a launch would join (``cluster.address``, ``RAY_ADDRESS``, or one started
with ``ray start`` on this machine). With none (or ``cluster.address=local``) it simulates the
config's cluster here: ``cluster.nodes`` Ray nodes of ``cluster.gpus_per_node`` logical GPUs
(``ray.cluster_utils.Cluster`` on 127.0.0.1, private temp dir). Then it reserves the placement
groups exactly as a launch does (``cluster.nodes.placement.reserve``), starts one tiny probe actor
per role actor with that actor's resources and bundle (the learner's through
``learner.ranks.rank_options``, the learner's own code), finds the learner's rendezvous the
way ``Learner`` does, and reports the node and GPU ids of each. No probe touches a GPU:
they read Ray's node id and ``ray.get_gpu_ids()``; no vLLM, no DeepSpeed.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

from cluster.nodes.placement import (
    Plan, PlacementError, Reservation, check_fits, layout, live_nodes, reserve)

# Simulated nodes: a small object store each (probes store nothing), no workers started
# ahead of demand (Ray would prestart one per logical CPU: hundreds here), and few probe
# processes starting at once per node (they all start on this machine's cores).
SIM_OBJECT_STORE = 100 * 1024 * 1024
SIM_SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "enable_worker_prestart": False,
                     "worker_maximum_startup_concurrency": 2}
SIM_TIMEOUT_S = 30.0   # an empty simulated cluster places a group in well under a second
LIVE_TIMEOUT_S = 60.0  # a real cluster may be finishing other work


@dataclass(frozen=True)
class Shape:
    """A cluster of identical nodes."""

    nodes: int
    gpus_per_node: int
    cpus_per_node: int  # Ray's nodes have whole CPUs

    def node_resources(self) -> list[dict[str, float]]:
        return [{"CPU": float(self.cpus_per_node), "GPU": float(self.gpus_per_node)}] * self.nodes

    def describe(self) -> str:
        return (f"{self.nodes} node(s) x {self.gpus_per_node} GPU, {self.cpus_per_node:g} CPU "
                "(simulated here on 127.0.0.1)")


@dataclass(frozen=True)
class Landing:
    """Where one role actor's probe ran."""

    role: str
    index: int          # actor index within its role (learner: the rank)
    node_id: str
    node_ip: str
    gpu_ids: tuple[str, ...]


def simulated_shape(cfg, p: Plan) -> Shape:
    """The config's cluster shape (``cluster.nodes/gpus_per_node/cpus_per_node``)."""
    c = cfg.cluster
    if c.gpus_per_node is None and p.total_gpus > 0:
        raise PlacementError(
            f"the plan uses {p.total_gpus:g} GPUs but the config does not say what cluster it is "
            "meant for: set cluster.nodes and cluster.gpus_per_node (e.g. cluster.nodes=4 "
            "cluster.gpus_per_node=8), or run --check-placement where the cluster is running")
    return Shape(nodes=c.nodes or 1, gpus_per_node=c.gpus_per_node or 0,
                 cpus_per_node=c.cpus_per_node or math.ceil(p.total_cpus))


@contextlib.contextmanager
def private_ray_tmpdir(prefix: str = "v05sim-"):
    """A fresh folder as ``RAY_TMPDIR`` while the block runs (then the previous value, and the
    folder removed): a cluster started in it keeps its files, and Ray's address file, which
    ``ray.init(address="auto")`` reads, to itself, so other Ray drivers on this machine never
    find or join it."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: Ray's socket paths < 108
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    try:
        yield tmp
    finally:
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def simulated_cluster(shape: Shape):
    """A Ray cluster of ``shape`` on this machine (in a ``private_ray_tmpdir``), this process
    connected to it as driver."""
    import ray
    from ray.cluster_utils import Cluster

    node = dict(num_cpus=shape.cpus_per_node, num_gpus=shape.gpus_per_node,
                node_ip_address="127.0.0.1", object_store_memory=SIM_OBJECT_STORE)
    cluster = None
    with private_ray_tmpdir():
        try:
            cluster = Cluster(initialize_head=True, head_node_args={
                **node, "include_dashboard": False, "_system_config": SIM_SYSTEM_CONFIG})
            for _ in range(shape.nodes - 1):
                cluster.add_node(**node)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
            yield cluster
        finally:
            if ray.is_initialized():
                ray.shutdown()
            if cluster is not None:
                cluster.shutdown()


class _Probe:
    """Stands in for one role actor: holds its resources, reports where it runs."""

    def where(self) -> tuple[str, str, tuple[str, ...]]:
        import ray

        return (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
                tuple(str(g) for g in ray.get_gpu_ids()))


def actor_options(p: Plan, groups: dict, reservations: tuple[Reservation, ...]) -> dict:
    """{role: [Ray options of each actor]}, as the launch starts them (cluster/nodes/roles.py);
    the learner's from ``learner.ranks.rank_options``, which ``Learner`` uses."""
    from cluster.nodes.roles import pg_strategy
    from learner.ranks import rank_options

    out = {}
    for res in reservations:
        r = p[res.role]
        if res.role == "learner":
            out["learner"] = rank_options(r.count, r.cpus, r.gpus, groups["learner"])
        else:
            out[res.role] = [{"num_cpus": r.cpus, "num_gpus": r.gpus,
                              "scheduling_strategy": pg_strategy(groups[key], bundle)}
                             for key, bundle in map(res.where, range(len(res.slots)))]
    return out


def probe(p: Plan, groups: dict, reservations: tuple[Reservation, ...]):
    """Start every probe at once (all hold their resources together, as the roles will),
    ask each where it is, find the learner's rendezvous; returns (landings, rendezvous)."""
    import ray

    from learner.ranks import rendezvous

    options = actor_options(p, groups, reservations)
    cls = ray.remote(_Probe)
    handles = {role: [cls.options(**o).remote() for o in opts] for role, opts in options.items()}
    try:
        where = {role: ray.get([h.where.remote() for h in hs]) for role, hs in handles.items()}
        meet = rendezvous(options["learner"][0]) if "learner" in options else None
    finally:
        for hs in handles.values():
            for h in hs:
                ray.kill(h)
    landings = [Landing(role, i, *w) for role, ws in where.items() for i, w in enumerate(ws)]
    return landings, meet


def problems(p: Plan, reservations, landings: list[Landing], meet) -> list[str]:
    """What is wrong with where the probes landed (empty: the plan is placed as it must be)."""
    out = []
    by_role = {r.role: [x for x in landings if x.role == r.role] for r in reservations}
    for res in reservations:
        r, got = p[res.role], by_role[res.role]
        if len(got) != r.count:
            out.append(f"{res.role}: {len(got)} placed, {r.count} planned")
        want = math.ceil(r.gpus)  # a fractional share still sees one GPU id
        for x in got:
            if len(x.gpu_ids) != want:
                out.append(f"{res.role} {x.index}: GPUs {list(x.gpu_ids)}, wanted {want}")
        nodes = {x.node_id for x in got}
        per_bundle = {}
        for x in got:
            slot = res.slots[x.index] if x.index < len(res.slots) else None
            per_bundle.setdefault(slot, set()).add(x.node_id)
        if any(len(v) > 1 for v in per_bundle.values()):
            out.append(f"{res.role}: actors of one bundle on different nodes")
        if res.strategy == "STRICT_PACK" and len(nodes) > 1:
            out.append(f"{res.role}: on {len(nodes)} nodes, STRICT_PACK keeps it on one")
        if res.strategy == "STRICT_SPREAD" and len(nodes) < len(per_bundle):
            out.append(f"{res.role}: {len(per_bundle)} bundles share {len(nodes)} node(s)")
    ranks = sorted(by_role.get("learner", []), key=lambda x: x.index)
    if ranks and meet is not None and meet.node_id != ranks[0].node_id:
        out.append(f"learner rendezvous on node {meet.node_id[:8]}, rank 0 on "
                   f"{ranks[0].node_id[:8]}")
    whole = [(x.node_id, g) for x in landings if p[x.role].gpus >= 1 for g in x.gpu_ids]
    if len(set(whole)) != len(whole):
        out.append("two actors were given the same whole GPU")
    if len(whole) != sum(r.count * r.gpus for r in p.roles if r.gpus >= 1):
        out.append(f"{len(whole)} whole GPUs placed, the plan asks for "
                   f"{sum(r.count * r.gpus for r in p.roles if r.gpus >= 1):g}")
    return out


def _span(ids: list[int]) -> str:
    ids = sorted(ids)
    return f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1 \
        else ",".join(map(str, ids))


def render(p: Plan, nodes: list[dict], reservations, landings: list[Landing], meet,
           where: str) -> str:
    """The report a person reads: nodes, then each role's actors and GPUs node by node."""
    number = {n["NodeID"]: i + 1 for i, n in enumerate(nodes)}
    lines = [f"cluster: {where}"]
    for n in nodes:
        res = n["Resources"]
        lines.append(f"  node {number[n['NodeID']]}: {n['NodeManagerAddress']} "
                     f"id {n['NodeID'][:8]}  {res.get('GPU', 0):g} GPU, {res.get('CPU', 0):g} CPU"
                     + ("  (head)" if "node:__internal_head__" in res else ""))
    for res in reservations:
        lines.append(res.describe())
        got = [x for x in landings if x.role == res.role]
        for node_id in sorted({x.node_id for x in got}, key=number.get):
            here = [x for x in got if x.node_id == node_id]
            gpus = sorted((g for x in here for g in x.gpu_ids), key=lambda g: (len(g), g))
            name = "rank" if res.role == "learner" else res.role
            lines.append(f"  node {number[node_id]}: {name} {_span([x.index for x in here])}"
                         f"  GPUs {','.join(gpus) if gpus else 'none'}")
        if res.role == "learner" and meet is not None:
            lines.append(f"  rendezvous {meet.addr}:{meet.port} on node "
                         f"{number.get(meet.node_id, '?')} (rank 0's node)")
    holders: dict[tuple, int] = {}  # a GPU, whole or shared (fractional shares), counts once
    for x in landings:
        for g in x.gpu_ids:
            holders[(x.node_id, g)] = holders.get((x.node_id, g), 0) + 1
    shared = sum(1 for n in holders.values() if n > 1)
    total = sum(n["Resources"].get("GPU", 0) for n in nodes)
    lines.append(f"GPUs placed: {len(holders)} of {total:g} on "
                 f"{len({x.node_id for x in landings})} node(s)"
                 + (f" ({shared} shared by several actors)" if shared else "")
                 + f"; CPUs reserved: {p.total_cpus:g}")
    return "\n".join(lines)


def _join(cfg) -> bool:
    """Join the cluster a launch would join; False when there is none to join."""
    import ray

    address = cfg.cluster.address or os.environ.get("RAY_ADDRESS")
    if address == "local":
        return False
    try:
        ray.init(address=address or "auto", logging_level="ERROR", log_to_driver=False)
        return True
    except ConnectionError:
        if address:  # given explicitly: not reaching it is the answer
            raise
        return False


def check(cfg, p: Plan, out=None) -> int:
    """Place ``p`` with probes and print the report; 0 when every role landed as it must.
    Raises PlacementError (the launcher exits 2 with its message) when the plan cannot fit."""
    from common.rayproc import prefer_loopback

    prefer_loopback(cfg.cluster.address)  # a simulated cluster listens on 127.0.0.1 only
    import ray
    from ray.util.placement_group import remove_placement_group

    out = out or sys.stdout
    if _join(cfg):
        scope = contextlib.nullcontext()
        where, timeout_s = f"joined {ray.get_runtime_context().gcs_address}", LIVE_TIMEOUT_S
    else:
        shape = simulated_shape(cfg, p)
        # Fail before starting anything when the shape cannot hold the plan on paper.
        check_fits(p, {"GPU": shape.nodes * shape.gpus_per_node,
                       "CPU": shape.nodes * shape.cpus_per_node})
        layout(p, shape.node_resources())
        print(f"starting a simulated cluster: {shape.describe()}", file=sys.stderr, flush=True)
        scope, where, timeout_s = simulated_cluster(shape), shape.describe(), SIM_TIMEOUT_S
    with scope:
        nodes = live_nodes()
        reservations = layout(p, [n["Resources"] for n in nodes])  # what reserve() asks for
        groups = reserve(p, timeout_s)
        try:
            landings, meet = probe(p, groups, reservations)
        finally:
            for pg in groups.values():
                remove_placement_group(pg)
    print(render(p, nodes, reservations, landings, meet, where), file=out)
    found = problems(p, reservations, landings, meet)
    for msg in found:
        print(f"problem: {msg}", file=out)
    print("placement OK" if not found else "placement FAILED", file=out, flush=True)
    return 0 if not found else 1
