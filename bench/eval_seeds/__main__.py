"""Do the held-out evaluation's standard errors hold? The embedded policy's held-out prompts
sampled under several evaluation seeds, with the seeds the evaluation now uses (one per prompt
and sample, ``cluster.run.evaluation.eval_seeds``) and with the old shared seed (sample i of every
prompt seeded ``seed + i``, as ``eval_requests`` asked the generators for):

    python -m bench.eval_seeds [--prompts 200] [--seeds 8] [--samples 4] [--task NAME]

For each scheme ``cluster.run.evaluation.seed_spread_check`` compares the spread over the seeds of
the mean sampled accuracy (T = 1) with the binomial SE within prompts that the outcomes
predict, and with the SE the evaluation reports (over prompts). Sampling runs on vLLM (CPU)
in this process (``tasks.policy_eval.VllmSampler``: one engine request per sample with its
own seed, as the generators do). Writes bench/results/eval_seeds.json and eval_seeds.png.

Cost: 2 schemes x seeds x prompts x samples completions (12,800 by default). On 2 busy cores
(load ~12, 2026-12-01) a smoke run of 20 prompts x 2 seeds x 4 took 134-143 s per scheme,
about 0.9 s per completion: the default needs a GPU engine or an idle machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"
SCHEMES = ("per_prompt", "shared")


def scheme_seeds(scheme: str, run_seed: int, ids: list[str], n: int) -> list[list[int]]:
    """Each prompt's n sampling seeds under ``scheme``: "per_prompt" (the evaluation's,
    ``eval_seeds``) or "shared" (the old one: ``run_seed + i`` for sample i of every prompt)."""
    from common.seeds import eval_seeds

    if scheme == "per_prompt":
        return eval_seeds(run_seed, ids, n)
    if scheme == "shared":
        return [[run_seed + i for i in range(n)] for _ in ids]
    raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")


def outcomes(sampler, task, problems, scheme: str, seeds: int, n: int, temperature: float,
             max_tokens: int):
    """(seeds, prompts, n) 0/1: sample i of problem j under evaluation seed s correct? One
    engine call for all the seeds (a full engine; the seeds, not the batch, fix each sample)."""
    import numpy as np

    ids = [p.id for p in problems]
    rows = [row for s in range(seeds) for row in scheme_seeds(scheme, s, ids, n)]
    texts, _ = sampler([p.prompt for p in problems] * seeds, n=n, temperature=temperature,
                       max_tokens=max_tokens, seeds=rows)
    r_hi = task.rewards[1]
    ok = [[task.score(p, t).reward == r_hi for t in row]
          for p, row in zip(problems * seeds, texts)]
    return np.array(ok, dtype=float).reshape(seeds, len(problems), n)


def plot(result: dict, path: Path) -> None:
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 3.4))
    ax = fig.subplots()
    for k, (scheme, c) in enumerate(zip(SCHEMES, ("#1f77b4", "#d62728"))):
        r = result["schemes"][scheme]
        acc = np.array(r["accuracy_by_seed"])
        x = np.arange(len(acc)) + 0.15 * (2 * k - 1)
        ax.plot(x, acc, "o", color=c, label=f"{scheme}: spread sd {r['spread_sd']:.4f}, "
                f"binomial SE {r['predicted_se']:.4f}, reported SE {r['reported_se']:.4f}")
        ax.axhspan(r["accuracy_mean"] - r["predicted_se"], r["accuracy_mean"] + r["predicted_se"],
                   color=c, alpha=0.12)
    ax.set_xlabel("evaluation seed")
    ax.set_ylabel("sampled accuracy (T = 1)")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=80, bbox_inches="tight")


def main(argv=None) -> dict:
    from cluster.run.evaluation import seed_spread_check
    from tasks import DEFAULT_TASK, make_task
    from tasks.policy import ensure_default_policy, policy_recipe
    from tasks.policy_eval import VllmSampler

    ap = argparse.ArgumentParser(prog="python -m bench.eval_seeds", description=__doc__.split("\n")[0])
    ap.add_argument("--task", default=DEFAULT_TASK)
    ap.add_argument("--prompts", type=int, default=200, help="held-out prompts")
    ap.add_argument("--seeds", type=int, default=8, help="evaluation seeds per scheme")
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt and seed")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "eval_seeds.json")
    args = ap.parse_args(argv)

    t0 = time.time()
    path = ensure_default_policy(task=args.task)
    max_tokens = policy_recipe(args.task).max_tokens
    task = make_task(args.task, n_heldout=args.prompts)
    problems = task.heldout()[:args.prompts]
    sampler = VllmSampler(path, max_model_len=max(len(p.prompt) for p in problems) + max_tokens)
    t_ready = time.time() - t0
    result = {"task": args.task, "policy": str(path), "prompts": len(problems),
              "seeds": args.seeds, "samples": args.samples, "temperature": args.temperature,
              "max_tokens": max_tokens, "engine_start_s": round(t_ready, 1), "schemes": {},
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
              "command": "python -m bench.eval_seeds " + " ".join(argv or [])}
    for scheme in SCHEMES:
        t1 = time.time()
        x = outcomes(sampler, task, problems, scheme, args.seeds, args.samples,
                     args.temperature, max_tokens)
        result["schemes"][scheme] = {**seed_spread_check(x), "sampling_s": round(time.time() - t1, 1)}
        r = result["schemes"][scheme]
        print(f"{scheme:>10}: accuracy {r['accuracy_mean']:.4f}  spread over {args.seeds} seeds "
              f"{r['spread_sd']:.4f} [{r['spread_sd_ci95'][0]:.4f}, {r['spread_sd_ci95'][1]:.4f}]  "
              f"binomial SE {r['predicted_se']:.4f}  reported SE {r['reported_se']:.4f}  "
              f"ratio {r['ratio_to_predicted']:.2f}  ({r['sampling_s']}s)", flush=True)
    result["wall_s"] = round(time.time() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out}", flush=True)
    return result


if __name__ == "__main__":
    main()
