"""Does it learn, and for how much compute? Held-out accuracy of five training modes on the
default task, each for several seeds on the same wall-clock budget:

    python -m bench.learning [--quick] [--budget-s S] [--seeds N] [--modes a,b]
                             [--config FILE] [overrides ...]

    async_v05     V0.5, k_init 4 (up to 16), asynchronous: the product
    sync_grpo16   GRPO, G = 16, synchronous (generate, then train: the colocated baseline on
                  this machine, where every role shares the same cores)
    async_grpo16  GRPO, G = 16, asynchronous
    async_grpo4   GRPO, G = 4, asynchronous: V0.5's starting budget without the prior
    sync_dapo16   DAPO, G = 16 (all-equal groups dropped and refilled), synchronous

``--baselines`` runs the baseline study instead (issue 29): Dr.GRPO-4, the oracle (4 trained
samples per prompt against the mean of 12 more, not trained on), V0.5 adaptive, V0.5 held at
k = 4 and GRPO-4, every update on the same 64 samples (16 prompts of 4 trained samples; V0.5's
batch trimmed to 64 by the scheduler) for ``--steps`` updates (default 60): accuracy at equal
updates, each mode minus Dr.GRPO-4 paired by seed (``summary.baselines.<start>``), with each
mode's samples and prompts per update and its gradient noise-to-signal (``optim.grad_noise``).
Add ``task.n_train=64`` to run it where train prompts recur.

``--selection`` runs the per-rollout study instead (issue 41): every mode synchronous and
seeded (as the paired study), each run stopped at the same number of generated rollouts
(``--rollouts``, default 3072; ``run.max_rollouts``: every rollout sent to a generator counts,
those of filtered groups, cancelled extras and held-out ones included) and evaluated every
``rollouts / evals`` of them (``run.eval_every_rollouts``). The modes: Dr.GRPO-4, GRPO-4,
DAPO's dynamic sampling at 4, James-Stein at 4, V0.5 (adaptive), V0.5 and V0.5 held at k = 4
with admission by selection (``algo.select: prior``), and Dr.GRPO-4 with it; GRESO-style
skipping by a prompt's own rewards (``sync_greso4``) where prompts recur. Read per generated
rollout (``bench.learning.per_rollout``): accuracy at the generated rollouts every run
reached, the area under accuracy against generated rollouts, accuracy at equal wall-clock,
each paired by seed, against the best baseline picked after the runs; written to
bench/results/learning_selection.json under ``summary.settings.<--setting>`` (one setting per
invocation) with a plot per setting (learning_selection_<setting>.png).

``--config`` runs the study on another run config than v05.yaml (configs/smollm2-135m.yaml:
the pretrained SmolLM2 on word_arithmetic), with that config's own model and task.

A study longer than a sitting: ``--run-dir DIR`` keeps the runs in DIR, and the same command
run again reads the runs that finished there and runs the rest. A study longer than a
machine (a sitting's machine is fresh): DIR under bench/results/study_runs/, whose .gitignore keeps
the four files a finished run is read from (summary.json, metrics.jsonl, prompts.jsonl,
config.yaml), and invocations.jsonl (each invocation's command, date and commit), committed
as runs finish; the clone goes on from them. ``--add-seeds-from FILE``
gives a study already in FILE more seeds (its runs kept, the seeds after them run).

Same task, same initial policy (one set of long-lived actors, reset to the same weights and
an empty prior before every run: bench.harness), same learner settings (v05.yaml's),
the same held-out prompts (the starting accuracy is measured once per seed, by its first run,
and shared by the seed's other runs: the same weights, evaluation seed and prompts). Each run
trains for ``--budget-s`` seconds of training wall-clock (evaluations excluded:
``run.max_train_s``) and is evaluated every ``budget / evals`` seconds of it
(``run.eval_every_s``) and at its end. Runs go round-robin over modes within each seed,
so that drift in the machine's load spreads over the modes.

Writes bench/results/learning.json (every run's curve; ``summary``: final accuracy per mode,
V0.5's rollouts and wall-clock to reach GRPO-16's final accuracy, V0.5 against GRPO-4 at equal
rollouts, gradient-norm variance and zero-advantage share per mode, the prior's quality) and
learning.png (accuracy against wall-clock, rollouts and trained tokens; seeds' spread shaded)
with learning_stats.png (gradient-norm variance, zero-advantage share, the prior's
reliability).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from bench.harness import config_for, round_robin, shared_roles, stamp, write_json
from bench.learning.analysis import baselines, controlled, mean_curves, read_curve, summarise
from bench.learning.starts import STARTS
from bench.modes import MODES

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
# The controlled study's modes: V0.5 against async GRPO at every G (the best is the baseline
# to beat) and the colocated synchronous GRPO-16, every update on the same S samples.
CONTROLLED_MODES = ("async_v05", "async_grpo2", "async_grpo4", "async_grpo8", "async_grpo16",
                    "sync_grpo16")
QUICK_MODES = ("async_v05", "sync_grpo16")
# The baseline study (--baselines): Dr.GRPO-4 (no std division: V0.5's convention), GRPO-4,
# V0.5 held at k = 4 (the prior's baseline alone), V0.5 adaptive, and the oracle (4 trained
# samples per prompt against the mean of 12 more that are not trained on), at equal updates.
BASELINE_MODES = ("async_drgrpo4", "async_oracle4", "async_v05", "async_v05_k4", "async_grpo4")
PAIRED_MODES = ("sync_drgrpo4", "sync_oracle4", "sync_v05", "sync_v05_k4")
# The per-rollout study (--selection): every mode on the warm start, each with the same
# budget of generated rollouts; the baselines the selection mode is judged against (the best
# of them per setting, picked after the runs); Dr.GRPO-4 the reference.
SELECTION_MODES = ("sync_drgrpo4", "sync_grpo4", "sync_dapo4", "sync_js4", "sync_v05",
                   "sync_v05_sel", "sync_v05_k4_sel", "sync_drgrpo4_sel")
SELECTION_BASELINES = ("sync_drgrpo4", "sync_grpo4", "sync_dapo4", "sync_js4", "sync_greso4")
SELECTION_MODE = "sync_v05_k4_sel"  # the selection mode the aims read (chosen on the warm start)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"{', '.join(QUICK_MODES)}; one seed, 30 s each, 48 held-out prompts")
    ap.add_argument("--budget-s", type=float, help="training seconds per run (default 240)")
    ap.add_argument("--steps", type=int,
                    help="instead of --budget-s: this many updates per run, every mode (equal "
                         "updates; --baselines' budget)")
    ap.add_argument("--baselines", action="store_true",
                    help=f"the baseline study: {', '.join(BASELINE_MODES)} at equal updates "
                         "(--steps, default 60); summary.baselines.<start>")
    ap.add_argument("--paired", action="store_true",
                    help=f"with --baselines: {', '.join(PAIRED_MODES)} (synchronous, each "
                         "training rollout seeded: common random numbers across modes)")
    ap.add_argument("--selection", action="store_true",
                    help=f"the per-rollout study: {', '.join(SELECTION_MODES)} on the same "
                         "budget of generated rollouts (--rollouts), compared at equal generated "
                         "rollouts; writes summary.settings.<--setting> of --out (default "
                         "bench/results/learning_selection.json)")
    ap.add_argument("--rollouts", type=int,
                    help="with --selection: generated rollouts per run (default 3072: 48 "
                         "updates of 64 at 4 a prompt)")
    ap.add_argument("--setting", help="with --selection: the setting's name in the results "
                                      "(default: --start)")
    ap.add_argument("--selection-mode", default=SELECTION_MODE,
                    help=f"with --selection: the mode the aims read (default {SELECTION_MODE})")
    ap.add_argument("--seeds", type=int, help="seeds per mode (default 3; --quick: 1)")
    ap.add_argument("--evals", type=int, help="evaluations per run after the initial one "
                                              "(default 6; --quick: 1)")
    ap.add_argument("--eval-prompts", type=int, help="held-out prompts (default 300)")
    ap.add_argument("--modes", help="comma-separated subset (default: the controlled study's "
                                    f"{', '.join(CONTROLLED_MODES)})")
    ap.add_argument("--start", default="warm", choices=sorted(STARTS),
                    help="the starting policy: warm (the default run's warm start) or weak (a "
                         "shorter warm start, greedy held-out accuracy in 0.3-0.7); results "
                         "merge into --out under studies.<start>. v05.yaml only: another "
                         "--config starts from its own model")
    ap.add_argument("--config", default="v05.yaml",
                    help="the run config every mode starts from (default v05.yaml)")
    ap.add_argument("--batch-samples", type=int, default=64,
                    help="samples per learner update for every mode (rollout.batch_samples; "
                         "default 64; 0: v05.yaml's batch of prompts, the old uncontrolled study)")
    ap.add_argument("--out", help="the results file (default bench/results/learning.json; "
                                  "--selection: learning_selection.json)")
    ap.add_argument("--keep-runs-from", metavar="FILE",
                    help="the modes not run now: their runs from the same study in FILE (its "
                         "steps, seeds, evaluations, held-out prompts, start and config must be "
                         "this invocation's): re-run one mode after a change that leaves the "
                         "others' runs as they were")
    ap.add_argument("--add-seeds-from", metavar="FILE",
                    help="more seeds for a study in FILE (the same study, its sizes this "
                         "invocation's but for fewer seeds): FILE's runs of every mode kept, and "
                         "the modes asked for (each in FILE) run at the seeds after FILE's, up "
                         "to --seeds; a mode not asked for keeps FILE's seeds")
    ap.add_argument("--run-dir", metavar="DIR",
                    help="where the runs go (default: a new temporary folder); a run that "
                         "finished there already, with the config this invocation would run, "
                         "is read, not run again: a study longer than a sitting goes on where "
                         "it stopped")
    ap.add_argument("--from-runs", metavar="DIR",
                    help="read this invocation's runs from DIR (the run directory of an "
                         "invocation with the same arguments that stopped before writing its "
                         "results: every (mode, seed) run finished there, its config the one "
                         "this invocation would run) instead of running them")
    ap.add_argument("--merge-from", metavar="FILE",
                    help="fold a study written with --out FILE into --out (no runs; with "
                         "--selection files, each setting of FILE)")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for every run")
    return ap.parse_args(argv)


def run_config(base: dict, mode: str, seed: int, run_dir: Path, seeded: bool = False):
    """``mode``'s run (bench.modes) at ``seed``; ``seeded``: every training rollout seeded
    (rollout.seeded), as the paired and per-rollout studies run every mode."""
    spec = mode_spec(mode, seeded)
    return config_for(base, f"{mode}-seed{seed}", run_dir, mode=spec["mode"],
                      algo=spec["algo"], run={"seed": seed},
                      **{k: spec[k] for k in ("prior", "rollout") if k in spec})


def mode_spec(mode: str, seeded: bool = False) -> dict:
    """``mode``'s overrides, with the study's seeding (as the results files record them)."""
    spec = MODES[mode]
    return {**spec, "rollout": {**spec.get("rollout", {}), "seeded": True}} if seeded else spec


@dataclass(frozen=True)
class Settings:
    """One invocation's sizes: the same for every run."""

    budget_s: float    # training wall-clock per run (evaluations excluded)
    seeds: int
    evals: int         # evaluations after the initial one (one every budget / evals seconds)
    eval_prompts: int
    modes: tuple[str, ...]
    steps: int | None = None  # updates per run instead of budget_s (equal updates)
    rollouts: int | None = None  # generated rollouts per run instead (equal generated rollouts)
    start: str = "warm"       # the starting policy (bench.learning.starts)
    batch_samples: int = 64   # samples per update, every mode (0: batch_prompts)
    config: str = "v05.yaml"  # the run config the modes start from
    seeded: bool = False      # every training rollout seeded (--paired, --selection)

    @classmethod
    def of(cls, args) -> "Settings":
        default = (SELECTION_MODES if args.selection else
                   (PAIRED_MODES if args.paired else BASELINE_MODES) if args.baselines else
                   QUICK_MODES if args.quick else CONTROLLED_MODES)
        modes = tuple(m for m in (args.modes.split(",") if args.modes else default) if m)
        unknown = set(modes) - set(MODES)
        if unknown:
            raise SystemExit(f"unknown modes {sorted(unknown)}; known: {sorted(MODES)}")
        return cls(budget_s=args.budget_s or (30.0 if args.quick else 240.0),
                   seeds=args.seeds or (1 if args.quick else 3),
                   evals=args.evals or (1 if args.quick else 6),
                   eval_prompts=args.eval_prompts or (48 if args.quick else 300), modes=modes,
                   steps=args.steps or (60 if args.baselines else None),
                   rollouts=(args.rollouts or 3072) if args.selection else None,
                   start=args.start, batch_samples=args.batch_samples, config=args.config,
                   seeded=bool(args.selection or args.paired))

    def overrides(self) -> list[str]:
        n = self.eval_prompts
        samples = [f"rollout.batch_samples={self.batch_samples}"] if self.batch_samples else []
        if self.rollouts:  # equal generated rollouts: every run stops at the same budget
            budget = ["run.max_steps=100000", "run.max_train_s=null",
                      f"run.max_rollouts={self.rollouts}", "run.eval_every=0",
                      f"run.eval_every_rollouts={max(1, self.rollouts // self.evals)}",
                      "run.eval_every_s=0"]
        elif self.steps:  # equal updates: every mode stops at the same step
            budget = [f"run.max_steps={self.steps}", "run.max_train_s=null",
                      f"run.eval_every={max(1, self.steps // self.evals)}", "run.eval_every_s=0"]
        else:
            budget = ["run.max_steps=100000", f"run.max_train_s={self.budget_s}",
                      "run.eval_every=0", f"run.eval_every_s={self.budget_s / self.evals}"]
        # optim.grad_noise: the gradient's noise-to-signal per update (one gradient copy)
        return [*samples, *budget, "optim.grad_noise=true", f"run.eval_prompts={n}",
                f"task.n_heldout={n}", "run.save_final=false", "run.progress=false",
                "cluster.address=local"]


