"""The role actors in their reserved placement groups (``cluster.nodes.placement.reserve``,
on the cluster ``cluster.nodes.connect`` joined): generators, prior and learner started
together and waited for, and ``Roles``, the handles the driver holds.

Everything here imports Ray lazily so that ``cluster.config.schema`` and ``--help`` stay fast.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from common.model_files import check_same_model
from common.names import actor_name
from common.threads import threads_for
from cluster.nodes.placement import group_key, release


def log_dir(cfg) -> Path | None:
    """Where the roles' output goes: <run dir>/logs/ (None with logging.verbose: the console,
    as Ray forwards it)."""
    return None if cfg.logging.verbose else cfg.run_dir / "logs"


def log_path(cfg, role: str) -> str | None:
    d = log_dir(cfg)
    return None if d is None else str(d / f"{role}.log")


@dataclass
class Startup:
    """Seconds from the start (before placement) to each role's ready answer, written once by
    ``start_roles`` and read by attribute: the launcher's "actors up" line, summary.json's
    ``startup`` (``to_json``). A role the run does not have stays None."""

    placement_s: float | None = None
    generators_s: float | None = None
    learner_s: float | None = None
    prior_s: float | None = None
    engines_s: list[float] = field(default_factory=list)  # each engine's own start
    total_s: float | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def line(self) -> str:
        """``actors up in Ns (learner Ns, generators Ns[, prior Ns])``."""
        prior = "" if self.prior_s is None else f", prior {self.prior_s:.0f}s"
        return (f"actors up in {self.total_s:.0f}s (learner {self.learner_s:.0f}s, "
                f"generators {self.generators_s:.0f}s{prior})")


@dataclass
class Roles:
    """Handles of the running actors; the driver talks to the system only through these."""

    generators: list
    learner: object
    prior: object | None = None
    # Ray placement groups by key: a role's, or generator-<i> for each generator's own
    # (cluster.nodes.placement.reserve); a replaced generator's is its new one.
    placement_groups: dict = field(default_factory=dict)
    # The policy version: the newest weights the learner published to the generators. Its one
    # owner, and its one "only goes forward" check (``advance``, before any weights are
    # sent: a generator refusing a stale version would leave a broadcast waiting); a fresh
    # run takes what the generators serve (``adopt``). The trainer reads it; the coordinator's
    # scheduler and each generator keep what they were last told (set_version,
    # update_weights), and nothing else in the product stores a version
    # (tests/unit/test_structure.py).
    published: int = 0
    startup: Startup = field(default_factory=Startup)
    # What the learner and the engines compute in (``run_dtypes_of``), resolved once before
    # they start: the start's line and summary.json read it here.
    dtypes: dict = field(default_factory=dict)
    # Starts generator i in a placement group, as ``start_roles`` started the first ones
    # (``cluster.nodes.replace``: a generator whose node was lost). None: not replaceable.
    new_generator: Callable | None = None

    def advance(self, version: int) -> int:
        """``version`` is the next to publish: strictly newer than the last published one
        (0 is the initial checkpoint), else ValueError before anything is sent."""
        if version <= self.published:
            raise ValueError(f"weight version {version} is not newer than the last "
                             f"published version {self.published}")
        self.published = version
        return version

    def adopt(self, served: int) -> None:
        """A fresh run on generators that already serve ``served`` (actors that outlived a
        run): the policy version continues from there; never back."""
        self.published = max(self.published, served)

    def shutdown(self) -> None:
        import ray

        if self.learner is not None:
            self.learner.shutdown()
        for h in self.generators + ([self.prior] if self.prior is not None else []):
            ray.kill(h, no_restart=True)
        release(self.placement_groups)


def pg_strategy(pg, index: int):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


def start_generator(cfg, model_path: str, i: int, pg, name: str):
    """Generator ``i`` in placement group ``pg`` (its own, bundle 0), Ray actor ``name``; not
    waited for."""
    import ray

    from actors.generator import Generator

    g = cfg.generators
    threads = threads_for(g.cpus, g.threads)
    ncores = os.cpu_count() or 1
    # Pin each CPU engine's threads to its own cores so two engines do not share core 0.
    first = (i * threads) % ncores
    bind = None if g.gpus else ",".join(str((first + j) % ncores) for j in range(threads))
    env = {"runtime_env": {"env_vars": cfg.cluster.role_env}} if cfg.cluster.role_env else {}
    return ray.remote(Generator).options(
        name=name, num_cpus=g.cpus, num_gpus=g.gpus, max_restarts=3, max_task_retries=0,
        max_concurrency=1024, scheduling_strategy=pg_strategy(pg, 0), **env,
    ).remote(model_path, i, g.engine, threads, bind, log_path(cfg, f"generator-{i}"))


def new_generator(cfg, model_path: str, i: int, pg):
    """Generator ``i`` started anew in ``pg`` (``Roles.new_generator``: one whose node was
    lost), named as the first was."""
    return start_generator(cfg, model_path, i, pg, actor_name(cfg.run.name, f"generator-{i}"))


def start_learner(cfg, model_path: str, pg):
    from learner.ranks import Learner

    lp = cfg.learner
    logs = log_dir(cfg)
    return Learner(model_path, lp.ranks, cfg.optim, num_cpus_per_rank=lp.cpus,
                   placement_group=pg, num_gpus_per_rank=lp.gpus, threads=lp.threads,
                   log_dir=None if logs is None else str(logs), run_name=cfg.run.name,
                   rendezvous_port=lp.rendezvous_port, env=cfg.cluster.role_env)


def start_prior(cfg, pg, name: str):
    """The prior server in ``pg`` (bundle 0), Ray actor ``name``; not waited for."""
    import ray

    from actors.priors.server import PriorServer

    p = cfg.prior
    handle = ray.remote(PriorServer).options(
        name=name, num_cpus=p.cpus, num_gpus=p.gpus, max_restarts=1,
        scheduling_strategy=pg_strategy(pg, 0),
    ).remote(p.backend, p.options, p.window, threads_for(p.cpus), fallback=p.fallback,
             fallback_options=p.fallback_options, budget_s=p.server_budget_s,
             log_path=log_path(cfg, "prior"))
    return handle


def run_dtypes_of(cfg) -> dict:
    """The run's learner and engine dtypes as their roles resolve them (on a CPU, ``auto``
    is this machine's measured choice for the model: ``common.cpu_dtype``)."""
    from common.cpu_dtype import run_dtypes

    return run_dtypes(cfg.optim.dtype, cfg.generators.engine.dtype,
                      on_gpu=bool(cfg.generators.gpus or cfg.learner.gpus),
                      model_path=cfg.model_path())


