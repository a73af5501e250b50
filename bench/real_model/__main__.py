"""A real pretrained model through the whole system, measured.

    python -m bench.real_model [--config configs/smollm2-135m.yaml] [--run-dir DIR]
                               [--batches 1,4,8,16,32,64] [--out FILE] [overrides ...]
    python -m bench.real_model --prior-truth bench/results/prior_truth.json [--out FILE]
    python -m bench.real_model --fp32-baseline [...]   # the same run in float32 beside it

1. On a quiet machine, before the run: the float32 matmul peak (1 and 2 threads) and one
   generator's engine alone at fixed batches of real prompts (``measure``), each in a
   process of its own.
2. The run, as a user runs it: ``python -m cluster.launch CONFIG`` in a subprocess (its
   console shown here), on a local Ray cluster of its own, outputs under ``--work-dir``;
   each role's resident memory sampled meanwhile. ``--run-dir`` analyses a finished run
   instead (then memory and the run's wall time are not measured).
3. ``analysis``: seconds per step split into generation wait, training and weight sync;
   generator tokens/s during the run as a share of the engine alone at the batch it ran;
   learner tokens/s and FLOP/s against the matmul peak; memory per role; start-up; held-out
   accuracy before and after.

``--fp32-baseline`` (``dtypes``): before the run, this CPU's bf16 probe for the model and the
plain and learner steps on one batch in both dtypes; after it, the same run with
``optim.dtype=fp32 generators.engine.dtype=float32`` (its engine curve measured in float32),
side by side with the run in the dtype ``auto`` chose.

Writes bench/results/real_model.json (with the command) and real_model.png.

``--prior-truth FILE`` adds to an existing real_model.json the prior against the truth on the
run's task, from ``python -m studies.prior_truth --task word_arithmetic``'s result (a separate
command: its 64-sample truth takes longer than the run), with that command and its date
beside it (``prior_truth.command``: the file's ``runs.<task>``, the run of this task, not the
file's latest invocation, which may have measured another task).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import stamp, write_json

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def log(msg: str) -> None:
    print(f"[real_model {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def launch(config: str, work_dir: Path, name: str, overrides: list[str]) -> tuple[Path, float, dict]:
    """The run, as ``python -m cluster.launch``; (its run directory, wall seconds, peak RSS
    MiB by role)."""
    from bench.throughput.memory import MemorySampler

    cmd = [sys.executable, "-m", "cluster.launch", config, f"run.output_dir={work_dir}",
           f"run.name={name}", "run.overwrite=true", "cluster.address=local", *overrides]
    log("run: " + " ".join(cmd[2:]))
    sampler, t0 = MemorySampler(period=2.0), time.time()
    try:
        proc = subprocess.run(cmd, cwd=REPO)
    finally:
        sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"the run failed (exit {proc.returncode}); its logs: "
                         f"{work_dir / name / 'logs'}")
    return work_dir / name, time.time() - t0, sampler.peaks_mib()


def parameters(model_path: str) -> int:
    """The model's parameter count (tied embeddings once), from its config on the meta
    device: no weights loaded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return sum(p.numel() for p in model.parameters())


def add_prior_truth(out_path: Path, prior_path: Path, argv: list[str]) -> int:
    """Fold ``studies.prior_truth``'s figures for the run's task into ``out_path``; the units
    line is rewritten from the run's config (the sampling temperature it names)."""
    from bench.real_model import analysis
    from cluster.config.schema import load_config

    out = json.loads(out_path.read_text())
    cfg = load_config(out["config"], out.get("overrides", []))
    try:
        figures = analysis.prior_figures(json.loads(prior_path.read_text()), out["task"])
    except ValueError as e:
        raise SystemExit(f"{prior_path}: {e}")
    out.update(figures, units=analysis.units(cfg.rollout.temperature),
               prior_truth_added_by=stamp("bench.real_model", argv)["command"])
    write_json(out_path, out)
    log(f"added the prior's figures ({figures['prior_snapshot']} snapshot) to {out_path}")
    print(json.dumps({k: out[k] for k in ("prior_error_sd_noise_removed",
                                          "level_only_error_sd_noise_removed")}))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.real_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/smollm2-135m.yaml")
    ap.add_argument("--run-dir", type=Path, help="analyse this finished run instead of running")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/v05-real-model"))
    ap.add_argument("--name", default="real-model")
    ap.add_argument("--batches", default="1,4,8,16,32,64",
                    help="the engine-alone batches (comma-separated)")
    ap.add_argument("--out", type=Path, default=RESULTS / "real_model.json")
    ap.add_argument("--prior-truth", type=Path,
                    help="add this studies.prior_truth result's figures for the run's task to --out")
    ap.add_argument("--fp32-baseline", action="store_true",
                    help="run it again in float32 and measure both dtypes side by side")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for the run")
    a = ap.parse_intermixed_args(argv)
    if a.fp32_baseline and a.run_dir is not None:
        ap.error("--fp32-baseline runs both runs itself: leave out --run-dir")
    if a.prior_truth is not None:
        return add_prior_truth(a.out, a.prior_truth, argv)
    from bench.real_model import analysis, dtypes, measure
    from bench.real_model.plot import plot
    from cluster.config.schema import load_config

    cfg = load_config(a.config, a.overrides)
    threads = sorted({1, cfg.learner.threads, 2})
    log(f"matmul peak at {threads} threads ...")
    matmul = measure.in_subprocess("matmul", *map(str, threads))
    log(f"matmul GFLOP/s: {matmul}; the engine alone at batches {a.batches} ...")
    curve = measure.in_subprocess("engine", a.config, a.batches, *a.overrides)
    if a.fp32_baseline:
        probe = dtypes.probe_figures(cfg.model_path())
        log(f"dtype probe: {probe}")
        batch = dtypes.same_batch(cfg.model_path(), log)
    if a.run_dir is None:
        run_dir, wall, memory = launch(a.config, a.work_dir, a.name, a.overrides)
    else:
        run_dir, wall, memory = a.run_dir, float("nan"), {}
    params = parameters(cfg.model_path())
    out = {**stamp("bench.real_model", argv), "config": a.config, "overrides": a.overrides,
           "model_path": cfg.model.path, "task": cfg.task.name,
           "units": analysis.units(cfg.rollout.temperature),
           "matmul_gflops_by_threads": matmul,
           **analysis.analyse(run_dir, params, matmul, curve, memory, wall)}
    if a.fp32_baseline:
        over32 = [*a.overrides, *dtypes.FP32]
        log("the float32 baseline: the engine alone, then the same run ...")
        curve32 = measure.in_subprocess("engine", a.config, a.batches, *over32)
        run32, wall32, memory32 = launch(a.config, a.work_dir, f"{a.name}-fp32", over32)
        fp32 = analysis.analyse(run32, params, matmul, curve32, memory32, wall32)
        out.update(dtypes.side_by_side(dtypes.run_figures(out, run_dir),
                                       dtypes.run_figures(fp32, run32), batch, probe))
    write_json(a.out, out)
    plot(out, a.out.with_suffix(".png"))
    log(f"wrote {a.out} and {a.out.with_suffix('.png')}")
    print(json.dumps({k: out[k] for k in ("start_accuracy", "end_accuracy", "heldout_gain_se",
                                          "generator_share_of_engine_limit", "step_split_s",
                                          "learner", "ratios") if k in out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
