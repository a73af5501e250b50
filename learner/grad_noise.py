"""The gradient's noise-to-signal (``optim.grad_noise``; issue 29): the batch's prompts in two
halves (``learner.batch.prompt_halves``), each half's gradient scaled by its share of the
loss normaliser to an estimate of the batch's gradient, and

    noise_to_signal = |g_A - g_B|^2 / |(g_A + g_B) / 2|^2

the squared distance between the two estimates relative to the squared norm of their mean.
It falls as the advantages' noise falls at a fixed batch (a better baseline), unlike the
variance over steps of the gradient norm, which follows the norm's drift. The worker copies
its gradient after the first half's micro-batches (``flat_grad``) and reads the whole one
after the last; this module holds the arithmetic (torch, no DeepSpeed)."""
from __future__ import annotations

import math


def flat_grad(params):
    """Every trainable parameter's gradient (zeros where none yet), flattened into one
    float64 CPU vector (a copy)."""
    import torch

    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach()
                      .reshape(-1).double().cpu() for p in params if p.requires_grad])


def noise_to_signal(g_a, g, share_a: float) -> float:
    """``g_a``: the first half's gradient, ``g``: the batch's (both over the batch's
    normaliser), ``share_a``: the first half's share of that normaliser. NaN when a half is
    empty or the mean gradient is 0."""
    import torch

    if not 0.0 < share_a < 1.0:
        return math.nan
    est_a, est_b = g_a / share_a, (g - g_a) / (1.0 - share_a)
    signal = float(torch.sum(((est_a + est_b) / 2) ** 2))
    return float(torch.sum((est_a - est_b) ** 2)) / signal if signal > 0 else math.nan


def plan_halves(samples, plan, aggregation: str):
    """The micro-batches of the two prompt halves, the first half's first: (micro-batches,
    how many hold the first half, the first half's size in the normaliser's unit: response
    tokens for ``token_mean``, non-empty responses for ``seq_mean``). ``plan``: the worker's
    micro-batch planner. The worker then ends the list with at least one filler, so that the
    first half's gradient is read before the last micro-batch's backward, which reduces
    across ranks."""
    from learner.batch import prompt_halves

    a, b = prompt_halves(samples)
    first = plan(a)
    size_a = (sum(len(s.token_ids) for s in a) if aggregation == "token_mean"
              else sum(1 for s in a if s.token_ids))
    return first + plan(b), len(first), size_a
