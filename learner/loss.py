"""The token-level clipped policy-gradient loss: a pure function on typed tensors.

torch only (no DeepSpeed, Ray or model): tests check it against a slow loop reference.

Shapes: B responses, T token positions (already aligned so that position t of every
tensor refers to the same response token; see ``learner/batch.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

# log-ratios beyond this are clamped before exp (as verl does): e^20 is far outside any clip
# range, and an unclamped exp overflows to inf, whose backward turns a zero gradient into NaN.
LOG_RATIO_LIMIT = 20.0


@dataclass
class LossInputs:
    logprobs: torch.Tensor  # (B, T) log-probs of the current policy (carries the gradient)
    behaviour_logprobs: torch.Tensor  # (B, T) log-probs under the policy that sampled
    advantages: torch.Tensor  # (B,) one scalar per response
    mask: torch.Tensor  # (B, T) bool/0-1: which positions are response tokens
    ref_logprobs: torch.Tensor | None = None  # (B, T) frozen reference policy, for the KL term
    entropy: torch.Tensor | None = None  # (B, T) policy entropy per position (metric only)

    def validate(self) -> None:
        if self.logprobs.dim() != 2:
            raise ValueError(f"logprobs must be (B, T), got shape {tuple(self.logprobs.shape)}")
        shape = self.logprobs.shape
        for name in ("behaviour_logprobs", "mask", "ref_logprobs", "entropy"):
            t = getattr(self, name)
            if t is not None and t.shape != shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} "
                                 "like logprobs")
        if self.advantages.shape != shape[:1]:
            raise ValueError(f"advantages has shape {tuple(self.advantages.shape)}, "
                             f"expected ({shape[0]},)")


@dataclass
class LossOutputs:
    loss: torch.Tensor  # () the differentiable objective
    clip_fraction: torch.Tensor  # () share of response tokens whose clipped branch is active
    approx_kl: torch.Tensor  # () k3 estimate of KL(behaviour || current), token mean
    kl: torch.Tensor  # () k3 estimate of KL(current || reference), token mean; 0 without ref
    entropy: torch.Tensor  # () mean entropy over response tokens; 0 without entropy input
    n_tokens: torch.Tensor  # () number of response tokens (the metrics' weight)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / n.clamp(min=1)


def policy_loss(
    inputs: LossInputs,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    kl_coef: float = 0.0,
    aggregation: Literal["token_mean", "seq_mean"] = "token_mean",
    normalizer: float | torch.Tensor | None = None,
) -> LossOutputs:
    """PPO clipped surrogate per token, plus optional k3 KL to a reference, aggregated.

    per-token loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A) + kl_coef * k3,
    with r = exp(logp - behaviour_logp). Aggregation:
      token_mean: sum of per-token losses / number of response tokens;
      seq_mean:   per response, mean over its tokens; then sum / number of responses.
    Responses with no tokens count for nothing in either mode.
    ``normalizer`` replaces the denominator (token or response count) so that shards of one
    global batch can each divide by the GLOBAL count: their losses then sum to the global loss.
    """
    inputs.validate()
    if aggregation not in ("token_mean", "seq_mean"):
        raise ValueError(f"aggregation must be 'token_mean' or 'seq_mean', got {aggregation!r}")
    if kl_coef > 0 and inputs.ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    mask = inputs.mask.bool()
    maskf = mask.to(inputs.logprobs.dtype)
    # Zero the padding first: garbage there (even NaN) must not reach the sums or gradients.
    logp = torch.where(mask, inputs.logprobs, 0.0)
    old = torch.where(mask, inputs.behaviour_logprobs.to(logp.dtype), 0.0)
    adv = inputs.advantages.to(logp.dtype)[:, None]  # (B, 1)

    log_ratio = (logp - old).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # (B, T)
    ratio = torch.exp(log_ratio)
    surr = ratio * adv
    surr_clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(surr, surr_clipped)  # (B, T)

    kl = torch.zeros((), dtype=logp.dtype, device=logp.device)
    n_tok = maskf.sum()
    if inputs.ref_logprobs is not None:
        d = torch.where(mask, inputs.ref_logprobs.to(logp.dtype), 0.0) - logp
        k3 = torch.exp(d) - d - 1.0  # >= 0, unbiased for KL(current || ref) under current
        kl = _masked_mean(k3.detach(), maskf, n_tok)
        if kl_coef > 0:
            per_token = per_token + kl_coef * k3

    per_token = per_token * maskf
    if aggregation == "token_mean":
        denom = n_tok.clamp(min=1) if normalizer is None else normalizer
        loss = per_token.sum() / denom
    else:
        seq_len = maskf.sum(dim=1)  # (B,)
        per_seq = per_token.sum(dim=1) / seq_len.clamp(min=1)  # (B,)
        denom = (seq_len > 0).sum().clamp(min=1) if normalizer is None else normalizer
        loss = per_seq.sum() / denom

    with torch.no_grad():
        clipped = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))
        clip_fraction = _masked_mean(clipped.to(maskf.dtype), maskf, n_tok)
        approx_kl = _masked_mean((ratio - 1.0) - log_ratio, maskf, n_tok)
        entropy = torch.zeros_like(kl)
        if inputs.entropy is not None:
            entropy = _masked_mean(torch.where(mask, inputs.entropy.to(logp.dtype), 0.0), maskf, n_tok)
    return LossOutputs(loss=loss, clip_fraction=clip_fraction, approx_kl=approx_kl, kl=kl,
                       entropy=entropy, n_tokens=n_tok.detach())
