"""Soak benchmark: one long run of the default task, its resources sampled as it goes.

    python -m tests.acceptance.soak [--quick] [--minutes M] [--steps N] [--every-s S] [overrides ...]

Runs v05.yaml (evaluation sparse: every ``--eval-every-s`` seconds of training on a small
held-out set; a checkpoint every ``--checkpoint-every`` steps, as a long run would) on a local
Ray cluster of its own, until it has trained at least ``--minutes`` and ``--steps`` (60 and
1000; ``--quick``: 4 minutes, 10 steps), and samples every ``--every-s`` seconds (60; quick:
10) each process's resident memory and open file descriptors by role (driver, generators,
their vLLM engine processes, learner rank, prior, coordinator, raylet, gcs_server ...), the
object store's use, the run directory's size (and its checkpoints' and logs'), the
coordinator's state (entries held per container: ``Coordinator.state_size``) and each
step's time (metrics.jsonl's ``step_time_s``).

For each quantity, ``growth_per_hour``: the Theil-Sen slope after the warm-up (the first
``--warmup`` fraction of the run) per hour, divided by its mean level (tests/acceptance/soak/growth.py).
The aims: every role's RSS and the run's state (checkpoints, coordinator entries) grow
< 5 %/hour, step time flat within 10 %/hour. The run directory's total grows by design
(metrics.jsonl, prompts.jsonl: a line per step and per prompt) and is reported, not judged.
``prompts_lost`` is by uid from the run's files (``cluster.records.files.prompt_fates``).

Writes bench/results/soak.json (``--quick``: soak_quick.json) and the plot beside it (.png).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import shared_roles, stamp, write_json
from tests.acceptance.soak.report import summarise

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "bench" / "results"


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m tests.acceptance.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a few minutes: 4 min, 10 steps, a sample every 10 s")
    ap.add_argument("--minutes", type=float, help="least training time (default 60; quick 4)")
    ap.add_argument("--steps", type=int, help="least learner steps (default 1000; quick 10)")
    ap.add_argument("--max-minutes", type=float,
                    help="stop at this much training time whatever the steps (default 4 x "
                         "--minutes)")
    ap.add_argument("--every-s", type=float, help="seconds between samples (60; quick 10)")
    ap.add_argument("--warmup", type=float, default=0.15,
                    help="fraction of the run left out of the growth fit (default 0.15)")
    ap.add_argument("--eval-every-s", type=float,
                    help="held-out evaluation every this much training (1200; quick 120)")
    ap.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (100; "
                                                         "quick 5)")
    ap.add_argument("--out", help="result file (default bench/results/soak.json; quick "
                                  "soak_quick.json)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set in the environment before the cluster starts, so that every "
                         "Ray process and vLLM engine inherits it (e.g. MALLOC_ARENA_MAX=2); "
                         "repeatable")
    ap.add_argument("--workdir", help="where the run is written (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the run folder")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides of v05.yaml")
    args = ap.parse_args(argv)
    q = args.quick
    for name, full, quick in (("minutes", 60.0, 4.0), ("steps", 1000, 10), ("every_s", 60.0, 10.0),
                              ("eval_every_s", 1200.0, 120.0), ("checkpoint_every", 100, 5)):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    args.max_minutes = args.max_minutes or 4 * args.minutes
    args.out = args.out or str(RESULTS / ("soak_quick.json" if q else "soak.json"))
    return args


def overrides(args, workdir: Path) -> list[str]:
    """v05.yaml as a long run: sparse, small evaluations, regular checkpoints, no end export;
    its length is the bench's (``Stop``), not run.max_steps."""
    return ["cluster.address=local", "run.name=soak", f"run.output_dir={workdir}",
            "run.max_steps=100000000", "run.eval_every=0",
            f"run.eval_every_s={args.eval_every_s:g}", "run.eval_prompts=64",
            "run.eval_samples=1", f"run.checkpoint_every={args.checkpoint_every}",
            "run.save_final=false", "run.progress=false", *args.overrides]


class Stop:
    """The ``after_step`` hook: records each step's time and, once the run has trained
    ``min_s`` seconds and ``min_steps`` steps (or ``max_s`` whatever the steps), makes the
    next step the last (``run.max_steps``, which the trainer reads after every step)."""

    def __init__(self, cfg, min_s: float, min_steps: int, max_s: float):
        self.cfg, self.min_s, self.min_steps, self.max_s = cfg, min_s, min_steps, max_s
        self.steps: list[dict] = []
        self.t0 = None

    def __call__(self, step: int, m) -> None:
        """``m``: the step's ``cluster.records.step.StepMetrics``."""
        self.t0 = self.t0 or m.t_start
        self.steps.append({"step": step, "t_end": m.t_step_end, "step_time_s": m.step_time_s})
        trained = m.t_step_end - self.t0
        if (trained >= self.min_s and step >= self.min_steps) or trained >= self.max_s:
            self.cfg.run.max_steps = min(self.cfg.run.max_steps, step + 1)


def soak(args, workdir: Path) -> dict:
    """The run, sampled; its summary, samples and steps."""
    from tests.acceptance.soak.sampler import Sampler
    from cluster.config.schema import load_config

    over = overrides(args, workdir)
    cfg = load_config(REPO / "v05.yaml", over)
    t0 = time.time()
    with shared_roles(cfg, workdir) as shared:
        stop = Stop(cfg, args.minutes * 60, args.steps, args.max_minutes * 60)
        trainer = shared.trainer(cfg, after_step=stop)
        sampler = Sampler(trainer.coord, cfg.run_dir, args.every_s, stop.steps)
        sampler.start()
        try:
            summary = trainer.run().to_json()
        finally:
            sampler.stop()
    return {"cfg": cfg, "overrides": over, "summary": summary, "samples": sampler.samples, "steps": stop.steps,
            "setup_s": round(shared.setup_s, 1), "wall_s": round(time.time() - t0, 1),
            "object_store_error": sampler.store.error, "process_titles": sampler.procs.titles}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from common.rayproc import prefer_loopback

    prefer_loopback("local")  # before ray is imported: this bench starts its own cluster
    for kv in args.env:  # inherited by the cluster this process starts
        key, sep, value = kv.partition("=")
        if not sep or not key:
            print(f"error: --env {kv!r} must look like KEY=VALUE", file=sys.stderr)
            return 2
        os.environ[key] = value
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="v05-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        got = soak(args, workdir)
        out = {**stamp("tests.acceptance.soak", argv), **summarise(got, args)}
    finally:
        if not (args.keep or args.workdir):
            shutil.rmtree(workdir, ignore_errors=True)
    write_json(args.out, out)
    from tests.acceptance.soak.plot import plot

    print(f"plot: {plot(out, Path(args.out).with_suffix('.png'))}", file=sys.stderr)
    for name, g in out["growth_per_hour"].items():
        print(f"{name:45s} {'-' if g is None else f'{g:+.3f}'} /h", file=sys.stderr)
    print(f"wrote {args.out}: {out['steps']} steps, {out['duration_s']:.0f}s, "
          f"prompts_lost={out['prompts_lost']}, aims met: {out['aims']['met']}", file=sys.stderr)
    return 0 if out["prompts_lost"] == 0 else 1


if __name__ == "__main__":
    from common.rayproc import run_main

    run_main(main)
