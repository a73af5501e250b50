"""What sets V0.5's extra rollouts, on the estimator alone (exact, no Monte Carlo noise):

    python -m bench.budget_sweep [--truth bench/results/prior_truth.json] [--prior-sd 0.08]

For every setting of the budget rule (``algo.cost`` x the look-ahead x ``k_max``; the
one-rollout-at-a-time OSLA rule, whose stopping law the batched plan follows closely,
docs/estimator.md) and two priors (exact, and Gaussian error of the measured sd on p,
clipped), over the true success rates a default run's middle snapshot measured
(``prior_truth.json``: the stepwise task, 64 samples per prompt): the mean k, the share of
prompts stopped at k_init (the prior kept by the real-time test), the share that went to
k_max, and the baseline's MSE on the {-1, +1} scale, beside GRPO-G's at the same mean k.
The law of every prompt's stopping rule is summed exactly over its reward paths
(``bench.estimator_mse.montecarlo.exact_rule``). Writes bench/results/budget_sweep.json.

This is the estimator's side of issue 18's item 5; which setting learns best per rollout is
the controlled study's question (``bench.learning`` has the modes ``async_v05_cost2x``,
``_cost4x``, ``_kmax8``, ``_plugin``).
"""
from __future__ import annotations

import argparse
import json
import itertools
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "results"
COSTS = (0.0039, 0.0078, 0.0156)
LOOKAHEADS = ("predictive", "plugin")
K_MAX = (8, 16)


def truth_rates(path: Path, task: str = "stepwise", snapshot: str = "middle") -> np.ndarray:
    snaps = json.loads(path.read_text())["snapshots"]
    [s] = [s for s in snaps if s["task"] == task and s["snapshot"] == snapshot]
    return np.array(s["points"]["truth"], dtype=float)


def sweep(p: np.ndarray, prior_sd: float, reps: int, seed: int = 0) -> list[dict]:
    from bench.estimator_mse.montecarlo import exact_rule
    from estimator.registry import EstimatorConfig

    rng = np.random.default_rng(seed)
    pp = np.repeat(p, reps)                                     # (N reps,)
    priors = {"exact": pp, f"sd{prior_sd:g}": np.clip(pp + rng.normal(0, prior_sd, pp.shape), 0, 1)}
    rows = []
    for (name, prob), cost, look, kmax in itertools.product(priors.items(), COSTS, LOOKAHEADS, K_MAX):
        cfg = EstimatorConfig(k_init=4, k_max=kmax, cost=cost, lookahead=look)
        law = exact_rule(pp, 2 * prob - 1, cfg, adaptive=True)
        pmf = law["k_pmf"]                                      # (N, kmax + 1)
        k_mean = float((pmf * np.arange(pmf.shape[1])).sum(1).mean())
        mse = float(law["sq_err"].mean())
        grpo_at_k = float(np.mean(4 * pp * (1 - pp))) / k_mean  # var of a mean of k_mean rewards
        rows.append({"prior": name, "cost": cost, "lookahead": look, "k_max": kmax,
                     "k_mean": k_mean, "stopped_at_k_init": float(pmf[:, 4].mean()),
                     "at_k_max": float(pmf[:, kmax].mean()), "baseline_mse": mse,
                     "grpo_mse_at_equal_k": grpo_at_k, "mse_ratio_to_grpo": mse / grpo_at_k})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.budget_sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--truth", type=Path, default=RESULTS / "prior_truth.json")
    ap.add_argument("--prior-sd", type=float, default=0.08,
                    help="the prior's error sd on p (default: the measured 0.08)")
    ap.add_argument("--reps", type=int, default=20, help="prior draws per true rate")
    ap.add_argument("--out", type=Path, default=RESULTS / "budget_sweep.json")
    args = ap.parse_args(argv)
    p = truth_rates(args.truth)
    rows = sweep(p, args.prior_sd, args.reps)
    out = {"command": "python -m bench.budget_sweep " + " ".join(argv or []),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "population": f"{len(p)} true rates of the stepwise default run's middle snapshot "
                         f"(bench/results/prior_truth.json), x {args.reps} prior draws",
           "units": "k: rollouts per prompt; MSE: (baseline - mu)^2 on the {-1,+1} scale",
           "rows": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"{r['prior']:>7} cost {r['cost']:.4f} {r['lookahead']:>10} kmax {r['k_max']:>2}: "
              f"k {r['k_mean']:.2f}, kept at 4 {r['stopped_at_k_init']:.1%}, at kmax "
              f"{r['at_k_max']:.1%}, MSE {r['baseline_mse']:.4f} ({r['mse_ratio_to_grpo']:.2f}x "
              f"GRPO at equal k)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