def run_all(st: Settings, base: dict, run_dir: Path,
            first_seed: int = 0) -> dict[str, list[dict]]:
    """Every (seed, mode) run, seeds ``first_seed`` to ``st.seeds - 1``, on one set of
    long-lived actors, reset before each run to the same initial weights and an empty prior
    (``bench.harness``); {mode: [curve per seed]}. A run that finished in ``run_dir`` already
    (``--run-dir``: an invocation stopped part-way) is read, not run again."""
    plan = planned(st, base, run_dir, first_seed)
    todo = {i for i, (_, _, cfg) in enumerate(plan) if not finished(cfg, "--run-dir")}
    runs: dict[str, list[dict]] = {m: [] for m in st.modes}
    # Every run of a seed starts from the same weights and evaluates with the same seed and
    # prompts: the seed's first run measures the starting accuracy, the others reuse it.
    initial: dict[int, dict] = {}
    shape = run_config(base, "async_v05", 0, run_dir)  # the shape with a prior
    with (shared_roles(shape, run_dir) if todo else nullcontext()) as shared:
        for i, (seed, mode, cfg) in enumerate(plan):
            if i not in todo:
                log(f"== {mode} seed {seed}: finished in {cfg.run_dir}, read")
                runs[mode].append(curve_of(cfg, mode, seed))
                continue
            shared.reset(cfg)
            log(f"== {mode} seed {seed}: " + (
                f"{st.rollouts} generated rollouts" if st.rollouts else
                f"{st.steps} updates" if st.steps else f"{st.budget_s:.0f} s of training"))
            trainer = shared.trainer(cfg, initial_eval=initial.get(seed))
            trainer.run()
            initial[seed] = trainer.initial_eval
            curve = curve_of(cfg, mode, seed)
            runs[mode].append(curve)
            a, b = curve["points"][0], curve["points"][-1]
            log(f"   {a['accuracy']:.3f} -> {b['accuracy']:.3f} +- {b['se']:.3f} in "
                f"{b['train_s']:.0f} s, {b['generated']} rollouts generated, "
                f"{b['rollouts']} trained, {curve['steps']} steps")
    return runs