def measure_dtype(cfg) -> dict:
    """``run_dtypes_of(cfg)``, once, here, before the roles start: on a CPU with a dtype
    ``auto`` this machine's bf16 probe for the run's model runs now (the first run of a model
    on a machine, said when it ran) and the roles read its cached answer instead of each
    probing at once (common/cpu_dtype.py)."""
    t = time.perf_counter()
    dtypes = run_dtypes_of(cfg)
    probe = dtypes.get("cpu_probe") or {}
    if probe.get("source") == "probe":
        print(f"dtype probe for this model on this CPU: {time.perf_counter() - t:.0f}s, "
              f"chose {probe['chosen']} (kept for the next runs)", file=sys.stderr, flush=True)
    return dtypes


def start_roles(cfg, groups: dict, model_path: str, t0: float | None = None) -> Roles:
    """The long-lived roles in their placement groups (``groups``: ``reserve``'s, asked for
    at ``t0``): generators, prior, learner (weight sender connected). Their Ray names are
    chosen once, before any starts. A run's own roles (coordinator, telemetry) come from
    ``start_run_roles``."""
    import ray

    t0 = time.perf_counter() if t0 is None else t0
    dtypes = measure_dtype(cfg)
    keys = [group_key("generator", i) for i in range(cfg.generators.count)]
    names = {key: actor_name(cfg.run.name, key)
             for key in keys + (["prior"] if "prior" in groups else [])}
    roles = Roles(generators=[], learner=None, placement_groups=groups, dtypes=dtypes,
                  new_generator=functools.partial(new_generator, cfg, model_path))
    try:
        # Actor constructors run concurrently: engines, prior and DeepSpeed start together;
        # each role's time is measured to its ready answer (the split goes to summary.json).
        roles.startup.placement_s = time.perf_counter() - t0
        roles.generators = [start_generator(cfg, model_path, i, groups[key], names[key])
                            for i, key in enumerate(keys)]
        if "prior" in groups:
            roles.prior = start_prior(cfg, groups["prior"], names["prior"])
        waits = {"generators": [h.ready.remote() for h in roles.generators]}
        if shares_gpus(cfg):  # vLLM profiles its memory at start: not while DeepSpeed loads
            ray.get(waits["generators"])
            roles.startup.generators_s = time.perf_counter() - t0
            waits["generators"] = []
        if roles.prior is not None:
            waits["prior"] = [roles.prior.ready.remote()]
        roles.learner = start_learner(cfg, model_path, groups["learner"])
        roles.startup.learner_s = time.perf_counter() - t0
        # Each role's own time to ready (whichever answers first), not the order we ask in.
        role_of = {ref: role for role, refs in waits.items() for ref in refs}
        left = {role: len(refs) for role, refs in waits.items() if refs}
        pending = list(role_of)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)  # raises what a role's constructor raised
            role = role_of[done[0]]
            left[role] -= 1
            if not left[role] and role == "generators":
                roles.startup.generators_s = time.perf_counter() - t0
            elif not left[role]:
                roles.startup.prior_s = time.perf_counter() - t0
        # Every role loaded the same model: model.path resolves on each node
        check_same_model(
            [(f"generator {i}", *fp) for i, fp in
             enumerate(ray.get([g.model_fingerprint.remote() for g in roles.generators]))]
            + [(f"learner rank {r}", *fp) for r, fp in
               enumerate(roles.learner.model_fingerprints())], model_path)
        # The sender lives on learner rank 0, beside the weights (NCCL needs its GPU).
        roles.learner.connect_weight_sync(cfg.cluster.weight_sync_config.model_dump(),
                                          roles.generators)
        roles.startup.engines_s = [s.engine_start_s for s in
                                   ray.get([g.stats.remote() for g in roles.generators])]
        roles.startup.total_s = time.perf_counter() - t0
    except BaseException:
        roles.shutdown()
        raise
    return roles


def shares_gpus(cfg) -> bool:
    """Whether generators and learner ranks share GPUs (a fraction of one each): the engines
    then start, and measure the memory they may take, before the learner loads (vLLM's
    profiling would otherwise count the learner's growing allocations against itself)."""
    g, lr = cfg.generators.gpus, cfg.learner.gpus
    return bool(g and lr) and (not float(g).is_integer() or not float(lr).is_integer())
