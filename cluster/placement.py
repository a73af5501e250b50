"""Resource placement: which GPUs/CPUs each role gets, through Ray placement groups.

``plan(cfg)`` is pure (tests compute the 32-GPU plan on a laptop); ``reserve(plan)`` asks Ray
for one placement group per role and fails with a clear error, before any actor starts, when
the cluster cannot hold the plan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


COORDINATOR_CPUS = 0.1


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class RolePlan:
    role: str
    count: int          # actors of this role
    cpus: float         # logical CPUs per actor
    gpus: float         # GPUs per actor

    @property
    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.cpus}
        if self.gpus:
            b["GPU"] = self.gpus
        return b


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

    def describe(self) -> str:
        return ", ".join(f"{r.role} {r.count}x{r.bundle}" for r in self.roles)


def plan(cfg) -> Plan:
    """The resources each role asks for, from the config's placement sections."""
    roles = (
        RolePlan("generator", cfg.generators.count, cfg.generators.cpus, cfg.generators.gpus),
        RolePlan("learner", cfg.learner.ranks, cfg.learner.cpus, cfg.learner.gpus),
        RolePlan("prior", 1 if cfg.algo.name in ("v05", "prior_only") else 0,
                 cfg.prior.cpus, cfg.prior.gpus),
        # The coordinator is light (asyncio bookkeeping, reward checks): a sliver of a CPU.
        # Both modes run through it (sync is its scheduler with a barrier).
        RolePlan("coordinator", 1, COORDINATOR_CPUS, 0),
    )
    for r in roles:
        if r.gpus > 1 and not float(r.gpus).is_integer():
            raise PlacementError(f"{r.role}: a GPU count above 1 must be whole, got {r.gpus}")
    if cfg.cluster.weight_sync == "nccl" and (cfg.generators.gpus == 0 or cfg.learner.gpus == 0):
        raise PlacementError("cluster.weight_sync=nccl needs GPUs for generators and learner; "
                             "use object_store on CPU machines")
    return Plan(tuple(r for r in roles if r.count > 0))


def check_fits(p: Plan, available: dict[str, float]) -> None:
    """Raise PlacementError if the plan asks for more than the cluster has."""
    for res, need in (("GPU", p.total_gpus), ("CPU", p.total_cpus)):
        have = available.get(res, 0.0)
        if need > have + 1e-9:
            raise PlacementError(
                f"placement asks for {need:g} {res} ({p.describe()}) but the cluster has "
                f"{have:g}; lower the per-role cpus/gpus or the counts")


def reserve(p: Plan, timeout_s: float = 60.0):
    """One placement group per role, bundles packed; returns {role: placement_group}."""
    import ray
    from ray.util.placement_group import placement_group

    check_fits(p, ray.cluster_resources())
    groups = {r.role: placement_group([r.bundle] * r.count, strategy="PACK") for r in p.roles}
    for role, pg in groups.items():
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            raise PlacementError(f"placement group for {role} not ready after {timeout_s}s "
                                 f"({p[role].count}x{p[role].bundle}); is the cluster busy?")
    return groups


def threads_for(cpus: float, threads: int | None = None) -> int:
    """CPU threads an actor uses: its explicit setting, else its share rounded up (>= 1)."""
    return threads if threads else max(1, math.ceil(cpus))
