"""Bring the cluster up and the role actors with it: Ray connection, placement, handles.

Everything here imports Ray lazily so that ``cluster.config.schema`` and ``--help`` stay fast.
"""
from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from common.names import actor_name
from common.rayproc import LOOPBACK_SWITCH, exit_process, prefer_loopback, run_main  # noqa: F401
from common.threads import threads_for
from cluster.nodes.placement import Plan, check_fits, group_key, reserve


def log_dir(cfg) -> Path | None:
    """Where the roles' output goes: <run dir>/logs/ (None with logging.verbose: the console,
    as Ray forwards it)."""
    return None if cfg.logging.verbose else cfg.run_dir / "logs"


def log_path(cfg, role: str) -> str | None:
    d = log_dir(cfg)
    return None if d is None else str(d / f"{role}.log")


def connect(cfg, plan: Plan) -> bool:
    """Join the configured cluster, or one started with ``ray start --head`` on this machine,
    else start a local one of this launch's own on 127.0.0.1 (``own_temp_dir``). Returns
    True if this process started the cluster (and so should stop it)."""
    import ray

    if ray.is_initialized():
        return False
    env = {"env_vars": {"PYTHONPATH": os.getcwd(), "TOKENIZERS_PARALLELISM": "false"}}
    address = cfg.cluster.address or os.environ.get("RAY_ADDRESS")
    # Joining: the job's own runtime env (ray job submit --working-dir) or the installed
    # package makes our modules importable on the workers; ours would fight the job's.
    if address and address != "local":
        ray.init(address=address, log_to_driver=True)
        return False
    started_by_ray_start = ray_start_address() if address is None else None
    if started_by_ray_start:
        try:
            ray.init(address=started_by_ray_start)
            return False
        except ConnectionError:  # its address file outlived it: start one of our own
            pass
    cpus = cfg.cluster.num_cpus or max(os.cpu_count() or 1, math.ceil(plan.total_cpus + 0.5))
    # Ray would take num_gpus on trust: a plan of more GPUs than this machine has is refused
    # here, with the numbers, rather than failing in the engines once they start.
    check_fits(plan, {"CPU": cpus, "GPU": gpus_here()}, "a local cluster on this machine"
               + (" (cluster.num_cpus)" if cfg.cluster.num_cpus else ""))
    quiet_auth_notice()
    bound_task_events()
    ray.init(address="local", num_cpus=cpus, num_gpus=int(plan.total_gpus) or None,
             _node_ip_address="127.0.0.1", include_dashboard=False, runtime_env=env,
             logging_level="WARNING", _temp_dir=own_temp_dir())
    return True


def ray_start_address() -> str | None:
    """The cluster ``ray start --head`` started on this machine, as ``ray.init()`` finds it
    (Ray's address file), or None. Not Ray's ``address="auto"``, which falls back to any Ray
    cluster whose process it sees on this machine: another launch's own, whose resources its
    roles hold."""
    from ray._private.services import canonicalize_bootstrap_address

    return canonicalize_bootstrap_address(None)


def own_temp_dir(root: str | None = None) -> str:
    """A folder of its own, under Ray's usual one, for a cluster this launch starts: its
    session files and its address file, which ``ray.init(address="auto")`` reads. In Ray's
    shared folder a second launch on this machine would find this cluster there, join it,
    and wait for resources that this run's roles hold; in a folder of its own it is found by
    no other driver, and the second launch starts a cluster of its own. A cluster started
    with ``ray start --head`` stays where Ray puts it, and launches join it."""
    import tempfile

    base = Path(root or Path(os.environ.get("RAY_TMPDIR") or "/tmp") / "ray")  # Ray's rule
    base.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix="v05-", dir=base)  # short: Ray's socket paths < 108


