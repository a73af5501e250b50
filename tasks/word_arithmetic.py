"""Arithmetic questions in plain English, for a small pretrained chat model.

A prompt is one question a person might type, sent through the model's chat template::

    prompt       "What is the product of 7 and 6?"
    completion   "The product of 7 and 6 is 42."            (free text; graded: 42)

Six families of question, each a difficulty level (numbered by family, not by measured
difficulty; docs/task.md has the measured success rates):

- level 1, addition of one-digit numbers ("What is 4 + 5?", "Add 4 and 5.");
- level 2, multiplication of one-digit numbers ("What is 7 times 6?");
- level 3, subtraction of one-digit numbers, never below zero ("Subtract 3 from 8.");
- level 4, a story problem that adds two one-digit counts ("Mia has 4 pencils. She gets 5
  more. How many pencils does she have now?");
- level 5, addition of two-digit numbers ("What is 47 + 38?");
- level 6, subtraction of two-digit numbers, never below zero ("Subtract 38 from 47.").

Levels 5 and 6 are nearly beyond a 135M model at the start (``python -m bench.level_rates``
measures each level's success rate: docs/benchmarks.md): in a mix with them many groups of 4
rollouts are all wrong, as many of a
4B model's groups are all right or all wrong on DAPO-Math, the regime where choosing which
prompts get rollouts can pay (configs/smollm2-135m.yaml draws all six; the task's default is
levels 1-4).

Every family has several phrasings, so a level holds prompts of different difficulty for the
same arithmetic (a spread within the level, not only between levels).

The verifier reads the **last number** the completion writes (verl's "flexible" GSM8K rule:
a model that restates the question and then answers ends on its answer) and compares it with
the true value; a completion with no number is unparsed (the low reward). A rambling answer
that ends on another number is wrong, so RL has a clear thing to teach: answer, then stop.

The train / held-out split is a fixed function of the prompt text (``tasks.splits``), not of
the seed, as in the other generated tasks.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from tasks import splits
from tasks.base import GeneratedTask, Problem

DIGITS = range(10)
TWO_DIGITS = range(10, 100)

ADD = ("What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}.",
       "What is the sum of {a} and {b}?")
MUL = ("What is {a} times {b}?", "What is {a} multiplied by {b}?", "Multiply {a} by {b}.",
       "What is the product of {a} and {b}?")
SUB = ("What is {a} - {b}?", "What is {a} minus {b}?", "Subtract {b} from {a}.",
       "What is {a} take away {b}?")
STORY = ("{name} has {a} {things}. {they} gets {b} more. How many {things} does {them} have now?",
         "{name} had {a} {things} and bought {b} more. How many {things} does {name} have?")
NAMES = (("Tom", "He", "he"), ("Mia", "She", "she"), ("Sam", "He", "he"), ("Ana", "She", "she"),
         ("Ben", "He", "he"), ("Lily", "She", "she"), ("Omar", "He", "he"), ("Zoe", "She", "she"))
THINGS = ("apples", "pencils", "books", "marbles", "stickers", "cookies", "shells", "cards")


@dataclass(frozen=True)
class Level:
    """One family of questions: its phrasings and how ``(a, b)`` are drawn and combined."""

    what: str
    pairs: Callable[[], list[tuple[int, int]]]
    value: Callable[[int, int], int]


LEVELS: dict[int, Level] = {
    1: Level("addition", lambda: [(a, b) for a in DIGITS for b in DIGITS], lambda a, b: a + b),
    2: Level("multiplication", lambda: [(a, b) for a in range(1, 10) for b in range(1, 10)],
             lambda a, b: a * b),
    3: Level("subtraction", lambda: [(a, b) for a in DIGITS for b in DIGITS if a >= b],
             lambda a, b: a - b),
    4: Level("story addition", lambda: [(a, b) for a in range(1, 10) for b in range(1, 10)],
             lambda a, b: a + b),
    5: Level("two-digit addition", lambda: [(a, b) for a in TWO_DIGITS for b in TWO_DIGITS],
             lambda a, b: a + b),
    6: Level("two-digit subtraction",
             lambda: [(a, b) for a in TWO_DIGITS for b in TWO_DIGITS if a >= b],
             lambda a, b: a - b),
}
PHRASINGS = {1: ADD, 2: MUL, 3: SUB, 5: ADD, 6: SUB}  # level 4: STORY, with names and things
SUBTRACTIONS = (3, 6)
HELDOUT_FRACTION = 0.2
SPLIT_SALT = "v05rl-word-arithmetic-split-v1"
# The last number written: an optional minus sign, digits with optional thousands commas,
# an optional decimal part ("42", "-3", "1,000", "6.0").
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _questions(level: int) -> list[str]:
    """Every question of ``level``, in a fixed order."""
    pairs = LEVELS[level].pairs()
    if level != 4:
        return [t.format(a=a, b=b) for t in PHRASINGS[level] for a, b in pairs]
    return [t.format(a=a, b=b, name=name, they=they, them=them, things=things)
            for t, (name, they, them), things in itertools.product(STORY, NAMES, THINGS)
            for a, b in pairs]


_OPERANDS = re.compile(r"\d+")


def make_problem(question: str, level: int) -> Problem:
    a, b = (int(x) for x in _OPERANDS.findall(question)[:2])
    if level in SUBTRACTIONS and question.startswith("Subtract"):
        a, b = b, a  # "Subtract {b} from {a}." names the subtrahend first
    return Problem(id=f"word-arithmetic/{question}", prompt=question,
                   answer=str(LEVELS[level].value(a, b)), difficulty=level)


def is_heldout(prompt: str) -> bool:
    """The fixed split: a salted hash of the prompt text, independent of any seed."""
    return splits.is_heldout(prompt, SPLIT_SALT, HELDOUT_FRACTION)


@lru_cache(maxsize=None)
def _pool(level: int, heldout: bool) -> tuple[str, ...]:
    return tuple(q for q in _questions(level) if is_heldout(q) == heldout)


def build_split(seed: int, n: int, difficulties: Sequence[int], heldout: bool) -> list[Problem]:
    """``n`` distinct problems spread evenly over ``difficulties``, shuffled (deterministic)."""
    levels = splits.check_levels(difficulties, LEVELS)
    key = f"word-arithmetic-{seed}-{'heldout' if heldout else 'train'}"
    return splits.draw_split(key, n, {lv: _pool(lv, heldout) for lv in levels}, heldout,
                             make_problem)


class WordArithmeticTask(GeneratedTask):
    """Plain-English arithmetic questions; the verifier grades the last number written."""

    name = "word_arithmetic"
    answer_format = "the last number written"
    levels, default_levels, default_n_train = LEVELS, (1, 2, 3, 4), 800
    build_split = staticmethod(build_split)

    def extract(self, completion: str) -> str | None:
        found = _NUMBER_RE.findall(completion)
        return found[-1].replace(",", "") if found else None
