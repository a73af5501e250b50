"""The starting policies of the controlled study (``python -m bench.learning --start NAME``).

    warm   the default run's embedded policy (``model.path: embedded``): it knows the procedure
           (greedy decoding solves nearly every held-out problem) and samples slips; RL makes
           the correct procedure reliable.
    weak   the same recipe stopped early (WEAK_STEPS of its 1400 steps, the learning-rate
           schedule scaled with it): the per-step arithmetic is only partly learned, greedy
           held-out accuracy in the 0.3-0.7 range, so RL has to improve what the policy can
           do, not only how reliably it samples it. Built once and cached like the embedded
           policy (bit-identical when rebuilt; its own recipe hash).
"""
from __future__ import annotations

WEAK_STEPS = 660


def weak_recipe() -> dict:
    from tasks.stepwise_policy import RECIPE

    return {**RECIPE, "steps": WEAK_STEPS}


def weak_policy() -> str:
    from tasks.policy import ensure_default_policy

    return str(ensure_default_policy(task="stepwise", recipe=weak_recipe()))


STARTS = {"warm": lambda: "embedded", "weak": weak_policy}
