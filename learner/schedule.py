"""The learning-rate schedule: a pure function of the optimiser-update count.

Update s (0-based: the s-th update actually applied) uses::

    s <  W             lr * (s + 1) / W                  linear warm-up (W = lr_warmup_steps)
    s >= W, constant   lr
    s >= W, cosine     lr_min + (lr - lr_min) * (1 + cos(pi * min(1, (s - W) / D))) / 2

with D = lr_decay_steps. The first update already moves (lr / W, not 0). The learner keeps
s in its checkpoint (``learner_step``), so a restored run continues the schedule.
"""
from __future__ import annotations

import math

from learner.config import LearnerConfig


def lr_at(cfg: LearnerConfig, step: int) -> float:
    """Learning rate of optimiser update ``step`` (0-based)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    warm = cfg.lr_warmup_steps
    if step < warm:
        return cfg.lr * (step + 1) / warm
    if cfg.lr_schedule == "constant":
        return cfg.lr
    progress = min(1.0, (step - warm) / cfg.lr_decay_steps)
    return cfg.lr_min + (cfg.lr - cfg.lr_min) * 0.5 * (1.0 + math.cos(math.pi * progress))