def gpus_here() -> int:
    """GPUs a Ray node started on this machine would find (Ray's own count: NVIDIA's driver,
    CUDA_VISIBLE_DEVICES honoured)."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    return int(get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators())


TASK_EVENTS_VAR = "RAY_task_events_max_num_task_in_gcs"
TASK_EVENTS_KEPT = 2_000
DROPPED_VAR = "RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs"
DROPPED_KEPT = 10_000


def bound_task_events(environ=os.environ) -> str:
    """A cluster this process starts keeps the events of its last ``TASK_EVENTS_KEPT`` tasks
    (the dashboard's task table: the last 20 steps or so) instead of Ray's 100,000: a run makes
    about a hundred actor calls a step, each event about 3 KiB in gcs_server, which at Ray's
    default grew by ~3 MiB a minute for the first hours of a run, and at 10,000 for the first
    ten minutes (bench.soak; ``gcs_task_events`` in soak.json counts them). Every event it
    lets go is then remembered as a dropped task attempt, up to Ray's 1,000,000 a job (about
    80,000 an hour here: gcs_server grew ~6 MiB an hour for that, for half a day); it
    remembers ``DROPPED_KEPT``. Set before ``ray.init`` starts the cluster's processes, which
    read them; a value the user set wins. Returns the task-event bound in force."""
    environ.setdefault(DROPPED_VAR, str(DROPPED_KEPT))
    return environ.setdefault(TASK_EVENTS_VAR, str(TASK_EVENTS_KEPT))


AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def quiet_auth_notice() -> None:
    """Ray 2.60 turns token authentication on for every cluster ``ray.init`` starts and says
    so with a WARNING on the console ("Token authentication is enabled for this Ray cluster
    ..."). That is the safe default we keep (the cluster listens on 127.0.0.1 only; the token
    guards it against other users of this machine); there is nothing for the user to do, so
    the notice is dropped (its logger's level only: an authentication *error* still shows).
    ``RAY_AUTH_MODE`` set by the user still decides, as Ray documents."""
    import logging

    logging.getLogger(AUTH_NOTICE_LOGGER).setLevel(logging.ERROR)


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
    # owner: only a publish (run_start.publish, reset_roles) advances it, and a fresh run
    # takes what the generators serve; the trainer reads it, the coordinator's scheduler and
    # each generator hold a copy they are told about (set_version, update_weights).
    published: int = 0
    startup: dict = field(default_factory=dict)  # seconds from the start to each role's ready
    # Starts generator i in a placement group, as ``start_roles`` started the first ones
    # (``cluster.nodes.replace``: a generator whose node was lost). None: not replaceable.
    new_generator: Callable | None = None

    def shutdown(self) -> None:
        import ray

        if self.learner is not None:
            self.learner.shutdown()
        for h in self.generators + ([self.prior] if self.prior is not None else []):
            ray.kill(h, no_restart=True)
        for pg in self.placement_groups.values():
            ray.util.remove_placement_group(pg)


def pg_strategy(pg, index: int):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


def start_generator(cfg, model_path: str, i: int, pg):
    """Generator ``i`` in placement group ``pg`` (its own, bundle 0); not waited for."""
    import ray

    from actors.generator import Generator

    g = cfg.generators
    threads = threads_for(g.cpus, g.threads)
    ncores = os.cpu_count() or 1
    # Pin each CPU engine's threads to its own cores so two engines do not share core 0.
    first = (i * threads) % ncores
    bind = None if g.gpus else ",".join(str((first + j) % ncores) for j in range(threads))
    return ray.remote(Generator).options(
        name=actor_name(cfg.run.name, f"generator-{i}"),
        num_cpus=g.cpus, num_gpus=g.gpus, max_restarts=3, max_task_retries=0,
        max_concurrency=1024, scheduling_strategy=pg_strategy(pg, 0),
    ).remote(model_path, i, g.engine, threads, bind, log_path(cfg, f"generator-{i}"))


def start_generators(cfg, model_path: str, groups: dict) -> list:
    """Every generator, each in its own group; not waited for: engines start while the
    learner starts."""
    return [start_generator(cfg, model_path, i, groups[group_key("generator", i)])
            for i in range(cfg.generators.count)]


def start_learner(cfg, model_path: str, pg):
    from learner.ranks import Learner

    lp = cfg.learner
    logs = log_dir(cfg)
    return Learner(model_path, lp.ranks, cfg.optim, num_cpus_per_rank=lp.cpus,
                   placement_group=pg, num_gpus_per_rank=lp.gpus, threads=lp.threads,
                   log_dir=None if logs is None else str(logs), run_name=cfg.run.name)


def start_prior(cfg, pg):
    import ray

    from actors.priors.server import PriorServer

    p = cfg.prior
    handle = ray.remote(PriorServer).options(
        name=actor_name(cfg.run.name, "prior"), num_cpus=p.cpus, num_gpus=p.gpus, max_restarts=1,
        scheduling_strategy=pg_strategy(pg, 0),
    ).remote(p.backend, p.options, p.window, threads_for(p.cpus), fallback=p.fallback,
             fallback_options=p.fallback_options, budget_s=p.server_budget_s,
             log_path=log_path(cfg, "prior"))
    return handle


def start_roles(cfg, plan: Plan, model_path: str) -> Roles:
    """The long-lived roles: generators, prior, learner (weight sender connected). A run's
    own roles (coordinator, telemetry) come from ``start_run_roles``."""
    import ray

    t0 = time.perf_counter()
    groups = reserve(plan)
    roles = Roles(generators=[], learner=None, placement_groups=groups,
                  new_generator=functools.partial(start_generator, cfg, model_path))
    try:
        # Actor constructors run concurrently: engines, prior and DeepSpeed start together;
        # each role's time is measured to its ready answer (the split goes to summary.json).
        roles.startup["placement_s"] = time.perf_counter() - t0
        roles.generators = start_generators(cfg, model_path, groups)
        if "prior" in groups:
            roles.prior = start_prior(cfg, groups["prior"])
        waits = {"generators": [h.ready.remote() for h in roles.generators]}
        if roles.prior is not None:
            waits["prior"] = [roles.prior.ready.remote()]
        roles.learner = start_learner(cfg, model_path, groups["learner"])
        roles.startup["learner_s"] = time.perf_counter() - t0
        # Each role's own time to ready (whichever answers first), not the order we ask in.
        role_of = {ref: role for role, refs in waits.items() for ref in refs}
        left = {role: len(refs) for role, refs in waits.items()}
        pending = list(role_of)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)  # raises what a role's constructor raised
            role = role_of[done[0]]
            left[role] -= 1
            if not left[role]:
                roles.startup[f"{role}_s"] = time.perf_counter() - t0
        # The sender lives on learner rank 0, beside the weights (NCCL needs its GPU).
        roles.learner.connect_weight_sync(cfg.cluster.weight_sync_config.model_dump(),
                                          roles.generators)
        roles.startup["engines_s"] = [s["engine_start_s"] for s in
                                      ray.get([g.stats.remote() for g in roles.generators])]
        roles.startup["total_s"] = time.perf_counter() - t0
    except BaseException:
        roles.shutdown()
        raise
    return roles


def wait_ready(handles: list, timeout_s: float = 600.0) -> None:
    """Wait until every actor answers ``ready()``. An actor Ray is restarting raises
    ``ActorUnavailableError`` at once instead of waiting; retry those until ``timeout_s``."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    pending = list(handles)
    while pending:
        left = []
        for h, ref in [(h, h.ready.remote()) for h in pending]:
            try:
                ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
            except ray.exceptions.ActorUnavailableError:
                left.append(h)
        if left and time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} actor(s) not ready after {timeout_s:.0f}s")
        if left:
            time.sleep(0.5)  # restarting: no event to wait on, Ray answers at once
        pending = left


