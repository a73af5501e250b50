"""Synthetic integer arithmetic with graded difficulty: the CPU default task.

A prompt is an expression followed by "=", e.g. ``"12+7*3="``; the expected completion is the
integer value under the usual precedence (``"33"``) followed by EOS. The prompt is kept this
short because the default policy is a tiny character-level model.

Difficulty levels mix operand digits, operator set and chain length (see ``LEVELS``).

The train / held-out split is a fixed function of the prompt text (a salted hash), not of the
seed: a problem is held out for every seed, so the warm-started default policy
(``tasks/policy.py``) never trains on any held-out problem, whatever seed a run uses.
"""
from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from tasks import splits
from tasks.base import GeneratedTask, Problem


def _operand_range(digits: int) -> range:
    return range(10) if digits == 1 else range(10 ** (digits - 1), 10 ** digits)


@dataclass(frozen=True)
class LevelSpec:
    """Operand i has exactly ``digits[i]`` digits (1 digit: 0-9), uniformly; one operator from
    ``ops`` between consecutive operands. Exact digit counts keep the levels disjoint."""

    digits: tuple[int, ...]
    ops: str

    @property
    def n_ops(self) -> int:
        return len(self.digits) - 1

    def universe_size(self) -> int:
        return math.prod(len(_operand_range(d)) for d in self.digits) * len(self.ops) ** self.n_ops


# Ordered by how hard they are for the tiny char-level default policy (measured after its
# warm start, see tasks/policy.py): one-digit facts; precedence; carries; a 2x2-digit product.
LEVELS: dict[int, LevelSpec] = {
    1: LevelSpec(digits=(1, 1), ops="+-"),       # "7-8="      200 problems in all
    2: LevelSpec(digits=(1, 1, 1), ops="+-*"),   # "3+4*7="    9,000
    3: LevelSpec(digits=(2, 2), ops="+-"),       # "47-38="    16,200
    4: LevelSpec(digits=(2, 2), ops="*"),        # "47*38="    8,100
}
HELDOUT_FRACTION = 0.2
SPLIT_SALT = "v05rl-arith-split-v1"
# Universes up to this size are enumerated (exact, no rejection loop); larger ones are sampled.
_ENUMERATE_MAX = 10_000
_INT_RE = re.compile(r"[+-]?\d+")


def evaluate(expr: str) -> int:
    """Value of an expression of non-negative integers and + - * with the usual precedence."""
    tokens = re.findall(r"\d+|[+\-*]", expr)
    if "".join(tokens) != expr or not tokens or len(tokens) % 2 == 0:
        raise ValueError(f"not an arithmetic expression: {expr!r}")
    # Fold "*" into the running term, then sum the signed terms (left to right).
    total, sign, term = 0, 1, int(tokens[0])
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            term *= int(num)
        else:
            total += sign * term
            sign, term = (1 if op == "+" else -1), int(num)
    return total + sign * term


def is_heldout(prompt: str) -> bool:
    """The fixed split: a salted hash of the prompt text, independent of any seed."""
    return splits.is_heldout(prompt, SPLIT_SALT, HELDOUT_FRACTION)


def make_problem(expr: str, level: int) -> Problem:
    prompt = expr + "="
    return Problem(id=f"arith/{expr}", prompt=prompt, answer=str(evaluate(expr)), difficulty=level)


def sample_expr(rng: random.Random, spec: LevelSpec) -> str:
    parts = [str(rng.choice(_operand_range(spec.digits[0])))]
    for d in spec.digits[1:]:
        parts += [rng.choice(spec.ops), str(rng.choice(_operand_range(d)))]
    return "".join(parts)


def _enumerate(spec: LevelSpec) -> Iterator[str]:
    nums = [[str(i) for i in _operand_range(d)] for d in spec.digits]
    pieces = [nums[0]]
    for n in nums[1:]:
        pieces += [spec.ops, n]
    for combo in itertools.product(*pieces):
        yield "".join(combo)


@lru_cache(maxsize=None)
def _pool(level: int, heldout: bool) -> tuple[str, ...] | None:
    """Every expression of a small level on one side of the split; None for large levels."""
    spec = LEVELS[level]
    if spec.universe_size() > _ENUMERATE_MAX:
        return None
    return tuple(e for e in _enumerate(spec) if is_heldout(e + "=") == heldout)


def _level_problems(rng: random.Random, level: int, n: int, heldout: bool) -> list[Problem]:
    """``n`` distinct problems of one level from one side of the split."""
    pool = _pool(level, heldout)
    if pool is not None:  # exact: no rejection loop on a small universe
        return [make_problem(e, level) for e in rng.sample(pool, n)]
    seen: dict[str, None] = {}  # insertion-ordered set, for determinism
    while len(seen) < n:
        e = sample_expr(rng, LEVELS[level])
        if is_heldout(e + "=") == heldout:
            seen[e] = None
    return [make_problem(e, level) for e in seen]


def _quotas(n: int, levels: Sequence[int], heldout: bool) -> dict[int, int]:
    """Split ``n`` evenly over ``levels``; a level with fewer distinct problems than its share
    gives them all and the rest is spread over the other levels."""
    caps = {lv: len(p) if (p := _pool(lv, heldout)) is not None else n for lv in levels}
    return splits.spread_evenly(n, caps, "held-out" if heldout else "train")


def build_split(seed: int, n: int, difficulties: Sequence[int], heldout: bool) -> list[Problem]:
    """``n`` distinct problems spread over ``difficulties``, shuffled (deterministic)."""
    rng = random.Random(f"{seed}-{'heldout' if heldout else 'train'}")
    out: list[Problem] = []
    for level, k in _quotas(n, difficulties, heldout).items():
        out += _level_problems(rng, level, k, heldout)
    rng.shuffle(out)
    return out


def train_stream(seed: int, difficulties: Sequence[int] = tuple(LEVELS)) -> Iterator[Problem]:
    """An endless stream of train-side problems (levels uniform, repeats allowed), for warm starts."""
    levels = splits.check_levels(difficulties, LEVELS)
    rng = random.Random(f"{seed}-stream")
    while True:
        level = rng.choice(levels)
        e = sample_expr(rng, LEVELS[level])
        if not is_heldout(e + "="):
            yield make_problem(e, level)


class ArithmeticTask(GeneratedTask):
    """Integer arithmetic; the verifier reads an integer on the completion's first line."""

    name = "arithmetic"
    answer_format = "an integer alone on the first line"
    levels, default_n_train = LEVELS, 800
    build_split = staticmethod(build_split)

    def extract(self, completion: str) -> str | None:
        # The policy ends its answer with EOS; anything after a newline is ignored.
        line = completion.strip().split("\n", 1)[0].strip()
        return line if _INT_RE.fullmatch(line) else None
