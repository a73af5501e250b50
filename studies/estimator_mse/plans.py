"""Batched against sequential budget plans under the arrival model (``arrivals.py``).

For every prior quality, on the same prompts, rewards and rollout durations:

- ``sequential``: the paper's one-at-a-time OSLA (``plan="sequential", max_rounds=None``);
- ``batched``: the estimator's default (``plan="batched"`` with its default round cap);
- the alternatives docs/estimator.md cites, each changing one thing of the default.

Rollouts are counted in rollout equivalents: every observed reward is 1, a cancelled rollout
counts the fraction of its generation it had run. MSE is against the true mean reward.
"""
from __future__ import annotations

import time

import numpy as np

from studies.estimator_mse.arrivals import ArrivalRun, draw_durations, run_arrivals
from studies.estimator_mse.montecarlo import Population
from estimator import EstimatorConfig, make_estimator

AIMS = {"mse_ratio_max": 1.10, "k_ratio_max": 1.10, "rounds_mean_max": 2.0, "rounds_p99_max": 3}

# label -> (EstimatorConfig overrides, decide() keywords); "batched" is the default config
VARIANTS = {
    "batched_no_cap": ({"max_rounds": None}, {}),
    "batched_cap2": ({"max_rounds": 2}, {}),
    "batched_last_round_plan": ({}, {"last_round": "plan"}),
    "batched_last_no_wait": ({}, {"last_waits": False}),
    "batched_replan_from_first": ({}, {"replan_at": 1}),
    "sequential_cap3": ({"plan": "sequential", "max_rounds": 3}, {}),
}


def summary(run: ArrivalRun, mu: np.ndarray) -> dict:
    """Rollouts, MSE, rounds, cancellations and latency of one plan on N prompts."""
    err2 = (run.baseline - mu) ** 2
    n = err2.size
    return {"k_mean": float(run.spent.mean()), "observed_k_mean": float(run.k.mean()),
            "mse": float(err2.mean()), "mse_se": float(err2.std() / np.sqrt(n)),
            "rounds_mean": float(run.rounds.mean()),
            "rounds_p99": int(np.percentile(run.rounds, 99, method="inverted_cdf")),
            "rounds_max": int(run.rounds.max()),
            "cancelled_fraction": float(run.cancelled.sum() / run.requested.sum()),
            "cancelled_spent_mean": float((run.spent - run.k).mean()),
            "time_mean": float(run.time.mean())}


def compare_plans(pop: Population, priors: dict, base: EstimatorConfig, slots: int,
                  rng: np.random.Generator, variants: bool = True, log=print):
    """-> (batched_vs_sequential rows, variant rows). ``base`` sets everything but the plan."""
    durations = draw_durations(pop.p.size, slots, rng)  # (N, S): shared by every plan
    fields = {f: getattr(base, f) for f in ("k_init", "k_max", "cost", "lookahead", "noise",
                                            "rewards")}
    seq_est = make_estimator("v05", **fields, plan="sequential", max_rounds=None)
    bat_est = make_estimator("v05", **fields)  # the defaults: what the coordinator runs
    rows, extra = [], []
    for q, prior in priors.items():
        t0 = time.perf_counter()
        seq = run_arrivals(pop, prior, seq_est, durations)
        bat = run_arrivals(pop, prior, bat_est, durations)
        s, b = summary(seq, pop.mu), summary(bat, pop.mu)
        diff = (bat.baseline - pop.mu) ** 2 - (seq.baseline - pop.mu) ** 2  # paired
        row = {"prior": q, "plan_batched": {"plan": bat_est.cfg.plan,
                                            "max_rounds": bat_est.cfg.max_rounds},
               **{f"{key}_sequential": v for key, v in s.items()},
               **{f"{key}_batched": v for key, v in b.items() if not key.startswith("cancel")},
               "cancelled_fraction": b["cancelled_fraction"],
               "cancelled_spent_mean": b["cancelled_spent_mean"],
               "mse_ratio": b["mse"] / s["mse"], "k_ratio": b["k_mean"] / s["k_mean"],
               "mse_diff_se": float(diff.std() / np.sqrt(diff.size)),
               "seconds": time.perf_counter() - t0}
        row["aims_met"] = {"mse": row["mse_ratio"] <= AIMS["mse_ratio_max"],
                           "k": row["k_ratio"] <= AIMS["k_ratio_max"],
                           "rounds_mean": b["rounds_mean"] <= AIMS["rounds_mean_max"],
                           "rounds_p99": b["rounds_p99"] <= AIMS["rounds_p99_max"]}
        rows.append(row)
        log(fmt_row(row))
        if variants:
            for label, (over, rule) in VARIANTS.items():
                est = make_estimator("v05", **{**fields, **over})
                v = summary(run_arrivals(pop, prior, est, durations, **rule), pop.mu)
                extra.append({"variant": label, "prior": q, "config": over, "rule": rule, **v,
                              "mse_ratio": v["mse"] / s["mse"],
                              "k_ratio": v["k_mean"] / s["k_mean"]})
    return rows, extra


def fmt_row(r: dict) -> str:
    miss = [key for key, ok in r["aims_met"].items() if not ok]
    return (f"{r['prior']:<9} sequential k={r['k_mean_sequential']:5.2f} "
            f"mse={r['mse_sequential']:.5f} rounds={r['rounds_mean_sequential']:.2f} | batched "
            f"k={r['k_mean_batched']:5.2f} ({r['k_ratio']:.3f}x) mse={r['mse_batched']:.5f} "
            f"({r['mse_ratio']:.3f}x) rounds={r['rounds_mean_batched']:.2f} "
            f"p99={r['rounds_p99_batched']} cancelled={r['cancelled_fraction']:.3f}"
            + (f"  MISSED: {', '.join(miss)}" if miss else ""))
