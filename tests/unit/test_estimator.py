"""The estimator contract (docs/estimator.md): sanity facts, properties, slow references."""
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimator import (EstimatorConfig, PromptState, fuse, make_estimator, noise_bound,
                       plan_batched, prob_to_reward, should_continue)
from estimator.core import expected_next_mse

CONVENTIONS = [(-1.0, 1.0), (0.0, 1.0)]


# -- slow, obviously-correct references -------------------------------------------------------
def fuse_scalar(vbar, k, prior, sigma2):
    s2 = sigma2 / k
    delta2 = max(0.0, (vbar - prior) ** 2 - s2)
    w = delta2 / (delta2 + s2)
    return w * vbar + (1 - w) * prior, w, delta2, w * w * s2 + (1 - w) ** 2 * delta2


def next_mse_bruteforce(vbar, k, prior, sigma2, r_lo, r_hi):
    """Enumerate both outcomes of the next binary reward, as the spec words it."""
    baseline = fuse_scalar(vbar, k, prior, sigma2)[0]
    q = min(1.0, max(0.0, (baseline - r_lo) / (r_hi - r_lo)))
    total = 0.0
    for r, prob in ((r_hi, q), (r_lo, 1 - q)):
        total += prob * fuse_scalar((k * vbar + r) / (k + 1), k + 1, prior, sigma2)[3]
    return total


def mean_in(rewards):
    r_lo, r_hi = rewards
    return st.floats(r_lo, r_hi, allow_nan=False)


# -- the spec's sanity facts -----------------------------------------------------------------
@pytest.mark.parametrize("rewards", CONVENTIONS)
def test_accepted_prior_is_the_baseline_exactly(rewards):
    s2 = noise_bound(rewards)
    prior = prob_to_reward(0.3, rewards)
    for k in (1, 4, 16):
        vbar = prior + 0.999 * math.sqrt(s2 / k)  # inside the acceptance region
        f = fuse(vbar, k, prior, s2)
        assert f.weight == 0.0 and f.delta2 == 0.0 and f.mse == 0.0
        assert f.baseline == prior


def test_paper_example_weight():
    # k = 4, sigma2 = 1: s2 = 0.25. An estimated bias^2 of 0.01 gives w* = 0.01 / 0.26.
    vbar = 0.1 + math.sqrt(0.26)
    f = fuse(vbar, 4, 0.1, 1.0)
    assert f.delta2 == pytest.approx(0.01)
    assert f.weight == pytest.approx(0.01 / 0.26)
    assert f.weight == pytest.approx(0.038, abs=5e-4)


@pytest.mark.parametrize("plan", ["sequential", "batched"])
@pytest.mark.parametrize("lookahead", ["predictive", "plugin"])
@pytest.mark.parametrize("rewards", CONVENTIONS)
def test_osla_stops_at_k_init_when_prior_exact(lookahead, rewards, plan):
    r_lo, r_hi = rewards
    est = make_estimator("v05", lookahead=lookahead, rewards=rewards, plan=plan)
    st_ = PromptState(est, prior_p=0.5)  # prior at the middle, rewards split evenly
    assert st_.to_request() == 4
    for r in (r_hi, r_lo, r_hi, r_lo):
        st_.add(r)
    assert st_.to_request() == 0 and st_.done and st_.k == 4
    assert st_.baseline == prob_to_reward(0.5, rewards)


@pytest.mark.parametrize("lookahead", ["predictive", "plugin"])
def test_osla_runs_to_exactly_16_when_prior_far_off(lookahead):
    # Prior says "never solved", the policy always solves it: delta2 is large, mse ~ 1/k,
    # gain 1/(k(k+1)) > 0.0039 iff k <= 15.
    k = 4
    while should_continue(1.0, k, -1.0, cost=0.0039, k_max=16, sigma2=1.0, lookahead=lookahead):
        k += 1
    assert k == 16
    # Without the k_max cap the same test would have continued at 16 only if the gain allowed.
    gains = [1 / (j * (j + 1)) > 0.0039 for j in range(4, 20)]
    assert gains.index(False) + 4 == 16


def test_limits():
    # delta2 -> infinity: w -> 1 (pure empirical mean).
    assert fuse(1.0, 4, -1.0, 1e-9).weight == pytest.approx(1.0)
    # k -> infinity: baseline -> vbar.
    f = fuse(0.2, 10**9, -0.5, 1.0)
    assert f.baseline == pytest.approx(0.2, abs=1e-6)
    ws = [fuse(0.2, k, -0.3, 1.0).weight for k in (1, 4, 16, 64, 256)]
    assert all(a <= b for a, b in zip(ws, ws[1:]))  # more rollouts, more trust in the data


# -- properties over random inputs -----------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(vbar=mean_in((-1, 1)), prior=mean_in((-1, 1)), k=st.integers(1, 64),
       sigma2=st.floats(0.01, 4))
