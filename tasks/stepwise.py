"""Repeated addition or subtraction written out step by step: the CPU default reasoning task.

A prompt asks to apply ``+d`` (or ``-d``) ``k`` times to a two-digit start value ``x``; values
wrap around like a two-digit counter (modulo 100). The completion is a trace of ``k`` lines,
each led by the number of steps left, then a delimited final answer::

    prompt       "37+8 x5\\n"
    completion   "5: 37+8=45\\n4: 45+8=53\\n3: 53+8=61\\n2: 61+8=69\\n1: 69+8=77\\nanswer: 77"

Every value is written with two digits, so each line has the same layout and a step is one
small fact (units digit, carry) that a tiny character-level model can learn. What makes a
problem hard is its number of steps, since a slip anywhere spoils the answer: ``k`` sets the
difficulty level (``LEVELS``) and the response length (11-12 characters per step, one token
per character).

The warm-start data (``sample_trace`` with a ``slip_rate``) mixes correct traces with traces
that make plausible slips: a dropped carry or borrow, a units digit off by one, a skipped or
repeated count of the steps left. The trace then carries on consistently from the slip, as a
person's worked solution would, so its answer is wrong. A policy that imitates this mixture
knows the procedure but samples slips; RL's job is to make every step reliable (docs/task.md).

The train / held-out split is a fixed function of the prompt text (``tasks.splits``), not of
the seed, as in ``tasks.arithmetic``.
"""
from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from tasks import splits
from tasks.base import GeneratedTask, Problem


@dataclass(frozen=True)
class LevelSpec:
    """Step count ``k`` in ``steps`` (inclusive); every start value, step size and sign."""

    steps: tuple[int, int]


# Step counts grow about geometrically, so that with levels spread evenly the response
# lengths have a long tail (the longest 5% about 3.8x the median; tests/unit/test_stepwise.py).
LEVELS: dict[int, LevelSpec] = {
    1: LevelSpec(steps=(1, 2)),     # 21-32 characters; 3,200 problems in all
    2: LevelSpec(steps=(3, 4)),     # 43-54; 3,200
    3: LevelSpec(steps=(5, 10)),    # 65-131; 9,600
    4: LevelSpec(steps=(11, 20)),   # 142-241; 16,000
}
MODULUS = 100        # two-digit values that wrap around: 97+8=05, 03-8=95
STEP_SIZES = range(2, 10)
OPS = "+-"
HELDOUT_FRACTION = 0.2
SPLIT_SALT = "v05rl-stepwise-split-v1"
ANSWER_PREFIX = "answer: "
# Slips of the warm-start traces, drawn uniformly among those that apply at a step.
SLIPS = ("carry", "units", "skip", "repeat")
# Longest correct completion, in characters (= tokens): k = 20 lines + the answer line.
MAX_TRACE_CHARS = 11 * 12 + 9 * 11 + len(ANSWER_PREFIX) + 2

_PROMPT_RE = re.compile(r"(\d\d)([+-])(\d) x(\d+)\n")
_ANSWER_RE = re.compile(re.escape(ANSWER_PREFIX) + r"(-?\d+)")


@dataclass(frozen=True)
class Spec:
    """One problem: apply ``op d`` to ``x``, ``k`` times (modulo ``MODULUS``)."""

    x: int
    op: str
    d: int
    k: int

    @property
    def prompt(self) -> str:
        return f"{self.x:02d}{self.op}{self.d} x{self.k}\n"

    @property
    def answer(self) -> int:
        return (self.x + (self.k * self.d if self.op == "+" else -self.k * self.d)) % MODULUS


def parse_prompt(prompt: str) -> Spec:
    m = _PROMPT_RE.fullmatch(prompt)
    if m is None:
        raise ValueError(f"not a stepwise prompt: {prompt!r}")
    return Spec(x=int(m[1]), op=m[2], d=int(m[3]), k=int(m[4]))


def is_heldout(prompt: str) -> bool:
    """The fixed split: a salted hash of the prompt text, independent of any seed."""
    return splits.is_heldout(prompt, SPLIT_SALT, HELDOUT_FRACTION)


def level_of(k: int) -> int:
    for level, spec in LEVELS.items():
        if spec.steps[0] <= k <= spec.steps[1]:
            return level
    raise ValueError(f"no level has {k} steps")


def make_problem(spec: Spec) -> Problem:
    return Problem(id=f"stepwise/{spec.prompt.strip()}", prompt=spec.prompt,
                   answer=f"{spec.answer:02d}", difficulty=level_of(spec.k))


