"""The estimator benchmark (studies/estimator_mse/) at tiny sizes: output structure, and the
behaviours its conclusions rest on (exact prior beats GRPO, MC agrees with exact sums, the
vectorised drivers agree with the per-prompt state machine the coordinator uses)."""
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from studies.estimator_mse import QUICK, V05_VARIANTS, est_config, main, run_benchmark
from studies.estimator_mse import arrivals
from studies.estimator_mse import montecarlo as mc
from estimator import PromptState, make_estimator, plan_batched

TINY = replace(QUICK, n_prompts=2000, n_exact=300, bias_ks=(1, 4, 16), grid_points=11,
               mc_bias_prompts=20, mc_bias_reps=400, timing_n=2000, n_arrivals=1000)
VERSUS_KEYS = {"prior", "k_mean_sequential", "mse_sequential", "k_mean_batched", "mse_batched",
               "rounds_mean_sequential", "rounds_mean_batched", "rounds_p99_batched",
               "cancelled_fraction"}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "estimator_mse"
    res = run_benchmark(TINY, out, plot=True, log=lambda *_: None)
    return res, out


def _row(res, prior, estimator="v05_osla", lookahead="predictive", noise="bound"):
    (row,) = [r for r in res["v05"] if (r["estimator"], r["prior"], r["lookahead"], r["noise"])
              == (estimator, prior, lookahead if estimator == "v05_osla" else None, noise)]
    return row


def test_outputs_are_written_with_the_documented_structure(result):
    res, out = result
    on_disk = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert {"config", "machine", "date", "grpo", "v05", "bias_vs_k", "convention_check",
            "timing", "v05_loses", "batched_vs_sequential",
            "plan_variants"} <= set(on_disk)
    assert on_disk["machine"]["cpu_count"] >= 1 and on_disk["config"]["n_prompts"] == 2000
    assert [r["group"] for r in on_disk["grpo"]] == [2, 4, 8, 16]
    assert len(on_disk["v05"]) == len(TINY.priors) * len(V05_VARIANTS)
    for r in on_disk["v05"]:
        assert {"mse", "mse_se", "bias", "mean_k", "k_hist", "cond_bias_mean_abs",
                "cond_bias_max_abs", "mse_ratio_vs_grpo_same_k"} <= set(r)
        assert len(r["k_hist"]) == TINY.k_max + 1
        assert sum(r["k_hist"]) == pytest.approx(1.0)
        assert sum(r["k_hist"][: TINY.k_init]) == 0.0
    assert on_disk["timing"]["decisions_per_s"]["predictive/bound"] > 0
    assert on_disk["timing"]["decisions_per_s"]["plan_batched"]["predictive/bound"] > 0
    versus = on_disk["batched_vs_sequential"]
    assert [r["prior"] for r in versus] == list(TINY.priors)
    for r in versus:
        assert VERSUS_KEYS <= set(r)
        assert r["plan_batched"] == {"plan": "batched", "max_rounds": 3}
        assert 1 <= r["rounds_mean_batched"] <= r["rounds_p99_batched"] <= 3
        assert 0 <= r["cancelled_fraction"] < 1
        assert r["k_mean_batched"] >= r["observed_k_mean_batched"] >= TINY.k_init


def test_exact_prior_osla_beats_grpo4_and_k_stays_in_range(result):
    res, _ = result
    grpo4 = next(r for r in res["grpo"] if r["group"] == 4)
    exact = _row(res, "exact")
    assert exact["mse"] < grpo4["mse"] / 3
    for r in res["v05"]:
        assert TINY.k_init <= r["mean_k"] <= TINY.k_max
    # an uninformative prior must cost rollouts: OSLA spends more than with an exact prior
    assert _row(res, "const0.5")["mean_k"] > exact["mean_k"] + 1


def test_monte_carlo_agrees_with_exact_sums(result):
    res, _ = result
    var_r = res["population_var_reward"]
    for r in res["grpo"]:  # GRPO's MSE is E[Var r] / G
        assert abs(r["mse"] - var_r / r["group"]) < 5 * r["mse_se"]
    for r in res["v05"]:
        assert abs(r["mc_minus_exact_mse_in_se"]) < 5, r
    check = res["bias_vs_k"]["mc_check"]
    assert check["max_abs_z"] < 6 and check["max_abs_diff_where_sd_0"] < 1e-12


