"""Start a training run:  python -m cluster.launch CONFIG.yaml [key.sub=value ...]

Starts a local Ray cluster on 127.0.0.1 when none is running, joins the running one otherwise
(so ``ray job submit -- python -m cluster.launch v05.yaml`` works against ``ray start --head``).
The config is parsed and checked (keys, model path, dataset file, placement) before any actor
starts (the model loads, the tokenizer encodes the prompts). Outputs go to the absolute run
directory ``<run.output_dir>/<run.name>/`` (cluster/config/paths.py), printed at the start and end.
A launch never deletes a previous run unless asked (``run.overwrite=true``): where the
directory holds one it continues from its newest whole checkpoint (``run.resume=auto``, the
default), says so and exits 0 when that checkpoint is at ``run.max_steps`` already, or
refuses (exit 2) when there is no whole checkpoint (``cluster.run.directory.plan_start``).
Exit status: 0 done (or nothing to do), 2 a bad request (config, model, data, placement, a
previous run in the way, a path out of its folder, a tampered checkpoint, a cluster address
where nothing answers), 3 the watchdog stopped a stalled run, 4 preempted, resumable
(SIGTERM or SIGINT: a whole checkpoint of the last step with its prompts in flight was written;
the same command, or ``run.resume=true``, continues it), 5 a checkpoint could not be written
(disk full, unwritable; the previous checkpoint is whole: free space, then relaunch), 143 or
130 a second signal or the end of ``run.preempt_grace_s`` before the preemption checkpoint was
whole (the last whole checkpoint is kept), 1 anything else.
"""
from __future__ import annotations

import argparse
import sys
import time

from cluster.config.schema import dump_config, load_config
from cluster.run.directory import plan_start, prepare
from cluster.nodes.placement import PlacementError, plan
from cluster.config.door import check_address, resolved_paths
from cluster.config.preflight import check_model, check_prompts
from cluster.records.summary import RunSummary


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m cluster.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="YAML config file (e.g. v05.yaml)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. run.max_steps=3")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the resolved config and placement plan, start nothing")
    ap.add_argument("--check-placement", action="store_true",
                    help="place every role with probe actors (no model, no GPU work) on the "
                         "running cluster, or on a simulated one of cluster.nodes x "
                         "cluster.gpus_per_node, print where each lands, exit non-zero if the "
                         "plan does not fit")
    return ap.parse_intermixed_args(argv)  # overrides before or after the flags


def preflight(cfg):
    """What can be checked before an actor starts: placement (GPUs, the prior the algorithm
    needs), the task and its data, and how the run starts in its directory (``plan_start``:
    a checkpoint to resume, or a previous run in the way). The model and tokenizer checks are
    ``cluster.config.preflight``'s. Returns (placement, task, start)."""
    from tasks import make_task_from_config

    p = plan(cfg)
    task = make_task_from_config(cfg.task)
    task.train(), task.heldout()  # splits are built on first use: their errors are said now
    if cfg.task.reward_function is not None:  # the user's function on the first rows
        from tasks.reward_function import check
        check(task)
    # nothing to resume, or a run in the way, is said now, not once the actors are up
    start = plan_start(cfg.run_dir, cfg.run.resume, cfg.run.overwrite, cfg.run.max_steps,
                       cfg.run.keep_checkpoints)
    return p, task, start


