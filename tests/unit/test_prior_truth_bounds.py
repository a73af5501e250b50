"""studies.prior_truth's fits to the truth itself (bounds.py, analysis.level_cv_predictor): the
level-told predictor out of fold, the generators' own variables of a prompt, and the
cross-validated fit on them that the prior's aims are read against."""
from __future__ import annotations

import numpy as np
import pytest

from studies.prior_truth.analysis import (error_stats, folds_of, level_cv_predictor,
                                        level_mean_predictor, repeats_block)
from studies.prior_truth.bounds import (RIDGE_GRID, cross_validated_bound, generator_variables,
                                      ridge_out_of_fold)


def test_the_level_told_predictor_out_of_fold_never_reads_a_prompts_own_truth():
    levels = np.array([1, 1, 1, 2, 2, 2, 3])
    truth = np.array([0.0, 0.5, 1.0, 0.2, 0.4, 0.9, 0.3])
    got = level_cv_predictor(truth, levels, folds=7)   # each prompt its own fold
    # level 1: the mean of the other two; level 3 has no other prompt: the others' mean
    assert got[:3].tolist() == pytest.approx([0.75, 0.5, 0.25])
    assert got[3:6].tolist() == pytest.approx([0.65, 0.55, 0.3])
    assert got[6] == pytest.approx(truth[:6].mean())
    assert folds_of(7, 3).tolist() == [0, 1, 2, 0, 1, 2, 0]
    # in sample the level-told predictor is closer to the truth than out of fold
    rng = np.random.default_rng(0)
    lv = np.repeat([1, 2, 3, 4], 20)
    t = np.clip(1.0 - 0.2 * lv + rng.normal(0, 0.1, 80), 0, 1)
    inside, outside = (np.mean((f - t) ** 2) for f in
                       (level_mean_predictor(t, lv), level_cv_predictor(t, lv)))
    assert inside < outside


def test_the_bound_finds_a_truth_its_variables_make_and_not_one_they_do_not():
    rng = np.random.default_rng(1)
    F = rng.normal(size=(200, 3))
    mu = np.clip(0.5 + 0.15 * F[:, 0] - 0.1 * F[:, 2], 0.02, 0.98)
    samples = 10**6   # a noiseless truth
    truth = rng.binomial(samples, mu) / samples
    made = cross_validated_bound(F, truth, samples)
    assert made["error_sd_noise_removed"] < 0.01 and made["spearman"] > 0.99
    assert made["folds"] == 10 and made["error_at"]["ridge"] in RIDGE_GRID
    unrelated = cross_validated_bound(rng.normal(size=(200, 3)), truth, samples)
    # no better than the truth's own spread about its mean
    assert unrelated["error_sd_noise_removed"] > 0.9 * truth.std()
    # the best of its grid: no single ridge strength on either scale does better
    for lam in RIDGE_GRID[::3]:
        p = np.clip(ridge_out_of_fold(F, truth, lam), 0, 1)
        err = error_stats(p, truth, samples)["error_sd_noise_removed"]
        assert made["error_sd_noise_removed"] <= err + 1e-12


def test_a_fold_is_predicted_by_the_other_folds_alone():
    F = np.arange(20, dtype=float)[:, None]
    y = 2.0 * F[:, 0] + 1.0
    y_bad = y.copy()
    y_bad[0] = 1000.0   # prompt 0 is in fold 0: its own value must not move its prediction
    a, b = ridge_out_of_fold(F, y, 1e-9, folds=4), ridge_out_of_fold(F, y_bad, 1e-9, folds=4)
    assert a[0] == pytest.approx(b[0]) and a[0] == pytest.approx(1.0, abs=1e-3)
    assert b[1] != pytest.approx(a[1])   # the other folds trained on it


def test_the_generators_variables_of_a_prompt_by_hand():
    names, X = generator_variables("stepwise", ["37+8 x5\n", "10-7 x2\n"], [3, 1])
    row = dict(zip(names, X[0]))
    # 37+8=45 carries, 45+8=53, 53+8=61 carry, 61+8=69 does not, 69+8=77 carries
    assert row["carries"] == 4 and row["carry_share"] == pytest.approx(0.8)
    assert row["level3"] == 1 and row["steps_at_level3"] == 5 and row["steps_at_level1"] == 0
    assert row["step_size8"] == 1 and row["start_units7"] == 1 and row["minus"] == 0
    row = dict(zip(names, X[1]))   # 10-7=03 borrows, 03-7=96 borrows
    assert row["carries"] == 2 and row["minus"] == 1 and row["steps_at_level1"] == 2
    names, X = generator_variables("arithmetic", ["3+4*7=", "7-8=", "47*38="], [2, 1, 4])
    rows = [dict(zip(names, x)) for x in X]
    assert rows[0]["times_second"] == 1 and rows[0]["times_first"] == 0   # 31
    assert rows[0]["two_digits"] == 1 and rows[0]["negative"] == 0 and rows[0]["level2"] == 1
    assert rows[1]["negative"] == 1 and rows[1]["minus"] == 1 and rows[1]["times"] == 0
    assert rows[2]["three_digits"] == 1 and rows[2]["units_carry"] == 1   # 1786; 7 + 8
    assert rows[2]["log_value"] == pytest.approx(np.log1p(1786))
    assert generator_variables("word_arithmetic", ["Zoe has 4 cookies."], [1]) is None


def test_repeats_carry_the_bounds_and_the_level_told_predictor_out_of_fold():
    rng = np.random.default_rng(2)
    level = np.repeat([1, 2], 20)
    points = [{"truth": np.clip(0.8 - 0.3 * level + rng.normal(0, 0.1, 40), 0, 1).tolist(),
               "p": rng.uniform(size=40).tolist(), "level": level.tolist()} for _ in range(2)]
    block = repeats_block(points, 64, ["a", "b"], None, {"generator_spearman": [0.5, 0.7]})
    assert block["bounds"]["generator_spearman"]["mean"] == pytest.approx(0.6)
    assert block["level_cv_error_sd_noise_removed"]["values"] == pytest.approx(
        [error_stats(level_cv_predictor(np.array(p["truth"]), level), np.array(p["truth"]),
                     64)["error_sd_noise_removed"] for p in points])