def test_bias_bound_and_reward_convention(result):
    res, _ = result
    wc = res["bias_vs_k"]["worst_case_grid"]["bound"]["max_abs_times_sqrt_k_over_sigma"]
    assert max(wc) <= 1.0 + 1e-9 and min(wc) > 0.5  # O(1/sqrt k), and the constant is ~1
    conv = res["convention_check"]
    assert conv["max_fraction_prompts_with_different_k"] == 0.0
    assert conv["max_relative_diff_4mse01_vs_mse_pm1"] < 1e-9


@pytest.mark.parametrize("lookahead, noise", [("predictive", "bound"), ("plugin", "bernoulli")])
def test_vectorised_osla_matches_the_per_prompt_state(lookahead, noise):
    rng = np.random.default_rng(3)
    pop = mc.draw_population(60, 16, rng)
    prior_p = mc.prior_probs("sd0.2", pop.p, rng)
    cfg = est_config(TINY, lookahead, noise)
    k_stop, base = mc.run_osla(pop, mc.to_reward_scale(prior_p, cfg.rewards), cfg)
    est = make_estimator("v05", lookahead=lookahead, noise=noise, plan="sequential",
                         max_rounds=None)
    for i in range(60):
        st = PromptState(est, prior_p=float(prior_p[i]))
        while (n := st.to_request()):
            for _ in range(n):
                st.add(float(pop.rewards[i, st.k]))
        assert st.k == k_stop[i]
        assert st.baseline == pytest.approx(base[i], abs=1e-12)


def test_exact_dynamic_programme_matches_binomial_sum():
    rng = np.random.default_rng(4)
    p, prior = rng.random(300), rng.uniform(-1, 1, 300)
    for noise in ("bound", "bernoulli"):
        cfg = est_config(TINY, noise=noise)
        ex = mc.exact_rule(p, prior, cfg, adaptive=False, k_fixed=8)
        assert np.allclose(ex["mean_baseline"] - ex["mu"], mc.conditional_bias(p, prior, cfg, 8))
        osla = mc.exact_rule(p, prior, cfg, adaptive=True)
        assert np.allclose(osla["k_pmf"].sum(axis=1), 1.0)


@pytest.mark.parametrize("argv, message", [(["--rewards", "1,0"], "r_lo < r_hi"),
                                           (["--rewards", "1"], "two values")])
