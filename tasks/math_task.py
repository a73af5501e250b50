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

The completion's final answer is the last ``\\boxed{...}``, else the last ``Answer: ...``
line (the DAPO instruction), and it is compared with the ground truth by
``math_verify.verify`` (so 1/2, 0.5 and \\frac{1}{2} agree). No such answer, or one that
``math_verify`` cannot parse, scores ``r_lo`` with ``parsed=False``.
"""
from __future__ import annotations

import random
import re
import threading
from functools import lru_cache
from pathlib import Path

from tasks.base import Problem, Task
from tasks.datafile import Table, json_type, read_table

# As DAPO's own verifier: the text after the last "Answer:" on its line (case-insensitive).
_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
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
    return Problem(id=default_id if pid is _MISSING else str(pid), prompt=text, answer=answer,
                   difficulty=difficulty, messages=turns)


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
                              "id", "extra_info", "difficulty"])
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


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (balanced braces), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip() or None
    return None


def extract_answer(completion: str) -> str | None:
    """The final answer: last \\boxed{...}, else the last "Answer: ..." line, else None."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    lines = _ANSWER_LINE.findall(completion)
    if not lines:
        return None
    ans = lines[-1].strip().strip("*").strip().rstrip(".").strip()  # "**Answer:** 5."
    ans = ans[1:-1].strip() if len(ans) >= 2 and ans[0] == ans[-1] == "$" else ans
    return ans or None


def _timeout() -> int | None:
    # math_verify's timeouts use SIGALRM, which only the main thread may install.
    return 5 if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=65536)
def _parse(text: str) -> tuple:
    """math_verify parse of a bare answer; tried as LaTeX math first, then as plain text."""
    from math_verify import parse

    # no_fallback: text math_verify cannot interpret yields [] instead of the raw string.
    kw = dict(fallback_mode="no_fallback", parsing_timeout=_timeout())
    return tuple(parse(f"${text}$", **kw) or parse(text, **kw))


def answers_match(gold: str, answer: str) -> bool | None:
    """math_verify equivalence; None when ``answer`` cannot be parsed."""
    from math_verify import verify

    pred = _parse(answer)
    if not pred:
        return None
    ref = _parse(gold)
    if not ref:  # an unparseable ground truth (free text): fall back to exact text
        return " ".join(gold.split()) == " ".join(answer.split())
    return bool(verify(list(ref), list(pred), timeout_seconds=_timeout()))


class MathTask(Task):
    """Problems from a dataset file (see the module docstring), scored with math_verify.

    Prompts are de-duplicated by text. With ``heldout_path`` the two files are the splits
    (held-out prompts are removed from train); without it, ``n_heldout`` distinct prompts of
    ``path`` are held out at random (by ``seed``). ``n_train`` caps the train split. The files
    are read on the first ``train()`` or ``heldout()`` (the launcher's preflight asks for both,
    so a bad file is said before any actor starts; verifier worker processes never read them).
    """

    name = "math"
    answer_format = "the last \\boxed{...}, else the last 'Answer: ...' line"
    slow_verifier = True  # math_verify: scored in worker processes, each with a deadline

    def __init__(self, path: str | Path, heldout_path: str | Path | None = None, seed: int = 0,
                 n_train: int | None = None, n_heldout: int = 200,
                 reward_low: float = -1.0, reward_high: float = 1.0,
                 prompt_key: str = "prompt", answer_key: str | None = None):
        super().__init__(reward_low, reward_high)
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

    def extract(self, completion: str) -> str | None:
        return extract_answer(completion)

    def is_correct(self, problem: Problem, extracted: str) -> bool | None:
        return answers_match(problem.answer, extracted)
