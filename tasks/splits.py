"""Seed-independent train / held-out splits and even spreads over difficulty levels.

Shared by the generated tasks (``tasks.arithmetic``, ``tasks.stepwise``,
``tasks.word_arithmetic``): a problem's side of
the split is a salted hash of its prompt text, so a prompt held out under one seed is held out
under every seed, and a warm-started policy never trains on a held-out problem.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Collection, Mapping, Sequence


def is_heldout(prompt: str, salt: str, fraction: float) -> bool:
    """Whether ``prompt`` is on the held-out side: a salted hash of its text below ``fraction``."""
    h = hashlib.blake2b((salt + prompt).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0 ** 64 < fraction


def spread_evenly(n: int, caps: Mapping[int, int], side: str) -> dict[int, int]:
    """Split ``n`` evenly over the levels of ``caps`` (level -> most problems it has); a level
    with fewer problems than its share gives them all and the rest is spread over the others.
    Raises ValueError naming ``side`` when the levels together have fewer than ``n``."""
    levels = list(caps)
    quotas = dict.fromkeys(levels, 0)
    left, open_ = n, list(levels)
    while left and open_:
        base, extra = divmod(left, len(open_))
        for i, lv in enumerate(open_):
            give = min(base + (i < extra), caps[lv] - quotas[lv])
            quotas[lv] += give
            left -= give
        open_ = [lv for lv in open_ if quotas[lv] < caps[lv]]
    if left:
        raise ValueError(f"difficulties {levels} have only {n - left} distinct {side} "
                         f"problems, {n} requested")
    return quotas


def check_levels(difficulties: Sequence[int], levels: Collection[int]) -> tuple[int, ...]:
    """``difficulties`` as a tuple when they are distinct members of ``levels`` (a task's
    level numbers); else ValueError naming the valid ones."""
    chosen = tuple(difficulties)
    bad = [d for d in chosen if d not in levels]
    if not chosen or bad or len(set(chosen)) != len(chosen):
        raise ValueError(f"difficulties must be distinct levels from {sorted(levels)}, "
                         f"got {list(chosen)}")
    return chosen


def draw_split(key: str, n: int, pools: Mapping[int, Sequence], heldout: bool,
               make: Callable[[object, int], object]) -> list:
    """``n`` distinct problems spread evenly over the levels of ``pools`` (level -> that side's
    specs, in a fixed order), each made by ``make(spec, level)``, shuffled; deterministic in
    ``key`` (a task's name for the seed and side of the split)."""
    rng = random.Random(key)
    side = "held-out" if heldout else "train"
    out = []
    for level, q in spread_evenly(n, {lv: len(pool) for lv, pool in pools.items()},
                                  side).items():
        out += [make(spec, level) for spec in rng.sample(pools[level], q)]
    rng.shuffle(out)
    return out
