"""Admission by selection (actors/scheduler/selection.py), alone and inside the scheduler: the
chance of a uniform group against a Monte Carlo, the admission rule and its floor, the
coins' common random numbers, the prior's error measured from finished prompts, a prompt's
own history, the window walked in draw order, the accounting identity drawn = admitted +
deferred + waiting (also across a checkpoint), and the fallback to the data order."""
from __future__ import annotations

import numpy as np
import pytest

from actors.scheduler import Scheduler, SchedulerConfig
from actors.scheduler.checkpoint import restore, snapshot
from actors.scheduler.selection import (Candidate, PriorError, SelectionConfig, Selector,
                                        admission_probability, coin, uniform_chance)
from estimator import make_estimator
from tests.unit.test_scheduler import Fake


@pytest.mark.parametrize("p,var", [(0.5, 0.0), (0.9, 0.0), (0.9, 0.004), (0.3, 0.02),
                                   (0.97, 0.001), (0.6, 0.1)])
def test_the_uniform_chance_is_that_of_a_beta_of_the_mean_and_variance(p, var):
    rng = np.random.default_rng(0)
    if var == 0:
        q = np.full(1, p)
    else:
        size = max(p * (1 - p) / var - 1, 1.0)
        q = rng.beta(p * size, (1 - p) * size, 400_000)
    mc = float(np.mean(q ** 4 + (1 - q) ** 4))
    assert uniform_chance(p, var, 4) == pytest.approx(mc, abs=3e-3)


def test_admission_falls_with_the_chance_of_a_uniform_group_and_never_below_the_floor():
    ps = np.linspace(0.5, 1.0, 51)
    a = [admission_probability(p, 0.0, 4, 0.1) for p in ps]
    assert a[0] == pytest.approx(1 - 2 * 0.5 ** 4)
    assert all(x >= y - 1e-12 for x, y in zip(a, a[1:]))  # falls as p nears 1
    assert min(a) == 0.1 and a[-1] == 0.1
    # q^k is convex: an uncertain p makes a uniform group likelier (Jensen), never less
    for p in (0.5, 0.8, 0.97):
        assert uniform_chance(p, 0.01, 4) > uniform_chance(p, 0.0, 4)


def test_a_threshold_admits_below_it_and_at_the_floor_above_it():
    from actors.scheduler.selection import admit_given_u

    assert [admit_given_u(u, 0.1, 0.3) for u in (0.0, 0.29, 0.3, 0.9)] == [1.0, 1.0, 0.1, 0.1]
    assert admit_given_u(0.25, 0.1) == 0.75  # the shipped rule: 1 - U
    # from p: at p = 0.5 four rollouts are uniform with chance 1/8 (admitted); at 0.9, 0.66
    assert admission_probability(0.5, 0.0, 4, 0.1, threshold=0.3) == 1.0
    assert admission_probability(0.9, 0.0, 4, 0.1, threshold=0.3) == 0.1
    # the selector applies it, for the prior's p and for a prompt's own history alike
    sel = Selector(SelectionConfig(window=8, threshold=0.3))
    assert sel.probability(Candidate("s1", "x", p=0.9)) == 0.1
    assert sel.probability(Candidate("s2", "y", p=0.5)) == 1.0
    hist = Selector(SelectionConfig(window=8, source="history", threshold=0.3))
    hist.observe("z", None, 1.0, 16)
    assert hist.probability(Candidate("s3", "z")) == 0.1
    with pytest.raises(ValueError, match="threshold"):
        SelectionConfig(threshold=0.0)


def test_coins_are_fixed_by_seed_and_uid_and_uniform():
    assert coin(3, "s17") == coin(3, "s17")
    assert coin(3, "s17") != coin(4, "s17")
    xs = np.array([coin(0, f"s{i}") for i in range(20_000)])
    assert 0 <= xs.min() and xs.max() < 1
    assert xs.mean() == pytest.approx(0.5, abs=0.01)


def _selector(**kw) -> Selector:
    return Selector(SelectionConfig(**{"window": 8, **kw}))


def test_the_window_is_walked_in_draw_order_and_every_candidate_ends_once():
    sel = _selector(floor=0.05)
    sel.offer([Candidate(f"s{i}", f"q{i}") for i in range(40)])
    sel.score([0.999 if i % 2 else 0.5 for i in range(40)])
    admitted, deferred = sel.choose(10)
    assert len(admitted) == 10
    walked = [c.uid for c in admitted + deferred]
    order = [int(u[1:]) for u in walked]
    assert sorted(order) == list(range(len(walked)))  # a prefix of the window, none twice
    assert [c.uid for c in sel.waiting] == [f"s{i}" for i in range(len(walked), 40)]
    assert sel.drawn == len(admitted) + sel.deferred + len(sel.waiting)
    # the sure ones (p = 0.999) are deferred far more often than the uncertain ones
    assert sum(int(c.uid[1:]) % 2 for c in deferred) > sum(int(c.uid[1:]) % 2 for c in admitted)


def test_the_admitted_share_is_the_admission_probability():
    sel = _selector(floor=0.1)
    n = 20_000
    sel.offer([Candidate(f"s{i}", "q") for i in range(n)])
    sel.score([0.9] * n)
    admitted, deferred = sel.choose(n)
    a = admission_probability(0.9, sel.error.var, 4, 0.1)
    share = len(admitted) / n
    assert share == pytest.approx(a, abs=4 * np.sqrt(a * (1 - a) / n))