def test_fuse_properties_and_scalar_reference(vbar, prior, k, sigma2):
    f = fuse(vbar, k, prior, sigma2)
    ref = fuse_scalar(vbar, k, prior, sigma2)
    assert 0.0 <= f.weight <= 1.0
    assert min(vbar, prior) - 1e-12 <= f.baseline <= max(vbar, prior) + 1e-12
    assert np.allclose([f.baseline, f.weight, f.delta2, f.mse], ref, rtol=1e-9, atol=1e-12)
    assert f.mse <= sigma2 / k + 1e-12  # never worse than the empirical mean's bound


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**31 - 1),
       lookahead=st.sampled_from(["predictive", "plugin"]))
def test_vectorised_matches_scalar_loop(n, seed, lookahead):
    rng = np.random.default_rng(seed)
    vbar, prior = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    k = rng.integers(1, 20, n)
    out = should_continue(vbar, k, prior, k_max=16, lookahead=lookahead)
    f = fuse(vbar, k, prior, 1.0)
    assert out.shape == (n,)
    for i in range(n):
        assert out[i] == should_continue(float(vbar[i]), int(k[i]), float(prior[i]),
                                         k_max=16, lookahead=lookahead)
        assert f.baseline[i] == pytest.approx(fuse_scalar(vbar[i], k[i], prior[i], 1.0)[0])


@settings(max_examples=300, deadline=None)
@given(k=st.integers(1, 32), p=st.floats(0, 1), hits=st.integers(0, 32),
       conv=st.sampled_from(CONVENTIONS))
def test_predictive_lookahead_matches_bruteforce(k, p, hits, conv):
    r_lo, r_hi = conv
    hits = min(hits, k)
    vbar = (hits * r_hi + (k - hits) * r_lo) / k
    prior = r_lo + p * (r_hi - r_lo)
    s2 = noise_bound(conv)
    fast = expected_next_mse(np.float64(vbar), np.float64(k), np.float64(prior), s2, conv)
    assert fast == pytest.approx(next_mse_bruteforce(vbar, k, prior, s2, r_lo, r_hi),
                                 rel=1e-9, abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 20), hits=st.integers(0, 20), p=st.floats(0, 1),
       lookahead=st.sampled_from(["predictive", "plugin"]))
def test_decisions_invariant_to_reward_convention(k, hits, p, lookahead):
    """{0,1} with cost c/4 decides exactly as {-1,+1} with cost c (affine invariance)."""
    hits = min(hits, k)
    pm = should_continue(2 * hits / k - 1, k, 2 * p - 1, cost=0.0039, lookahead=lookahead)
    zo = should_continue(hits / k, k, p, cost=0.0039 / 4, lookahead=lookahead,
                         rewards=(0.0, 1.0))
    assert pm == zo


# -- the per-prompt state --------------------------------------------------------------------
def test_state_any_arrival_order_gives_the_same_result():
    rewards = [1.0, -1.0, 1.0, 1.0]
    results = []
    for order in itertools.permutations(range(4)):
        s = PromptState(make_estimator("v05"), prior_p=0.2)
        s.to_request()
        for i in order:
            s.add(rewards[i], index=i)
        results.append((s.baseline, tuple(s.advantages())))
    assert len(set(results)) == 1


def test_state_waits_for_outstanding_rollouts():
    s = PromptState(make_estimator("v05", plan="sequential", max_rounds=None), prior_p=0.0)
    assert s.to_request() == 4
    s.add(1.0, index=0)
    assert s.to_request() == 0 and not s.done  # 3 still in flight
    for i in (1, 2, 3):
        s.add(1.0, index=i)
    assert s.to_request() == 1  # prior (never solved) contradicted: one more
    assert s.to_request() == 0 and s.outstanding == 1 and s.to_cancel() == 0


def test_v05_all_equal_group_still_carries_signal_grpo_does_not():
    rewards = np.ones((1, 4))
    v05 = make_estimator("v05").group(rewards, prior=np.array([-0.5]))
    grpo = make_estimator("grpo").group(rewards)
    assert (v05.advantages > 0).all()
    assert np.allclose(grpo.advantages, 0.0)


@pytest.mark.parametrize("rewards_range", [(-1.0, 1.0), (0.0, 1.0)])
def test_zero_uniform_zeroes_only_all_equal_groups(rewards_range):
    lo, hi = rewards_range
    rewards = np.array([[lo, lo, lo, lo], [hi, hi, hi, hi], [lo, hi, lo, lo]])
    prior = np.full(3, lo + 0.3 * (hi - lo))
    plain = make_estimator("v05", rewards=rewards_range).group(rewards, prior=prior)
    zu = make_estimator("v05", rewards=rewards_range, zero_uniform=True).group(rewards, prior=prior)
    assert (plain.advantages[0] < 0).all() and (plain.advantages[1] > 0).all()
    assert np.array_equal(zu.advantages[:2], np.zeros((2, 4)))
    assert np.allclose(zu.advantages[2], plain.advantages[2])  # a mixed group is untouched
    assert np.allclose(zu.baseline, plain.baseline)            # the baseline is reported as is
    # through the per-prompt state, with a padded mask (k = 3 of 4 observed)
    mask = np.array([[True, True, True, False]])
    out = make_estimator("v05", rewards=rewards_range, zero_uniform=True).group(
        rewards[:1], mask, prior[:1])
    assert np.array_equal(out.advantages, np.zeros((1, 4)))


