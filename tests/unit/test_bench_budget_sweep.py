"""bench.budget_sweep on a small population: the exact laws behave as the budget rule says."""
import numpy as np

from bench.budget_sweep.__main__ import sweep


def test_cheaper_rollouts_buy_more_of_them_and_a_noisy_prior_is_kept_less_often():
    p = np.linspace(0.1, 0.9, 9)
    rows = sweep(p, prior_sd=0.2, reps=20)
    by = {(r["prior"], r["cost"], r["lookahead"], r["k_max"]): r for r in rows}
    for prior in ("exact", "sd0.2"):
        ks = [by[(prior, c, "predictive", 16)]["k_mean"] for c in (0.0039, 0.0078, 0.0156)]
        assert ks[0] >= ks[1] >= ks[2] >= 4.0
    exact, noisy = by[("exact", 0.0039, "predictive", 16)], by[("sd0.2", 0.0039, "predictive", 16)]
    # Even an exact prior is rejected by binomial noise alone at k = 4 for some prompts.
    assert 0.05 < 1 - exact["stopped_at_k_init"] < 0.35
    assert noisy["stopped_at_k_init"] < exact["stopped_at_k_init"]
    assert noisy["baseline_mse"] > exact["baseline_mse"]
    assert all(r["at_k_max"] <= 1.0 and r["k_mean"] <= r["k_max"] for r in rows)
