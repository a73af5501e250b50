"""The loss of one packed micro-batch: model forward (log-probs only) + ``policy_loss``.

Shared by the learner rank (``learner/worker.py``, ``model`` = its DeepSpeed engine around a
``LogprobModel``) and the tests (``model`` = a bare ``LogprobModel``), so that the packed
path the tests compare against the padded reference is the one the learner runs.
"""
from __future__ import annotations

from learner.batch import PackedBatch
from learner.config import LearnerConfig
from learner.loss import LossOutputs


def packed_loss(model, b: PackedBatch, cfg: LearnerConfig, normalizer: float,
                ref_model=None) -> LossOutputs:
    """policy_loss of micro-batch ``b`` (already on the model's device) as one row: B = 1,
    T = its K response tokens. ``normalizer``: the GLOBAL token (or response) count."""
    import torch

    from learner.loss import LossInputs, policy_loss

    args = (b.input_ids, b.position_ids, b.positions, b.targets)
    logp, entropy = model(*args)  # (K,) each
    ref = None
    if ref_model is not None:
        with torch.no_grad():
            ref = ref_model(*args, with_entropy=False)[0][None]
    # decoupled: pi_prox = the weights before this update = the weights of this forward
    # (the learner takes one optimiser step per batch), so its log-probs are ours, detached.
    prox = logp.detach()[None] if cfg.objective == "decoupled" else None
    inputs = LossInputs(logprobs=logp[None], behaviour_logprobs=b.behaviour_logprobs[None],
                        advantages=b.advantages[None], mask=b.mask[None], ref_logprobs=ref,
                        entropy=entropy[None], proximal_logprobs=prox,
                        segment_ids=b.segment_ids[None])
    return policy_loss(inputs, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                       kl_coef=cfg.kl_coef, aggregation=cfg.aggregation,
                       normalizer=float(normalizer), objective=cfg.objective,
                       tis_cap=cfg.tis_cap, dual_clip=cfg.dual_clip)