def test_fallback_without_prior_uses_empirical_mean_at_k_init():
    s = PromptState(make_estimator("v05"), prior_p=None)
    assert s.fallback and s.to_request() == 4
    for r in (1.0, 1.0, -1.0, 1.0):
        s.add(r)
    assert s.to_request() == 0 and s.done
    assert s.baseline == pytest.approx(0.5)


# -- reference estimators --------------------------------------------------------------------
def test_reference_estimators():
    r = np.array([[1.0, -1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    grpo = make_estimator("grpo").group(r)
    assert np.allclose(grpo.baseline, [0.5, 1.0])
    assert np.allclose(grpo.advantages[0], (r[0] - 0.5) / (np.std(r[0]) + 1e-6))
    assert np.allclose(make_estimator("dr_grpo").group(r).advantages[0], r[0] - 0.5)
    rloo = make_estimator("rloo").group(r).advantages[0]
    assert np.allclose(rloo, [r[0, i] - np.delete(r[0], i).mean() for i in range(4)])
    assert list(make_estimator("dapo").group(r).keep) == [True, False]
    prior = np.array([0.0, 0.2])
    assert np.allclose(make_estimator("prior_only").group(r, prior=prior).baseline, prior)
    mask = np.array([[True, True, False, False], [True] * 4])
    masked = make_estimator("dr_grpo").group(r, mask)
    assert masked.baseline[0] == 0.0 and (masked.advantages[0, 2:] == 0).all()


def test_fixed_k_estimators_request_exactly_k_init():
    s = PromptState(make_estimator("grpo", k_init=8, k_max=8))
    assert s.to_request() == 8
    for _ in range(8):
        s.add(1.0)
    assert s.to_request() == 0 and s.done


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda: fuse(np.nan, 4, 0.0), "NaN"),
    (lambda: fuse(0.0, 0, 0.0), "k must be >= 1"),
    (lambda: fuse(0.0, 4, 0.0, sigma2=0.0), "sigma2"),
    (lambda: should_continue(0.0, 4, 1.5), "prior must lie in the reward range"),
    (lambda: should_continue(0.0, 4, 0.0, cost=-1.0), "cost"),
    (lambda: should_continue(0.0, 4, 0.0, lookahead="oracle"), "lookahead"),
    (lambda: EstimatorConfig(k_init=8, k_max=4), "k_init"),
    (lambda: EstimatorConfig(k_init=0), "k_init must be >= 1"),
    (lambda: EstimatorConfig(k_max=16.0), "k_max must be an integer"),
    (lambda: EstimatorConfig(cost=-0.1), "cost"),
    (lambda: EstimatorConfig(plan="greedy"), "plan must be one of"),
    (lambda: EstimatorConfig(max_rounds=0), "max_rounds"),
    (lambda: EstimatorConfig(max_rounds=2.5), "max_rounds"),
    (lambda: EstimatorConfig(max_rounds=True), "max_rounds"),
    (lambda: plan_batched(np.nan, 4, 0.0), "NaN"),
    (lambda: plan_batched(0.0, 4, 1.5), "prior must lie in the reward range"),
    (lambda: plan_batched(0.0, 4.5, 0.0), "whole number"),
    (lambda: plan_batched(0.0, 0, 0.0), "k must be >= 1"),
    (lambda: plan_batched(0.0, 4, 0.0, cost=np.inf), "cost"),
    (lambda: plan_batched(0.0, 4, 0.0, k_max=0), "k_max"),
    (lambda: plan_batched(0.0, 4, 0.0, lookahead="oracle"), "lookahead"),
    (lambda: plan_batched(0.0, 4, 0.0, noise="gauss"), "noise"),
    (lambda: make_estimator("ppo"), "unknown estimator"),
    (lambda: make_estimator("grpo").group(np.array([[2.0, 1.0]])), "rewards must lie in"),
    (lambda: make_estimator("grpo").group(np.array([[np.nan, 1.0]])), "NaN"),
    (lambda: make_estimator("v05").group(np.ones((1, 2)), prior=np.array([3.0])), "prior"),
    (lambda: make_estimator("v05").group(np.ones((1, 2))), "needs a prior"),
    (lambda: PromptState(make_estimator("v05"), prior_p=1.2), "prior probability"),
    (lambda: prob_to_reward(-0.1), "prior probability"),
])
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_state_rejects_bad_rewards():
    s = PromptState(make_estimator("v05", rewards=(0.0, 1.0)), prior_p=0.5)
    s.to_request()
    for bad in (float("nan"), -1.0, 2.0):
        with pytest.raises(ValueError):
            s.add(bad)
    s.add(1.0, index=0)
    with pytest.raises(ValueError, match="already added"):
        s.add(1.0, index=0)
    with pytest.raises(ValueError, match="never requested"):
        s.add(1.0, index=7)


