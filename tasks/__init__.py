"""Datasets and verifiers: a registry of tasks keyed by name, and their typed config.

``make_task("stepwise", seed=1)`` or ``make_task_from_config(TaskConfig(...))``. Importing
this package pulls in neither torch nor math_verify (the math verifier imports lazily).

Tasks: ``stepwise`` (the default: repeated +d/-d written out as a reasoning trace, with an
embedded policy that RL can improve), ``arithmetic`` (bare answers of 2-5 tokens),
``word_arithmetic`` (questions in plain English for a pretrained chat model) and ``math``
(a dataset file as verl and OpenRLHF users have one: Parquet or JSON lines, verl's column
layout or any columns named by ``prompt_key``/``answer_key``; ``math_jsonl`` is its earlier
name). Embedded policies: ``tasks.policy``. Neither ``datasets`` nor pyarrow is imported here:
the math task reads its file on first use.
"""
from __future__ import annotations


from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.arithmetic import ArithmeticTask
from tasks.base import GeneratedTask, Problem, Task, Verdict, check_rewards
from tasks.math_task import MathTask, check_key
from tasks.stepwise import StepwiseTask
from tasks.word_arithmetic import WordArithmeticTask

TASKS: dict[str, type[Task]] = {
    StepwiseTask.name: StepwiseTask,
    ArithmeticTask.name: ArithmeticTask,
    WordArithmeticTask.name: WordArithmeticTask,
    MathTask.name: MathTask,
    "math_jsonl": MathTask,  # the math task's earlier name (JSONL only then): configs keep it
}
# The tasks that read a dataset file (task.path).
DATASET_TASKS = ("math", "math_jsonl")
# The task of the CPU default run, and of the policy that ``tasks.policy.ensure_default_policy``
# builds when no task is named.
DEFAULT_TASK = StepwiseTask.name
# The generated tasks: each checks its own levels (their numbers differ in meaning).
_GENERATED = {n: t for n, t in TASKS.items() if issubclass(t, GeneratedTask)}


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
        "(bare answers), 'word_arithmetic' (plain-English questions for a pretrained chat "
        "model) or 'math' (a dataset file: Parquet, JSON lines, a save_to_disk directory; "
        "'math_jsonl' is its earlier name)."))
    seed: int = Field(0, description="Seed of the problem sampling / held-out selection.")
    n_train: int | None = Field(None, ge=1, description=(
        "Number of train problems; None = the task's default (stepwise: 4000, arithmetic: 800, "
        "word_arithmetic: 800, math: all)."))
    n_heldout: int = Field(200, ge=1, description="Number of held-out evaluation problems.")
    reward_low: float = Field(-1.0, description="Reward of a wrong or unparseable answer (r_lo).")
    reward_high: float = Field(1.0, description="Reward of a correct answer (r_hi).")
    difficulties: list[int] = Field(default_factory=lambda: [1, 2, 3, 4], description=(
        "stepwise, arithmetic and word_arithmetic: difficulty levels to draw problems from, "
        "spread evenly (1 = easiest). stepwise: the number of steps, 1: 1-2, 2: 3-4, 3: 5-10, "
        "4: 11-20; arithmetic: operand digits and operators (tasks/arithmetic.py LEVELS); "
        "word_arithmetic: 1 addition, 2 multiplication, 3 subtraction, 4 story problems (one-digit "
        "numbers), 5 addition and 6 subtraction of two-digit numbers."))
    path: str | None = Field(None, description=(
        "math: the dataset (train split): a .parquet, .jsonl or .json file (optionally "
        ".gz/.bz2/.xz/.zst), or a directory written by datasets' save_to_disk; local, never "
        "fetched from the hub."))
    heldout_path: str | None = Field(None, description=(
        "math: optional held-out dataset, as `path`; without it n_heldout prompts of `path` "
        "are held out."))
    prompt_key: str = Field("prompt", description=(
        "math: the prompt column (OpenRLHF's --input_key); a dotted path reaches into a nested "
        "column. Its cells are strings, taken as is, or chat messages [{role, content}, ...] "
        "(verl's layout), rendered with the model's chat template when it has one."))
    grading: Literal["default", "strict", "flexible"] = Field("default", description=(
        "math: how a completion's final answer is read and graded (tasks/grading.py). "
        "default: the last of \\boxed{...}, an 'Answer:' line, '#### ...', 'The answer is "
        "...' and <answer> tags, compared by math_verify; strict: verl's math_dapo rule (the "
        "last 'Answer:' line of the last 300 characters, Minerva-normalized, equal as text: "
        "curves comparable with a verl DAPO run); flexible: the last number written (verl's "
        "GSM8K flexible, for small models that ignore a format instruction)."))
    grading_by_source: dict[str, Literal["default", "strict", "flexible"]] = Field(
        default_factory=dict, description=(
            "math: a grader per dataset source, for rows that carry verl's data_source column "
            "(e.g. {openai/gsm8k: flexible, math_dapo: strict}); other rows get `grading`."))
    reward_function: str | None = Field(None, description=(
        "FILE.py:FUNCTION, a reward function in verl's signature (data_source, solution_str, "
        "ground_truth, extra_info) -> float or dict with 'score' (tasks/reward_function.py) "
        "that replaces the task's verifier in every process that scores (coordinator, scoring "
        "workers, evaluation); the file relative to the launch directory or absolute. Its "
        "rewards must span [reward_low, reward_high]: checked at launch on the first rows."))
    answer_key: str | None = Field(None, description=(
        "math: the ground-truth column (OpenRLHF's --label_key), e.g. 'answer' or "
        "'reward_model.ground_truth'; None: 'reward_model.ground_truth' (verl's layout) when "
        "the file has it, else 'answer'. Strings or numbers."))

    @field_validator("name")
    @classmethod
    def _known_name(cls, v: str) -> str:
        if v not in TASKS:
            raise ValueError(f"unknown task {v!r}; valid names: {sorted(TASKS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "TaskConfig":
        check_rewards(self.reward_low, self.reward_high)
        if self.name in _GENERATED:
            _GENERATED[self.name].check_difficulties(self.difficulties)
        if self.name in DATASET_TASKS and self.path is None:
            raise ValueError(f"task {self.name!r} needs `path` (a .parquet, .jsonl or .json "
                             "file, or a save_to_disk directory)")
        check_key(self.prompt_key, "task.prompt_key")
        if self.reward_function is not None:
            from tasks.reward_function import split_spec
            split_spec(self.reward_function)
        if self.answer_key is not None:
            check_key(self.answer_key, "task.answer_key")
        return self

    def check_files(self) -> None:
        """The datasets exist, in a format the task reads. Checked when the task is built (at
        launch, before any actor starts), not at parse time, so a config for another machine
        still parses. Their rows are checked when the task first reads them (preflight)."""
        from tasks.datafile import check_source

        for field in ("path", "heldout_path"):
            p = getattr(self, field)
            if p is not None:
                try:
                    check_source(p)
                except ValueError as err:
                    raise ValueError(f"task.{field}: {err}") from None


def make_task_from_config(cfg: TaskConfig) -> Task:
    task = _dataset_task(cfg)
    if cfg.reward_function is None:
        return task
    from tasks.reward_function import RewardFunctionTask
    return RewardFunctionTask(task, cfg.reward_function)


def _dataset_task(cfg: TaskConfig) -> Task:
    cfg.check_files()
    common = dict(seed=cfg.seed, n_heldout=cfg.n_heldout,
                  reward_low=cfg.reward_low, reward_high=cfg.reward_high)
    if cfg.name in _GENERATED:
        return make_task(cfg.name, difficulties=tuple(cfg.difficulties), n_train=cfg.n_train,
                         **common)
    return make_task(cfg.name, path=cfg.path, heldout_path=cfg.heldout_path,
                     n_train=cfg.n_train, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key,
                     grading=cfg.grading, grading_by_source=dict(cfg.grading_by_source),
                     **common)


__all__ = ["DATASET_TASKS", "DEFAULT_TASK", "TASKS", "Problem", "Task", "TaskConfig", "Verdict",
           "make_task", "make_task_from_config", "ArithmeticTask", "MathTask", "StepwiseTask",
           "WordArithmeticTask"]
