"""Math datasets as verl and OpenRLHF users have them, checked with the ``math_verify`` package.

The dataset is a Parquet, JSON-lines or JSON file, or a ``save_to_disk`` directory, read
through the Hugging Face ``datasets`` library (``tasks/datafile.py``). Two columns matter,
named by dotted paths into nested structs as OpenRLHF's ``--input_key`` / ``--label_key`` do:

- ``prompt_key`` (default ``prompt``): a string, taken as is, or verl's chat messages
  ``[{"role": "user", "content": ...}, ...]``. One user turn is the prompt text; any other
  conversation keeps its turns (``Problem.messages``) for the generator's chat template, and
  its text is the contents joined by a blank line.
- ``answer_key`` (default: ``reward_model.ground_truth``, verl's layout, when the file has
  that column, else ``answer``): a non-empty string or number.

Optional: ``id`` (else verl's ``extra_info.index``, else FILE-STEM:LINE or FILE-STEM:ROW) and
an integer ``difficulty``. Every other column (``data_source``, ``ability``, ...) is ignored.
A key that is not a column names the file and its columns; a bad row names the file, the row
(the line, for JSON lines) and the column. Two rows with one id and different prompts are an
error; rows that repeat a prompt are kept once.

The completion's final answer is read and graded by ``tasks.grading``: by default the last
of the markers models write (``\\boxed{...}``, an ``Answer: ...`` line, ``#### ...``, "The
answer is ...", ``<answer>`` tags), compared by ``math_verify`` (so 1/2, 0.5 and
\\frac{1}{2} agree); ``grading: strict`` is verl's math_dapo rule, ``flexible`` the last
number. A row's ``data_source`` column picks its grader from ``grading_by_source``. No
answer, or one the grader cannot interpret, scores ``r_lo`` with ``parsed=False``.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from tasks.base import Problem, Task
from tasks.datafile import Table, json_type, read_table
from tasks.grading import Grader

# verl's layout first; the flat shape {"prompt": ..., "answer": ...} otherwise.
ANSWER_KEYS = ("reward_model.ground_truth", "answer")
_MISSING = object()


def check_key(key: str, field: str) -> str:
    """A dotted column path: non-empty parts, no surrounding spaces."""
    if not key or any(not part or part != part.strip() for part in key.split(".")):
        raise ValueError(f"{field} {key!r} must be a column name, or a dotted path into a "
                         "nested column (e.g. reward_model.ground_truth)")
    return key


def lookup(row: dict, key: str):
    """The value at dotted ``key`` in ``row``; ``_MISSING`` when a part is absent or null."""
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            return _MISSING
        value = value[part]
    return value


def _messages(prompt: list) -> tuple[tuple[str, str], ...]:
    turns = []
    for n, m in enumerate(prompt, 1):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) \
                or not isinstance(m.get("role"), str):
            raise ValueError(f"message {n} of {len(prompt)} needs a string 'role' and a string "
                             f"'content', got {m!r:.80}")
        turns.append((m["role"], m["content"]))
    return tuple(turns)


def prompt_of(value) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(text, turns) of a prompt cell: a string, or a list of chat messages."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("a blank string")
        return value, ()
    if not isinstance(value, list):
        raise ValueError(f"must be a string or a list of chat messages, got {json_type(value)}")
    if not value:
        raise ValueError("an empty list of messages")
    turns = _messages(value)
    text = "\n\n".join(c for _, c in turns)
    if not text.strip():
        raise ValueError("blank: every message's 'content' is empty")
    return text, (() if len(turns) == 1 and turns[0][0] == "user" else turns)


def answer_of(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"must be a string or a number, got {json_type(value)}")
    if not str(value).strip():
        raise ValueError("a blank string")
    return str(value).strip()


def _cell(row: dict, key: str, parse):
    value = lookup(row, key)
    if value is _MISSING:
        raise ValueError(f"column {key!r}: missing or null")
    try:
        return parse(value)
    except ValueError as e:
        raise ValueError(f"column {key!r}: {e}") from None


def parse_row(row: dict, prompt_key: str, answer_key: str, default_id: str) -> Problem:
    """One row -> Problem; raises ValueError naming the column and what is wrong."""
    text, turns = _cell(row, prompt_key, prompt_of)
    answer = _cell(row, answer_key, answer_of)
    pid = lookup(row, "id")
    pid = lookup(row, "extra_info.index") if pid is _MISSING else pid
    difficulty = lookup(row, "difficulty")
    difficulty = 0 if difficulty is _MISSING else difficulty
    if isinstance(difficulty, bool) or not isinstance(difficulty, int):
        raise ValueError(f"column 'difficulty': must be an integer, got {difficulty!r}")
    source, extra = lookup(row, "data_source"), lookup(row, "extra_info")
    return Problem(id=default_id if pid is _MISSING else str(pid), prompt=text, answer=answer,
                   difficulty=difficulty, messages=turns,
                   source="" if source is _MISSING else str(source),
                   extra="" if not isinstance(extra, dict) else json.dumps(extra, sort_keys=True,
                                                                          default=str))


def _no_problems(table: Table) -> ValueError:
    return ValueError(f"{table.path}: no problems in file (it is empty"
                      + (" or holds only blank lines)" if table.lines is not None else ")"))


def resolve_keys(table: Table, prompt_key: str, answer_key: str | None) -> tuple[str, str]:
    """The (prompt, answer) columns; a key that is not a column names the file's columns."""
    if not table.columns:
        raise _no_problems(table)
    if answer_key is None:
        answer_key = next((k for k in ANSWER_KEYS if k in table.columns), None)
        if answer_key is None:
            raise ValueError(f"{table.path}: no answer column (tried {', '.join(ANSWER_KEYS)}; "
                             "set task.answer_key); its columns: "
                             f"{', '.join(table.columns) or '(none)'}")
    for field, key in (("task.prompt_key", prompt_key), ("task.answer_key", answer_key)):
        if key not in table.columns:
            raise ValueError(f"{table.path}: {field} {key!r} is not a column; its columns: "
                             f"{', '.join(table.columns) or '(none)'}")
    return prompt_key, answer_key


