"""A run's start on running roles (``cluster.nodes.roles.start_roles``): where it resumes
from, its own roles (coordinator, telemetry), the watchdog, the run files; and ``publish``,
the one way weights reach the generators (on a resume, first of all: ``Trainer.run``).
``cluster.run.trainer.Trainer`` drives the ``Run`` this returns.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from common.names import actor_name
from cluster.records.checkpoints import Checkpoints
from cluster.config.schema import dump_config
from cluster.run.evaluation import Evaluator
from cluster.records.metrics import Tally
from cluster.run.directory import Start
from cluster.records.files import RunFiles
from cluster.nodes.roles import log_path, pg_strategy
from cluster.records.wandb_log import WandbLog
from cluster.nodes.waits import failed_updates, gather_stats
from cluster.nodes.replace import Replacer
from cluster.nodes.watch import NodeWatch
from cluster.run.watchdog import Watchdog, coordinator_blame

STATS_WAIT_S = 5.0  # telemetry: a generator that does not answer in this long is skipped


@dataclass
class RunState:
    """Where a run starts: fresh, or from its last whole checkpoint."""

    version: int                 # policy version the generators serve at the start
    step: int = 0
    totals: dict = field(default_factory=dict)
    run_state: str | None = None  # the coordinator's prompts and sampler position to restore
    resumed_from: str | None = None
    skipped_checkpoints: list = field(default_factory=list)

    @property
    def resumed(self) -> bool:
        return self.resumed_from is not None


def resume_state(cfg, roles, start: Start) -> RunState:
    """Fresh: versions continue from what the generators serve (actors may outlive a run).
    Resume: the learner loads the newest whole checkpoint (older ones if it is corrupt), and
    the run continues its counters and its admitted prompts."""
    import ray

    try:  # before the run's watchdog exists: bounded by the run's call timeout instead
        versions = ray.get([g.version.remote() for g in roles.generators],
                           timeout=cfg.run.call_timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"the generators did not say which weights they serve within "
                           f"run.call_timeout_s = {cfg.run.call_timeout_s:g} s") from None
    served = max(max(versions), roles.published)
    if start.action != "resume":
        return RunState(version=served)
    tag, st, run_state, skipped = start.checkpoints.load(roles.learner)
    # Generators that outlived the run hold a newer version: publish over theirs.
    version = max(st["policy_version"], served + 1)
    return RunState(version=version, step=st["step"], totals=st.get("totals", {}),
                    run_state=str(run_state), resumed_from=tag, skipped_checkpoints=skipped)


def coordinator_config(cfg, task, state: RunState):
    """The run's ``CoordinatorConfig`` and estimator, from its config."""
    from actors.coordinator import CoordinatorConfig
    from actors.scheduler import SchedulerConfig
    from actors.scoring import Overlong, shaped_range
    from common.types import SamplingConfig
    from estimator.registry import ESTIMATORS

    r = cfg.rollout
    overlong = Overlong(r.max_tokens, cfg.reward.overlong_buffer, cfg.reward.overlong_penalty)
    est = ESTIMATORS[cfg.algo.name](cfg.algo.estimator_config(shaped_range(task.rewards, overlong)))
    sched = SchedulerConfig(
        batch_prompts=cfg.scheduler_batch_prompts(), batch_samples=r.batch_samples,
        max_staleness=cfg.max_staleness, slots_per_generator=cfg.generators.engine.max_num_seqs,
        max_inflight_prompts=r.max_inflight_prompts, selection=cfg.selection())
    return est, CoordinatorConfig(
        cfg.task, sched, SamplingConfig(temperature=r.temperature, top_p=r.top_p,
                                        max_tokens=r.max_tokens,
                                        seed=cfg.run.seed if r.seeded else None),
        seed=cfg.run.seed, version=state.version, prior_timeout_s=cfg.prior.timeout_s,
        request_timeout_s=cfg.run.call_timeout_s, score_workers=cfg.score_workers(),
        score_timeout_s=cfg.reward.timeout_s, overlong=overlong, restore=state.run_state,
        score_fault=(cfg.reward.inject_fault, cfg.reward.inject_every),
        log_path=log_path(cfg, "coordinator"), learner_ranks=cfg.learner.ranks)


def start_run_roles(cfg, roles, task, state: RunState):
    """A run's coordinator (the scheduler with its estimator) and its telemetry actor."""
    import ray

    from actors.coordinator import Coordinator
    from actors.telemetry import Telemetry
    from cluster.nodes.placement import COORDINATOR_CPUS

    est, coord_cfg = coordinator_config(cfg, task, state)
    run = cfg.run.name
    coord_name, telemetry_name = (actor_name(run, role) for role in ("coordinator", "telemetry"))
    coord = ray.remote(Coordinator).options(
        name=coord_name, num_cpus=COORDINATOR_CPUS, max_concurrency=1000,
        scheduling_strategy=pg_strategy(roles.placement_groups["coordinator"], 0)).remote(
        roles.generators, roles.prior, est, coord_cfg)
    telemetry = ray.remote(Telemetry).options(name=telemetry_name, num_cpus=0).remote(run)
    return coord, telemetry


@dataclass
class Run:
    """A started run: its config, the long-lived roles and its own, and the objects that own
    its deadline (``dog``), files, counters (``tally``), checkpoints and evaluation."""

    cfg: object
    roles: object
    task: object
    state: RunState
    coord: object
    telemetry: object
    dog: Watchdog
    files: RunFiles
    tally: Tally
    ckpts: Checkpoints
    evaluator: Evaluator
    nodes: NodeWatch | None = None  # the cluster's nodes and the roles on them
    replacer: Replacer | None = None  # replaces a generator whose node was lost
    update_failed: list = field(default_factory=list)  # (version, generator, why)


