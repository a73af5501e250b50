"""The estimator contract (shared/design/estimator.md): sanity facts, properties, slow references."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimator import (EstimatorConfig, PromptState, fuse, make_estimator, noise_bound,
                       prob_to_reward, should_continue)
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


@pytest.mark.parametrize("lookahead", ["predictive", "plugin"])
@pytest.mark.parametrize("rewards", CONVENTIONS)
def test_osla_stops_at_k_init_when_prior_exact(lookahead, rewards):
    r_lo, r_hi = rewards
    est = make_estimator("v05", lookahead=lookahead, rewards=rewards,
                         cost=0.0039 * noise_bound(rewards))
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
    s = PromptState(make_estimator("v05"), prior_p=0.0)
    assert s.to_request() == 4
    s.add(1.0, index=0)
    assert s.to_request() == 0 and not s.done  # 3 still in flight
    for i in (1, 2, 3):
        s.add(1.0, index=i)
    assert s.to_request() == 1  # prior (never solved) contradicted: one more
    assert s.to_request() == 0 and s.outstanding == 1


def test_v05_all_equal_group_still_carries_signal_grpo_does_not():
    rewards = np.ones((1, 4))
    v05 = make_estimator("v05").group(rewards, prior=np.array([-0.5]))
    grpo = make_estimator("grpo").group(rewards)
    assert (v05.advantages > 0).all()
    assert np.allclose(grpo.advantages, 0.0)


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
    (lambda: EstimatorConfig(cost=-0.1), "cost"),
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
