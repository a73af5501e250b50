"""The arithmetic task's embedded policy: warm-started on bare answers (2-5 tokens).

Supervised training (teacher forcing, loss on the answer and EOS) on the arithmetic train
stream, kept short so that held-out accuracy starts in a middle range that falls with
difficulty. Registered in ``tasks.policy.POLICIES`` under ``"arithmetic"``.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

from tasks import arithmetic
from tasks.base import Problem
from tasks.policy_model import DEFAULT_ARCH, EOS, PAD, vocab

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


def encode_batch(problems: Sequence[Problem]):
    """Arithmetic warm start: teacher-forcing tensors for prompt + answer + EOS, loss on the answer and EOS only.

    Returns input_ids, attention_mask, labels, each (B, T) with right padding; labels are
    -100 on the prompt and the padding.
    """
    import torch

    v = vocab()
    seqs, labels = [], []
    for p in problems:
        prompt = [v[c] for c in p.prompt]
        answer = [v[c] for c in p.answer] + [v[EOS]]
        seqs.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    t = max(map(len, seqs))
    ids = torch.tensor([s + [v[PAD]] * (t - len(s)) for s in seqs])
    lab = torch.tensor([s + [-100] * (t - len(s)) for s in labels])
    mask = (torch.arange(t)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]).long()
    return ids, mask, lab


def _lr_at(step: int, recipe: dict) -> float:
    """Linear warmup, then cosine decay from lr to min_lr."""
    if step < recipe["warmup_steps"]:
        return recipe["lr"] * (step + 1) / recipe["warmup_steps"]
    frac = (step - recipe["warmup_steps"]) / max(1, recipe["steps"] - recipe["warmup_steps"])
    return recipe["min_lr"] + 0.5 * (recipe["lr"] - recipe["min_lr"]) * (1 + math.cos(math.pi * frac))


def warm_start(model, recipe: dict, log: Callable[[str], None]) -> float:
    """Arithmetic: AdamW with teacher forcing on the train stream; returns the last loss."""
    import torch

    stream = arithmetic.train_stream(recipe["seed"], recipe["difficulties"])
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"],
                            weight_decay=recipe["weight_decay"])
    model.train()
    t0, loss_avg = time.time(), None
    for step in range(recipe["steps"]):
        ids, mask, labels = encode_batch([next(stream) for _ in range(recipe["batch_size"])])
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, recipe)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_avg = loss.item() if loss_avg is None else 0.9 * loss_avg + 0.1 * loss.item()
        if step % 100 == 0 or step == recipe["steps"] - 1:
            log(f"step {step + 1}/{recipe['steps']} loss {loss_avg:.3f} "
                f"elapsed {time.time() - t0:.1f}s")
    model.eval()
    return float(loss_avg)
