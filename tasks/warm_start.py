"""The supervised warm start that both embedded policies share (``tasks/arithmetic_policy.py``,
``tasks/stepwise_policy.py``): AdamW with teacher forcing on a policy's own batches, at its
own learning-rate schedule, the gradient norm clipped to 1. Each policy supplies its data,
its schedule and its optimiser constants (from its hashed ``RECIPE``); the loop is the same.

torch is imported only when a batch is padded or a model trained.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from tasks.policy_model import PAD, vocab


def collate(batch: Sequence[tuple[list[int], list[int]]]):
    """input_ids, attention_mask, labels, each (B, T), right-padded (labels -100 there)."""
    import torch

    pad = vocab()[PAD]
    t = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([s + [pad] * (t - len(s)) for s, _ in batch])
    labels = torch.tensor([lab + [-100] * (t - len(lab)) for _, lab in batch])
    mask = (torch.arange(t)[None, :] < torch.tensor([len(s) for s, _ in batch])[:, None]).long()
    return ids, mask, labels


def train(model, recipe: dict, batches: Iterator, lr_at: Callable[[int, dict], float],
          log: Callable[[str], None], *, loss_weight: float, **adamw) -> float:
    """``recipe["steps"]`` AdamW steps (lr ``lr_at(step, recipe)``, weight decay
    ``recipe["weight_decay"]``, ``adamw``: other AdamW options such as ``betas``) on
    ``collate``d ``batches``; returns the last loss, smoothed (an exponential average in
    which each new loss weighs ``loss_weight``). Leaves ``model`` in eval mode."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"],
                            weight_decay=recipe["weight_decay"], **adamw)
    model.train()
    t0, loss_avg = time.time(), None
    for step in range(recipe["steps"]):
        ids, mask, labels = collate(next(batches))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_avg = loss.item() if loss_avg is None else (
            (1 - loss_weight) * loss_avg + loss_weight * loss.item())
        if step % 100 == 0 or step == recipe["steps"] - 1:
            log(f"step {step + 1}/{recipe['steps']} loss {loss_avg:.3f} "
                f"elapsed {time.time() - t0:.1f}s")
    model.eval()
    return float(loss_avg)