def test_estimator_imports_no_heavy_library():
    import subprocess
    import sys
    code = ("import sys, estimator, estimator.state; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'ray', 'vllm', 'deepspeed', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- batched look-ahead: plan_batched against explicit enumeration ---------------------------
def risks_bruteforce(vbar, k, prior, sigma2, cost, k_max, r_lo, r_hi, lookahead):
    """R(m) = E[mse(k + m)] + cost * m for m = 0..k_max-k, every outcome enumerated."""
    base, _, delta2, _ = fuse_scalar(vbar, k, prior, sigma2)
    q = min(1.0, max(0.0, (base - r_lo) / (r_hi - r_lo)))
    risks = []
    for m in range(k_max - k + 1):
        if lookahead == "plugin":
            s2 = sigma2 / (k + m)
            expected = delta2 * s2 / (delta2 + s2) if delta2 + s2 > 0 else 0.0
        else:
            expected = sum(math.comb(m, j) * q ** j * (1 - q) ** (m - j)
                           * fuse_scalar((k * vbar + j * r_hi + (m - j) * r_lo) / (k + m), k + m,
                                         prior, sigma2)[3] for j in range(m + 1))
        risks.append(expected + cost * m)
    return risks


@settings(max_examples=300, deadline=None)
@given(k=st.integers(1, 16), hits=st.integers(0, 16), p=st.floats(0, 1),
       k_max=st.integers(1, 20), cost_pm1=st.floats(1e-4, 0.05),
       conv=st.sampled_from(CONVENTIONS), lookahead=st.sampled_from(["predictive", "plugin"]))
def test_plan_batched_matches_bruteforce(k, hits, p, k_max, cost_pm1, conv, lookahead):
    r_lo, r_hi = conv
    hits = min(hits, k)
    vbar = (hits * r_hi + (k - hits) * r_lo) / k
    prior = r_lo + p * (r_hi - r_lo)
    s2, cost = noise_bound(conv), cost_pm1 * noise_bound(conv)
    m = int(plan_batched(vbar, k, prior, cost=cost, k_max=k_max, lookahead=lookahead,
                         rewards=conv))
    if k >= k_max:
        assert m == 0
        return
    risks = risks_bruteforce(vbar, k, prior, s2, cost, k_max, r_lo, r_hi, lookahead)
    best = min(risks)
    assert 0 <= m <= k_max - k
    # the smallest minimiser (ties within float noise resolve to the smaller m)
    assert m == next(i for i, r in enumerate(risks) if r <= best + 1e-12)


@pytest.mark.parametrize("lookahead", ["predictive", "plugin"])
def test_plan_sanity_facts(lookahead):
    # prior accepted now: mse(k) = 0 = R(0) < R(m >= 1)
    assert plan_batched(0.1, 4, 0.0, lookahead=lookahead) == 0
    # prior totally wrong (delta2 -> infinity; a wide reward range makes it ~40,000), sigma2 = 1,
    # c = 1/256: R(m) ~ 1/(4 + m) + c m is smallest at 4 + m = 16, even with room for more
    for k_max in (16, 64):
        assert plan_batched(100.0, 4, -100.0, cost=1 / 256, k_max=k_max, sigma2=1.0,
                            lookahead=lookahead, rewards=(-100.0, 100.0)) == 12
    # on {-1,+1} the most wrong prior there is asks for the same 12 at once
    assert plan_batched(1.0, 4, -1.0, cost=1 / 256, sigma2=1.0, lookahead=lookahead) == 12


@settings(max_examples=300, deadline=None)
@given(k=st.integers(1, 20), hits=st.integers(0, 20), p=st.floats(0, 1),
       conv=st.sampled_from(CONVENTIONS), lookahead=st.sampled_from(["predictive", "plugin"]),
       noise=st.sampled_from(["bound", "bernoulli"]), extra=st.integers(0, 10))
def test_plan_agrees_with_the_one_step_rule(k, hits, p, conv, lookahead, noise, extra):
    r_lo, r_hi = conv
    hits = min(hits, k)
    kw = dict(cost=0.0039 * noise_bound(conv), lookahead=lookahead, rewards=conv, noise=noise)
    vbar, prior = (hits * r_hi + (k - hits) * r_lo) / k, r_lo + p * (r_hi - r_lo)
    # one step of room: the plan is the one-step rule exactly
    assert int(plan_batched(vbar, k, prior, k_max=k + 1, **kw)) == int(
        should_continue(vbar, k, prior, k_max=k + 1, **kw))
    # more room: whenever one more is worth it, the plan wants at least one
    more = bool(should_continue(vbar, k, prior, k_max=k + 1 + extra, **kw))
    plan = int(plan_batched(vbar, k, prior, k_max=k + 1 + extra, **kw))
    assert plan >= 1 if more else plan >= 0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), seed=st.integers(0, 2**31 - 1),
       lookahead=st.sampled_from(["predictive", "plugin"]))
