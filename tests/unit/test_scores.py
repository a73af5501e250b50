"""The evaluation figures of ``python -m cluster.evaluate`` (cluster/records/scores.py): the
unbiased pass@k against every k-subset counted by hand, the majority vote and its ties,
mean@n and greedy, per data source, the table."""
from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

from cluster.records.scores import (PromptAnswers, by_source, figures, majority_right,
                                    pass_at_k, table)


@pytest.mark.parametrize("n, c, k", [(4, 0, 1), (4, 1, 1), (4, 2, 2), (8, 3, 4), (8, 7, 8),
                                     (5, 5, 3), (6, 1, 6)])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_right_answer(n, c, k):
    answers = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(answers, k))
    assert pass_at_k(n, c, k) == pytest.approx(np.mean([any(s) for s in subsets]))
    with pytest.raises(ValueError, match="pass@9 needs at least 9"):
        pass_at_k(8, 3, 9)


def test_majority_vote_counts_what_the_grader_read_and_breaks_ties_by_first_appearance():
    assert majority_right([False, True, True, False], ["3", "4", "4", "3"], 4) is False  # tie: 3
    assert majority_right([False, True, True, False], ["3", "4", "4", "5"], 4) is True
    assert majority_right([True, False, False], ["7", None, None], 3) is True  # unread: no vote
    assert majority_right([False, False], [None, None], 2) is False
    assert majority_right([False, True, True], ["1", "2", "2"], 1) is False    # first k only


def test_figures_per_source_with_their_standard_errors():
    prompts = [PromptAnswers("gsm8k", [True, True, False, False], ["1", "1", "2", "3"], True),
               PromptAnswers("gsm8k", [False] * 4, ["9"] * 4, False),
               PromptAnswers("math", [True] * 4, ["5"] * 4, True)]
    out = by_source(prompts, [1, 2, 4, 8])
    all_ = out["all"]
    assert all_["n"] == 4 and "pass@8" not in all_
    assert all_["mean@4"]["mean"] == pytest.approx(np.mean([0.5, 0.0, 1.0]))
    assert all_["mean@4"]["se"] == pytest.approx(np.std([0.5, 0.0, 1.0], ddof=1) / np.sqrt(3))
    assert all_["pass@1"]["mean"] == pytest.approx(all_["mean@4"]["mean"])
    assert all_["pass@4"]["mean"] == pytest.approx(2 / 3)
    assert all_["maj@4"]["mean"] == pytest.approx(2 / 3) and all_["greedy"]["mean"] == 2 / 3
    assert out["gsm8k"]["prompts"] == 2 and out["math"]["mean@4"]["mean"] == 1.0
    text = table(out)
    assert text.splitlines()[0].split()[:3] == ["source", "prompts", "mean@4"]
    assert text.splitlines()[2].split()[:5] == ["gsm8k", "2", "0.250", "+-", "0.250"]
    assert figures([], [1])["prompts"] == 0


def test_the_command_says_its_usage_without_a_cluster():
    out = subprocess.run([sys.executable, "-m", "cluster.evaluate", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "pass@k" in out.stdout and "MODEL_OR_RUN" in out.stdout


def test_a_bad_request_is_said_before_any_actor_starts(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cluster.evaluate", str(tmp_path / "nothing"),
                          "--data", str(tmp_path / "absent.jsonl")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("error: "), out.stderr[-2000:]