def start_run(cfg, roles, task, start: Start) -> Run:
    """Everything a run needs before its first step, on roles already up. ``start``: how the
    run starts in its directory, decided once before (by the launcher, or
    ``cluster.run.directory.start_on_running_roles`` for a run on roles already up), its
    directory prepared; its checkpoints are the run's."""
    state = resume_state(cfg, roles, start)
    if not state.resumed:  # the generators serve this version already: nothing to publish
        roles.adopt(state.version)
    coord, telemetry = start_run_roles(cfg, roles, task, state)
    files = RunFiles(cfg.run_dir, dump_config(cfg), state.step if state.resumed else None,
                     tensorboard=cfg.logging.tensorboard, progress=cfg.run.progress,
                     record_rollouts=cfg.run.record_rollouts,
                     wandb=WandbLog.open(cfg, state.resumed) if cfg.logging.wandb else None)
    run = Run(cfg, roles, task, state, coord, telemetry,
              Watchdog(cfg.run.stall_timeout_s, coordinator_blame(coord)), files,
              Tally(state.totals), start.checkpoints, Evaluator(cfg, task),
              NodeWatch(roles.placement_groups), Replacer(roles, coord))
    return run


def publish(run: Run, version: int) -> None:
    """Learner rank 0's weights -> every generator, in place, as ``version``; then the
    coordinator.

    The generators in service get them, and those back but waiting for a publish
    (``Coordinator.publish_targets``: restarted under a broadcast transport, where only the
    sender can take an engine into its group); one the coordinator took out (dead,
    restarting, its node lost) loads the newest weights when it rejoins, and is not waited
    for. The updates are waited for together, at most ``run.call_timeout_s``
    and never past the watchdog's deadline. A generator that did not load them (dead, hung,
    or its ``update_weights`` raised) is counted in ``generator_update_failures`` and
    named in the summary's ``generator_update_failed``; the coordinator re-syncs one
    that Ray restarts (its incarnation changes)."""
    import ray

    roles = run.roles
    alive = run.dog.get("coordinator", run.coord.publish_targets.remote())
    serving = [i for i, a in enumerate(alive) if a]  # in service, or back and waiting for it
    roles.advance(version)
    payload, refs = run.dog.call("learner (weight publish)", roles.learner.publish_weights,
                                 [roles.generators[i] for i in serving], version)
    refs = list(refs)
    ready, _ = ray.wait(refs, num_returns=len(refs),
                        timeout=min(run.cfg.run.call_timeout_s, run.dog.time_left())) \
        if refs else ([], [])
    failed = failed_updates(refs, ready, functools.partial(ray.get, timeout=10))
    run.tally.update_failures(len(failed))
    run.update_failed += [(version, serving[i], why) for i, why in failed.items()]
    run.dog.get("coordinator", run.coord.set_version.remote(version, payload))


def in_service(run: Run) -> list[int]:
    """The generators the coordinator has in service, by index."""
    alive = run.dog.get("coordinator", run.coord.serving.remote())
    return [i for i, a in enumerate(alive) if a]


def generator_stats(generators: list, serving: list[int] | None = None) -> list:
    """Each generator's ``stats()`` (a ``GeneratorStats``; None while it is dead or
    restarting), waited for at most ``STATS_WAIT_S``; ``serving``: only those (by index) are
    asked, the others are None."""
    import ray

    if serving is not None:
        asked = generator_stats([generators[i] for i in serving])
        got = dict(zip(serving, asked))
        return [got.get(i) for i in range(len(generators))]

    return gather_stats([g.stats.remote() for g in generators], ray.wait, ray.get,
                        STATS_WAIT_S, (ray.exceptions.RayActorError,))


def measure_peaks(run: Run) -> list[float]:
    """Each engine's decode tokens/s with every slot busy, all engines at once (they share
    the machine as they do in a run)."""
    import ray

    heldout = run.evaluator.heldout
    prompt, n = heldout[0].prompt if heldout else "0", min(32, run.cfg.rollout.max_tokens)
    return run.dog.call("generators (peak probe)", ray.get,
                        [g.measure_peak.remote(prompt, n) for g in run.roles.generators])


def run_extras(run: Run, t_start: float, gen0: list, peaks: list | None,
               initial_reused: bool) -> dict:
    """summary.json's fields about the generators over the run, its start and its resume."""
    from cluster.records.metrics import generator_delta, per_generator

    gen_end, st = generator_stats(run.roles.generators), run.state
    return {**generator_delta(gen0, gen_end).to_dict(), "t_start": t_start,
            "eval_initial_reused": initial_reused, "resumed_from": st.resumed_from,
            "startup": run.roles.startup.to_json(), "skipped_checkpoints": st.skipped_checkpoints,
            "generator_update_failed": run.update_failed,
            "role_nodes": run.nodes.at_start if run.nodes else {},
            "node_events": list(run.nodes.events) if run.nodes else [],
            "generators_replaced": list(run.replacer.events) if run.replacer else [],
            "generators": per_generator(gen0, gen_end, peaks),
            "decode_peak_tokens_per_s": sum(peaks) if peaks else None,
            "dtypes": run.roles.dtypes}
