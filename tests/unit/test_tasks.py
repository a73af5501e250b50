"""The arithmetic task, the task registry and TaskConfig (pure Python, no torch).

The stepwise task has its own file (test_stepwise.py)."""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from tasks import DEFAULT_TASK, TASKS, TaskConfig, make_task, make_task_from_config
from tasks.arithmetic import (LEVELS, ArithmeticTask, evaluate, is_heldout, sample_expr,
                              train_stream)
from tasks.base import Problem, Verdict
from tasks.stepwise import StepwiseTask

FIXTURE = Path(__file__).parents[1] / "fixtures" / "math_small.jsonl"


@pytest.fixture(scope="module")
def task() -> ArithmeticTask:
    return ArithmeticTask(seed=3, n_train=400, n_heldout=120)


# ---- arithmetic: problems -------------------------------------------------------------------

@pytest.mark.parametrize("expr,value", [("12+7*3", 33), ("5-3-2", 0), ("2*3*4-5", 19),
                                        ("9-2*3+1", 4), ("0*7", 0), ("3-9", -6), ("42", 42)])
def test_evaluate_uses_usual_precedence(expr, value):
    assert evaluate(expr) == value


def test_evaluate_agrees_with_python_on_random_expressions():
    rng = random.Random(0)
    for level in LEVELS:
        for _ in range(200):
            e = sample_expr(rng, LEVELS[level])
            assert evaluate(e) == eval(e)  # the slow, obviously-correct reference


@pytest.mark.parametrize("bad", ["", "1+", "+1", "1++2", "1/2", "a+1", "1 + 2"])
def test_evaluate_rejects_malformed(bad):
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        evaluate(bad)


def test_same_seed_same_problems_other_seed_different():
    a = ArithmeticTask(seed=7, n_train=200, n_heldout=40)
    b = ArithmeticTask(seed=7, n_train=200, n_heldout=40)
    c = ArithmeticTask(seed=8, n_train=200, n_heldout=40)
    assert a.train() == b.train() and a.heldout() == b.heldout()
    assert a.train() != c.train()


def test_train_stream_never_yields_heldout_and_is_deterministic():
    s1, s2 = train_stream(5), train_stream(5)
    drawn = [next(s1) for _ in range(500)]
    assert drawn == [next(s2) for _ in range(500)]
    assert not any(is_heldout(p.prompt) for p in drawn)
    assert set(Counter(p.difficulty for p in drawn)) == set(LEVELS)


def test_problems_spread_evenly_over_levels(task):
    assert Counter(p.difficulty for p in task.train()) == {1: 100, 2: 100, 3: 100, 4: 100}
    assert Counter(p.difficulty for p in task.heldout()) == {1: 30, 2: 30, 3: 30, 4: 30}


def test_difficulty_grading_matches_level_spec(task):
    for p in task.train() + task.heldout():
        spec = LEVELS[p.difficulty]
        expr = p.prompt.removesuffix("=")
        ops = [c for c in expr if c in "+-*"]
        nums = expr.replace("+", " ").replace("-", " ").replace("*", " ").split()
        assert p.prompt.endswith("=") and len(ops) == spec.n_ops == len(nums) - 1
        assert set(ops) <= set(spec.ops)
        assert [len(n) for n in nums] == list(spec.digits)
        assert int(p.answer) == eval(expr)
    # Every operator of a level shows up.
    for level, spec in LEVELS.items():
        used = {c for p in task.train() if p.difficulty == level for c in p.prompt if c in "+-*"}
        assert used == set(spec.ops)


def test_selected_difficulties_only():
    t = ArithmeticTask(n_train=50, n_heldout=10, difficulties=(2, 4))
    assert {p.difficulty for p in t.train() + t.heldout()} == {2, 4}


def test_small_level_gives_all_it_has_and_the_rest_spreads():
    # Level 1 (one-digit +/-) has 200 problems in all, so fewer than 100 held-out ones.
    t = ArithmeticTask(n_heldout=400)
    counts = Counter(p.difficulty for p in t.heldout())
    assert sum(counts.values()) == 400 and len({p.prompt for p in t.heldout()}) == 400
    assert counts[1] < 100 and counts[2] == counts[3] >= counts[4] >= counts[2] - 1 > 100


