"""The learning-rate schedule (learner/schedule.py) on hand-computed values."""
from __future__ import annotations

import math

import pytest

from learner.config import LearnerConfig
from learner.schedule import lr_at


def test_constant_without_warmup():
    cfg = LearnerConfig(lr=3e-5)
    assert [lr_at(cfg, s) for s in (0, 1, 1000)] == [3e-5] * 3


def test_linear_warmup_then_constant():
    cfg = LearnerConfig(lr=1e-4, lr_warmup_steps=4)
    assert [lr_at(cfg, s) for s in range(6)] == pytest.approx(
        [2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4, 1e-4])


def test_cosine_decay_to_min():
    cfg = LearnerConfig(lr=1e-4, lr_warmup_steps=2, lr_schedule="cosine", lr_decay_steps=4,
                        lr_min=1e-5)
    got = [lr_at(cfg, s) for s in range(9)]
    cos = lambda p: 1e-5 + 9e-5 * 0.5 * (1 + math.cos(math.pi * p))  # noqa: E731
    assert got == pytest.approx([5e-5, 1e-4, cos(0), cos(0.25), cos(0.5), cos(0.75), 1e-5,
                                 1e-5, 1e-5])
    assert got[2] == pytest.approx(1e-4) and got[4] == pytest.approx(5.5e-5)


def test_negative_step_rejected():
    with pytest.raises(ValueError, match="step"):
        lr_at(LearnerConfig(), -1)
