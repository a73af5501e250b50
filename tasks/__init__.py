"""Datasets and verifiers: a registry of tasks keyed by name, and their typed config.

``make_task("stepwise", seed=1)`` or ``make_task_from_config(TaskConfig(...))``. Importing
this package pulls in neither torch nor math_verify (the math verifier imports lazily).

Tasks: ``stepwise`` (the default: repeated +d/-d written out as a reasoning trace, with an
embedded policy that RL can improve), ``arithmetic`` (bare answers of 2-5 tokens) and
``math_jsonl`` (DAPO-Math-17k-shaped files). Embedded policies: ``tasks.policy``.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks import stepwise
from tasks.arithmetic import ArithmeticTask, check_difficulties
from tasks.base import Problem, Task, Verdict, check_rewards
from tasks.math_jsonl import MathJsonlTask
from tasks.stepwise import StepwiseTask

TASKS: dict[str, type[Task]] = {
    StepwiseTask.name: StepwiseTask,
    ArithmeticTask.name: ArithmeticTask,
    MathJsonlTask.name: MathJsonlTask,
}
# The task of the CPU default run, and of the policy that ``tasks.policy.ensure_default_policy``
# builds when no task is named.
DEFAULT_TASK = StepwiseTask.name
# The levels of the synthetic tasks; each checks its own (their numbers differ in meaning).
_LEVEL_CHECKS = {ArithmeticTask.name: check_difficulties,
                 StepwiseTask.name: stepwise.check_difficulties}


def make_task(name: str, **kwargs) -> Task:
    """Instantiate the task registered as ``name`` with its constructor's keyword arguments."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid names: {sorted(TASKS)}")
    return TASKS[name](**kwargs)


class TaskConfig(BaseModel):
    """Which dataset and verifier to train and evaluate on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(DEFAULT_TASK, description=(
        "Registered task name: 'stepwise' (reasoning traces, the CPU default), 'arithmetic' "
        "(bare answers) or 'math_jsonl'."))
    seed: int = Field(0, description="Seed of the problem sampling / held-out selection.")
    n_train: int | None = Field(None, ge=1, description=(
        "Number of train problems; None = the task's default (stepwise: 4000, arithmetic: 800, "
        "math_jsonl: all)."))
    n_heldout: int = Field(200, ge=1, description="Number of held-out evaluation problems.")
    reward_low: float = Field(-1.0, description="Reward of a wrong or unparseable answer (r_lo).")
    reward_high: float = Field(1.0, description="Reward of a correct answer (r_hi).")
    difficulties: list[int] = Field(default_factory=lambda: [1, 2, 3, 4], description=(
        "stepwise and arithmetic: difficulty levels to draw problems from, spread evenly "
        "(1 = easiest). stepwise: the number of steps, 1: 1-2, 2: 3-4, 3: 5-10, 4: 11-20; "
        "arithmetic: operand digits and operators (tasks/arithmetic.py LEVELS)."))
    path: str | None = Field(None, description="math_jsonl: the JSONL dataset (train split).")
    heldout_path: str | None = Field(None, description=(
        "math_jsonl: optional JSONL held-out split; without it n_heldout prompts of `path` are held out."))

    @field_validator("name")
    @classmethod
    def _known_name(cls, v: str) -> str:
        if v not in TASKS:
            raise ValueError(f"unknown task {v!r}; valid names: {sorted(TASKS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "TaskConfig":
        check_rewards(self.reward_low, self.reward_high)
        if self.name in _LEVEL_CHECKS:
            _LEVEL_CHECKS[self.name](self.difficulties)
        if self.name == "math_jsonl":
            if self.path is None:
                raise ValueError("task 'math_jsonl' needs `path` (a JSONL file)")
        return self

    def check_files(self) -> None:
        """The dataset files exist. Checked when the task is built (at launch, before any
        actor starts), not at parse time, so a config for another machine still parses."""
        for field in ("path", "heldout_path"):
            p = getattr(self, field)
            if p is not None and Path(p).is_dir():
                raise ValueError(f"task.{field}: {p} is a directory, not a dataset file")
            if p is not None and not Path(p).is_file():
                raise ValueError(f"task.{field}: dataset file {p} does not exist")


def make_task_from_config(cfg: TaskConfig) -> Task:
    cfg.check_files()
    common = dict(seed=cfg.seed, n_heldout=cfg.n_heldout,
                  reward_low=cfg.reward_low, reward_high=cfg.reward_high)
    if cfg.name in _LEVEL_CHECKS:
        extra = {"n_train": cfg.n_train} if cfg.n_train is not None else {}
        return make_task(cfg.name, difficulties=tuple(cfg.difficulties), **extra, **common)
    return make_task("math_jsonl", path=cfg.path, heldout_path=cfg.heldout_path,
                     n_train=cfg.n_train, **common)


__all__ = ["DEFAULT_TASK", "TASKS", "Problem", "Task", "TaskConfig", "Verdict", "make_task",
           "make_task_from_config", "ArithmeticTask", "MathJsonlTask", "StepwiseTask"]