def test_more_problems_than_exist_is_an_error():
    with pytest.raises(ValueError, match=r"difficulties \[1\] have only \d+ distinct held-out"):
        ArithmeticTask(n_heldout=100, difficulties=(1,)).heldout()


@pytest.mark.parametrize("bad", [(), (0,), (5,), (1, 1)])
def test_bad_difficulties(bad):
    with pytest.raises(ValueError, match="difficulties"):
        ArithmeticTask(difficulties=bad)


# ---- arithmetic: verifier -------------------------------------------------------------------

P = Problem(id="x", prompt="3-9=", answer="-6", difficulty=1)


@pytest.mark.parametrize("completion,reward,parsed,extracted", [
    ("-6", 1.0, True, "-6"),
    ("  -6  ", 1.0, True, "-6"),
    ("\n-6\n", 1.0, True, "-6"),
    ("-6\n7+1=8", 1.0, True, "-6"),
    ("-06", 1.0, True, "-06"),
    ("6", -1.0, True, "6"),
    ("-7", -1.0, True, "-7"),
    ("", -1.0, False, None),
    ("   ", -1.0, False, None),
    ("-6.0", -1.0, False, None),
    ("-6x", -1.0, False, None),
    ("- 6", -1.0, False, None),
    ("=-6", -1.0, False, None),
    ("minus six", -1.0, False, None),
])
def test_verifier_edge_cases(completion, reward, parsed, extracted):
    assert ArithmeticTask().score(P, completion) == Verdict(reward, parsed, extracted)


def test_zero_one_reward_convention():
    t = ArithmeticTask(reward_low=0.0, reward_high=1.0)
    assert t.rewards == (0.0, 1.0)
    assert t.score(P, "-6").reward == 1.0
    assert t.score(P, "5").reward == 0.0
    assert t.score(P, "??") == Verdict(0.0, False, None)


def test_reward_order_checked():
    with pytest.raises(ValueError, match="reward_low"):
        ArithmeticTask(reward_low=1.0, reward_high=1.0)


def test_reference_answers_score_r_hi(task):
    assert all(task.score(p, p.answer).reward == 1.0 for p in task.heldout())


# ---- registry and config --------------------------------------------------------------------

def test_registry_names():
    assert set(TASKS) == {"stepwise", "arithmetic", "word_arithmetic", "math", "math_jsonl"}
    assert TASKS["math_jsonl"] is TASKS["math"]  # the earlier name of the dataset task
    assert isinstance(make_task("arithmetic", n_train=10, n_heldout=10), ArithmeticTask)
    assert isinstance(make_task("stepwise", n_train=10, n_heldout=10), StepwiseTask)
    # the generated tasks' defaults: their own train sizes and every level
    defaults = {n: (make_task(n).n_train, make_task(n).difficulties)
                for n in ("stepwise", "arithmetic", "word_arithmetic")}
    assert defaults == {"stepwise": (4000, (1, 2, 3, 4)), "arithmetic": (800, (1, 2, 3, 4)),
                        "word_arithmetic": (800, (1, 2, 3, 4))}
    assert DEFAULT_TASK == "stepwise"


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown task 'gsm8k'.*arithmetic.*math_jsonl"):
        make_task("gsm8k")
    with pytest.raises(ValueError, match=r"unknown task 'gsm8k'.*arithmetic"):
        TaskConfig(name="gsm8k")


def test_config_defaults_build_stepwise():
    t = make_task_from_config(TaskConfig())
    assert isinstance(t, StepwiseTask) and t.rewards == (-1.0, 1.0)
    assert len(t.train()) == 4000 and len(t.heldout()) == 200


def test_config_builds_arithmetic_by_name():
    t = make_task_from_config(TaskConfig(name="arithmetic"))
    assert isinstance(t, ArithmeticTask) and len(t.train()) == 800 and len(t.heldout()) == 200


