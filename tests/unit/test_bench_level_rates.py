"""bench.level_rates' arithmetic: the expected share of all-equal groups of k from n samples
a prompt, against drawing k of the n by brute force."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from bench.level_rates import all_equal_shares, level_figures, mix_share


@pytest.mark.parametrize("correct, n, k", [([0, 3, 12], 12, 4), ([1, 2, 5], 6, 4),
                                           ([4], 4, 4), ([2, 2], 5, 2)])
def test_all_equal_shares_are_what_drawing_k_of_the_n_gives(correct, n, k):
    right = wrong = 0.0
    for c in correct:
        answers = [1] * c + [0] * (n - c)
        draws = list(itertools.combinations(answers, k))
        right += sum(all(d) for d in draws) / len(draws) / len(correct)
        wrong += sum(not any(d) for d in draws) / len(draws) / len(correct)
    assert all_equal_shares(np.array(correct), n, k) == pytest.approx((right, wrong))


def test_a_levels_figures_and_a_mix():
    hard = level_figures(np.array([0, 0, 1, 0]), 12, 4)
    assert hard["success_rate"] == pytest.approx(1 / 48, abs=1e-4) and hard["prompts"] == 4
    assert hard["all_right_share"] == 0 and hard["all_wrong_share"] == pytest.approx(
        (3 + 8 / 12) / 4, abs=1e-4)  # C(11,4)/C(12,4) = 8/12 for the prompt with one right
    assert hard["all_equal_share"] == hard["all_wrong_share"]
    even = level_figures(np.array([6, 6]), 12, 4)
    levels = {"1": even, "5": hard}
    assert mix_share(levels, [1, 5]) == pytest.approx(
        (even["all_equal_share"] + hard["all_equal_share"]) / 2, abs=1e-4)
