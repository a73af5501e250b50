"""JSONL math datasets (DAPO-Math-17k shape) checked with the ``math_verify`` package.

Accepted records, one UTF-8 JSON object per line (blank lines are skipped; any other bad line
fails naming the file and line):

- DAPO shape: ``{"prompt": [{"role": "user", "content": ...}, ...],
  "reward_model": {"ground_truth": ...}, "extra_info": {"index": ...}}``; the prompt text is
  the messages' contents joined by a blank line (the roles are dropped: ``Problem.prompt`` is
  one string; chat templating is the generator's business).
- Flat shape: ``{"prompt": str, "answer": str}`` (optional ``"id"``, ``"difficulty"``).

The completion's final answer is the last ``\\boxed{...}``, else the last ``Answer: ...``
line (the DAPO instruction), and it is compared with the ground truth by
``math_verify.verify`` (so 1/2, 0.5 and \\frac{1}{2} agree). No such answer, or one that
``math_verify`` cannot parse, scores ``r_lo`` with ``parsed=False``.
"""
from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from tasks.base import Problem, Task

# As DAPO's own verifier: the text after the last "Answer:" on its line (case-insensitive).
_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


# JSON's names for what json.loads returns, for messages about a line's shape.
_JSON_TYPE = {dict: "an object", list: "an array", str: "a string", int: "a number",
              float: "a number", bool: "a boolean", type(None): "null"}


def _prompt_text(prompt) -> str:
    if isinstance(prompt, str) and prompt.strip():
        return prompt
    if isinstance(prompt, list) and prompt:
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt):
            raise ValueError("every prompt message needs a string 'content'")
        text = "\n\n".join(m["content"] for m in prompt)
        if not text.strip():
            raise ValueError("'prompt' is blank: every message's 'content' is empty")
        return text
    raise ValueError("'prompt' must be a non-empty string or a non-empty list of messages")


def _ground_truth(obj: dict) -> str:
    if "reward_model" in obj:
        rm = obj["reward_model"]
        if not isinstance(rm, dict) or "ground_truth" not in rm:
            raise ValueError("'reward_model' must be an object with a 'ground_truth'")
        gt = rm["ground_truth"]
    elif "answer" in obj:
        gt = obj["answer"]
    else:
        raise ValueError("missing answer: need 'reward_model.ground_truth' or 'answer'")
    if isinstance(gt, bool) or not isinstance(gt, (str, int, float)) or not str(gt).strip():
        raise ValueError(f"ground truth must be a non-empty string or number, got {gt!r}")
    return str(gt).strip()


def parse_record(obj, default_id: str) -> Problem:
    """One JSON object -> Problem; raises ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        got = _JSON_TYPE.get(type(obj), type(obj).__name__)
        raise ValueError(f"expected a JSON object, got {got}")
    if "prompt" not in obj:
        raise ValueError("missing field 'prompt'")
    extra = obj.get("extra_info") if isinstance(obj.get("extra_info"), dict) else {}
    pid = obj.get("id", extra.get("index", default_id))
    difficulty = obj.get("difficulty", 0)
    if isinstance(difficulty, bool) or not isinstance(difficulty, int):
        raise ValueError(f"'difficulty' must be an integer, got {difficulty!r}")
    return Problem(id=str(pid), prompt=_prompt_text(obj["prompt"]), answer=_ground_truth(obj),
                   difficulty=difficulty)


def load_jsonl(path: str | Path) -> list[Problem]:
    """All problems of a JSONL file; a bad line raises ValueError naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"math_jsonl dataset not found: {path}")
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    with path.open("rb") as f:  # decoded per line, so that bad bytes are named by line
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not UTF-8 text (byte {raw[e.start]:#04x} "
                                 f"at column {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                p = parse_record(json.loads(line), default_id=f"{path.stem}:{line_no}")
            except ValueError as e:  # json.JSONDecodeError is a ValueError too
                raise ValueError(f"{path}:{line_no}: {e}") from None
            if p.id in first_line:
                raise ValueError(f"{path}:{line_no}: duplicate id {p.id!r} "
                                 f"(first on line {first_line[p.id]})")
            first_line[p.id] = line_no
            problems.append(p)
    if not problems:
        raise ValueError(f"{path}: no problems in file (it is empty or holds only blank lines)")
    return problems


def _dedupe(problems: Sequence[Problem]) -> list[Problem]:
    seen: dict[str, Problem] = {}
    for p in problems:
        seen.setdefault(p.prompt, p)
    return list(seen.values())


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


class MathJsonlTask(Task):
    """Problems from a JSONL file, scored with math_verify.

    Prompts are de-duplicated by text. With ``heldout_path`` the two files are the splits
    (held-out prompts are removed from train); without it, ``n_heldout`` distinct prompts of
    ``path`` are held out at random (by ``seed``). ``n_train`` caps the train split.
    """

    name = "math_jsonl"

    def __init__(self, path: str | Path, heldout_path: str | Path | None = None, seed: int = 0,
                 n_train: int | None = None, n_heldout: int = 200,
                 reward_low: float = -1.0, reward_high: float = 1.0):
        super().__init__(reward_low, reward_high)
        problems = _dedupe(load_jsonl(path))
        if heldout_path is not None:
            heldout = _dedupe(load_jsonl(heldout_path))[:n_heldout]
        else:
            if not 1 <= n_heldout < len(problems):
                raise ValueError(f"n_heldout={n_heldout} (task.n_heldout) must be in [1, "
                                 f"{len(problems)}): {path} holds {len(problems)} distinct "
                                 "prompts, and at least one must be left to train on")
            heldout = random.Random(seed).sample(problems, n_heldout)
        held = {p.prompt for p in heldout}
        train = [p for p in problems if p.prompt not in held]
        if not train:
            raise ValueError(f"{path}: no train problems left after removing the held-out ones"
                             + (f" (every prompt is also in {heldout_path})" if heldout_path
                                is not None else ""))
        self._train = train[:n_train] if n_train is not None else train
        self._heldout = heldout

    def train(self) -> list[Problem]:
        return list(self._train)

    def heldout(self) -> list[Problem]:
        return list(self._heldout)

    def extract(self, completion: str) -> str | None:
        return extract_answer(completion)

    def is_correct(self, problem: Problem, extracted: str) -> bool | None:
        return answers_match(problem.answer, extracted)