@pytest.mark.parametrize("cls", [ArithmeticTask, StepwiseTask])
def test_config_passes_fields_through(cls):
    cfg = TaskConfig(name=cls.name, seed=4, n_train=40, n_heldout=8, reward_low=0.0,
                     difficulties=[1, 2])
    t = make_task_from_config(cfg)
    assert isinstance(t, cls)
    assert t.rewards == (0.0, 1.0) and len(t.train()) == 40 and len(t.heldout()) == 8
    assert t.train() == cls(seed=4, n_train=40, n_heldout=8, difficulties=(1, 2)).train()


def test_config_rejects_unknown_fields_and_bad_values():
    with pytest.raises(ValidationError, match="extra"):
        TaskConfig(nmae="arithmetic")
    with pytest.raises(ValueError, match="reward_low"):
        TaskConfig(reward_low=1.0, reward_high=0.0)
    with pytest.raises(ValueError, match="difficulties"):
        TaskConfig(difficulties=[9])
    with pytest.raises(ValueError, match="difficulties"):
        TaskConfig(name="arithmetic", difficulties=[5])
    with pytest.raises(ValueError, match="n_heldout"):
        TaskConfig(n_heldout=0)


def test_config_math_jsonl_path_checked_when_the_task_is_built(tmp_path):
    missing = tmp_path / "nope.jsonl"
    cfg = TaskConfig(name="math_jsonl", path=str(missing))  # parses: may be another machine's path
    with pytest.raises(ValueError, match=f"task.path: dataset file {missing} does not exist"):
        make_task_from_config(cfg)
    with pytest.raises(ValueError, match="needs `path`"):
        TaskConfig(name="math_jsonl")
    with pytest.raises(ValueError, match="heldout_path: dataset file .* does not exist"):
        make_task_from_config(TaskConfig(name="math_jsonl", path=str(FIXTURE),
                                         heldout_path=str(missing)))


@pytest.mark.parametrize("name", ["math", "math_jsonl"])
def test_config_builds_the_math_task(name):
    t = make_task_from_config(TaskConfig(name=name, path=str(FIXTURE), n_heldout=3))
    assert len(t.heldout()) == 3 and len(t.train()) == 8


def test_config_passes_the_dataset_keys(tmp_path):
    f = tmp_path / "openrlhf.jsonl"
    f.write_text("".join(json.dumps({"input": {"text": f"{i}+1?"}, "label": i + 1}) + "\n"
                         for i in range(4)))
    t = make_task_from_config(TaskConfig(name="math", path=str(f), n_heldout=1,
                                         prompt_key="input.text", answer_key="label"))
    assert sorted(p.answer for p in t.train() + t.heldout()) == ["1", "2", "3", "4"]
    with pytest.raises(ValueError, match=r"openrlhf\.jsonl: task\.answer_key 'answer' is not a "
                                         r"column; its columns: input, input\.text, label"):
        make_task_from_config(TaskConfig(name="math", path=str(f), n_heldout=1,
                                         prompt_key="input.text", answer_key="answer")).train()


@pytest.mark.parametrize("key", ["", " prompt", "a..b", "reward_model."])
def test_config_rejects_a_key_that_is_no_column_path(key):
    with pytest.raises(ValueError, match="task.prompt_key .* must be a column name"):
        TaskConfig(name="math", path="d.parquet", prompt_key=key)
    with pytest.raises(ValueError, match="task.answer_key .* must be a column name"):
        TaskConfig(name="math", path="d.parquet", answer_key=key)


def test_config_checks_the_dataset_format_when_the_task_is_built(tmp_path):
    (tmp_path / "d.csv").write_text("prompt,answer\n1+1,2\n")
    with pytest.raises(ValueError, match=r"task\.path: .*d\.csv: unknown dataset format '\.csv'"):
        make_task_from_config(TaskConfig(name="math", path=str(tmp_path / "d.csv")))
    with pytest.raises(ValueError, match=r"task\.path: .* is a directory but not one written by "
                                         "save_to_disk"):
        make_task_from_config(TaskConfig(name="math", path=str(tmp_path)))


def test_config_round_trips_json():
    cfg = TaskConfig(seed=2, difficulties=[3])
    assert TaskConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg
    # Every field is documented (the config reference is generated from these).
    assert all(f.description for f in TaskConfig.model_fields.values())
