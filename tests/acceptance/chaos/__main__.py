"""Chaos benchmark: faults injected one at a time into real runs of the default task.

    python -m tests.acceptance.chaos [--quick] [--scenarios a,b] [--out FILE] [overrides ...]

Runs v05.yaml (small overrides for speed: steps, batch, no evaluation) on real actors and
injects, one scenario at a time:

 0 baseline                               nothing: the control run (its median step time is
                                          the reference of the reward scenarios)
 1 generator_killed_mid_generation        ray.kill of a generator holding rollouts
 2 generator_killed_during_weight_update  ray.kill of a generator right after the learner
                                          asked it to load new weights
 3 prior_killed                           ray.kill of the prior server
 4 learner_rank_killed                    SIGKILL of learner rank 0's process (subprocess run),
                                          then run.resume=true
 5 driver_sigkill                         SIGKILL of `python -m cluster.launch` after a
                                          checkpoint, then run.resume=true
 6 reward_raises                          reward.inject_fault=raise
 7 reward_hangs                           reward.inject_fault=hang, one worker, short deadline
 8 nan_loss                               NaN advantages for one step's batch
 9 corrupt_checkpoint                     the newest checkpoint truncated, then resume
10 sigterm_then_resume                    SIGTERM to the driver at a random step (no periodic
                                          checkpoint): it checkpoints within
                                          run.preempt_grace_s and exits 4; then run.resume=true
11 disk_full_at_checkpoint                the run directory's tmpfs fills up during the step-4
                                          checkpoint: exit 5 with step2 whole; space freed,
                                          then run.resume=true
12 second_job_killed                      two jobs on one `ray start --head` cluster, the
                                          second stopped (`ray job stop`) once both train
13 node_lost_generators                   on a local cluster of 4 nodes (head, learner, two
                                          generators), a generator's node lost whole
14 node_added                             (the same run) a new generator node joins
15 node_lost_learner                      the learner's node lost whole; a new one joins and
                                          the same command resumes
16 prior_killed_under_selection           3 while the prior decides admission (algo.select):
                                          drawn = admitted + deferred + waiting checked
17 sigterm_then_resume_under_selection    10 under selection: the waiting candidates are in
                                          the checkpoint; the identity checked after resume

In-process scenarios share one set of long-lived actors (engine start dominates on a CPU;
``bench.harness`` starts them once and gives each scenario the same starting state); 4, 5, 10
and 11 run the launcher in subprocesses, each with its own local Ray cluster, and stop only
what those started; 12 submits two jobs to a `ray start --head` cluster of its own; 13-15 run
the launcher joined to a local multi-node cluster of their own (``tests.acceptance.chaos.nodes``).
A run of some scenarios keeps the other scenarios' rows of an existing result file, each row
saying when and by which command it was measured.

Each scenario reports survived, prompts_lost and prompts_trained_twice (by uid, from the run's
prompts.jsonl / dropped.jsonl / inflight_at_end.json: ``cluster.records.metrics.prompt_fates``), hung
(past its wall-clock budget, or stopped by the watchdog), recovery_time_s (defined per scenario,
in its ``recovery`` field) and what the system did. Writes bench/results/chaos.json and
chaos.png (each run's steps over time, the fault and the recovery marked); exits 1 when a
scenario is not clean (survived, 0 lost, 0 trained twice, not hung).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import shared_roles, stamp, write_json

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "bench" / "results"

# name -> where it runs: the function of that name in tests.acceptance.chaos.inproc (one shared cluster),
# tests.acceptance.chaos.procs or tests.acceptance.chaos.stops (subprocesses)
SCENARIOS = {
    "baseline": "inproc",
    "generator_killed_mid_generation": "inproc",
    "generator_killed_during_weight_update": "inproc",
    "prior_killed": "inproc",
    "learner_rank_killed": "procs",
    "driver_sigkill": "procs",
    "reward_raises": "inproc",
    "reward_hangs": "inproc",
    "nan_loss": "inproc",
    "corrupt_checkpoint": "inproc",
    "sigterm_then_resume": "stops",
    "disk_full_at_checkpoint": "stops",
    "second_job_killed": "procs",
    "node_lost_generators": "nodes",
    "node_added": "nodes",
    "node_lost_learner": "nodes",
    "prior_killed_under_selection": "inproc",
    "sigterm_then_resume_under_selection": "stops",
}
QUICK = ["baseline", "generator_killed_mid_generation", "reward_hangs", "nan_loss",
         "driver_sigkill"]


def counts(rows: list[dict]) -> dict:
    """The file's rows counted (the docs quote these, bench/figures.py checks them): how
    many scenarios, survived, clean, and prompts lost, trained twice and runs hung in all."""
    return {"scenarios": len(rows), "survived": sum(bool(r["survived"]) for r in rows),
            "clean": sum(bool(r["clean"]) for r in rows),
            "prompts_lost": sum(r["prompts_lost"] or 0 for r in rows),
            "prompts_trained_twice": sum(r["prompts_trained_twice"] or 0 for r in rows),
            "hung": sum(bool(r["hung"]) for r in rows)}


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m tests.acceptance.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"a few representative scenarios, short runs ({', '.join(QUICK)})")
    ap.add_argument("--scenarios", help="comma-separated subset (default: all, or --quick's)")
    ap.add_argument("--steps", type=int, help="learner steps per run (default 8; --quick: 6)")
    ap.add_argument("--batch", type=int, help="prompts per step (default 8; --quick: 4)")
    ap.add_argument("--out", default=str(RESULTS / "chaos.json"))
    ap.add_argument("--workdir", help="where runs are written (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the run folders and logs")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of node_lost_generators/node_added, each on a cluster of its own "
                         "(default 1): their throughput ratio is the mean, with its SE")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for every run")
    return ap.parse_args(argv)


def run_inproc(names, base_cfg, workdir: Path, steps: int, budget_s: float, hold_s: float):
    """One local cluster, one set of actors, the in-process scenarios in turn."""
    from tests.acceptance.chaos import inproc

    out = []
    with shared_roles(base_cfg, workdir) as shared:
        bench = inproc.Bench(base=base_cfg.model_dump(mode="json"), shared=shared,
                             workdir=workdir, steps=steps, budget_s=budget_s, hold_s=hold_s)
        for name in names:
            print(f"== {name}", file=sys.stderr, flush=True)
            o = getattr(inproc, name)(bench)
            print(f"   {_line(o)}", file=sys.stderr, flush=True)
            out.append(o)
    return out, shared.setup_s


def run_procs(names, overrides, workdir: Path, steps: int, budget_s: float):
    import importlib

    from tests.acceptance.chaos import procs

    pb = procs.ProcBench(overrides=overrides, workdir=workdir, steps=steps, budget_s=budget_s)
    out = []
    for name in names:
        print(f"== {name} (subprocesses)", file=sys.stderr, flush=True)
        o = getattr(importlib.import_module(f"tests.acceptance.chaos.{SCENARIOS[name]}"), name)(pb)
        print(f"   {_line(o)}", file=sys.stderr, flush=True)
        out.append(o)
    return out


def _line(o) -> str:
    return (f"survived={o.survived} lost={o.prompts_lost} twice={o.prompts_trained_twice} "
            f"hung={o.hung} recovery={o.recovery_time_s}s wall={o.wall_s}s")


def table(rows: list[dict]) -> str:
    """The markdown table of docs/reliability.md."""
    head = ("| scenario | injected | survived | lost | trained twice | hung | recovery (s) "
            "| what the system did |\n|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['name']} | {r['injected']} | {'yes' if r['survived'] else '**no**'} | "
        f"{r['prompts_lost']} | {r['prompts_trained_twice']} | "
        f"{'**yes**' if r['hung'] else 'no'} | "
        f"{'-' if r['recovery_time_s'] is None else r['recovery_time_s']} | "
        f"{r['what_happened']} |\n" for r in rows)
    return head + body


@dataclass(frozen=True)
class Settings:
    """Run sizes and time limits: the same for every scenario of one invocation."""

    steps: int      # learner steps per run
    batch: int      # prompts per step
    hold_s: float   # longest wait for a killed role to come back inside a run

    @property
    def budget_s(self) -> float:  # per scenario (a process scenario: per subprocess)
        return self.hold_s + 150.0

    @property
    def stall_s(self) -> float:   # the watchdog (run.stall_timeout_s) of every run
        return self.hold_s + 60.0

    def overrides(self, extra: list[str]) -> list[str]:
        """v05.yaml, shortened: no evaluation, no peak probe, no final export; a local
        cluster of its own."""
        return [f"rollout.batch_prompts={self.batch}", "run.eval_every=0",
                "cluster.address=local", "generators.measure_peak=false",
                "run.save_final=false", f"run.stall_timeout_s={self.stall_s:g}", *extra]


def run_all(names: list[str], st: Settings, overrides: list[str], workdir: Path,
            repeats: int = 1):
    """In-process scenarios on one cluster, then the subprocess ones; {name: Outcome}.
    ``repeats``: runs of the generator node scenarios."""
    from cluster.config.schema import load_config

    results, setup_s = {}, None
    local = [n for n in names if SCENARIOS[n] == "inproc"]
    if "baseline" not in local and any(n.startswith("reward_") for n in local):
        local.insert(0, "baseline")  # the reward scenarios' reference step time
    if local:
        base_cfg = load_config(REPO / "v05.yaml", [*overrides, f"run.max_steps={st.steps}",
                                                   "run.progress=false"])
        done, setup_s = run_inproc(local, base_cfg, workdir, st.steps, st.budget_s, st.hold_s)
        results.update((o.name, o) for o in done)
    remote = [n for n in names if SCENARIOS[n] in ("procs", "stops")]
    if remote:
        results.update((o.name, o) for o in run_procs(remote, overrides, workdir, st.steps,
                                                      st.budget_s))
    on_nodes = [n for n in names if SCENARIOS[n] == "nodes"]
    if on_nodes:
        results.update((o.name, o) for o in run_nodes(on_nodes, overrides, workdir, st.steps,
                                                      st.budget_s, repeats)
                       if o.name in on_nodes)
    return results, setup_s


def run_nodes(names, overrides, workdir: Path, steps: int, budget_s: float, repeats: int = 1):
    """The node scenarios: the two generator ones come from one run (``repeats`` runs)."""
    from tests.acceptance.chaos import nodes, procs

    pb = procs.ProcBench(overrides=overrides, workdir=workdir, steps=steps, budget_s=budget_s)
    out = []
    if {"node_lost_generators", "node_added"} & set(names):
        print("== node_lost_generators, node_added (a local 4-node cluster)", file=sys.stderr,
              flush=True)
        out += nodes.generator_nodes(pb, repeats)
    if "node_lost_learner" in names:
        print("== node_lost_learner (a local 4-node cluster)", file=sys.stderr, flush=True)
        out.append(nodes.node_lost_learner(pb))
    for o in out:
        print(f"   {o.name}: {_line(o)}", file=sys.stderr, flush=True)
    return out


def merged(path: Path, rows: list[dict], when: dict) -> list[dict]:
    """This run's rows (each stamped with ``when``: date and command) and, from an existing
    result file, the rows of scenarios not run now; in ``SCENARIOS`` order."""
    import json

    old = {}
    if path.exists():
        prev = json.loads(path.read_text())
        stamp_old = {"date": prev.get("date"), "command": prev.get("command")}
        old = {r["name"]: {"measured": stamp_old, **r} for r in prev.get("scenarios", [])}
    new = {r["name"]: {**r, "measured": when} for r in rows}
    both = {**old, **new}
    return [both[n] for n in SCENARIOS if n in both]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from common.rayproc import prefer_loopback

    prefer_loopback("local")  # before ray is imported: this bench starts its own cluster
    names = [n for n in (args.scenarios.split(",") if args.scenarios
                         else QUICK if args.quick else SCENARIOS) if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"error: unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}",
              file=sys.stderr)
        return 2
    st = Settings(steps=args.steps or (6 if args.quick else 8),
                  batch=args.batch or (4 if args.quick else 8),
                  hold_s=150.0 if args.quick else 240.0)
    overrides = st.overrides(args.overrides)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="v05-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    kept = args.keep or bool(args.workdir)
    t0 = time.time()
    try:
        results, setup_s = run_all(names, st, overrides, workdir, args.repeats)
    finally:
        if not kept:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = [results[n].to_dict() for n in SCENARIOS if n in results]
    when = stamp("tests.acceptance.chaos", argv)
    rows = merged(Path(args.out), rows, {"date": when.get("date"), "command": when.get("command")})
    out = {
        **when,
        "config": {"file": "v05.yaml", "overrides": [*overrides, f"run.max_steps={st.steps}"],
                   "steps": st.steps, "batch_prompts": st.batch},
        "budget": {"per_scenario_s": st.budget_s, "per_subprocess_s": st.budget_s,
                   "hold_for_restart_s": st.hold_s, "watchdog_stall_timeout_s": st.stall_s},
        "setup_s": setup_s and round(setup_s, 1),
        "wall_s": round(time.time() - t0, 1),
        "all_clean": all(r["clean"] for r in rows),
        "summary": counts(rows),
        "workdir": str(workdir) if kept else None,
        "scenarios": rows,
    }
    write_json(args.out, out, indent=2, default=str)
    from tests.acceptance.chaos.plot import plot

    print(f"plot: {plot(rows, Path(args.out).with_suffix('.png'))}", file=sys.stderr)
    print(table(rows))
    print(f"wrote {args.out} ({out['wall_s']:.0f}s)", file=sys.stderr)
    return 0 if out["all_clean"] else 1


if __name__ == "__main__":
    from common.rayproc import run_main

    run_main(main)