def planned(st: Settings, base: dict, run_dir: Path, first_seed: int = 0) -> list[tuple]:
    """Each run of an invocation, in the order they run: (seed, mode, config)."""
    return [(first_seed + r, mode, run_config(base, mode, first_seed + r, run_dir, st.seeded))
            for r, mode in round_robin(st.modes, st.seeds - first_seed)]  # drift spreads out


def finished(cfg, flag: str) -> bool:
    """Whether ``cfg``'s run finished in its directory (its summary.json written with status
    "finished": a run preempted, stalled or stopped by a failed checkpoint writes one too),
    checked to be that run: its saved config equal to ``cfg`` (else exits, naming ``flag``),
    but for the folder it was written under (``run.output_dir``): the run is the one found
    there, so a study's runs can move, or come with a clone, and still be read."""
    from cluster.config.schema import load_config

    where = Path(cfg.run_dir)
    summary = where / "summary.json"
    if not summary.is_file() or json.loads(summary.read_text()).get("status",
                                                                     "finished") != "finished":
        return False
    saved = load_config(where / "config.yaml", []).model_dump(mode="json")
    wanted = cfg.model_dump(mode="json")
    saved["run"]["output_dir"] = wanted["run"]["output_dir"]
    if saved != wanted:
        raise SystemExit(f"{flag}: {where}/config.yaml is not the run this invocation would "
                         "make (other arguments or another version)")
    return True


