"""Join the Ray cluster a launch runs on, or start one of its own on 127.0.0.1.

``connect`` decides which (``cluster.address``, ``RAY_ADDRESS``, a cluster ``ray start``
started, else a local one in a folder of its own) and sets what a cluster this process starts
needs before ``ray.init``: its size (refused when the plan cannot fit this machine), its
bounded task events, Ray's authentication notice quieted. The role actors start on it after
(``cluster.nodes.roles``). Ray is imported lazily.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from cluster.nodes.placement import Plan, check_fits


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
    ten minutes (tests.acceptance.soak; ``gcs_task_events`` in soak.json counts them). Every event it
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