def test_an_unscored_candidate_is_admitted_in_data_order_and_counted():
    sel = _selector()
    sel.offer([Candidate(f"s{i}", "q") for i in range(5)])
    sel.score([None] * 5)
    admitted, deferred = sel.choose(3)
    assert [c.uid for c in admitted] == ["s0", "s1", "s2"] and not deferred
    assert sel.fallbacks == 3


def test_the_prior_error_is_measured_with_the_rates_noise_taken_out():
    rng = np.random.default_rng(1)
    err = PriorError(100_000)
    true_sd = 0.08
    for _ in range(40_000):
        q = rng.uniform(0.2, 0.8)
        p = float(np.clip(q + rng.normal(0, true_sd), 0, 1))
        rate = rng.binomial(8, q) / 8
        err.add(p, rate, 8)
    assert np.sqrt(err.var) == pytest.approx(true_sd, rel=0.05)


def test_history_admits_the_unseen_and_defers_by_the_prompts_own_last_rewards():
    sel = _selector(source="history", floor=0.1)
    assert not sel.needs_scores
    seen, fresh, mixed = Candidate("s0", "a"), Candidate("s1", "b"), Candidate("s2", "c")
    sel.observe("a", None, 1.0, 4)   # all right last time
    sel.observe("c", None, 0.5, 4)   # two of four
    assert sel.probability(fresh) == 1.0
    assert 0.1 <= sel.probability(seen) < sel.probability(mixed) < 1.0


def sel_sched(floor=0.1, window=16, batch=4, seed=0, est=None):
    cfg = SchedulerConfig(batch_prompts=batch, max_staleness=0, slots_per_generator=64,
                          selection=SelectionConfig(floor=floor, window=window, seed=seed))
    return Scheduler(cfg, est or make_estimator("dr_grpo", k_init=4, k_max=4), 2)


def offer_scored(s: Scheduler, start: int, p_of) -> int:
    n = s.to_draw()
    s.offer([f"q{start + i}" for i in range(n)], [f"s{start + i}" for i in range(n)])
    s.score([p_of(int(c.uid[1:])) for c in s.selector.waiting])
    return start + n


def test_the_scheduler_admits_by_selection_and_accounts_for_every_draw():
    s = sel_sched()
    f = Fake(s, reward=lambda uid, i: 1.0)
    with pytest.raises(ValueError, match="selection"):
        s.admit(["q"], [0.5])
    pos = 0
    while s.room():
        pos = offer_scored(s, pos, lambda i: 0.999 if i % 3 else 0.5)
        f.apply(s.admit_selected())
    assert s.in_flight() == 4
    acct = s.accounting()
    assert acct.prompts_drawn == (acct.scheduler.prompts_admitted + acct.prompts_deferred
                                     + acct.prompts_waiting_at_end)
    assert acct.prompts_deferred > 0
    uids = {p.uid for p in s.inflight.values()}
    assert sum(int(u[1:]) % 3 == 0 for u in uids) >= 2  # the uncertain third is favoured
    # their rewards reach the prior's error estimate when they finish
    f.complete_all()
    assert len(s.selector.error.terms) == 4


def test_selection_decides_the_same_prompts_in_two_runs_of_one_seed():
    picked = []
    for est in (make_estimator("dr_grpo", k_init=4, k_max=4),
                make_estimator("v05", k_init=4, k_max=16)):
        s = sel_sched(est=est)
        offer_scored(s, 0, lambda i: [0.95, 0.5, 0.99, 0.2][i % 4])
        Fake(s).apply(s.admit_selected())
        picked.append(sorted(s.inflight))
    assert picked[0] == picked[1]


def test_the_window_survives_a_checkpoint_and_the_identity_holds_after_it():
    s = sel_sched(window=32)
    f = Fake(s)
    offer_scored(s, 0, lambda i: 0.97 if i % 2 else 0.5)
    f.apply(s.admit_selected())
    snap = snapshot(s, lambda p: {"text": p}, lambda x: x)
    t = sel_sched(window=32)
    restore(t, snap, lambda d: d["text"], lambda x: x)
    assert [c.uid for c in t.selector.waiting] == [c.uid for c in s.selector.waiting]
    assert [c.problem for c in t.selector.waiting] == [c.problem for c in s.selector.waiting]
    a, b = s.accounting(), t.accounting()
    for key in ("prompts_drawn", "prompts_deferred", "prompts_waiting_at_end"):
        assert getattr(a, key) == getattr(b, key)
    assert a.scheduler.prompts_admitted == b.scheduler.prompts_admitted
    assert b.prompts_drawn == (b.scheduler.prompts_admitted + b.prompts_deferred
                                  + b.prompts_waiting_at_end)


def test_a_window_smaller_than_a_batch_is_refused():
    with pytest.raises(ValueError, match="at least one batch"):
        sel_sched(window=3, batch=4)
    with pytest.raises(ValueError, match="floor"):
        SelectionConfig(floor=0.0)
    with pytest.raises(ValueError, match="source"):
        SelectionConfig(source="oracle")