def test_plan_vectorised_matches_scalar_loop(n, seed, lookahead):
    rng = np.random.default_rng(seed)
    vbar, prior = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    k = rng.integers(1, 20, n)  # some beyond k_max = 16: they plan 0
    out = plan_batched(vbar, k, prior, lookahead=lookahead)
    assert out.shape == (n,) and out.dtype.kind == "i"
    for i in range(n):
        assert out[i] == plan_batched(float(vbar[i]), int(k[i]), float(prior[i]),
                                      lookahead=lookahead)
    assert plan_batched(vbar.reshape(1, n), k.reshape(1, n), prior).shape == (1, n)


# -- config: plans, rounds, cost scaling ------------------------------------------------------
def test_cost_is_stated_on_the_pm1_scale_and_rescaled_by_the_estimator():
    assert make_estimator("v05").cfg.scaled_cost == pytest.approx(0.0039)
    assert make_estimator("v05", rewards=(0.0, 1.0)).cfg.scaled_cost == pytest.approx(0.0039 / 4)
    assert make_estimator("v05", rewards=(0.0, 4.0)).cfg.scaled_cost == pytest.approx(0.0039 * 4)


@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 16), hits=st.integers(0, 16), p=st.floats(0, 1),
       lookahead=st.sampled_from(["predictive", "plugin"]))
def test_both_reward_scales_take_the_same_decisions(k, hits, p, lookahead):
    hits = min(hits, k)
    pm1 = make_estimator("v05", lookahead=lookahead)
    zo = make_estimator("v05", lookahead=lookahead, rewards=(0.0, 1.0))
    args_pm1 = (np.array([2 * hits / k - 1]), np.array([k]), np.array([2 * p - 1]))
    args_zo = (np.array([hits / k]), np.array([k]), np.array([p]))
    assert pm1.wants_more(*args_pm1) == zo.wants_more(*args_zo)
    assert pm1.plan_more(*args_pm1) == zo.plan_more(*args_zo)


@pytest.mark.parametrize("plan, rounds", [("sequential", 13), ("batched", 2)])
@pytest.mark.parametrize("rewards", CONVENTIONS)
def test_wholly_wrong_prior_stops_at_16_on_both_scales(rewards, plan, rounds):
    est = make_estimator("v05", rewards=rewards, plan=plan, max_rounds=None)
    s = PromptState(est, prior_p=0.0)  # "never solved"; the policy always solves it
    while n := s.to_request():
        for i in range(s.requested - n, s.requested):
            s.add(rewards[1], index=i)
    assert s.done and s.k == 16 and s.rounds == rounds


# -- the batched plan in the per-prompt state -------------------------------------------------
def feed(s, rewards, start=0):
    for i, r in enumerate(rewards, start):
        s.add(r, index=i)


def test_batched_state_asks_for_the_whole_plan_in_one_round():
    s = PromptState(make_estimator("v05"), prior_p=0.0)
    assert s.to_request() == 4 and s.rounds == 1
    feed(s, [1.0] * 4)
    assert s.to_request() == 12 and s.to_cancel() == 0
    assert s.outstanding == 12 and s.rounds == 2 and not s.done
    assert [s.round_of(i) for i in (0, 3, 4, 15)] == [1, 1, 2, 2]
    feed(s, [1.0] * 12, start=4)
    assert s.to_request() == 0 and s.done and s.k == 16 and s.rounds == 2


def test_batched_state_cancels_what_the_plan_no_longer_needs():
    s = PromptState(make_estimator("v05", max_rounds=None), prior_p=0.5)
    s.to_request()
    feed(s, [1.0] * 4)  # the prior (a coin flip) looks wrong: plan more
    assert s.to_request() == 10
    s.add(-1.0, index=4)  # ... then the rewards vindicate it: the plan shrinks to 5
    assert s.to_cancel() == 5 and s.to_request() == 0
    for i in s.outstanding_indices()[-5:]:  # the caller picks the least advanced
        s.cancel(i)
    assert s.to_cancel() == 0 and s.outstanding == 4 and s.requested == 14
    with pytest.raises(ValueError, match="was cancelled"):
        s.add(1.0, index=13)
    with pytest.raises(ValueError, match="was cancelled"):
        s.cancel(13)
    with pytest.raises(ValueError, match="never requested"):
        s.cancel(14)
    s.add(-1.0, index=5)
    assert s.to_cancel() == 3  # the prior is accepted now (m* = 0): drop the rest
    for i in s.outstanding_indices():
        s.cancel(i)
    assert s.done and s.k == 6 and s.indices() == [0, 1, 2, 3, 4, 5]
    assert s.baseline == 0.0  # the accepted prior, exactly
    assert s.rounds == 2  # the cancelled requests do not count


