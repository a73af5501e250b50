"""The token-level policy-gradient loss: a pure function on typed tensors.

torch only (no DeepSpeed, Ray or model): tests check it against a slow loop reference.

Shapes: B rows, T token positions (already aligned so that position t of every tensor
refers to the same response token; see ``learner/batch.py``). A row is one response
(``collate``), or several responses packed back to back with ``segment_ids`` saying which
(the learner's packed micro-batches: B = 1, T = their response tokens).

Objectives (r: a probability ratio, A: the token's advantage, eps_l/eps_h: the clip range)::

    pg(r)  = -min(r A, clip(r, 1 - eps_l, 1 + eps_h) A)            the PPO surrogate
    dual   : for A < 0, pg <- min(pg, dual_clip * |A|)              (Ye et al. 2020)
    ppo       : loss_t = pg(pi / pi_behaviour)
                with tis_cap C: the ratio's value and gradient weight are truncated at C
    decoupled : loss_t = w * pg(pi / pi_prox),  w = pi_prox / pi_behaviour (min(w, C) with
                tis_cap), no gradient through w                      (Hilton et al. 2022;
                AReaL's decoupled PPO)

pi_prox is the policy at the start of the update (the learner passes its own log-probs,
detached; see ``LearnerConfig.objective``): the trust region is then measured from the
current policy, however stale the behaviour policy was, and the staleness is corrected by
the importance weight w.
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
    advantages: torch.Tensor  # (B,) one scalar per row, or (B, T) per token (packed rows)
    mask: torch.Tensor  # (B, T) bool/0-1: which positions are response tokens
    ref_logprobs: torch.Tensor | None = None  # (B, T) frozen reference policy, for the KL term
    entropy: torch.Tensor | None = None  # (B, T) policy entropy per position (metric only)
    proximal_logprobs: torch.Tensor | None = None  # (B, T) pi_prox, for objective="decoupled"
    segment_ids: torch.Tensor | None = None  # (B, T) long: response of each position (seq_mean
    #   groups by it; ids unique across rows, >= 0 on the mask); None: each row is one response

    def validate(self) -> None:
        if self.logprobs.dim() != 2:
            raise ValueError(f"logprobs must be (B, T), got shape {tuple(self.logprobs.shape)}")
        shape = self.logprobs.shape
        for name in ("behaviour_logprobs", "mask", "ref_logprobs", "entropy",
                     "proximal_logprobs", "segment_ids"):
            t = getattr(self, name)
            if t is not None and t.shape != shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} "
                                 "like logprobs")
        if self.advantages.shape not in (shape[:1], shape):
            raise ValueError(f"advantages has shape {tuple(self.advantages.shape)}, "
                             f"expected ({shape[0]},) or {tuple(shape)}")


@dataclass
class LossOutputs:
    loss: torch.Tensor  # () the differentiable objective
    clip_fraction: torch.Tensor  # () share of response tokens whose clipped branch is active
    approx_kl: torch.Tensor  # () k3 estimate of KL(behaviour || current), token mean
    kl: torch.Tensor  # () k3 estimate of KL(current || reference), token mean; 0 without ref
    entropy: torch.Tensor  # () mean entropy over response tokens; 0 without entropy input
    n_tokens: torch.Tensor  # () number of response tokens (the metrics' weight)
    is_weight: torch.Tensor  # () token mean of the untruncated importance weight to behaviour
    #   (pi_prox / pi_behaviour for decoupled, pi / pi_behaviour for ppo): how off-policy
    truncated_fraction: torch.Tensor  # () share of tokens whose weight tis_cap truncated
    dual_clip_fraction: torch.Tensor  # () share of tokens where the dual clip bounds the loss


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / n.clamp(min=1)


def _check_options(aggregation, objective, tis_cap, dual_clip, kl_coef, inputs) -> None:
    if aggregation not in ("token_mean", "seq_mean"):
        raise ValueError(f"aggregation must be 'token_mean' or 'seq_mean', got {aggregation!r}")
    if objective not in ("ppo", "decoupled"):
        raise ValueError(f"objective must be 'ppo' or 'decoupled', got {objective!r}")
    if objective == "decoupled" and inputs.proximal_logprobs is None:
        raise ValueError("objective='decoupled' needs proximal_logprobs")
    if tis_cap is not None and not tis_cap >= 1.0:
        raise ValueError(f"tis_cap must be >= 1 (or None), got {tis_cap}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if kl_coef > 0 and inputs.ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")


def policy_loss(
    inputs: LossInputs,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    kl_coef: float = 0.0,
    aggregation: Literal["token_mean", "seq_mean"] = "token_mean",
    normalizer: float | torch.Tensor | None = None,
    objective: Literal["ppo", "decoupled"] = "ppo",
    tis_cap: float | None = None,
    dual_clip: float | None = None,
) -> LossOutputs:
    """Per-token objective (see the module doc), plus optional k3 KL to a reference, aggregated.

    per-token loss = loss_t + kl_coef * k3. Aggregation:
      token_mean: sum of per-token losses / number of response tokens;
      seq_mean:   per response, mean over its tokens; then sum / number of responses.
    Responses with no tokens count for nothing in either mode.
    ``normalizer`` replaces the denominator (token or response count) so that shards of one
    global batch can each divide by the GLOBAL count: their losses then sum to the global loss.
    """
    inputs.validate()
    _check_options(aggregation, objective, tis_cap, dual_clip, kl_coef, inputs)
    mask = inputs.mask.bool()
    maskf = mask.to(inputs.logprobs.dtype)
    # Zero the padding first: garbage there (even NaN) must not reach the sums or gradients.
    logp = torch.where(mask, inputs.logprobs, 0.0)
    old = torch.where(mask, inputs.behaviour_logprobs.to(logp.dtype), 0.0)
    adv = inputs.advantages.to(logp.dtype)
    adv = adv[:, None].expand_as(logp) if adv.dim() == 1 else adv  # (B, T)
    adv = torch.where(mask, adv, 0.0)

    ratio, weight, is_weight, truncated = _ratio(inputs, mask, logp, old, objective, tis_cap)
    surr = ratio * adv
    surr_clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(surr, surr_clipped)  # (B, T)
    dual = torch.zeros_like(mask)
    if dual_clip is not None:
        bound = -dual_clip * adv  # c |A| where A < 0
        dual = (adv < 0) & (per_token > bound)
        per_token = torch.where(dual, bound, per_token)
    if weight is not None:
        per_token = weight * per_token

    kl = torch.zeros((), dtype=logp.dtype, device=logp.device)
    n_tok = maskf.sum()
    if inputs.ref_logprobs is not None:
        d = torch.where(mask, inputs.ref_logprobs.to(logp.dtype), 0.0) - logp
        k3 = torch.exp(d) - d - 1.0  # >= 0, unbiased for KL(current || ref) under current
        kl = _masked_mean(k3.detach(), maskf, n_tok)
        if kl_coef > 0:
            per_token = per_token + kl_coef * k3
    loss = _aggregate(per_token * maskf, maskf, n_tok, aggregation, normalizer,
                      inputs.segment_ids)

    return _outputs(loss, kl, inputs, mask, n_tok, logp, old, adv, ratio, is_weight, truncated,
                    dual, clip_low, clip_high)


@torch.no_grad()
def _outputs(loss, kl, inputs: LossInputs, mask, n_tok, logp, old, adv, ratio, is_weight,
             truncated, dual, clip_low: float, clip_high: float) -> LossOutputs:
    """The loss with its diagnostics: the share of tokens clipped (those whose update the clip
    stopped), the behaviour KL, the entropy, the importance weights, the dual clip."""
    maskf = mask.to(logp.dtype)
    r = ratio.detach()
    clipped = ((adv > 0) & (r > 1.0 + clip_high)) | ((adv < 0) & (r < 1.0 - clip_low))
    mean = lambda x: _masked_mean(x.to(maskf.dtype), maskf, n_tok)  # noqa: E731
    entropy = torch.zeros_like(kl)
    if inputs.entropy is not None:
        entropy = mean(torch.where(mask, inputs.entropy.to(logp.dtype), 0.0))
    behaviour_log_ratio = (logp - old).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # untruncated
    approx_kl = mean(torch.exp(behaviour_log_ratio) - 1.0 - behaviour_log_ratio)
    return LossOutputs(
        loss=loss, clip_fraction=mean(clipped), approx_kl=approx_kl, kl=kl,
        entropy=entropy, n_tokens=n_tok.detach(),
        is_weight=mean(torch.where(mask, is_weight, 0.0)),
        truncated_fraction=mean(truncated & mask), dual_clip_fraction=mean(dual & mask))


def _ratio(inputs: LossInputs, mask, logp, old, objective, tis_cap):
    """The objective's probability ratio r (B, T), its weight w ((B, T), None for ppo), the
    untruncated importance weight to behaviour (a metric) and where tis_cap truncated."""
    lim = LOG_RATIO_LIMIT
    truncated = torch.zeros_like(mask)
    if objective == "decoupled":
        prox = torch.where(mask, inputs.proximal_logprobs.to(logp.dtype), 0.0).detach()
        weight = torch.exp((prox - old).clamp(-lim, lim))  # (B, T) pi_prox / pi_behaviour
        is_weight = weight
        if tis_cap is not None:
            truncated = weight > tis_cap
            weight = weight.clamp(max=tis_cap)
        return torch.exp((logp - prox).clamp(-lim, lim)), weight, is_weight, truncated
    ratio = torch.exp((logp - old).clamp(-lim, lim))
    is_weight = ratio.detach()
    if tis_cap is not None:
        # Value min(r, C) and gradient weight min(r, C): r * C / sg(r) where truncated.
        truncated = ratio.detach() > tis_cap
        ratio = torch.where(truncated, ratio * (tis_cap / ratio.detach()), ratio)
    return ratio, None, is_weight, truncated


def _aggregate(per_token, maskf, n_tok, aggregation, normalizer, segment_ids) -> torch.Tensor:
    """token_mean or seq_mean of the (masked) per-token losses (see ``policy_loss``)."""
    if aggregation == "token_mean":
        return per_token.sum() / (n_tok.clamp(min=1) if normalizer is None else normalizer)
    if normalizer is None:
        normalizer = _n_segments(maskf, segment_ids).clamp(min=1)
    return _seq_mean_sum(per_token, maskf, segment_ids) / normalizer


def _segments(maskf: torch.Tensor, segment_ids: torch.Tensor | None) -> torch.Tensor:
    """(B, T) long response index of each position (rows are responses without segment_ids)."""
    if segment_ids is None:
        B, T = maskf.shape
        return torch.arange(B, device=maskf.device)[:, None].expand(B, T)
    return torch.where(maskf > 0, segment_ids.long(), 0)


def _seq_lengths(maskf: torch.Tensor, segment_ids: torch.Tensor | None) -> torch.Tensor:
    seg = _segments(maskf, segment_ids).reshape(-1)
    n = int(seg.max()) + 1 if seg.numel() else 0
    return torch.zeros(n, dtype=maskf.dtype, device=maskf.device).index_add_(
        0, seg, maskf.reshape(-1))


def _seq_mean_sum(per_token: torch.Tensor, maskf: torch.Tensor,
                  segment_ids: torch.Tensor | None) -> torch.Tensor:
    """sum over responses of (mean of the response's per-token losses); per_token is masked."""
    seg = _segments(maskf, segment_ids).reshape(-1)
    lengths = _seq_lengths(maskf, segment_ids)
    sums = torch.zeros_like(lengths).index_add(0, seg, per_token.reshape(-1))
    return (sums / lengths.clamp(min=1)).sum()


def _n_segments(maskf: torch.Tensor, segment_ids: torch.Tensor | None) -> torch.Tensor:
    return (_seq_lengths(maskf, segment_ids) > 0).sum()