def test_cli_rejects_bad_rewards(argv, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        main(argv + ["--quick", "--out", str(tmp_path / "x")])


def test_the_cli_writes_its_command_date_and_commit_into_the_results_file(tmp_path,
                                                                         monkeypatch):
    """``python -m studies.estimator_mse``'s file says where it came from, as a bench's does
    (estimator_mse.json's command and commit were added by hand in 6c7a7e0)."""
    from datetime import datetime

    from studies import provenance
    from studies.estimator_mse import cli

    monkeypatch.setattr(cli, "QUICK", TINY)  # --quick at the tiny sizes
    monkeypatch.setattr(provenance, "checkout_commit", lambda root: f"commit of {root}")
    argv = ["--quick", "--no-plot", "--out", str(tmp_path / "e")]
    main(argv)
    on_disk = json.loads((tmp_path / "e.json").read_text())
    assert on_disk["command"] == "python -m studies.estimator_mse " + " ".join(argv)
    assert on_disk["commit"] == f"commit of {provenance.REPO}"
    assert (provenance.REPO / "studies" / "estimator_mse").is_dir()
    assert datetime.fromisoformat(on_disk["date"]).utcoffset().total_seconds() == 0
    assert on_disk["config"]["n_prompts"] == TINY.n_prompts


def test_unknown_prior_quality_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown prior quality"):
        mc.prior_probs("oracle", np.array([0.5]), np.random.default_rng(0))


# -- the arrival model: the vectorised driver against the real PromptState --------------------
def _arrival_case(seed, n=80, quality="sd0.2"):
    rng = np.random.default_rng(seed)
    pop = mc.draw_population(n, 16, rng)
    prior_p = mc.prior_probs(quality, pop.p, rng)
    return pop, prior_p, arrivals.draw_durations(n, 64, rng)


@pytest.mark.parametrize("name, overrides", [
    ("v05", {}),                                        # the default: batched, max_rounds 3
    ("v05", {"max_rounds": None}),                      # re-plans, tops up and cancels freely
    ("v05", {"max_rounds": 2}),
    ("v05", {"plan": "sequential", "max_rounds": None}),
    ("v05", {"plan": "sequential", "max_rounds": 3}),
    ("v05", {"rewards": (0.0, 1.0)}),
    ("grpo", {}),
])
def test_vectorised_arrivals_match_the_prompt_state(name, overrides):
    pop, prior_p, dur = _arrival_case(7)
    est = make_estimator(name, **overrides)
    pop = mc.with_rewards(pop, est.cfg.rewards)
    prior = mc.to_reward_scale(prior_p, est.cfg.rewards)
    run = arrivals.run_arrivals(pop, prior, est, dur)
    for i in range(pop.p.size):
        ref = arrivals.drive_prompt_state(est, float(prior_p[i]) if est.needs_prior else None,
                                          pop.rewards[i], dur[i])
        got = {key: getattr(run, key)[i] for key in ref}
        assert got == pytest.approx(ref, abs=1e-12), i


def test_arrivals_exercise_cancellation_and_top_ups():
    """The uncapped batched plan both cancels and tops up on these prompts, so the equivalence
    test above covers those paths."""
    pop, prior_p, dur = _arrival_case(7)
    est = make_estimator("v05", max_rounds=None)
    run = arrivals.run_arrivals(pop, mc.to_reward_scale(prior_p, est.cfg.rewards), est, dur)
    assert run.cancelled.sum() > 0 and (run.rounds >= 3).any()
    assert (run.spent > run.k).any() and (run.spent >= run.k).all()


@pytest.mark.parametrize("lookahead", ["predictive", "plugin"])
def test_sequential_arrivals_are_monte_carlo_osla(lookahead):
    pop, prior_p, dur = _arrival_case(8, n=400, quality="const0.5")
    cfg = est_config(TINY, lookahead)
    prior = mc.to_reward_scale(prior_p, cfg.rewards)
    k_stop, base = mc.run_osla(pop, prior, cfg)
    est = make_estimator("v05", lookahead=lookahead, plan="sequential", max_rounds=None)
    run = arrivals.run_arrivals(pop, prior, est, dur)
    assert (run.k == k_stop).all() and np.allclose(run.baseline, base, rtol=0, atol=1e-12)
    assert (run.rounds == k_stop - TINY.k_init + 1).all() and run.cancelled.sum() == 0


@pytest.mark.parametrize("overrides, rule", [({}, {}), ({"max_rounds": None}, {}),
                                             ({"max_rounds": 2}, {}), ({}, {"replan_at": 1}),
                                             ({}, {"last_waits": False})])
def test_batched_prompts_stop_at_the_first_k_where_the_plan_is_zero(overrides, rule):
    """Whatever the timing and the cap, a batched prompt ends at the first k >= k_init with
    m* = 0 (or k_max): the documented property that makes its MSE timing-free."""
    pop, prior_p, dur = _arrival_case(9, n=600, quality="sd0.2")
    est = make_estimator("v05", **overrides)
    prior = mc.to_reward_scale(prior_p, est.cfg.rewards)
    expect = np.full(pop.p.size, 16)
    for k in range(15, 3, -1):  # the first k wins: scan downwards
        m = plan_batched(pop.csum[:, k - 1] / k, k, prior)
        expect[m == 0] = k
    run = arrivals.run_arrivals(pop, prior, est, dur, **rule)
    assert (run.k == expect).all()


def test_python_dash_m_runs_the_package():
    out = subprocess.run([sys.executable, "-m", "studies.estimator_mse", "--help"],
                         capture_output=True, text=True, check=True)
    assert "--quick" in out.stdout and "--rewards" in out.stdout