def load_problems(path: str | Path, prompt_key: str = "prompt",
                  answer_key: str | None = None) -> list[Problem]:
    """The distinct problems of the dataset at ``path``, in file order (a row that repeats
    an earlier row's prompt is skipped: verl's DAPO-Math-17k parquet holds each prompt about
    100 times). A bad row raises ValueError naming the file, the row and the column."""
    table = read_table(path, [prompt_key, *([answer_key] if answer_key else ANSWER_KEYS),
                              "id", "extra_info", "difficulty", "data_source"])
    prompt_key, answer_key = resolve_keys(table, prompt_key, answer_key)
    kept: dict[str, Problem] = {}  # prompt -> its first problem
    first_row: dict[str, int] = {}  # id of a kept problem -> its row
    stem = Path(path).name.split(".")[0]
    for i, row in enumerate(table.rows):
        try:
            p = parse_row(row, prompt_key, answer_key, f"{stem}:{table.number(i)}")
        except ValueError as e:
            raise ValueError(f"{table.where(i)}: {table.not_an_object(i) or e}") from None
        if p.prompt in kept:
            continue
        if p.id in first_row:
            raise ValueError(f"{table.where(i)}: duplicate id {p.id!r} with another prompt "
                             f"(first at {table.where(first_row[p.id])})")
        first_row[p.id] = i
        kept[p.prompt] = p
    if not kept:
        raise _no_problems(table)
    return list(kept.values())


class MathTask(Task):
    """Problems from a dataset file (see the module docstring), scored with math_verify.

    Prompts are de-duplicated by text. With ``heldout_path`` the two files are the splits
    (held-out prompts are removed from train); without it, ``n_heldout`` distinct prompts of
    ``path`` are held out at random (by ``seed``). ``n_train`` caps the train split. The files
    are read on the first ``train()`` or ``heldout()`` (the launcher's preflight asks for both,
    so a bad file is said before any actor starts; verifier worker processes never read them).
    """

    name = "math"
    slow_verifier = True  # math_verify: scored in worker processes, each with a deadline

    def __init__(self, path: str | Path, heldout_path: str | Path | None = None, seed: int = 0,
                 n_train: int | None = None, n_heldout: int = 200,
                 reward_low: float = -1.0, reward_high: float = 1.0,
                 prompt_key: str = "prompt", answer_key: str | None = None,
                 grading: str = "default", grading_by_source: dict | None = None):
        super().__init__(reward_low, reward_high)
        self.grader = Grader(grading)
        self.by_source = {s: Grader(g) for s, g in (grading_by_source or {}).items()}
        self.path, self.heldout_path, self.seed = path, heldout_path, seed
        self.n_train, self.n_heldout = n_train, n_heldout
        self.keys = (check_key(prompt_key, "prompt_key"),
                     None if answer_key is None else check_key(answer_key, "answer_key"))
        self._splits: tuple[list[Problem], list[Problem]] | None = None

    def _split(self) -> tuple[list[Problem], list[Problem]]:
        if self._splits is not None:
            return self._splits
        path, heldout_path, n_heldout = self.path, self.heldout_path, self.n_heldout
        problems = load_problems(path, *self.keys)
        if heldout_path is not None:
            heldout = load_problems(heldout_path, *self.keys)[:n_heldout]
        else:
            if not 1 <= n_heldout < len(problems):
                raise ValueError(f"n_heldout={n_heldout} (task.n_heldout) must be in [1, "
                                 f"{len(problems)}): {path} holds {len(problems)} distinct "
                                 "prompts, and at least one must be left to train on")
            heldout = random.Random(self.seed).sample(problems, n_heldout)
        held = {p.prompt for p in heldout}
        train = [p for p in problems if p.prompt not in held]
        if not train:
            raise ValueError(f"{path}: no train problems left after removing the held-out ones"
                             + (f" (every prompt is also in {heldout_path})" if heldout_path
                                is not None else ""))
        self._splits = (train[:self.n_train] if self.n_train is not None else train, heldout)
        return self._splits

    def train(self) -> list[Problem]:
        return list(self._split()[0])

    def heldout(self) -> list[Problem]:
        return list(self._split()[1])

    @property
    def answer_format(self) -> str:
        return self.grader.answer_format

    def grader_of(self, problem: Problem) -> Grader:
        """The grader of ``problem``'s ``data_source`` (``grading_by_source``), else the
        task's (``grading``)."""
        return self.by_source.get(problem.source, self.grader)

    def extract(self, completion: str) -> str | None:
        return self.grader.extract(completion)

    def answer_of(self, problem: Problem, completion: str) -> str | None:
        return self.grader_of(problem).extract(completion)

    def is_correct(self, problem: Problem, extracted: str) -> bool | None:
        return self.grader_of(problem).is_correct(problem.answer, extracted)
