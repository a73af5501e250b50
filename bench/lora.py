"""LoRA (``optim.lora``) against full fine-tuning on the real model, measured side by side.

    python -m bench.lora [--config configs/smollm2-135m.yaml] [--rank 16 --alpha 32
                         --lora-lr 2e-4] [--probe-rounds 2] [--probe-steps 5] [--no-runs]
                         [--out bench/results/lora.json] [overrides ...]

1. The learner alone (``probe``): one DeepSpeed rank on the config's model and threads, in a
   process of its own per measurement, trains the same batch (16 responses of 48 tokens
   after 40-token prompts: the config's micro-batch) for ``--probe-steps`` updates; its peak
   resident memory (ru_maxrss), its median step time after the first, the parameters that
   train and the optimiser state they carry. Full and LoRA alternate, ``--probe-rounds``
   times each, so that drift in the machine's load falls on both.
2. The learning runs, one after the other, each as a user runs it (``python -m
   cluster.launch CONFIG``, through ``bench.real_model.launch``; run.max_train_s bounds both:
   equal training wall-clock): full fine-tuning at the config's lr, then LoRA at
   ``--lora-lr`` (LoRA's adapters start at zero and move at their own scale, so it takes a
   larger lr; 10x the full run's is the usual starting point and is not tuned here). Each
   run's held-out accuracy at both ends (``bench.real_model.analysis.accuracy``), its steps,
   step time and the learner's peak resident memory during the run.

Writes ``--out`` (with the command) and a plot beside it: ``memory_ratio`` is LoRA over full
in the learner's peak resident memory during the runs (the probe's ratio beside it),
``heldout_gain_se`` is the LoRA run's held-out gain in standard errors.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import stamp, write_json

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PROMPT, RESPONSE, BATCH = 40, 48, 16


def trainable_count(model) -> tuple[int, int]:
    """(parameters that train, parameters in all)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def log(msg: str) -> None:
    print(f"[lora {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def lora_override(rank: int, alpha: float) -> str:
    return "optim.lora=" + json.dumps({"rank": rank, "alpha": alpha,
                                       "target_modules": "all-linear"}, separators=(",", ":"))


def probe(config: str, overrides: list[str], steps: int) -> dict:
    """The learner alone, in this process: see the module's doc (1)."""
    import resource

    import numpy as np

    from cluster.config.schema import load_config
    from common.types import TrainSample
    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    cfg = load_config(config, overrides)
    w = LearnerWorker(cfg.model_path(), cfg.optim, 0, 1, free_port(),
                      num_threads=cfg.learner.threads)
    rng = np.random.default_rng(0)
    vocab = w.model.config.vocab_size
    samples = [TrainSample(prompt_token_ids=rng.integers(10, vocab, PROMPT).tolist(),
                           token_ids=rng.integers(10, vocab, RESPONSE).tolist(),
                           logprobs=[-3.0] * RESPONSE, advantage=float(rng.normal()), version=0)
               for _ in range(BATCH)]
    loaded_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        res = w.train_step(samples)
        times.append(time.perf_counter() - t)
        assert not res.skipped, res.skip_reason
    opt_bytes = sum(t.numel() * t.element_size() for st in w._opt.state.values()
                    for t in st.values() if hasattr(t, "numel"))
    trainable, parameters = trainable_count(w.model)
    out = {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "rss_after_load_mib": round(loaded_mib, 1),
           "step_s": round(statistics.median(times[1:] or times), 3),
           "step_times_s": [round(x, 3) for x in times],
           "trained_tokens_per_step": BATCH * RESPONSE,
           "trainable_parameters": trainable, "parameters": parameters,
           "optimiser_state_mib": round(opt_bytes / 2**20, 1)}
    w.close()
    return out


def probe_in_subprocess(config: str, overrides: list[str], steps: int) -> dict:
    cmd = [sys.executable, "-m", "bench.lora", "--probe-only", "--probe-steps", str(steps),
           "--config", config, *overrides]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"the learner probe failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def probes(config: str, overrides: list[str], lora: list[str], rounds: int,
           steps: int) -> dict:
    got: dict[str, list[dict]] = {"full": [], "lora": []}
    for r in range(rounds):
        for name, extra in (("full", []), ("lora", lora)):
            got[name].append(probe_in_subprocess(config, overrides + extra, steps))
            log(f"probe {name} round {r}: {got[name][-1]['peak_rss_mib']} MiB peak, "
                f"{got[name][-1]['step_s']} s a step")
    out = {}
    for name, rows in got.items():
        out[name] = {"peak_rss_mib": statistics.median(x["peak_rss_mib"] for x in rows),
                     "step_s": statistics.median(x["step_s"] for x in rows),
                     **{k: rows[0][k] for k in ("trainable_parameters", "parameters",
                                                 "optimiser_state_mib",
                                                 "trained_tokens_per_step")},
                     "rounds": rows}
    out["memory_ratio"] = round(out["lora"]["peak_rss_mib"] / out["full"]["peak_rss_mib"], 3)
    out["step_time_ratio"] = round(out["lora"]["step_s"] / out["full"]["step_s"], 3)
    return out


