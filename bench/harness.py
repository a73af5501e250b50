"""The harness that ``bench.learning``, ``bench.throughput`` and ``tests.acceptance.chaos`` share.

Engine start dominates on a CPU, so a bench starts the roles once (``shared_roles``) and runs
every mode on them, each from the same state (``Shared.reset``: the learner's initial
weights, served by every generator, and an empty prior; ``reset_roles``).
``lend_roles`` goes one further: inside it, every bench of the process runs on roles already
started (the test suite runs two benches on one start: tests/integration/test_benches.py).
``round_robin`` interleaves the modes so that drift in the machine's load spreads over them;
``stamp`` and ``write_json`` write the results with the command that made them, its date and
the checkout's commit (``checkout_commit``).

Nothing heavy is imported here at import time: Ray, vLLM and torch come with the roles.
"""
from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

# checkout_commit's one owner sits below bench/, so that the studies stamp their files too
from studies.provenance import checkout_commit


def config_for(base: dict, name: str, run_dir: str | Path, **sections):
    """One run's ``Config``: ``base`` (a resolved config as data, not changed) with each of
    ``sections`` merged into base's section of that name (a dict) or replacing it (any other
    value), the run named ``name`` and written under ``run_dir``. A bench's run is a
    measurement made from the start: it replaces what an earlier run of that name left there
    (``run.overwrite=true``; a bench runs a mode's name once per round), unless it asks for
    ``run.resume=true``."""
    from cluster.config.schema import build_config

    data = json.loads(json.dumps(base))
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    data["run"] = {**data["run"], "name": name, "output_dir": str(run_dir),
                   "overwrite": data["run"].get("resume") is not True}
    return build_config(data)


@dataclass
class Shared:
    """The long-lived roles of one bench invocation and the state every run starts from."""

    roles: object     # cluster.nodes.roles.Roles
    task: object      # the task of the config the roles were started with
    init_dir: str     # the learner's initial state (``reset`` loads it)
    setup_s: float    # from the placement to the initial state saved

    def reset(self, cfg) -> None:
        """Back to the initial weights (learner and every generator) and an empty prior."""
        reset_roles(cfg, self.roles, self.init_dir)

    def trainer(self, cfg, **kw):
        """A ``Trainer`` of ``cfg`` on the shared roles (``kw``: ``after_step``,
        ``initial_eval``)."""
        from cluster.run.directory import start_on_running_roles
        from cluster.run.trainer import Trainer

        return Trainer.start(cfg, self.roles, self.task, start_on_running_roles(cfg), **kw)


def reset_roles(cfg, roles, init_dir: str) -> None:
    """The same starting point for another run on ``roles`` (``cluster.nodes.roles.Roles``;
    every run of a bench, tests): the learner back at the state saved in ``init_dir``, every
    generator serving it (as a new version from the version's owner), and a new prior actor
    of ``cfg``'s prior section (the old one killed: its context, counters and backends go
    with its process). The new prior starts first, so its start overlaps the reload."""
    import ray

    from cluster.nodes.roles import start_prior
    from common.names import actor_name

    if roles.prior is not None:
        ray.kill(roles.prior)
        roles.prior = start_prior(cfg, roles.placement_groups["prior"],
                                  actor_name(cfg.run.name, "prior"))
    roles.learner.load_checkpoint(init_dir)
    wait_ready(roles.generators)  # one Ray restarted is up again
    served = max(ray.get([g.version.remote() for g in roles.generators]))
    version = roles.advance(max(served, roles.published) + 1)
    _, refs = roles.learner.publish_weights(roles.generators, version)
    ray.get(refs)
    if roles.prior is not None:
        wait_ready([roles.prior])


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


def role_shape(cfg) -> dict:
    """What long-lived roles are made of (the model, the engines, the learner, the prior, the
    optimiser): two configs with the same shape can run on the same actors."""
    return {"model": cfg.model_path(), "generators": cfg.generators.count,
            "engine": cfg.generators.engine.model_dump(), "learner": cfg.learner.model_dump(),
            "prior": cfg.prior.model_dump(), "optim": cfg.optim.model_dump()}


_lent: list[tuple[Shared, dict]] = []  # (roles, their shape) lent by ``lend_roles``


@contextmanager
def lend_roles(shared: Shared, cfg) -> Iterator[Shared]:
    """Inside this block every ``shared_roles`` of this process runs on ``shared``'s roles
    (started with ``cfg``) instead of starting its own, and leaves them running: several
    benches, e.g. in one test module, pay for one start. A config of another shape is
    refused (``role_shape``)."""
    entry = (shared, role_shape(cfg))
    _lent.append(entry)
    try:
        yield shared
    finally:
        _lent.remove(entry)


@contextmanager
def shared_roles(cfg, workdir: str | Path) -> Iterator[Shared]:
    """Start ``cfg``'s roles once (joining a cluster, else starting a local one) and save the
    learner's initial state under ``workdir/init``; on the way out shut the roles down, and
    the cluster if this started it, whatever happened inside. Within ``lend_roles``: the
    lent roles, with this config's task, left running."""
    from cluster.nodes.connect import connect
    from cluster.nodes.placement import plan, reserve
    from cluster.nodes.roles import start_roles
    from tasks import make_task_from_config

    if _lent:
        lent, shape = _lent[-1]
        if role_shape(cfg) != shape:
            raise ValueError("shared_roles: the lent roles have another shape than this "
                             "config's (model, engines, learner, prior or optimiser)")
        yield Shared(roles=lent.roles, task=make_task_from_config(cfg.task),
                     init_dir=lent.init_dir, setup_s=0.0)
        return
    t0 = time.time()
    p = plan(cfg)
    started = connect(cfg, p)
    try:
        roles = start_roles(cfg, reserve(p), cfg.model_path())
        try:
            init_dir = str(Path(workdir) / "init")
            roles.learner.save_checkpoint(init_dir, {"step": 0})
            task = make_task_from_config(cfg.task)
            yield Shared(roles=roles, task=task, init_dir=init_dir, setup_s=time.time() - t0)
        finally:
            roles.shutdown()
    finally:
        if started:
            stop_cluster()


def stop_cluster() -> None:
    """Stop the Ray cluster this process started (``connect`` returned True)."""
    import ray

    ray.shutdown()


def round_robin(modes: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """``(round, mode)`` for every mode in each of ``rounds`` rounds; round r starts at mode
    ``r mod len(modes)``, so that each mode takes each place in the order in turn and drift
    in the machine's load spreads over the modes."""
    modes = list(modes)
    for r in range(rounds if modes else 0):
        k = r % len(modes)
        for mode in modes[k:] + modes[:k]:
            yield r, mode


REPO = Path(__file__).resolve().parents[1]


def stamp(prog: str, argv: Sequence[str]) -> dict:
    """What a result file says of where it came from: the command (``python -m prog
    argv...``), the date (UTC, to the second), the machine and the commit of this checkout
    (``checkout_commit``, studies.provenance's: None outside a git checkout)."""
    return {"command": " ".join(["python", "-m", prog, *argv]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "commit": checkout_commit(REPO)}


def write_json(path: str | Path, out: dict, indent: int = 1, **dumps) -> Path:
    """``out`` as JSON (and a newline) at ``path``, its folder made first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=indent, **dumps) + "\n")
    return path
