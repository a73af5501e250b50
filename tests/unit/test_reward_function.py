"""A user's reward function by path in verl's signature (tasks/reward_function.py): loaded by
every process that builds the task from its config (here: a scoring worker process too),
a float or a dict's score as the reward with its other numbers kept, refused at launch
when it fails, returns something else, or does not span the task's reward range."""
from __future__ import annotations

import asyncio
import functools
import json
import re
import textwrap

import pytest

from tasks import TaskConfig, make_task_from_config

ROWS = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
         "reward_model": {"ground_truth": str(a + b)}, "data_source": "toy",
         "extra_info": {"index": i, "split": "train"}} for i, (a, b) in enumerate(
             [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (2, 2)])]

VERL_STYLE = """
    import re

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        found = re.findall(r"-?\\d+", solution_str)
        right = bool(found) and found[-1] == ground_truth
        return {"score": 1.0 if right else 0.0, "acc": float(right),
                "has_index": float(extra_info is not None and "index" in extra_info),
                "pred": found[-1] if found else "[INVALID]", "parsed": bool(found)}
"""


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def function_file(tmp_path, body: str, name="my_rewards.py"):
    f = tmp_path / name
    f.write_text(textwrap.dedent(body))
    return f


def cfg(data, spec, **kw):
    return TaskConfig(name="math", path=str(data), n_heldout=2, reward_function=spec,
                      reward_low=0.0, reward_high=1.0, **kw)


def test_a_verl_style_function_scores_with_its_dict_and_keeps_its_other_numbers(tmp_path, data):
    task = make_task_from_config(cfg(data, f"{function_file(tmp_path, VERL_STYLE)}:compute_score"))
    p = task.train()[0]
    right = task.score(p, f"so it is {p.answer}")
    assert right.reward == 1.0 and right.parsed
    assert dict(right.extras) == {"acc": 1.0, "has_index": 1.0}  # text values left out
    wrong = task.score(p, "no idea")
    assert wrong.reward == 0.0 and not wrong.parsed
    assert p.source == "toy" and json.loads(p.extra)["split"] == "train"


def test_it_scores_in_a_worker_process_built_from_the_config(tmp_path, data):
    from actors.scoring import Scorer

    c = cfg(data, f"{function_file(tmp_path, VERL_STYLE)}:compute_score")
    task = make_task_from_config(c)
    p = task.train()[1]
    scorer = Scorer(task, functools.partial(make_task_from_config, c), workers=1, timeout_s=60)
    try:
        v = asyncio.run(scorer.score(p, f"answer {p.answer}", 3))
    finally:
        scorer.close()
    assert v.reward == 1.0 and dict(v.extras)["acc"] == 1.0


def test_the_launch_check_refuses_a_function_that_does_not_span_the_range(tmp_path, data):
    from tasks.reward_function import check

    spec = f"{function_file(tmp_path, VERL_STYLE)}:compute_score"
    check(make_task_from_config(cfg(data, spec)))  # 0/1 on [0, 1]: fine
    task = make_task_from_config(TaskConfig(name="math", path=str(data), n_heldout=2,
                                            reward_function=spec))  # the default [-1, 1]
    with pytest.raises(ValueError, match=re.escape(
            "the ground truth written as an answer got 1.0 at best and an empty answer 0.0, "
            "where the task's range is [-1.0, 1.0]: set task.reward_low=0 and "
            "task.reward_high=1")):
        check(task)


@pytest.mark.parametrize("body, message", [
    ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
     "    return 2.0\n", r"returned 2\.0, outside the task's reward range \[0\.0, 1\.0\]"),
    ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
     "    return {'acc': 1}\n", "returned a dict without 'score'"),
    ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
     "    return 'yes'\n", "returned 'yes': not a finite number"),
    ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
     "    raise KeyError('gt')\n", "KeyError: 'gt'"),
])
def test_a_function_that_misbehaves_is_named_at_launch(tmp_path, data, body, message):
    from tasks.reward_function import check

    spec = f"{function_file(tmp_path, body)}:compute_score"
    with pytest.raises(ValueError, match=message):
        check(make_task_from_config(cfg(data, spec)))


@pytest.mark.parametrize("make, message", [
    (lambda tmp: "nothing_here.py:compute_score", "nothing_here.py is not a file"),
    (lambda tmp: f"{function_file(tmp, 'x = 1')}:compute_score", "has no function 'compute_score'"),
    (lambda tmp: f"{function_file(tmp, 'import no_such_module')}:f",
     "raised ModuleNotFoundError"),
    (lambda tmp: f"{function_file(tmp, 'def f(text):' + chr(10) + '    return 1')}:f",
     "must take verl's keywords data_source, solution_str, ground_truth, extra_info"),
])
def test_a_bad_path_or_function_is_named(tmp_path, data, make, message):
    with pytest.raises(ValueError, match=message):
        make_task_from_config(cfg(data, make(tmp_path)))


def test_the_spec_is_checked_when_the_config_is_read():
    with pytest.raises(ValueError, match="must be FILE.py:FUNCTION"):
        TaskConfig(name="math", path="x.jsonl", reward_function="my_rewards.py")