def reset_roles(cfg, roles: Roles, init_dir: str) -> None:
    """The same starting point for another run on these actors (benchmarks, tests): the
    learner back at the state saved in ``init_dir``, every generator serving it (as a new
    version), and a fresh prior with an empty context and ``cfg``'s prior options (reset in
    place, or a new actor when the old one is dead or busy)."""
    import ray

    roles.learner.load_checkpoint(init_dir)
    wait_ready(roles.generators)  # one Ray restarted is up again
    served = max(ray.get([g.version.remote() for g in roles.generators]))
    roles.published = max(served, roles.published) + 1
    _, refs = roles.learner.publish_weights(roles.generators, roles.published)
    ray.get(refs)
    if roles.prior is not None and not _reset_in_place(roles.prior, cfg.prior.options):
        ray.kill(roles.prior)
        roles.prior = start_prior(cfg, roles.placement_groups["prior"])
        ray.get(roles.prior.ready.remote())


def _reset_in_place(prior, options: dict | None = None, timeout_s: float = 60.0) -> bool:
    """The prior back to its just-started state in its own process, with ``options`` (None:
    its own; ``PriorServer.reset``); False when it cannot be (dead, hung, or a call past its
    budget still running)."""
    import ray

    try:
        return bool(ray.get(prior.reset.remote(options), timeout=timeout_s))
    except (ray.exceptions.RayError, TimeoutError):
        return False