def sample_spec(rng: random.Random, level: int) -> Spec:
    lo, hi = LEVELS[level].steps
    return Spec(x=rng.randrange(MODULUS), op=rng.choice(OPS), d=rng.choice(STEP_SIZES),
                k=rng.randint(lo, hi))


def step_value(a: int, op: str, d: int) -> int:
    """The value after one step from ``a``."""
    return (a + d if op == "+" else a - d) % MODULUS


def units_carry(a: int, op: str, d: int) -> bool:
    """Whether the units column carries (``+``) or borrows (``-``); ``d`` has one digit."""
    return (a % 10 + d >= 10) if op == "+" else (a % 10 < d)


def sample_trace(spec: Spec, rng: random.Random | None = None,
                 slip_rate: float = 0.0) -> tuple[str, int]:
    """A completion for ``spec`` (without EOS) and the number of slips in it (0: correct).

    Each step slips with probability ``slip_rate`` (needs ``rng``); the kind is drawn
    uniformly among the ``SLIPS`` that apply there, and later steps continue from what was
    written.
    """
    if slip_rate > 0 and rng is None:
        raise ValueError("a slip_rate > 0 needs an rng")
    lines, a, left, slips = [], spec.x, spec.k, 0
    repeated = False  # at most one repeated count per trace, to bound its length
    while left > 0:
        b, nxt = step_value(a, spec.op, spec.d), left - 1
        if slip_rate > 0 and rng.random() < slip_rate:
            kind = rng.choice([s for s in SLIPS if _applies(s, a, spec, left, repeated)])
            slips += 1
            if kind == "carry":  # the units column carried (borrowed) and it was dropped
                b = (b - 10 if spec.op == "+" else b + 10) % MODULUS
            elif kind == "units":
                b = (b + rng.choice((-1, 1))) % MODULUS
            elif kind == "skip":  # a count skipped: one step too few
                nxt = left - 2
            else:  # "repeat": a count written twice: one step too many
                nxt, repeated = left, True
        lines.append(f"{left}: {a:02d}{spec.op}{spec.d}={b:02d}\n")
        a, left = b, nxt
    return "".join(lines) + f"{ANSWER_PREFIX}{a:02d}", slips


def _applies(kind: str, a: int, spec: Spec, left: int, repeated: bool) -> bool:
    if kind == "carry":
        return units_carry(a, spec.op, spec.d)
    if kind == "skip":
        return left >= 2
    if kind == "repeat":
        return not repeated
    return True  # "units"


def reference_trace(problem: Problem) -> str:
    """The correct completion of ``problem`` (without EOS)."""
    return sample_trace(parse_prompt(problem.prompt))[0]


@lru_cache(maxsize=None)
def _pool(level: int, heldout: bool) -> tuple[Spec, ...]:
    """Every problem of a level on one side of the split (at most 16,000: enumerated)."""
    lo, hi = LEVELS[level].steps
    specs = (Spec(x, op, d, k) for k, x, op, d in
             itertools.product(range(lo, hi + 1), range(MODULUS), OPS, STEP_SIZES))
    return tuple(s for s in specs if is_heldout(s.prompt) == heldout)


def build_split(seed: int, n: int, difficulties: Sequence[int], heldout: bool) -> list[Problem]:
    """``n`` distinct problems spread evenly over ``difficulties``, shuffled (deterministic)."""
    levels = splits.check_levels(difficulties, LEVELS)
    key = f"stepwise-{seed}-{'heldout' if heldout else 'train'}"
    return splits.draw_split(key, n, {lv: _pool(lv, heldout) for lv in levels}, heldout,
                             lambda s, level: make_problem(s))


def train_stream(seed: int, difficulties: Sequence[int] = tuple(LEVELS)) -> Iterator[Problem]:
    """An endless stream of train-side problems (levels uniform, repeats allowed), for warm starts."""
    levels = splits.check_levels(difficulties, LEVELS)
    rng = random.Random(f"stepwise-{seed}-stream")
    while True:
        spec = sample_spec(rng, rng.choice(levels))
        if not is_heldout(spec.prompt):
            yield make_problem(spec)


class StepwiseTask(GeneratedTask):
    """Repeated +d / -d with a written trace; the verifier reads the completion's last line,
    which must be ``answer: <integer>`` (anything else is unparsed)."""

    name = "stepwise"
    answer_format = "an answer line ending the completion"
    levels, default_n_train = LEVELS, 4000
    build_split = staticmethod(build_split)

    def extract(self, completion: str) -> str | None:
        # The answer line must end the completion: a trace cut off by max_tokens, or one that
        # goes on after its answer, has no final answer.
        last = completion.rstrip().rsplit("\n", 1)[-1].strip()
        m = _ANSWER_RE.fullmatch(last)
        return m[1] if m else None
