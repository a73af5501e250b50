"""Held-out accuracy per unit of compute, mode against mode (python -m bench.learning):
curves over wall-clock, rollouts and trained tokens, and V0.5 against GRPO-16 and GRPO-4."""
from bench.learning.analysis import (final_stats, first_reach, mean_curve, prior_quality,
                                     read_curve, summarise, zero_advantage_share)

__all__ = ["final_stats", "first_reach", "mean_curve", "prior_quality", "read_curve",
           "summarise", "zero_advantage_share"]