def test_batched_state_tops_up_while_rollouts_are_outstanding():
    s = PromptState(make_estimator("v05", max_rounds=None), prior_p=0.2)
    s.to_request()
    feed(s, [1.0, 1.0, 1.0, -1.0])
    assert s.to_request() == 10
    s.add(1.0, index=4)  # more evidence against the prior: the plan grows past the 9 in flight
    assert s.outstanding == 9 and s.to_request() == 1 and s.to_cancel() == 0
    assert s.round_of(14) == 3 and s.rounds == 3 and s.requested == 15


@pytest.mark.parametrize("make", [
    lambda: make_estimator("v05", plan="sequential"), lambda: make_estimator("grpo"),
    lambda: make_estimator("v05", plan="sequential", max_rounds=None)])
def test_sequential_and_fixed_k_never_cancel(make):
    s = PromptState(make(), prior_p=0.1)
    rng = np.random.default_rng(0)
    while n := s.to_request():
        assert s.to_cancel() == 0
        for i in range(s.requested - n, s.requested):
            s.add(float(rng.choice([-1.0, 1.0])), index=i)
            assert s.to_cancel() == 0
    assert s.done


# -- rounds and the round cap -----------------------------------------------------------------
def test_the_last_allowed_round_waits_then_spends_the_remaining_budget():
    s = PromptState(make_estimator("v05", max_rounds=3), prior_p=0.5)
    s.to_request()
    feed(s, [1.0] * 4)
    assert s.to_request() == 10  # round 2 is not the last: the plan m* (to k = 14)
    feed(s, [1.0] * 9, start=4)
    # the plan now wants more, but a request would be round 3, the last: it waits for the
    # last outstanding reward, so that the final decision sees every reward
    assert s.to_request() == 0 and s.outstanding == 1
    s.add(1.0, index=13)
    assert s.next_round == 3 and s.to_request() == 2  # the whole remaining budget, to 16
    assert s.round_of(15) == 3
    feed(s, [1.0, 1.0], start=14)
    assert s.to_request() == 0 and s.done and s.rounds == 3 and s.k == 16


def test_after_the_cap_no_more_requests_only_keep_or_cancel_all():
    s = PromptState(make_estimator("v05", max_rounds=2), prior_p=0.5)
    s.to_request()
    feed(s, [1.0] * 4)
    assert s.to_request() == 12  # round 2 is the last: the budget (to 16), not m* = 10
    s.add(-1.0, index=4)
    assert s.to_request() == 0 and s.to_cancel() == 0  # m* > 0: keep every rollout
    s.add(-1.0, index=5)
    assert s.to_cancel() == 10  # m* = 0: the prior is accepted, drop them all
    for i in s.outstanding_indices():
        s.cancel(i)
    assert s.done and s.k == 6 and s.rounds == 2


@pytest.mark.parametrize("max_rounds, requests", [(2, [4, 12]), (3, [4, 1, 11]),
                                                  (1, [4]), (None, [4] + [1] * 12)])
def test_sequential_plan_with_a_round_cap(max_rounds, requests):
    s = PromptState(make_estimator("v05", plan="sequential", max_rounds=max_rounds), 0.0)
    asked = []
    while n := s.to_request():
        asked.append(n)
        feed(s, [1.0] * n, start=s.requested - n)
    assert asked == requests and s.done and s.rounds == len(requests)


def test_round_is_one_more_than_the_highest_round_observed():
    s = PromptState(make_estimator("v05", max_rounds=None), prior_p=0.2)
    s.to_request()
    feed(s, [1.0, 1.0, 1.0, -1.0])
    s.to_request()                      # 4..13, round 2
    s.add(1.0, index=4)
    assert s.to_request() == 1          # 14, round 3: a round-2 reward was in
    assert s.round_of(14) == 3
    with pytest.raises(ValueError, match="never requested"):
        s.round_of(15)


# -- expire -----------------------------------------------------------------------------------
def test_expire_reopens_a_fixed_k_prompt_for_one_replacement():
    s = PromptState(make_estimator("grpo"))
    s.to_request()
    feed(s, [1.0, -1.0, 1.0, 1.0])
    assert s.to_request() == 0 and s.done
    s.expire(1)
    assert not s.done and s.k == 3 and s.indices() == [0, 2, 3]
    assert s.to_request() == 1 and s.requested == 5 and s.round_of(4) == 2
    s.add(-1.0, index=4)
    assert s.done and s.indices() == [0, 2, 3, 4] and s.rounds == 2
    assert np.allclose(s.rewards(), [1.0, 1.0, 1.0, -1.0])
    with pytest.raises(ValueError, match="was expired"):
        s.add(1.0, index=1)
    with pytest.raises(ValueError, match="no observed reward"):
        s.expire(1)


def test_expire_replans_a_v05_prompt_and_refills_past_the_cap():
    s = PromptState(make_estimator("v05", max_rounds=1), prior_p=0.5)
    s.to_request()
    feed(s, [1.0, -1.0, 1.0, -1.0])
    assert s.done and s.k == 4
    s.expire(0)  # below k_init: the cap does not stop the refill
    assert not s.done and s.to_request() == 1 and s.round_of(4) == 2
    s.add(1.0, index=4)
    assert s.done and s.k == 4