def curve_of(cfg, mode: str, seed: int) -> dict:
    """A finished run's curve (``bench.learning.analysis.read_curve``), named."""
    return {**read_curve(cfg.run_dir, cfg.run.eval_metric,
                         (cfg.task.reward_low, cfg.task.reward_high)), "mode": mode, "seed": seed}


def record_invocation(run_dir: Path, argv: list[str]) -> None:
    """What wrote the runs in ``run_dir`` (``--run-dir``): this invocation's command, date,
    machine and commit (``bench.harness.stamp``) appended to its invocations.jsonl."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "invocations.jsonl", "a") as f:
        f.write(json.dumps(stamp("bench.learning", argv)) + "\n")


def runs_from(st: Settings, base: dict, run_dir: Path,
              first_seed: int = 0) -> dict[str, list[dict]]:
    """``--from-runs DIR``: ``run_all``'s result read from the runs an interrupted invocation
    finished in ``run_dir`` (``finished``), running none."""
    runs: dict[str, list[dict]] = {m: [] for m in st.modes}
    for seed, mode, cfg in planned(st, base, run_dir, first_seed):
        if not finished(cfg, "--from-runs"):
            raise SystemExit(f"--from-runs: {cfg.run_dir} did not finish (no summary.json, or "
                             "one of a run stopped early); "
                             "ask for fewer --seeds or --modes, or go on with --run-dir")
        runs[mode].append(curve_of(cfg, mode, seed))
    return runs


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def report(st: Settings, base_cfg, runs: dict, argv: list[str], wall_s: float) -> dict:
    """One invocation's results: its config, every run's curve, the mean curves, the summary
    (with ``controlled``: this start's pinned comparison)."""
    out = {**stamp("bench.learning", argv),
           "config": {"file": st.config, "run": base_cfg.model_dump(mode="json")["run"],
                      "budget_train_s": None if st.steps else st.budget_s,
                      "budget_steps": st.steps, "budget_rollouts": st.rollouts,
                      "seeds": st.seeds, "seeds_by_mode": {m: len(r) for m, r in runs.items()},
                      "evals": st.evals,
                      "eval_prompts": st.eval_prompts, "eval_samples": base_cfg.run.eval_samples,
                      "eval_metric": base_cfg.run.eval_metric, "task": base_cfg.task.name,
                      "batch_prompts": base_cfg.rollout.batch_prompts,
                      "batch_samples": base_cfg.rollout.batch_samples, "lr": base_cfg.optim.lr,
                      "start": st.start, "model_path": base_cfg.model.path,
                      "modes": {m: mode_spec(m, st.seeded) for m in st.modes}},
           "units": "accuracy: held-out, mean over prompts of the success rate of the sampled "
                    f"answers (T = {base_cfg.rollout.temperature:g}, the config's "
                    "rollout.temperature); train_s: training wall-clock, evaluations excluded",
           "runs": runs,
           "curves": mean_curves(runs),
           "summary": summarise(runs), "wall_s": wall_s}
    out["summary"].update(command=out["command"], date=out["date"],
                          controlled={st.start: controlled(runs)})
    if any(m in BASELINE_MODES[:2] + PAIRED_MODES[:2] for m in runs):  # Dr.GRPO-4 or the oracle
        out["summary"]["baselines"] = {st.start: baselines(runs)}
    return out


def selection_report(st: Settings, base_cfg, runs: dict, argv: list[str], wall_s: float,
                     setting: str, selection_mode: str) -> dict:
    """One setting of the per-rollout study: ``report``'s runs and curves, its summary the
    per-generated-rollout reading (``bench.learning.per_rollout``) under ``settings.<name>``."""
    from bench.learning.per_rollout import setting_summary

    one = report(st, base_cfg, runs, argv, wall_s)
    one["config"]["setting"] = setting
    figures = setting_summary(runs, selection_mode, SELECTION_BASELINES, "sync_drgrpo4")
    one["summary"] = {"command": one["command"], "date": one["date"],
                      "final_accuracy": one["summary"]["final_accuracy"],
                      "settings": {setting: {**figures, "command": one["command"],
                                             "date": one["date"]}}}
    return one


def merge_settings(one: dict, path: Path) -> dict:
    """A setting of the per-rollout study into the file at ``path``: each setting's latest
    invocation under ``studies.<setting>``, their pinned figures under
    ``summary.settings.<setting>``; the top level names the latest invocation."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    setting = one["config"]["setting"]
    studies = {**old.get("studies", {}), setting: one}
    return {"command": one["command"], "date": one["date"], "study": "per generated rollout "
            "(bench.learning --selection): one setting per invocation, each with its command",
            "summary": {"settings": {name: s["summary"]["settings"][name]
                                     for name, s in studies.items()}},
            "studies": studies}


def is_baselines(out: dict) -> bool:
    """Whether an invocation is the baseline study (``--baselines``: its own modes)."""
    return "baselines" in out["summary"]


def study_key(out: dict) -> str:
    """``studies.<key>``: the start, ``<start>-baselines`` for the baseline study."""
    start = out["config"]["start"]
    return f"{start}-baselines" if is_baselines(out) else start


def merge(out: dict, path: Path) -> dict:
    """``out`` merged into the file at ``path``: every start's latest invocation of each study
    (the controlled one, the baseline one) kept under ``studies.<key>``, ``summary.controlled``
    and ``summary.baselines`` gathering each start's pinned figures. The warm and the weak start
    run as separate invocations (each well under a session). The top level is ``out``, the
    newest invocation of whichever study (so it is always one of ``studies``: an older top level
    kept under a newer invocation's pinned figures would contradict them). An invocation that
    replaces an earlier one of the same study appends that one's date, command and the commit
    it ran at (``ran_at_commit``; None where its file did not record one) to
    ``superseded.versions``; the file's ``superseded`` key is carried over, never dropped."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    later = ("studies", "superseded")  # the file's, not an invocation's
    kept = old.get("studies") or ({study_key(old): {k: v for k, v in old.items()
                                                    if k not in later}} if old else {})
    key = study_key(out)
    mine = {k: v for k, v in out.items() if k not in later}
    studies = {**kept, key: mine}
    merged = {**mine, "studies": studies}
    merged["summary"] = {**out["summary"],
                         "controlled": pinned(studies, "controlled", baseline_studies=False),
                         "baselines": pinned(studies, "baselines", baseline_studies=True)}
    superseded = old.get("superseded")
    replaced = kept.get(key)
    if replaced is not None and replaced != mine:
        superseded = {**(superseded or {})}
        superseded["versions"] = [*superseded.get("versions", []),
                                  {"date": replaced.get("date"),
                                   "command": replaced.get("command"),
                                   "ran_at_commit": replaced.get("commit")}]
    if superseded is not None:
        merged["superseded"] = superseded
    return merged


def pinned(studies: dict, key: str, baseline_studies: bool) -> dict:
    """{start: that study's ``summary.<key>.<start>``} over the studies of one kind."""
    out = {}
    for st in studies.values():
        start = st["config"]["start"]
        if is_baselines(st) == baseline_studies and start in st["summary"].get(key, {}):
            out[start] = st["summary"][key][start]
    return out


def plot_stem(out: dict, path: Path) -> Path:
    """learning.png for the controlled study, learning_baselines.png for the baseline one, at
    the warm start; another start's plots name it (learning_weak.png,
    learning_weak_baselines.png), so that one file's studies of two starts keep a plot each."""
    start = out.get("config", {}).get("start", "warm")
    return path.with_name(path.stem + ("" if start == "warm" else f"_{start}")
                          + ("_baselines" if is_baselines(out) else ""))


def kept_runs(path: Path, st: Settings, key: str, more_seeds: bool = False) -> dict:
    """``--keep-runs-from FILE``: the runs of the modes this invocation does not run, from the
    study ``key`` in FILE (a start, a start's baseline study, a setting), whose sizes must be
    this invocation's ({file, command, date, modes, runs}). ``more_seeds``
    (``--add-seeds-from``): every mode's runs, from a study with fewer seeds than this one
    (``first_seed``: the number it has, where this invocation's runs begin), each mode asked for
    among them."""
    res = json.loads(path.read_text())
    study = (res.get("studies") or {study_key(res): res}).get(key)
    if study is None:
        raise SystemExit(f"{path}: no study {key!r} to keep runs from")
    c = study["config"]
    mine = {"budget_steps": st.steps, "budget_rollouts": st.rollouts, "seeds": st.seeds,
            "evals": st.evals,
            "eval_prompts": st.eval_prompts, "start": st.start, "file": st.config,
            "batch_samples": st.batch_samples or None}
    if more_seeds:
        del mine["seeds"]
    differ = {k: (c.get(k), v) for k, v in mine.items() if c.get(k) != v}
    if differ:
        raise SystemExit(f"{path}: study {key!r} differs from this one in {differ} "
                         "(FILE's, this invocation's): its runs cannot stand beside these")
    if not more_seeds:
        modes = [m for m in study["runs"] if m not in st.modes]
        return {"file": str(path), "command": study.get("command"), "date": study.get("date"),
                "modes": modes, "order": list(study["runs"]),
                "runs": {m: study["runs"][m] for m in modes}}
    had = {m: {r["seed"] for r in rs} for m, rs in study["runs"].items()}
    missing = [m for m in st.modes if m not in had]
    if missing:
        raise SystemExit(f"{path}: study {key!r} has no runs of {missing} to add seeds to")
    first = max(max(had[m]) + 1 for m in st.modes)
    if any(had[m] != set(range(first)) for m in st.modes) or first >= st.seeds:
        raise SystemExit(f"{path}: study {key!r} has seeds {sorted(had[st.modes[0]])} of "
                         f"{list(st.modes)}; --seeds {st.seeds} asks for none after them")
    return {"file": str(path), "command": study.get("command"), "date": study.get("date"),
            "modes": list(study["runs"]), "order": list(study["runs"]),
            "runs": study["runs"], "first_seed": first,
            "runs_kept_from": study.get("runs_kept_from")}  # where FILE's own came from


def merge_from(src: Path, path: Path) -> int:
    """``--merge-from FILE``: a study written to a file of its own (``--out FILE``) folded into
    ``--out`` as the bench would have written it there; its figures unchanged."""
    from bench.learning.plots import plots, selection_plots

    res = json.loads(src.read_text())
    if "settings" in res.get("summary", {}):  # the per-rollout study: a setting each
        for name, study in res["studies"].items():
            write_json(path, merge_settings(study, path))
            selection_plots(study, path.with_name(f"{path.stem}_{name}"))
        print(f"merged {src} into {path}: settings "
              f"{sorted(json.loads(path.read_text())['studies'])}")
        return 0
    for study in (res.get("studies") or {study_key(res): res}).values():
        write_json(path, merge(study, path))
        plots(study, plot_stem(study, path))
    print(f"merged {src} into {path}: studies {sorted(json.loads(path.read_text())['studies'])}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from common.rayproc import prefer_loopback

    prefer_loopback("local")  # before ray is imported: this bench starts its own cluster
    from bench.learning.plots import plots, selection_plots
    from cluster.config.schema import load_config

    if args.out is None:
        args.out = str(RESULTS / ("learning_selection.json" if args.selection else
                                  "learning.json"))
    if args.merge_from:
        return merge_from(Path(args.merge_from), Path(args.out))
    st = Settings.of(args)
    if st.config != "v05.yaml" and st.start != "warm":
        raise SystemExit("--start picks a policy for v05.yaml; another --config has its own model")
    model = [f"model.path={STARTS[st.start]()}"] if st.config == "v05.yaml" else []
    base_cfg = load_config(REPO / st.config, [*st.overrides(), *model, *args.overrides])
    key = (args.setting or st.start if args.selection else
           f"{st.start}-baselines" if args.baselines else st.start)
    if args.keep_runs_from and args.add_seeds_from:
        raise SystemExit("--keep-runs-from and --add-seeds-from: one at a time")
    kept = (kept_runs(Path(args.keep_runs_from), st, key) if args.keep_runs_from else
            kept_runs(Path(args.add_seeds_from), st, key, more_seeds=True)
            if args.add_seeds_from else {})
    t0 = time.time()
    if args.from_runs:
        runs = runs_from(st, base_cfg.model_dump(mode="json"), Path(args.from_runs).resolve(),
                         kept.get("first_seed", 0))
    else:
        run_dir = (Path(args.run_dir).resolve() if args.run_dir else
                   Path(tempfile.mkdtemp(prefix="v05-learning-")))
        log(f"runs in {run_dir} (an invocation stopped part-way goes on with --run-dir "
            f"{run_dir})")
        if args.run_dir:
            record_invocation(run_dir, argv)
        runs = run_all(st, base_cfg.model_dump(mode="json"), run_dir, kept.get("first_seed", 0))
    if kept:
        order = dict.fromkeys([*kept["order"], *st.modes])
        if "first_seed" in kept:  # FILE's seeds of every mode, then this invocation's
            runs = {m: [*kept["runs"][m], *runs.get(m, [])] for m in order}
        else:
            both = {**kept["runs"], **runs}
            runs = {m: both[m] for m in order}
        st = replace(st, modes=tuple(runs))
    if args.selection:
        setting = args.setting or st.start
        one = selection_report(st, base_cfg, runs, argv, time.time() - t0, setting,
                               args.selection_mode)
    else:
        one = report(st, base_cfg, runs, argv, time.time() - t0)
    if args.from_runs:  # wall_s: the time to read them, not to make them
        one["runs_read_from"] = str(Path(args.from_runs).resolve())
    if kept:
        one["runs_kept_from"] = {k: kept[k] for k in ("file", "command", "date", "modes",
                                                      "first_seed", "runs_kept_from")
                                 if kept.get(k) is not None}
    if args.selection:
        write_json(args.out, merge_settings(one, Path(args.out)))
        selection_plots(one, Path(args.out).with_name(f"{Path(args.out).stem}_{setting}"))
        print(json.dumps({k: v for k, v in one["summary"]["settings"][setting].items()
                          if k != "modes"}, indent=1))
        return 0
    out = merge(one, Path(args.out))
    write_json(args.out, out)
    plots(one, plot_stem(one, Path(args.out)))
    print(json.dumps(one["summary"].get("baselines") or one["summary"]["controlled"], indent=1))
    return 0


if __name__ == "__main__":
    from common.rayproc import run_main

    run_main(main)  # exits without C++ static destructors: see common/rayproc.py
