"""Prior server benchmark: predict latency on the CPU and within-step AUC on proxy RL runs.

    python -m bench.prior            # full: 30 steps x 64 prompts, 2 seeds, 3 scenarios
    python -m bench.prior --quick    # smoke: 8 steps, 1 seed

(a) Latency of ``PriorServer.predict`` for 64 prompts with a 256-item context, one CPU thread,
after warm-up: embeddings cached and the context unchanged / just changed (refit), and 64
never-seen prompts (the encoder's cost, short and long prompts).
(b) AUC within step (bench/prior/proxy.py): each step's 64 queries are predicted from the
window of the 256 newest observations of earlier steps, then observed. Reported per predictor:
the mean over steps of the pairwise AUC between predicted p and observed success rates.
Writes bench/results/prior.json (with its command, date and commit: bench.harness.stamp) and
bench/results/prior.png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.harness import stamp

RESULTS = Path(__file__).resolve().parent.parent / "results"


class MemoEncoder:
    """One loaded MiniLM shared by every server of the benchmark, memoized by text, so that
    comparing predictors does not re-encode the same prompts (each server still keeps its own
    LRU cache in front of it, as in production)."""

    def __init__(self, threads: int):
        from actors.priors.embedded import SentenceEncoder
        self.inner = SentenceEncoder(threads=threads)
        self.memo: dict[str, object] = {}

    def encode(self, texts: list[str]):
        import numpy as np
        todo = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if todo:
            self.memo.update(zip(todo, self.inner.encode(todo)))
        return np.stack([self.memo[t] for t in texts])


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def bench_latency(batch: int, window: int, repeats: int, options: dict | None = None) -> dict:
    """Milliseconds per ``predict`` of ``batch`` prompts, 1 thread, real encoder and cache;
    ``options``: the embedded prior's (its defaults when None)."""
    from actors.priors.server import PriorServer
    import math
    from bench.prior.proxy import arithmetic_problems, word_problems
    from common.types import PriorObservation
    pool = word_problems(window + batch * (repeats + 3), seed=7)
    words = [p.prompt for p in pool]
    ariths = [p.prompt for p in arithmetic_problems(batch * (repeats + 1), seed=7)]
    t0 = time.perf_counter()
    server = PriorServer("embedded", dict(options or {}), window=window, cpu_threads=1)
    load_s = time.perf_counter() - t0
    context, queries = words[:window], words[window:window + batch]
    server.predict(context)                          # encode the context once, as in production
    # Difficulty-driven scores, so that the fit is a real kernel model (not the constant).
    server.observe([PriorObservation(p.prompt, 1.0 / (1.0 + math.exp(p.difficulty)), i // batch)
                    for i, p in enumerate(pool[:window])])
    server.predict(queries)                          # warm-up: fit + encode the queries
    cached_same = _median_ms(lambda: server.predict(queries), repeats)
    extra = iter(queries * repeats)

    def refit():
        server.observe([PriorObservation(next(extra), 0.5, window // batch)])  # a cached one done
        server.predict(queries)
    cached_refit = _median_ms(refit, repeats)
    fresh = iter([words[window + batch * (r + 1):window + batch * (r + 2)] for r in range(repeats + 1)])
    fresh_long = _median_ms(lambda: server.predict(next(fresh)), repeats)
    fresh_a = iter([ariths[batch * r:batch * (r + 1)] for r in range(repeats + 1)])
    fresh_short = _median_ms(lambda: server.predict(next(fresh_a)), repeats)
    return {"batch": batch, "window": window, "cpu_threads": 1, "repeats": repeats,
            "load_s": round(load_s, 2),
            "cached_same_context_ms": round(cached_same, 2),
            "cached_refit_ms": round(cached_refit, 2),
            "fresh_word_problems_ms": round(fresh_long, 1),
            "fresh_arithmetic_ms": round(fresh_short, 1),
            "backend_stats": server.stats().to_dict()}


def proxy_runs(scenario: str, steps: int, batch: int, seed: int):
    """One simulated run. The prompt pools are fixed (seed 0); ``seed`` draws the order, the
    policy's drift and the rollout noise."""
    from bench.prior.proxy import arithmetic_problems, simulate_run, word_problems
    n = steps * batch
    if scenario == "arithmetic":
        pool = arithmetic_problems(n)
    elif scenario == "word":
        pool = word_problems(n)
    elif scenario == "mixed":  # both families in one run, interleaved by the shuffle
        pool = arithmetic_problems(n)[: n // 2] + word_problems(n)[: n - n // 2]
    else:
        raise ValueError(f"unknown scenario {scenario!r}: arithmetic, word, mixed")
    return simulate_run(pool, steps, batch, seed=seed)


def replay(run, backend: str, options: dict, window: int) -> list[float]:
    """Per-step AUC of one backend served by a real PriorServer (steps >= 1)."""
    from actors.priors.server import PriorServer
    from bench.prior.proxy import pair_auc
    from common.types import PriorObservation
    server = PriorServer(backend, options, window=window)
    aucs = []
    for step in run:
        if step.version > 0:
            aucs.append(pair_auc(server.predict(step.prompts), step.observed))
        server.observe([PriorObservation(p, s, step.version)
                        for p, s in zip(step.prompts, step.observed.tolist())])
    return aucs


def heuristic_aucs(run, kind: str) -> list[float]:
    import numpy as np
    from bench.prior.proxy import pair_auc
    out = []
    for step in run[1:]:
        score = step.true_p if kind == "oracle" else -np.array([len(p) for p in step.prompts], float)
        out.append(pair_auc(score, step.observed))
    return out


def bench_auc(scenarios, seeds, steps, batch, window, encoder) -> dict:
    import numpy as np
    predictors = {"embedded": ("embedded", {"encoder": encoder}),
                  "embedded_no_length": ("embedded", {"encoder": encoder, "use_length": False}),
                  "constant": ("constant", {})}
    result = {}
    for scenario in scenarios:
        per = {name: [] for name in [*predictors, "length_only", "oracle"]}
        for seed in seeds:
            run = proxy_runs(scenario, steps, batch, seed)
            for name, (backend, opts) in predictors.items():
                per[name].append(replay(run, backend, opts, window))
            per["length_only"].append(heuristic_aucs(run, "length"))
            per["oracle"].append(heuristic_aucs(run, "oracle"))
            print(f"  {scenario} seed {seed}: " + ", ".join(
                f"{k} {np.nanmean(v[-1]):.3f}" for k, v in per.items()), flush=True)
        result[scenario] = {
            name: {"mean": round(float(np.nanmean(runs)), 4),
                   "per_seed": [round(float(np.nanmean(r)), 4) for r in runs],
                   "per_step_seed0": [round(float(a), 4) for a in runs[0]]}
            for name, runs in per.items()}
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    auc = result["auc"]
    scenarios = list(auc)
    fig, axes = plt.subplots(1, len(scenarios) + 1, figsize=(4.2 * (len(scenarios) + 1), 3.6))
    names = ["oracle", "embedded", "embedded_no_length", "length_only", "constant"]
    ax = axes[0]
    for i, name in enumerate(names):
        ax.bar([j + 0.16 * (i - 2) for j in range(len(scenarios))],
               [auc[s][name]["mean"] for s in scenarios], width=0.16, label=name)
    ax.set_xticks(range(len(scenarios)), scenarios)
    ax.set_ylim(0.4, 1.0)
    ax.axhline(0.5, color="k", lw=0.6)
    ax.set_ylabel("AUC within step (mean over steps)")
    ax.legend(fontsize=7)
    for ax, s in zip(axes[1:], scenarios):
        for name in ("oracle", "embedded", "length_only", "constant"):
            ax.plot(auc[s][name]["per_step_seed0"], label=name, lw=1.2)
        ax.set_title(f"{s} (seed 0)")
        ax.set_xlabel("step")
        ax.set_ylim(0.3, 1.0)
    axes[1].legend(fontsize=7)
    lat = result["latency_ms"]
    fig.suptitle(f"prior: predict {lat['batch']} prompts, ctx {lat['window']}: "
                 f"{lat['cached_refit_ms']:.0f} ms cached+refit, "
                 f"{lat['fresh_word_problems_ms']:.0f} ms fresh word problems", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="python -m bench.prior", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10, help="timed repetitions per latency case")
    ap.add_argument("--scenarios", default="arithmetic,word,mixed")
    ap.add_argument("--quick", action="store_true", help="8 steps, 1 seed, 3 repeats")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.repeats = 8, 1, 3
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    print("latency ...", flush=True)
    latency = bench_latency(args.batch, args.window, args.repeats)
    print(json.dumps({k: v for k, v in latency.items() if k != "backend_stats"}), flush=True)
    print("AUC within step ...", flush=True)
    encoder = MemoEncoder(threads=max(1, min(2, os.cpu_count() or 1)))
    auc = bench_auc(args.scenarios.split(","), list(range(args.seeds)), args.steps, args.batch,
                    args.window, encoder)
    made = stamp("bench.prior", argv)  # command, date, machine, commit: as the other benches
    result = {**{k: made[k] for k in ("command", "date", "commit")},
              "latency_ms": latency, "auc": auc,
              "config": {"steps": args.steps, "batch": args.batch, "window": args.window,
                         "seeds": args.seeds, "rollouts_per_prompt": 8},
              "machine": {**made["machine"], "loadavg_1m": round(os.getloadavg()[0], 2)}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prior.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "prior.png")
    for s, r in auc.items():
        print(f"{s:>10}: " + "  ".join(f"{k} {v['mean']:.3f}" for k, v in r.items()))
    print(f"wrote {args.out / 'prior.json'} and {args.out / 'prior.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
