"""The arithmetic task's embedded policy: warm-started on bare answers (2-5 tokens).

Supervised training (teacher forcing, loss on the answer and EOS) on the arithmetic train
stream, kept short so that held-out accuracy starts in a middle range that falls with
difficulty. Registered in ``tasks.policy.POLICIES`` under ``"arithmetic"``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict

from tasks import arithmetic
from tasks.base import Problem
from tasks.policy_model import DEFAULT_ARCH, EOS, vocab
from tasks.warm_start import train

# Every constant that changes the built weights. Any change here (or in the architecture,
# vocabulary, difficulty levels or split) changes the hash, so the cache rebuilds. Bump
# `version` when the training code itself changes.
RECIPE = dict(
    version=1,
    seed=1,
    steps=1500,
    batch_size=64,
    lr=1e-3,
    min_lr=1e-4,
    warmup_steps=50,
    weight_decay=0.01,
    difficulties=[1, 2, 3, 4],
    # One thread: bitwise-reproducible on a given torch build, and much faster than two OpenMP
    # threads when the two cores are shared with other processes (measured 3-8x).
    threads=1,
)
ARCH = DEFAULT_ARCH
MAX_TOKENS = 8  # the longest answer (4 characters: "9801") and EOS, with room


def facts() -> dict:
    """The task's side of the recipe hash (the keys of the single-policy days: cached builds
    from then stay valid)."""
    return dict(levels={k: asdict(v) for k, v in arithmetic.LEVELS.items()},
                split=[arithmetic.SPLIT_SALT, arithmetic.HELDOUT_FRACTION])


def examples(problems: Iterable[Problem]) -> list[tuple[list[int], list[int]]]:
    """Teacher forcing on bare answers: (input ids, labels) of prompt + answer + EOS, the
    loss on the answer and EOS only (labels -100 on the prompt; ``tasks.warm_start.collate``
    pads them)."""
    v = vocab()
    out = []
    for p in problems:
        prompt = [v[c] for c in p.prompt]
        answer = [v[c] for c in p.answer] + [v[EOS]]
        out.append((prompt + answer, [-100] * len(prompt) + answer))
    return out


def batches(recipe: dict) -> Iterator[list[tuple[list[int], list[int]]]]:
    """The warm start's batches in order: ``batch_size`` problems each from one seeded
    stream of train-side problems."""
    stream = arithmetic.train_stream(recipe["seed"], recipe["difficulties"])
    while True:
        yield examples([next(stream) for _ in range(recipe["batch_size"])])


def _lr_at(step: int, recipe: dict) -> float:
    """Linear warmup, then cosine decay from lr to min_lr."""
    if step < recipe["warmup_steps"]:
        return recipe["lr"] * (step + 1) / recipe["warmup_steps"]
    frac = (step - recipe["warmup_steps"]) / max(1, recipe["steps"] - recipe["warmup_steps"])
    return recipe["min_lr"] + 0.5 * (recipe["lr"] - recipe["min_lr"]) * (1 + math.cos(math.pi * frac))


def warm_start(model, recipe: dict, log: Callable[[str], None]) -> float:
    """Arithmetic: AdamW (torch's default betas) with teacher forcing on ``batches(recipe)``
    (``tasks.warm_start.train``); returns the last loss."""
    return train(model, recipe, batches(recipe), _lr_at, log, loss_weight=0.1)
