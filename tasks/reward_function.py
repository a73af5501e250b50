"""A user's reward function by path, as verl's ``custom_reward_function`` takes one.

``task.reward_function: my_rewards.py:compute_score`` (a file, relative to the directory the
run is launched from, or absolute, and a function in it) replaces the task's verifier with
verl's signature::

    def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

called with keywords, ``data_source`` the row's ``data_source`` column ("" where it has
none), ``extra_info`` its ``extra_info`` (a dict, or None). A float is the reward; a dict's
``score`` is the reward and its other numeric values are logged per step
(``metrics.jsonl``: ``reward_extras``, their means over the step's rollouts); a dict's
``parsed`` (when given) says whether an answer was read at all.

It lives in the task (``RewardFunctionTask`` wraps the dataset's task: its problems, the
reward range), so every process that builds the task from its config scores with it: the
coordinator, its scoring workers, the evaluation. Rewards must lie in the task's range
[``task.reward_low``, ``task.reward_high``]: the estimator's noise bound and the prior's
probability scale are that range's (V = r_lo + p (r_hi - r_lo)); a value outside it is an
error (the low reward, counted as a scoring error). ``check`` runs the function at preflight
on the first rows of both splits, with the ground truth written out as an answer and with an
empty answer, and refuses a function that fails, returns something else than a number or a
dict with a ``score``, or whose rewards do not span the range (a 0/1 function on the default
-1/+1 range: set ``task.reward_low=0``).
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import math
from pathlib import Path

from tasks.base import Problem, Task, Verdict

PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")
CHECK_ROWS = 3  # rows of each split the preflight check scores
# How the ground truth is written out when the check asks for a right answer: the function
# must give one of these the high reward (it may read any one of these formats).
RIGHT = ("\\boxed{{{}}}", "Answer: {}", "#### {}", "The answer is {}.", "<answer>{}</answer>",
         "{}")


def split_spec(spec: str) -> tuple[Path, str]:
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise ValueError(f"task.reward_function {spec!r} must be FILE.py:FUNCTION (e.g. "
                         "my_rewards.py:compute_score)")
    return Path(path), name


def load(spec: str):
    """The function named by ``spec`` (``FILE.py:NAME``), its signature checked."""
    path, name = split_spec(spec)
    if not path.is_file():
        raise ValueError(f"task.reward_function: {path} is not a file (relative paths are "
                         "from the directory the run is launched from)")
    module_spec = importlib.util.spec_from_file_location(f"v05_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's file: say what it raised
        raise ValueError(f"task.reward_function: importing {path} raised "
                         f"{type(err).__name__}: {err}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"task.reward_function: {path} has no function {name!r}")
    try:
        inspect.signature(fn).bind(**dict.fromkeys(PARAMS))
    except TypeError as err:
        raise ValueError(f"task.reward_function: {name} must take verl's keywords "
                         f"{', '.join(PARAMS)} ({err})") from None
    return fn


class RewardFunctionTask(Task):
    """``base``'s problems and reward range, scored by the user's function."""

    def __init__(self, base: Task, spec: str):
        super().__init__(*base.rewards)
        self.base, self.spec, self.fn = base, spec, load(spec)
        self.name = base.name
        self.answer_format = f"what {spec} reads"

    def train(self) -> list[Problem]:
        return self.base.train()

    def heldout(self) -> list[Problem]:
        return self.base.heldout()

    def extract(self, completion: str) -> str | None:  # the function reads its own answers
        return None

    def is_correct(self, problem: Problem, extracted: str) -> bool | None:
        return None

    def call(self, problem: Problem, completion: str):
        return self.fn(data_source=problem.source, solution_str=completion,
                       ground_truth=problem.answer,
                       extra_info=json.loads(problem.extra) if problem.extra else None)

    def score(self, problem: Problem, completion: str) -> Verdict:
        out = self.call(problem, completion)
        reward, extras, parsed = self.reading(out)
        return Verdict(reward=reward, parsed=parsed, extracted=None, extras=extras)

    def reading(self, out) -> tuple[float, tuple, bool]:
        """(reward, (key, value) pairs of the other numbers, parsed) of one return value;
        ValueError for anything else, or a reward out of the range."""
        extras, parsed = (), True
        if isinstance(out, dict):
            if "score" not in out:
                raise ValueError(f"{self.spec} returned a dict without 'score': {out!r:.120}")
            parsed = bool(out.get("parsed", True))
            extras = tuple(sorted((str(k), float(v)) for k, v in out.items()
                                  if k not in ("score", "parsed") and _number(v)))
            out = out["score"]
        if not _number(out) or not math.isfinite(float(out)):
            raise ValueError(f"{self.spec} returned {out!r:.80}: not a finite number")
        r_lo, r_hi = self.rewards
        if not r_lo <= float(out) <= r_hi:
            raise ValueError(f"{self.spec} returned {float(out)}, outside the task's reward "
                             f"range [{r_lo}, {r_hi}] (task.reward_low, task.reward_high)")
        return float(out), extras, parsed


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check(task: RewardFunctionTask) -> None:
    """The preflight check (module docstring); ValueError naming the row and what is wrong."""
    r_lo, r_hi = task.rewards
    rows = task.train()[:CHECK_ROWS] + task.heldout()[:CHECK_ROWS]
    for p in rows:
        try:
            right = max(task.reading(task.call(p, form.format(p.answer)))[0] for form in RIGHT)
            empty = task.reading(task.call(p, ""))[0]
        except Exception as err:  # noqa: BLE001 - the user's function: say what it did
            raise ValueError(f"task.reward_function {task.spec} on problem {p.id}: "
                             f"{type(err).__name__}: {err}") from None
        if right != r_hi or empty != r_lo:
            raise ValueError(
                f"task.reward_function {task.spec} on problem {p.id}: the ground truth "
                f"written as an answer got {right} at best and an empty answer {empty}, where "
                f"the task's range is [{r_lo}, {r_hi}]: set task.reward_low={empty:g} and "
                f"task.reward_high={right:g} if those are its rewards")
