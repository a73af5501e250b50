"""The answer formats verl and OpenRLHF users' models write, and the verdict each must get
from each grader (tasks/grading.py): True (right), False (wrong), None (no answer read, or
one that cannot be interpreted: the low reward, counted as unparsed)."""
from __future__ import annotations

import pytest

from tasks import TaskConfig, make_task_from_config
from tasks.base import Problem
from tasks.grading import Grader, extract_default, minerva_normalize

# (grader, completion, ground truth, verdict)
TABLE = [
    # -- markers, each alone ------------------------------------------------------------------
    ("default", "so the total is 72.\n#### 72", "72", True),                  # GSM8K
    ("default", "#### 71", "72", False),
    ("default", "The answer is 72.", "72", True),
    ("default", "Therefore, the final answer is 3.", "3", True),
    ("default", "The answer is $\\frac{1}{2}$.", "0.5", True),
    ("default", "<think>4*18=72</think><answer>72</answer>", "72", True),
    ("default", "<answer> 7 </answer>", "72", False),
    ("default", "**Final Answer**: 3", "3", True),
    ("default", "**Final Answer:** 12.", "12", True),
    ("default", "Final Answer: \\boxed{5}", "5", True),
    ("default", "We get \\boxed{\\frac{a}{b+1}}.", "\\frac{a}{b+1}", True),
    ("default", "\\fbox{9}", "9", True),
    ("default", "Answer: 4", "4", True),
    # -- several markers: the last one written wins ------------------------------------------
    ("default", "\\boxed{7} ... on reflection, Answer: 8", "8", True),
    ("default", "\\boxed{7} ... on reflection, Answer: 8", "7", False),
    ("default", "Answer: 3\nwait, Answer: 5", "5", True),
    ("default", "The answer is 3. Hmm, no.\n#### 4", "4", True),
    ("default", "\\boxed{1} then \\boxed{2}", "2", True),
    ("default", "The final answer is $\\boxed{3}$.", "3", True),
    # -- what the answer says ---------------------------------------------------------------
    ("default", "Answer: 72 clips", "72", True),                             # units
    ("default", "Answer: 5 apples", "5", True),
    ("default", "The answer is 18 dollars.", "18", True),
    ("default", "Answer: \\$18", "18", True),
    ("default", "Answer: 50%", "50", True),                                  # percentages
    ("default", "Answer: 50\\%", "50", True),
    ("default", "Answer: 1,000", "1000", True),                              # separators
    ("default", "Answer: 1{,}000", "1000", True),
    ("default", "\\boxed{\\dfrac34}", "0.75", True),                         # LaTeX fractions
    ("default", "Answer: 2/4", "\\frac{1}{2}", True),
    ("default", "Answer: 1/3", "\\frac{1}{2}", False),
    ("default", "\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
    ("default", "\\boxed{[1, 3]}", "[1,3]", True),                           # intervals
    ("default", "\\boxed{(1,3]}", "(1,3]", True),
    ("default", "\\boxed{2, 1}", "1,2", True),                               # several answers
    ("default", "\\boxed{x = 3}", "3", True),
    ("default", "Answer: -7", "-7", True),
    ("default", "Answer: 7", "-7", False),
    ("default", "I am not sure.", "3", None),                                # no answer
    ("default", "Answer: ???", "3", None),
    ("default", "\\boxed{}", "3", None),
    ("default", "\\boxed{unclosed", "3", None),
    # -- strict: verl's math_dapo -----------------------------------------------------------
    ("strict", "work...\nAnswer: 72", "72", True),
    ("strict", "Answer: $\\frac{1}{2}$", "\\frac{1}{2}", True),
    ("strict", "Answer: 0.5", "\\frac{1}{2}", False),                        # text, not value
    ("strict", "Answer: 1,000", "1000", True),
    ("strict", "Answer: 10 cm", "10", True),
    ("strict", "\\boxed{72}", "72", None),                                   # no Answer: line
    ("strict", "Answer: 5\n" + "x" * 400, "5", None),                        # not in the tail
    # -- flexible: the last number ---------------------------------------------------------
    ("flexible", "She has 3 apples and buys 4 more, so 7", "7", True),
    ("flexible", "It costs $1,250.", "1250", True),
    ("flexible", "first 5 then 6", "5", False),
    ("flexible", "no numbers here", "5", None),
    ("flexible", "The answer: -3.5", "-3.5", True),
]


def verdict(grader: str, completion: str, gold: str):
    g = Grader(grader)
    answer = g.extract(completion)
    return None if answer is None else g.is_correct(gold, answer)


@pytest.mark.parametrize("grader, completion, gold, expected", TABLE,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(TABLE)])
def test_each_format_gets_its_verdict(grader, completion, gold, expected):
    assert verdict(grader, completion, gold) is expected


def test_the_table_covers_forty_cases_and_every_grader():
    assert len(TABLE) >= 40 and {c[0] for c in TABLE} == {"default", "strict", "flexible"}


def test_an_inner_marker_is_the_answer_of_the_outer_one():
    assert extract_default("Answer: \\boxed{5} because 2+3") == "5"
    assert extract_default("<answer>\\boxed{\\frac{1}{2}}</answer>") == "\\frac{1}{2}"


def test_minerva_normalization_as_math_dapo_compares():
    assert minerva_normalize("x = \\text{5 dollars}") == "5"
    assert minerva_normalize("\\frac12") == "\\frac{1}{2}"
    assert minerva_normalize("$1,000$") == "1000"


def test_rows_are_graded_by_their_data_source(tmp_path):
    import json

    rows = [{"prompt": "what is 8*9?", "answer": "72", "data_source": "openai/gsm8k"},
            {"prompt": "half of 1?", "answer": "\\frac{1}{2}", "data_source": "math_dapo"},
            {"prompt": "2+2?", "answer": "4"}]
    path, train = tmp_path / "mixed.jsonl", tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    task = make_task_from_config(TaskConfig(
        name="math", path=str(train), heldout_path=str(path), n_heldout=3,
        grading_by_source={"openai/gsm8k": "flexible", "math_dapo": "strict"}))
    by = {p.source: p for p in task.heldout()}
    assert by["openai/gsm8k"].source == "openai/gsm8k" and by[""].prompt == "2+2?"
    assert task.score(by["openai/gsm8k"], "8*9 is 72").reward == 1.0       # flexible
    strict = task.score(by["math_dapo"], "Answer: 0.5")  # strict: read, and wrong as text
    assert strict.parsed and strict.reward == -1.0
    assert task.score(by[""], "#### 4").reward == 1.0                      # the default
    assert task.score(by[""], "8*9 is 72").parsed is False


def test_an_unknown_grader_is_refused():
    with pytest.raises(ValueError, match="unknown grader 'lenient'"):
        Grader("lenient")
    with pytest.raises(ValueError):
        TaskConfig(name="math", path="x.jsonl", grading="lenient")


def test_a_problem_without_a_source_keeps_the_tasks_grader():
    assert Problem("a", "q", "1").source == ""
