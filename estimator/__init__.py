"""The V0.5 baseline estimator (pure NumPy). See docs/estimator.md."""
from estimator.core import (DEFAULT_COST, DEFAULT_K_MAX, DEFAULT_REWARDS, Fusion,
                            bernoulli_sigma2, fuse, noise_bound, plan_batched, prob_to_reward,
                            reward_to_prob, should_continue)
from estimator.registry import (ESTIMATORS, PLANS, Estimator, EstimatorConfig, GroupResult,
                                make_estimator)
from estimator.state import PromptState

__all__ = ["DEFAULT_COST", "DEFAULT_K_MAX", "DEFAULT_REWARDS", "ESTIMATORS", "PLANS",
           "Estimator", "EstimatorConfig", "Fusion", "GroupResult", "PromptState",
           "bernoulli_sigma2", "fuse", "make_estimator", "noise_bound", "plan_batched",
           "prob_to_reward", "reward_to_prob", "should_continue"]
