"""Command line of the estimator benchmark (``python -m studies.estimator_mse``)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from studies.estimator_mse.scenarios import QUICK, BenchConfig, run_benchmark
from studies.provenance import provenance
from estimator.registry import EstimatorConfig


def main(argv=None) -> dict:
    """Run the study; ``<out>.json`` names its command, date and commit, as the benches' do."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(
        prog="python -m studies.estimator_mse",
        description="Baseline MSE against rollouts (GRPO-G vs V0.5, per prior quality) and the "
                    "batched vs sequential budget plans under an arrival model.")
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    ap.add_argument("--rewards", default="-1,1", help="binary reward values r_lo,r_hi")
    ap.add_argument("--prompts", type=int, help="Monte Carlo population size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/estimator_mse",
                    help="output path without suffix (.json and .png are written)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    rewards = tuple(float(x) for x in args.rewards.split(","))
    if len(rewards) != 2:
        raise ValueError(f"--rewards needs two values r_lo,r_hi, got {args.rewards!r}")
    cfg = replace(QUICK if args.quick else BenchConfig(), rewards=rewards, seed=args.seed)
    if args.prompts:
        cfg = replace(cfg, n_prompts=args.prompts)
    EstimatorConfig(rewards=rewards)  # validates the range with a clear error
    result = run_benchmark(cfg, args.out, plot=not args.no_plot,
                           made_by=provenance("studies.estimator_mse", argv))
    print(f"wrote {args.out}.json ({result['timing']['total_s']:.1f}s)")
    return result