def learning_run(config: str, work_dir: Path, name: str, overrides: list[str]) -> dict:
    from bench.real_model import analysis
    from bench.real_model.__main__ import launch

    run_dir, wall, memory = launch(config, work_dir, name, overrides)
    rows, summary, _ = analysis.read_run(run_dir)
    learner_mib = max((v for k, v in memory.items() if k.startswith("LearnerWorker")),
                      default=float("nan"))
    steady = analysis.steady(rows)
    return {"overrides": overrides, "run_dir": str(run_dir), "wall_s": round(wall, 1),
            "train_s": round(summary["train_s"], 1), "steps": len(rows),
            "rollouts": summary["rollouts"],
            "learner_tokens_per_s": round(sum(r["trained_tokens"] for r in steady)
                                          / sum(r["train_time_s"] for r in steady), 1),
            "step_split_s": analysis.step_split(rows),
            "learner_peak_rss_mib": round(learner_mib, 1), "memory_peak_mib": memory,
            "accuracy": analysis.accuracy(summary)}


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    names, colours = ("full", "lora"), ("tab:blue", "tab:orange")
    p = out["probe"]
    axes[0].bar(names, [p[n]["peak_rss_mib"] for n in names], color=colours)
    axes[0].set_title(f"learner peak resident (MiB), probe\nLoRA/full {p['memory_ratio']}")
    axes[1].bar(names, [p[n]["step_s"] for n in names], color=colours)
    axes[1].set_title(f"learner step (s, {BATCH}x{PROMPT}+{RESPONSE} tokens)\n"
                      f"LoRA/full {p['step_time_ratio']}")
    ax = axes[2]
    for i, (n, c) in enumerate(zip(names, colours)):
        run = out.get("runs", {}).get(n)
        if not run:
            continue
        a = run["accuracy"]
        ax.errorbar([0, 1], [a["start_accuracy"], a["end_accuracy"]],
                    yerr=[a["start_se"], a["end_se"]], color=c, marker="o", capsize=3,
                    label=f"{n}: {a['heldout_gain_se']} SE, {run['steps']} steps")
    ax.set_xticks([0, 1], ["start", f"after {out.get('train_s_each', '?')} s"])
    ax.set_title("held-out accuracy (sampled, equal train wall-clock)")
    if out.get("runs"):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/smollm2-135m.yaml")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--lora-lr", type=float, default=2e-4)
    ap.add_argument("--probe-rounds", type=int, default=2)
    ap.add_argument("--probe-steps", type=int, default=5)
    ap.add_argument("--no-runs", action="store_true", help="the learner probe only")
    ap.add_argument("--probe-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/v05-lora"))
    ap.add_argument("--out", type=Path, default=RESULTS / "lora.json")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for every run")
    a = ap.parse_args(argv)
    if a.probe_only:
        print(json.dumps(probe(a.config, a.overrides, a.probe_steps)))
        return 0
    from cluster.config.schema import load_config

    lora = [lora_override(a.rank, a.alpha)]
    cfg = load_config(a.config, a.overrides)
    out = {**stamp("bench.lora", argv), "config": a.config, "overrides": a.overrides,
           "lora": {"rank": a.rank, "alpha": a.alpha, "target_modules": "all-linear",
                    "lr": a.lora_lr}, "full_lr": cfg.optim.lr,
           "units": "MiB (resident set size, peak), seconds, held-out accuracy (the config's "
                    "eval metric) with its standard error; heldout_gain_se: the gain over "
                    "sqrt(se_start^2 + se_end^2)"}
    log(f"the learner alone, full and LoRA (rank {a.rank}), {a.probe_rounds} rounds ...")
    out["probe"] = probes(a.config, a.overrides, lora, a.probe_rounds, a.probe_steps)
    if not a.no_runs:
        out["train_s_each"] = cfg.run.max_train_s
        out["runs"] = {}
        for name, extra in (("full", []), ("lora", lora + [f"optim.lr={a.lora_lr}"])):
            log(f"learning run: {name}")
            out["runs"][name] = learning_run(a.config, a.work_dir, f"lora-bench-{name}",
                                             a.overrides + extra)
            write_json(a.out, out)  # what is measured so far survives a later failure
        full, lo = out["runs"]["full"], out["runs"]["lora"]
        out["memory_ratio"] = round(lo["learner_peak_rss_mib"] / full["learner_peak_rss_mib"], 3)
        out["heldout_gain_se"] = lo["accuracy"]["heldout_gain_se"]
        out["full_heldout_gain_se"] = full["accuracy"]["heldout_gain_se"]
    else:
        out["memory_ratio"] = out["probe"]["memory_ratio"]
    write_json(a.out, out)
    plot(out, a.out.with_suffix(".png"))
    log(f"wrote {a.out}")
    print(json.dumps({k: out.get(k) for k in ("memory_ratio", "heldout_gain_se",
                                              "full_heldout_gain_se")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