# -- snapshots --------------------------------------------------------------------------------
def in_flight_state():
    """A v05 prompt with every kind of index: observed, outstanding, cancelled, expired."""
    s = PromptState(make_estimator("v05", max_rounds=None), prior_p=0.5)
    s.to_request()
    feed(s, [1.0] * 4)
    s.to_request()  # 4..13
    s.add(-1.0, index=4)
    for i in s.outstanding_indices()[-s.to_cancel():]:
        s.cancel(i)
    s.expire(2)
    return s


def test_snapshot_round_trip_restores_an_in_flight_prompt_exactly():
    a = in_flight_state()
    d = json.loads(json.dumps(a.to_dict()))  # JSON-safe
    b = PromptState.from_dict(make_estimator("v05", max_rounds=None), d)
    assert b.to_dict() == a.to_dict()
    assert (b.k, b.outstanding, b.requested, b.rounds, b.done) == (
        a.k, a.outstanding, a.requested, a.rounds, a.done)
    assert b.outstanding_indices() == a.outstanding_indices() and b.indices() == a.indices()
    # both continue identically
    for s in (a, b):
        for i in s.outstanding_indices():
            s.add(1.0, index=i)
    assert (a.to_request(), a.to_cancel()) == (b.to_request(), b.to_cancel())
    assert a.to_dict() == b.to_dict() and a.baseline == b.baseline


def test_snapshot_keeps_a_finished_prompt_finished():
    s = PromptState(make_estimator("dr_grpo"))
    s.to_request()
    feed(s, [1.0] * 4)
    assert s.done
    assert PromptState.from_dict(make_estimator("dr_grpo"), s.to_dict()).done


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(version=99), "snapshot version"),
    (lambda d: d.update(estimator="grpo"), "restored onto"),
    (lambda d: d["cancelled"].append(0), "inconsistent"),
    (lambda d: d["rewards"].update({"0": 5.0}), "reward range"),
])
def test_bad_snapshots_are_clear_errors(edit, message):
    d = in_flight_state().to_dict()
    edit(d)
    with pytest.raises(ValueError, match=message):
        PromptState.from_dict(make_estimator("v05", max_rounds=None), d)


def test_add_needs_an_outstanding_rollout():
    s = PromptState(make_estimator("v05"), prior_p=0.5)
    with pytest.raises(ValueError, match="call to_request"):
        s.add(1.0)
    with pytest.raises(ValueError, match="never requested"):
        s.add(1.0, index=0)


def test_numpy_scalars_are_accepted_and_snapshots_stay_json_safe():
    s = PromptState(make_estimator("v05", cost=np.float32(0.0039)), prior_p=np.float32(0.5))
    s.to_request()
    s.add(np.float32(1.0), index=np.int64(0))
    s.cancel(np.int64(3))
    assert json.loads(json.dumps(s.to_dict()))["cancelled"] == [3]
    with pytest.raises(ValueError, match="reward must be a finite number"):
        s.add(True, index=1)


def test_cut_stops_a_prompt_with_the_rewards_in_hand():
    st = PromptState(make_estimator("v05", k_init=4, k_max=16), prior_p=1.0)
    assert st.to_request() == 4
    with pytest.raises(ValueError, match="k_init"):
        st.cut()
    for i in range(4):
        st.add(-1.0, index=i)  # the prior is rejected: the plan asks for more
    n = st.to_request()
    assert n > 0 and st.outstanding == n
    assert st.cut() == list(range(4, 4 + n))
    assert st.done and st.outstanding == 0 and st.k == 4 and st.to_request() == 0
    # The fused baseline of the 4 in hand: w = 3.75 / 4 on their mean -1, the rest on V = 1.
    assert st.baseline == pytest.approx(float(fuse(-1.0, 4, 1.0).baseline)) == pytest.approx(-0.875)


@pytest.mark.parametrize("rewards_range", [(-1.0, 1.0), (0.0, 1.0)])
def test_scale_by_std_keeps_uniform_groups_bounded(rewards_range):
    """V0.5 with GRPO's std normalisation: an all-equal group (std 0) whose baseline is not
    its value is scaled by the std its baseline implies as a success rate, not by std_eps
    (which gave -400,000 per sample); a group with contrast is scaled by its own std, as
    GRPO's; and GRPO itself is unchanged."""
    r_lo, r_hi = rewards_range
    span = r_hi - r_lo
    v05 = make_estimator("v05", scale_by_std=True, rewards=rewards_range)
    prior = r_lo + 0.2 * span  # p = 0.2: accepted by an all-fail group of 4
    out = v05.group([[r_lo] * 4], prior=[prior])
    assert out.baseline[0] == pytest.approx(prior)  # the prior was kept
    implied = span * np.sqrt(0.2 * 0.8)
    np.testing.assert_allclose(out.advantages, (r_lo - prior) / implied, rtol=1e-5)
    assert np.abs(out.advantages).max() <= 1.0
    # with contrast: the group's own std
    mixed = np.array([[r_lo, r_hi, r_lo, r_lo]])
    got = v05.group(mixed, prior=[prior])
    np.testing.assert_allclose(got.advantages, (mixed - got.baseline[0]) / (mixed.std() + 1e-6))
    # GRPO: unchanged, and an all-equal group still 0
    grpo = make_estimator("grpo", rewards=rewards_range)
    g = grpo.group(np.vstack([mixed, [[r_hi] * 4]]))
    np.testing.assert_allclose(g.advantages[0], (mixed[0] - mixed.mean()) / (mixed.std() + 1e-6))
    assert not g.advantages[1].any()
    # a uniform group at a baseline on the range's edge: bounded by |mean - b| too
    prior_only = make_estimator("prior_only", scale_by_std=True, rewards=rewards_range)
    edge = prior_only.group([[r_lo] * 4], prior=[r_hi])
    np.testing.assert_allclose(edge.advantages, -1.0, rtol=1e-5)