def run(cfg, checked=None) -> RunSummary:
    """Run one training job to the end; returns its summary (summary.json's record)."""
    import ray

    from cluster.run.preempt import Preemption
    from cluster.nodes.connect import connect
    from cluster.nodes.placement import reserve
    from cluster.nodes.roles import start_roles
    from cluster.run.trainer import Trainer

    p, task, start, model_path = checked or (*preflight(cfg), cfg.model_path())
    stop = Preemption(cfg.run.preempt_grace_s)
    started = connect(cfg, p)  # refuses a local cluster this machine cannot hold, unstarted
    roles = None
    try:
        t0 = time.perf_counter()
        # The cluster holds the plan, or PlacementError says so with its numbers, before
        # anything of a previous run is deleted.
        groups = reserve(p)
        prepare(start)  # before the roles open logs/; decided once (preflight), said once
        stop.install()  # after ray.init, whose own SIGTERM handler is a bare sys.exit
        print(f"placement: {p.describe()}", file=sys.stderr, flush=True)
        roles = start_roles(cfg, groups, model_path, t0=t0)
        print(roles.startup.line(), file=sys.stderr, flush=True)
        return Trainer.start(cfg, roles, task, start=start).run()
    finally:
        if roles is not None:  # its placement groups too; a group whose roles never started
            roles.shutdown()  # goes with this driver's job (or the cluster it started)
        if started:
            ray.shutdown()
        stop.uninstall()


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:  # everything that can be wrong with the request fails here, before any actor starts
        cfg = load_config(args.config, args.overrides)
        if args.check_placement:  # needs no model or dataset: it runs before a real launch
            from cluster.nodes.check_placement import check

            return check(cfg, plan(cfg))
        p, task, start = preflight(cfg)
        if args.dry_run:
            print(dump_config(cfg))
            print(f"# placement: {p.describe()} = {p.total_gpus:g} GPU, {p.total_cpus:g} CPU")
            print("\n".join(f"# {key}: {where}" for key, where in resolved_paths(cfg)))
            return 0
        if start.action == "done":
            print(start.line(), file=sys.stderr)
            return 0
        check_address(cfg.cluster.address)  # a head that does not answer: said now, not hung
        model_path = cfg.model_path()
        check_model(model_path, cfg.optim.lora)
        check_prompts(model_path, task, cfg.generators.engine, cfg.rollout.max_tokens)
    except (ValueError, FileNotFoundError, ConnectionError) as err:  # config, placement,
        print(f"error: {err}", file=sys.stderr)  # preflight, files, a head that does not answer
        return 2
    from common.rayproc import prefer_loopback
    from cluster.records.checkpoints import (CHECKPOINT_FAILED, CheckpointAltered,
                                             CheckpointWriteError)
    from cluster.run.preempt import PREEMPTED, Preempted
    from cluster.run.trainer import ROLE_LOST, RoleLost
    from cluster.run.watchdog import Stalled

    prefer_loopback(cfg.cluster.address)  # before ray is imported
    print(f"run directory: {cfg.run_dir}", flush=True)
    try:
        s = run(cfg, (p, task, start, model_path))
    except (PlacementError, ConnectionError, CheckpointAltered) as err:  # the cluster cannot
        print(f"error: {err}", file=sys.stderr, flush=True)  # hold the plan or was not reached,
        return 2  # or a checkpoint file changed after preflight verified it: nothing unpickled
    except Stalled as stall:
        print(f"error: {stall}; see {cfg.run_dir / 'summary.json'} (stall_report)",
              file=sys.stderr, flush=True)
        return 3
    except Preempted:  # its line is said; the checkpoint is whole
        print(f"run directory: {cfg.run_dir}", flush=True)
        return PREEMPTED
    except CheckpointWriteError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return CHECKPOINT_FAILED
    except RoleLost as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return ROLE_LOST
    print(f"done: {s.steps} steps in {s.wall_time_s:.0f}s ({s.train_wall_time_s:.0f}s "
          f"training, {s.totals.eval_time_s:.0f}s evaluating); {s.totals.prompts_trained} "
          "prompts trained")
    for line in accuracy_lines(s):
        print(line)
    print(f"run directory: {cfg.run_dir}", flush=True)
    return 0


def accuracy_lines(s: RunSummary) -> list[str]:
    """'held-out <metric> accuracy: start +- se -> end +- se (+n SE)' for the headline metric
    first, then the other one."""
    from cluster.records.step import HeldOut

    out = []
    for kind in sorted(HeldOut.KINDS, key=lambda k: k != s.eval_metric):
        a1, se1 = s.eval_final.of(kind) if s.eval_final else (None, None)
        if a1 is None:
            continue
        a0, se0 = s.eval_initial.of(kind) if s.eval_initial else (None, None)
        start = f"{a0:.3f} +- {se0:.3f} -> " if a0 is not None else ""
        gain = f" ({(a1 - a0) / se1:+.1f} SE)" if a0 is not None and se1 else ""
        what = " (the headline)" if kind == s.eval_metric else ""
        out.append(f"held-out {kind} accuracy{what}, {s.eval_final.prompts} prompts: "
                   f"{start}{a1:.3f} +- {se1:.3f}{gain}")
    return out


if __name__ == "__main__":
    from common.rayproc import run_main

    run_main(main)  # exits without C++ static destructors: see exit_process
