"""studies.selection_limits: an admission rule read off prompts that all got their rollouts."""
from __future__ import annotations

import math
import random

import pytest

from studies.selection_limits import Scored, auc, readings, rule_reading, scored_prompts


def test_a_rule_is_read_by_weighting_each_prompt_with_its_admission_chance():
    prompts = [Scored(0.9, True, 0.9), Scored(0.9, True, 0.9), Scored(0.1, False, 0.1),
               Scored(0.1, True, 0.1)]
    got = rule_reading(prompts, lambda u: 0.25 if u > 0.5 else 1.0)
    # weights 0.25, 0.25, 1, 1: admitted 2.5 of 4; uniform 0.25 + 0.25 + 1 of 2.5
    assert got["admitted_share"] == pytest.approx(2.5 / 4)
    assert got["uniform_share"] == pytest.approx(1.5 / 2.5)
    assert got["if_prior_exact"]["uniform_share"] == pytest.approx((0.225 * 2 + 0.2) / 2.5)
    assert rule_reading(prompts, lambda u: 1.0)["uniform_share"] == pytest.approx(0.75)


def test_the_deferred_prompts_are_read_for_what_they_would_have_taught_and_the_priors_error():
    """Deferred weight 1 - w: the share of it whose group was mixed, the share of all mixed
    groups deferred, and the prior's error weighted by admission and by deferral."""
    prompts = [Scored(0.9, True, 0.9, 0.05), Scored(0.9, False, 0.9, 0.45),
               Scored(0.1, False, 0.1, 0.2), Scored(0.1, True, 0.1, 0.1)]
    got = rule_reading(prompts, lambda u: 0.25 if u > 0.5 else 1.0)
    # deferred 0.75 of each of the first two (one mixed); none of the others
    assert got["deferred_informative_share"] == pytest.approx(0.5)
    assert got["informative_deferred"] == pytest.approx(0.75 / 2)
    assert got["prior_abs_error"]["deferred"] == pytest.approx((0.05 + 0.45) / 2)
    assert got["prior_abs_error"]["admitted"] == pytest.approx(
        (0.25 * 0.05 + 0.25 * 0.45 + 0.2 + 0.1) / 2.5)
    every = rule_reading(prompts, lambda u: 1.0)  # nothing deferred
    assert every["deferred_informative_share"] is None and every["informative_deferred"] == 0


def test_scored_prompts_carry_the_priors_error_against_all_their_rollouts():
    rows = [{"prior_p": 0.9, "t_admit": 0.0, "t_done": 1.0, "rewards": [1.0, 1.0, -1.0, 1.0,
                                                                        -1.0, 1.0, 1.0, 1.0]}]
    (s,) = scored_prompts(rows, 4, (-1.0, 1.0))
    assert not s.uniform and s.error == pytest.approx(abs(0.9 - 0.75))


def test_auc_ranks_uniform_groups_above_mixed_ones_ties_counting_half():
    assert auc([Scored(0.9, True, 0), Scored(0.1, False, 0)]) == 1.0
    assert auc([Scored(0.1, True, 0), Scored(0.9, False, 0)]) == 0.0
    assert auc([Scored(0.5, True, 0), Scored(0.5, False, 0)]) == 0.5
    assert math.isnan(auc([Scored(0.5, True, 0)]))


def _rows(n: int, seed: int = 0) -> list[dict]:
    """Prompts with a calibrated prior: rate q, p = q, four -1/+1 rewards drawn at q."""
    rng, out = random.Random(seed), []
    for i in range(n):
        q = rng.choice([0.05, 0.5, 0.95])
        out.append({"prior_p": q, "t_admit": float(i), "t_done": i + 0.5,
                    "rewards": [1.0 if rng.random() < q else -1.0 for _ in range(4)]})
    return out


def test_with_a_calibrated_prior_sharper_rules_cut_the_uniform_share_further():
    prompts = scored_prompts(_rows(3000), 4, (-1.0, 1.0))
    assert len(prompts) == 3000
    r = readings(prompts)
    assert r["auc_uniform_chance"] > 0.7
    shipped, sharpest = r["shipped"], r["threshold"][-1]
    assert shipped["vs_admitting_all"] < 0.9
    assert sharpest["admitted_share"] < shipped["admitted_share"]
    assert sharpest["vs_admitting_all"] < shipped["vs_admitting_all"]
    # the prior here is each prompt's true rate: the two readings agree, up to sampling
    assert shipped["if_prior_exact"]["uniform_share"] == pytest.approx(
        shipped["uniform_share"], abs=0.03)


def test_a_prior_that_knows_nothing_cuts_nothing():
    rows = [{**r, "prior_p": 0.5} for r in _rows(2000, seed=1)]
    r = readings(scored_prompts(rows, 4, (-1.0, 1.0)))
    # (U moves a little with the prior's measured error over the run, not with the prompt)
    assert r["shipped"]["vs_admitting_all"] == pytest.approx(1.0, abs=0.01)
    assert r["auc_uniform_chance"] == pytest.approx(0.5, abs=0.05)
