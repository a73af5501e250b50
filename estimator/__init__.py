"""The V0.5 baseline estimator (pure NumPy). See shared/design/estimator.md and docs/estimator.md."""
from estimator.core import (DEFAULT_COST, DEFAULT_REWARDS, Fusion, bernoulli_sigma2, fuse,
                            noise_bound, prob_to_reward, reward_to_prob, should_continue)
from estimator.registry import (ESTIMATORS, Estimator, EstimatorConfig, GroupResult,
                                make_estimator)
from estimator.state import PromptState

__all__ = ["DEFAULT_COST", "DEFAULT_REWARDS", "ESTIMATORS", "Estimator", "EstimatorConfig",
           "Fusion", "GroupResult", "PromptState", "bernoulli_sigma2", "fuse", "make_estimator",
           "noise_bound", "prob_to_reward", "reward_to_prob", "should_continue"]
