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
    assert {p.difficulty for p in problems} == {1, 2, 3, 4}  # the default levels


def test_the_two_digit_levels():
    """Levels 5 and 6 (configs/smollm2-135m.yaml draws them beside 1-4): two two-digit
    numbers added or subtracted, never below zero, in each level's several phrasings."""
    t = make_task("word_arithmetic", difficulties=(5, 6), n_train=400, n_heldout=100)
    problems = t.train() + t.heldout()
    assert {p.difficulty for p in problems} == {5, 6}
    for p in problems:
        a, b = (int(x) for x in re.findall(r"\d+", p.prompt)[:2])
        assert 10 <= a <= 99 and 10 <= b <= 99, p.prompt
        assert int(p.answer) == reference_answer(p.prompt), p
        assert (int(p.answer) >= 0) if p.difficulty == 6 else (int(p.answer) >= 20)
    for lv in (5, 6):
        assert len({re.sub(r"\d+", "N", p.prompt) for p in problems if p.difficulty == lv}) >= 3
    # drawn beside the one-digit levels, evenly, each from its own side of the split
    six = make_task("word_arithmetic", difficulties=(1, 2, 3, 4, 5, 6), n_train=600)
    assert sorted(sum(p.difficulty == lv for p in six.train()) for lv in range(1, 7)) == [100] * 6
    assert all(wa.is_heldout(p.prompt) for p in six.heldout())
    assert not any(wa.is_heldout(p.prompt) for p in six.train())


def test_levels_are_spread_evenly_and_phrased_in_several_ways(task):
    train = task.train()
    by_level = {lv: [p for p in train if p.difficulty == lv] for lv in task.difficulties}
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
    with pytest.raises(ValueError, match=r"distinct levels from \[1, 2, 3, 4, 5, 6\]"):
        TaskConfig(name="word_arithmetic", difficulties=[7])
