"""The prior against the truth, at snapshots of a default run.

    python -m studies.prior_truth [--task stepwise|arithmetic|word_arithmetic] [--run-dir DIR..]
                                [--repeats R] [--snapshots start,middle,end] [--quick]

1. A default run of the task (``v05.yaml``; the arithmetic task with its bare-answer
   overrides; word_arithmetic: ``configs/smollm2-135m.yaml``, the pretrained SmolLM2),
   evaluations off, saving its weights in Hugging Face format at its middle and end
   (``run.snapshot_every``); or ``--run-dir`` of one that did (a run's ``final/`` is its end
   when no snapshot was taken at its last step).
2. At each snapshot (start: the initial weights; middle; end), ``--prompts`` train prompts
   over every difficulty level, none of them seen by the run, get ``--samples`` sampled
   responses each (at the run's rollout.temperature, one sampling seed per prompt): a near-true success rate t.
3. The prior's p for each, with the context the running system would have given it then:
   the newest ``prior.window`` observations of the run's ``prompts.jsonl`` that finished
   before that version was published (at the start, the run's first ones: its prior is empty
   before them). The shipped backend and its variants (``--variants``) on the same context.
4. Against the truth: error sd, bias, MAE, rank correlation, a reliability table; the truth's
   own spread and sampling noise, the error with that noise removed, and the reference
   predictor told each level's true mean.

Writes bench/results/prior_truth.json (``snapshots``: one object per snapshot and task; a
task's run replaces that task's entries) and prior_truth.png.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from studies.prior_truth.analysis import (context_at, error_stats, in_sample_fit,
                                        level_cv_predictor, level_mean_predictor,
                                        level_window_predictor, observations,
                                        own_history_predictor, published_at, reliability,
                                        repeats_block)
from studies.prior_truth.bounds import cross_validated_bound, generator_variables
from studies.prior_truth.variants import VARIANTS
from studies.provenance import provenance

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
# Each task's default run: its config file and overrides.
TASK_RUNS = {"stepwise": ("v05.yaml", []),
             "arithmetic": ("v05.yaml", ["task.name=arithmetic", "rollout.max_tokens=8",
                                         "generators.engine.max_model_len=64"]),
             "word_arithmetic": ("configs/smollm2-135m.yaml", ["run.max_train_s=null"])}
SNAPSHOTS = ("start", "middle", "end")


def log(msg: str) -> None:
    print(f"[prior_truth {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_run(task: str, out_dir: Path, steps: int, recurring: int | None = None,
             seed: int = 0) -> Path:
    """A default run of ``task`` with snapshots at its middle and end; its directory.
    ``recurring``: its train split cut to that many prompts (``task.n_train``), so that the
    run trains each several times, as a fixed training set swept for epochs is. ``seed``
    (``run.seed``, the prompt order; 0: the config's): a repeat of the same run."""
    name = f"prior-truth-{task}" + (f"-recurring{recurring}" if recurring else "") + (
        f"-seed{seed}" if seed else "")
    config, overrides = TASK_RUNS[task]
    overrides = [*overrides, *([f"task.n_train={recurring}"] if recurring else []),
                 *([f"run.seed={seed}"] if seed else [])]
    cmd = [sys.executable, "-m", "cluster.launch", str(REPO / config), *overrides,
           f"run.name={name}", f"run.output_dir={out_dir}", f"run.max_steps={steps}",
           f"run.snapshot_every={steps // 2}", "run.eval_every=0", "run.save_final=false",
           "run.overwrite=true", "cluster.address=local"]
    log("default run: " + " ".join(cmd[2:]))
    run_log = out_dir / f"{name}.log"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(run_log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"the default run failed (exit {proc.returncode}); see {run_log}")
    return out_dir / name


def queries(task, seen: set[str], per_level: int, recurring: bool = False) -> list:
    """``per_level`` train prompts of each difficulty level that the run never trained on;
    ``recurring``: of those it did train on (every prompt of a small split recurs)."""
    by: dict[int, list] = {}
    for p in reversed(task.train()):  # from the end: the run reads the split from its start
        if (p.prompt in seen) == recurring and len(by.setdefault(p.difficulty, [])) < per_level:
            by[p.difficulty].append(p)
    return [p for d in sorted(by) for p in by[d]]


def times_trained(rows: list[dict]) -> float:
    """How many times the run trained each prompt it trained, on average (1: none recurs)."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["prompt"]] = counts.get(r["prompt"], 0) + 1
    return float(np.mean(list(counts.values()))) if counts else 0.0


def prior_predictions(cfg, ctx, prompts: list[str], options: dict) -> np.ndarray:
    from actors.priors.server import PriorServer
    from common.types import PriorObservation

    server = PriorServer(cfg.prior.backend, {**cfg.prior.options, **options},
                         window=cfg.prior.window, fallback=None, budget_s=None)
    server.observe([PriorObservation(o.prompt, o.score, o.version, o.rollouts) for o in ctx])
    return np.array(server.predict(prompts))


def snapshots_of(run_dir: Path, start_path: str, steps: int) -> list[tuple[str, int, str]]:
    """(name, step, weights) of the run's snapshots: its initial weights, ``snapshots/stepN``
    (middle, or end at its last step), and ``final/`` as the end when no snapshot was taken
    at the last step."""
    snap_root = run_dir / "snapshots"
    taken = sorted(((("middle" if int(d.name[4:]) < steps else "end"), int(d.name[4:]), str(d))
                    for d in (snap_root.iterdir() if snap_root.is_dir() else ())
                    if d.name.startswith("step")), key=lambda s: s[1])
    if (run_dir / "final").is_dir() and not any(name == "end" for name, _, _ in taken):
        taken.append(("end", steps, str(run_dir / "final")))
    return [("start", 0, start_path)] + taken


def measure_task(task_name: str, run_dir: Path, per_level: int, samples: int,
                 variants: dict, run_variant: str = "shipped",
                 which: tuple[str, ...] = SNAPSHOTS) -> list[dict]:
    """Every snapshot's entry (of the kinds in ``which``); ``run_variant``: the variant the run
    itself used (its online estimate is compared with that one's offline error)."""
    from actors.priors.embedded import surface_features
    from cluster.config.schema import load_config
    from tasks import make_task_from_config

    cfg = load_config(run_dir / "config.yaml", [])
    task = make_task_from_config(cfg.task)
    rows = [json.loads(x) for x in (run_dir / "prompts.jsonl").read_text().splitlines() if x]
    obs = observations(rows, task.rewards)
    steps = max(r["step"] for r in rows)
    snaps = [s for s in snapshots_of(run_dir, cfg.model_path(), steps) if s[0] in which]
    recurring = times_trained(rows) > 1.5  # a small split: the run saw its prompts again
    probs = queries(task, {r["prompt"] for r in rows}, per_level, recurring)
    levels = np.array([p.difficulty for p in probs])
    level_of = {p.prompt: p.difficulty for p in task.train()}  # the window's prompts' levels
    texts = [p.prompt for p in probs]
    out = []
    for name, step, path in snaps:
        log(f"{task_name} {name} (step {step}): {len(probs)} prompts x {samples} samples")
        correct, timing = sample_truth_cached(run_dir, name, path, task, probs, samples,
                                              cfg.rollout.max_tokens, cfg.rollout.temperature,
                                              cfg.generators.engine)
        truth = correct / samples
        ctx = context_at(obs, published_at(rows, step), cfg.prior.window,
                         min_items=min(64, len(obs)))
        entry = {"task": task_name, "snapshot": name, "step": step, "weights": path,
                 "recurring": recurring, "times_trained": times_trained(rows),
                 "n_train": cfg.task.n_train,
                 "n_prompts": len(probs), "samples_per_prompt": samples,
                 "levels": sorted(int(v) for v in set(levels)),
                 "context_size": len(ctx),
                 "context_versions": [min(o.version for o in ctx), max(o.version for o in ctx)]
                 if ctx else None,
                 "truth_mean": float(truth.mean()), "truth_sd": float(truth.std(ddof=1)),
                 "truth_by_level": {int(v): float(truth[levels == v].mean())
                                    for v in sorted(set(levels))},
                 "truth_within_level_sd": float(np.sqrt(np.mean(
                     [truth[levels == v].var(ddof=1) for v in set(levels)]))),
                 "timing": timing}
        lm = error_stats(level_mean_predictor(truth, levels), truth, samples)
        entry["level_mean_predictor"] = lm
        entry["level_error_sd_noise_removed"] = lm["error_sd_noise_removed"]
        lw = error_stats(level_window_predictor(levels, [level_of.get(o.prompt) for o in ctx],
                                                [o.score for o in ctx]), truth, samples)
        entry["level_window_predictor"] = lw
        entry["level_window_error_sd_noise_removed"] = lw["error_sd_noise_removed"]
        entry["surface_in_sample"] = error_stats(in_sample_fit(surface_features(texts), truth),
                                                 truth, samples)
        entry.update(truth_bounds(task_name, texts, levels, truth, samples))
        if recurring:  # what each prompt's own window history says alone
            entry["own_history_predictor"] = error_stats(own_history_predictor(texts, ctx),
                                                         truth, samples)
        entry["variants"], preds = {}, {}
        for vname, opts in variants.items():
            p = preds[vname] = prior_predictions(cfg, ctx, texts, opts)
            entry["variants"][vname] = {**error_stats(p, truth, samples), "options": opts,
                                        "reliability": reliability(p, truth)}
        shipped = entry["variants"]["shipped"]
        entry.update({k: shipped[k] for k in ("error_sd", "bias", "mae", "rmse", "spearman",
                                              "truth_noise_sd", "error_sd_noise_removed",
                                              "correlation_ceiling")})
        entry["reliability"] = shipped["reliability"]
        entry["online"] = online_estimate(rows, step, steps, cfg.algo.k_init, task.rewards)
        entry["online"]["offline_rmse_noise_removed"] = float(np.sqrt(max(
            0.0, entry["variants"][run_variant]["rmse"] ** 2
            - entry["variants"][run_variant]["truth_noise_sd"] ** 2)))
        entry["online"]["offline_variant"] = run_variant
        entry["points"] = {"truth": truth.round(4).tolist(),
                           "p": [round(float(x), 4) for x in preds["shipped"]],
                           "level": levels.tolist(), "prompts": texts}
        log(f"  truth {truth.mean():.3f} (sd {entry['truth_sd']:.3f}, noise "
            f"{shipped['truth_noise_sd']:.3f}); " + "; ".join(
                f"{v}: sd {s['error_sd']:.3f} (noise removed {s['error_sd_noise_removed']:.3f})"
                f" bias {s['bias']:+.3f} rho {s['spearman']:.3f}"
                for v, s in entry["variants"].items())
            + f"; level means: sd {lm['error_sd']:.3f}; the window's level means: noise removed "
              f"{lw['error_sd_noise_removed']:.3f}")
        out.append(entry)
    return out


def online_estimate(rows: list[dict], step: int, last: int, k_init: int,
                    rewards: tuple[float, float], half: int = 5) -> dict:
    """What the run's own metrics said about the prior near ``step``: the noise-corrected
    error (``cluster.records.metrics.prior_error_terms``, from each prompt's first k_init rewards) over
    the prompts trained in the ``2 * half`` steps around it (clipped to the run), to compare
    with the offline error against the truth. It estimates sqrt(E[(p - mu)^2]), bias
    included: the offline twin is the RMSE with the truth's noise removed."""
    from cluster.records.metrics import prior_error_summary, prior_error_terms

    lo = max(1, min(step - half + 1, last - 2 * half + 1))
    hi = lo + 2 * half - 1
    keep = [r for r in rows if lo <= r["step"] <= hi and r.get("prior_p") is not None
            and len(r["rewards"]) >= k_init >= 2]
    if not keep:
        return {"steps": [lo, hi], "prompts": 0}
    r_lo, r_hi = rewards
    first = np.clip((np.array([r["rewards"][:k_init] for r in keep]) - r_lo) / (r_hi - r_lo), 0, 1)
    sq, bias = prior_error_terms([r["prior_p"] for r in keep], first)
    return {"steps": [lo, hi], "prompts": len(keep),
            **prior_error_summary(float(sq.sum()), float(bias.sum()), len(keep))}


def sample_truth_cached(run_dir: Path, name: str, path: str, task, probs, samples: int,
                        max_tokens: int, temperature: float, engine):
    """The truth of one snapshot, kept beside the run (the expensive part: re-measuring a
    variant of the prior on it costs nothing); used again only for the same prompts and the
    same weights (``weights_fingerprint``: a run made again in the same directory has new
    snapshots, and a truth of the old ones would be measured against the new run's window)."""
    from studies.prior_truth.truth import sample_truth

    cache = run_dir / f"truth-{name}-{len(probs)}x{samples}.json"
    key = {"ids": [p.id for p in probs], "weights": weights_fingerprint(Path(path))}
    if cache.is_file():
        got = json.loads(cache.read_text())
        if all(got.get(k) == v for k, v in key.items()):
            return np.array(got["correct"]), got["timing"]
        log(f"{cache.name}: of other prompts or weights; measured again")
    correct, timing = sample_truth(path, task, probs, samples, max_tokens, temperature,
                                   engine=engine)
    cache.write_text(json.dumps({**key, "correct": correct.tolist(), "timing": timing}))
    return correct, timing


def weights_fingerprint(path: Path) -> str:
    """A sha256 of the weight files under ``path``, names and contents (a 135M-parameter
    snapshot reads in about a second)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(path.rglob("*.safetensors")):
        h.update(str(f.relative_to(path)).encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.prior_truth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="stepwise", choices=sorted(TASK_RUNS))
    ap.add_argument("--run-dir", type=Path, nargs="+", default=[],
                    help="runs with snapshots/ (default: make them); the first is the headline "
                         "run, the others its repeats")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of the task to measure (seeds 0..R-1; those not given by "
                         "--run-dir are made): each snapshot gets their mean and SE")
    ap.add_argument("--recurring", type=int, metavar="N_TRAIN",
                    help="the run's train split cut to N_TRAIN prompts (task.n_train), so its "
                         "prompts recur; the truth is measured on prompts it trained")
    ap.add_argument("--steps", type=int, default=40, help="the default run's steps (40)")
    ap.add_argument("--per-level", type=int, default=50, help="prompts per difficulty level")
    ap.add_argument("--samples", type=int, default=64, help="sampled responses per prompt")
    ap.add_argument("--run-variant", default="shipped", choices=sorted(VARIANTS),
                    help="the prior variant the run used (a run made before a default changed)")
    ap.add_argument("--snapshots", default=",".join(SNAPSHOTS),
                    help="which snapshots to measure (comma-separated of start, middle, end)")
    ap.add_argument("--quick", action="store_true", help="6 steps, 8 prompts a level, 16 samples")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/v05-prior-truth"))
    ap.add_argument("--out", type=Path, default=RESULTS / "prior_truth.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.per_level, args.samples = 6, 8, 16
    t0 = time.time()
    which = tuple(x for x in args.snapshots.split(",") if x)
    if set(which) - set(SNAPSHOTS):
        raise SystemExit(f"--snapshots: unknown {sorted(set(which) - set(SNAPSHOTS))}; "
                         f"known: {', '.join(SNAPSHOTS)}")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be at least 1, got {args.repeats}")
    given = list(args.run_dir)
    run_dirs = given + [make_run(args.task, args.work_dir, args.steps, args.recurring, seed)
                        for seed in range(len(given), args.repeats)]
    per_run = [measure_task(args.task, d, args.per_level, args.samples, VARIANTS,
                            args.run_variant, which) for d in run_dirs]
    snaps = with_repeats(per_run, run_dirs)
    run_dir = run_dirs[0]
    from cluster.config.schema import load_config

    made = provenance("studies.prior_truth", list(argv or sys.argv[1:]))
    command, date, commit = made["command"], made["date"], made["commit"]
    old = json.loads(args.out.read_text()) if args.out.is_file() else {}
    recurring = bool(snaps and snaps[0]["recurring"])
    kept = [s for s in old.get("snapshots", [])  # this task's entries of the same setting go
            if (s["task"], bool(s.get("recurring"))) != (args.task, recurring)]
    key = args.task + ("_recurring" if recurring else "")
    runs = runs_with_commands(old)
    res = {"command": command, "date": date, "commit": commit,
           "units": "probabilities: p the prior's, t the share of correct sampled answers "
                    "(at the task run's rollout.temperature: runs.<task>.temperature) among "
                    "samples_per_prompt; error = p - t over n_prompts prompts",
           "snapshots": kept + snaps,
           "runs": {**runs, key: {
               "run_dir": str(run_dir), "wall_s": round(time.time() - t0), "command": command,
               "date": date, "commit": commit, **made_by(runs.get(key, {}), run_dir),
               **({"repeat_run_dirs": [str(d) for d in run_dirs[1:]]} if run_dirs[1:] else {}),
               "temperature": load_config(run_dir / "config.yaml", []).rollout.temperature}}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    from studies.prior_truth.plot import plot
    plot(res, args.out.with_suffix(".png"))
    log(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


def truth_bounds(task_name: str, texts: list[str], levels: np.ndarray, truth: np.ndarray,
                 samples: int) -> dict:
    """The fits to the truth itself that a snapshot's aims are read against (bounds.py): the
    level-told predictor out of fold and, for a task with a generator to read, the truth's
    cross-validated fit on the generator's own variables."""
    out = {"level_cv_predictor": error_stats(level_cv_predictor(truth, levels), truth, samples)}
    gen = generator_variables(task_name, texts, levels)
    if gen is not None:
        out["generator_bound"] = {"variables": gen[0],
                                  **cross_validated_bound(gen[1], truth, samples)}
    return out


def with_repeats(per_run: list[list[dict]], run_dirs: list[Path]) -> list[dict]:
    """The headline run's snapshot entries, each with ``repeats`` (analysis.repeats_block)
    over every run's snapshot of the same name when there is more than one run."""
    head = per_run[0]
    if len(per_run) > 1:
        for entry in head:
            same = [next(e for e in run if e["snapshot"] == entry["snapshot"]) for run in per_run]
            entry["repeats"] = repeats_block(
                [e["points"] for e in same], entry["samples_per_prompt"], run_dirs,
                {v: [e["variants"][v]["error_sd_noise_removed"] for e in same]
                 for v in entry["variants"]},
                window_and_truth_bounds(same))
    return head


def window_and_truth_bounds(same: list[dict]) -> dict[str, list[float]]:
    """Each run's figures of the fits that bound the prior at one snapshot, for ``repeats``:
    the level told, its means learned from the window (``level_window_predictor``), and the
    truth fitted on the generator's variables (``generator_bound``) where the task has one."""
    out = {"level_window_error_sd_noise_removed":
           [e["level_window_error_sd_noise_removed"] for e in same]}
    if all("generator_bound" in e for e in same):
        out |= {f"generator_{k}": [e["generator_bound"][k] for e in same]
                for k in ("error_sd_noise_removed", "spearman")}
    return out


def made_by(old_run: dict, run_dir: Path) -> dict:
    """``run_made_by``: the command that made the run a ``--run-dir`` measures again (the
    earlier entry's, when it measured the same run directory), so that re-measuring a cached
    truth keeps the record of where the run came from."""
    if old_run.get("run_dir") != str(run_dir):
        return {}
    return {"run_made_by": old_run.get("run_made_by") or old_run.get("command")}


def runs_with_commands(old: dict) -> dict:
    """The earlier result's runs, each with the command that measured it: a file written
    before runs carried their own command names it only at its top level, for the task that
    command measured (``--task``, stepwise by default); that task's run gets it."""
    runs = {task: dict(r) for task, r in old.get("runs", {}).items()}
    cmd = old.get("command", "")
    args = cmd.split()
    task = args[args.index("--task") + 1] if "--task" in args[:-1] else "stepwise"
    if task in runs and "command" not in runs[task]:
        runs[task].update(command=cmd, date=old.get("date"))
    return runs


if __name__ == "__main__":
    raise SystemExit(main())
