"""The plain-English arithmetic task: its problems, split and verifier, each against a
reference that reads the question's words on its own."""
from __future__ import annotations

import re

import pytest

from tasks import TaskConfig, make_task, make_task_from_config
from tasks import word_arithmetic as wa

# Operation words -> the arithmetic, read from the text (not from the task's tables).
WORDS = {"+": "+", "plus": "+", "Add": "+", "sum": "+", "times": "*", "multiplied": "*",
         "Multiply": "*", "product": "*", "-": "-", "minus": "-", "take away": "-",
         "Subtract": "-", "gets": "+", "bought": "+"}


def reference_answer(question: str) -> int:
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    op = next(v for k, v in WORDS.items() if re.search(rf"(^|\s){re.escape(k)}(\s|$)", question))
    if question.startswith("Subtract"):  # "Subtract b from a"
        a, b = b, a
    return {"+": a + b, "*": a * b, "-": a - b}[op]


@pytest.fixture(scope="module")
def task():
    return make_task("word_arithmetic")


def test_every_answer_matches_the_words(task):
    problems = task.train() + task.heldout()
    assert len(problems) == 1000
    for p in problems:
        assert int(p.answer) == reference_answer(p.prompt), p
        assert p.difficulty in wa.LEVELS
        if p.difficulty == 3:
            assert int(p.answer) >= 0


def test_levels_are_spread_evenly_and_phrased_in_several_ways(task):
    train = task.train()
    by_level = {lv: [p for p in train if p.difficulty == lv] for lv in wa.LEVELS}
    assert sorted(len(v) for v in by_level.values())[0] >= 150
    for lv, problems in by_level.items():
        # at least 2 distinct phrasings per level: the words around the numbers differ
        shapes = {re.sub(r"\d+", "N", p.prompt) for p in problems}
        assert len(shapes) >= 2, lv


def test_split_is_disjoint_and_seed_independent():
    a, b = make_task("word_arithmetic", seed=0), make_task("word_arithmetic", seed=7)
    train0, held0 = {p.prompt for p in a.train()}, {p.prompt for p in a.heldout()}
    assert not train0 & held0
    assert all(wa.is_heldout(q) for q in held0) and not any(wa.is_heldout(q) for q in train0)
    # another seed draws other problems, from the same sides of the split
    held7, train7 = {p.prompt for p in b.heldout()}, {p.prompt for p in b.train()}
    assert held7 != held0 and not held7 & train0 and not train7 & held0
    # and the same seed draws the same ones
    assert [p.id for p in make_task("word_arithmetic", seed=0).train()] == \
        [p.id for p in a.train()]


@pytest.mark.parametrize("completion, extracted", [
    ("The answer is 42.", "42"),
    ("4 + 5 = 9", "9"),
    ("Tom has 4 + 5 = 9 apples. Then he eats 2, so 7.", "7"),
    ("It is 1,000 exactly", "1000"),
    ("The result is -3.", "-3"),
    ("6.0", "6.0"),
    ("I don't know.", None),
    ("", None),
])
def test_the_last_number_is_the_answer(task, completion, extracted):
    assert task.extract(completion) == extracted


def test_scores(task):
    p = next(p for p in task.train() if p.prompt.startswith("Multiply"))
    right, wrong = f"The product is {p.answer}.", f"{p.answer} plus one is {int(p.answer) + 1}"
    assert task.score(p, right).reward == 1.0 and task.score(p, right).parsed
    assert task.score(p, wrong).reward == -1.0 and task.score(p, wrong).parsed
    assert task.score(p, f"{p.answer}.0").reward == 1.0
    nothing = task.score(p, "Multiplication is repeated addition.")
    assert nothing.reward == -1.0 and not nothing.parsed


def test_config_builds_it_and_checks_levels():
    t = make_task_from_config(TaskConfig(name="word_arithmetic", difficulties=[4], n_train=50,
                                         n_heldout=10))
    assert {p.difficulty for p in t.train() + t.heldout()} == {4}
    with pytest.raises(ValueError, match=r"distinct levels from \[1, 2, 3, 4\]"):
        TaskConfig(name="word_arithmetic", difficulties=[5])