# -- the oracle: bench.learning's reference baseline (issue 29) -------------------------------
@pytest.mark.parametrize("rewards", CONVENTIONS)
def test_the_oracle_trains_its_first_train_k_against_the_mean_of_the_rest(rewards):
    r_lo, r_hi = rewards
    oracle = make_estimator("oracle", k_init=16, k_max=16, train_k=4, rewards=rewards)
    row = np.array([r_hi, r_lo, r_lo, r_lo] + [r_hi] * 3 + [r_lo] * 9)  # held out: 3 of 12
    res = oracle.group(row[None, :])
    held = (3 * r_hi + 9 * r_lo) / 12
    assert res.baseline[0] == pytest.approx(held)
    assert res.advantages[0, :4] == pytest.approx(row[:4] - held)  # no std division
    assert (res.advantages[0, 4:] == 0).all()
    assert oracle.trained(16) == 4 and make_estimator("dr_grpo").trained(7) == 7
    # the same rewards in the first train_k give the same advantages whatever the held-out
    # order: the baseline is the held-out mean, not the group's
    assert oracle.group(np.concatenate([row[:4], row[4:][::-1]])[None, :]).advantages[0, :4] \
        == pytest.approx(res.advantages[0, :4])


def test_the_oracle_refuses_what_it_cannot_be():
    with pytest.raises(ValueError, match="needs train_k"):
        make_estimator("oracle", k_init=16, k_max=16)
    with pytest.raises(ValueError, match="train_k must be"):
        make_estimator("oracle", k_init=4, k_max=16, train_k=4)
    with pytest.raises(ValueError, match="beyond the first train_k"):
        make_estimator("oracle", k_init=16, k_max=16, train_k=4).group(
            np.ones((1, 4)), np.ones((1, 4), bool))


def test_james_stein_against_a_loop_of_its_formula():
    """Each response's baseline: its group's leave-one-out mean shrunk toward the mean of the
    other groups' means by tau2 / (tau2 + s2 / (k - 1)), written out one response at a time."""
    from estimator.registry import batch_group

    rng = np.random.default_rng(5)
    groups = [rng.choice([-1.0, 1.0], size=k, p=[1 - q, q])
              for k, q in zip([4, 4, 6, 4, 8], [0.9, 0.5, 0.3, 0.1, 0.6])]
    res = batch_group(make_estimator("james_stein", k_init=4, k_max=8), groups)
    means = np.array([g.mean() for g in groups])
    s2 = np.mean([g.var(ddof=1) for g in groups])
    tau2 = max(0.0, means.var(ddof=1) - s2 * np.mean([1 / len(g) for g in groups]))
    for i, g in enumerate(groups):
        lam = tau2 / (tau2 + s2 / (len(g) - 1))
        others = np.mean(np.delete(means, i))
        for j, r in enumerate(g):
            loo = (g.sum() - r) / (len(g) - 1)
            assert res.advantages[i, j] == pytest.approx(r - (lam * loo + (1 - lam) * others))


def test_james_stein_alone_is_rloo_and_without_spread_is_the_others_mean():
    from estimator.registry import batch_group

    js = make_estimator("james_stein")
    g = np.array([1.0, -1.0, 1.0, 1.0])
    alone = js.group(g[None, :])
    assert np.allclose(alone.advantages, make_estimator("rloo").group(g[None, :]).advantages)
    # four groups of equal means: tau2 = 0, every baseline is the other groups' mean
    same = [np.array([1.0, -1.0, 1.0, -1.0]), np.array([-1.0, 1.0, -1.0, 1.0])] * 2
    res = batch_group(js, same)
    assert np.allclose(res.advantages[0], same[0] - 0.0)
    # a uniform group keeps a signal against the batch where tau2 < infinity
    mixed = [np.array([1.0, 1.0, 1.0, 1.0]), np.array([1.0, -1.0, -1.0, -1.0]),
             np.array([-1.0, -1.0, 1.0, 1.0])]
    adv = batch_group(js, mixed).advantages[0]
    assert (adv > 0).all() and np.allclose(adv, adv[0])
