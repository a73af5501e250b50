"""Log-probs of chosen tokens without materialising a batch's full-vocabulary logits.

A causal LM's last step is ``logits = hidden @ W.T`` over the whole vocabulary: at 16k
tokens and Qwen3's 151,936 tokens that is 5 GiB in bf16, and every fp32 copy of it
(upcast, temperature division, log-softmax, softmax for the entropy, their gradients) 10 GiB
more. Here the LM head is applied to ``chunk_size`` positions at a time, inside the chunk the
logits are upcast, divided by the temperature, reduced to (log-prob of the target, entropy)
and dropped; the backward pass recomputes one chunk's logits at a time (activation
checkpointing per chunk), so the peak holds one chunk's logits, not the batch's.

    LogprobModel(hf_causal_lm, temperature, chunk_size)(input_ids, position_ids, positions,
                                                        targets) -> (logp, entropy)

is what the learner hands DeepSpeed: its forward runs the model's body (the decoder, with
the model's own gradient checkpointing) and then the chunked head on the requested
positions only (response tokens), so the prompt positions never meet the LM head at all.
``token_logprobs`` is the plain full-logits version, kept as the reference the chunked one
is tested against.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def token_logprobs(logits, targets, temperature: float = 1.0, with_entropy: bool = True):
    """Reference: log-prob of each target and (no-grad) entropy per position, on full logits.

    logits (..., V), targets (...) -> logp (...) float32, entropy (...) float32 or None.
    Materialises several fp32 copies of ``logits``: use ``chunked_logprobs`` in training.
    """
    logits = logits.float() / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


class _TargetLogprob(torch.autograd.Function):
    """(logits (N, V), targets (N,)) -> (logp (N,) fp32, entropy (N,) fp32 without gradient).

    Fused so that only the input logits and the (N,) log-normaliser are saved for backward;
    the gradient (onehot - softmax) * g / T is rebuilt from them in one fp32 buffer. Peak
    inside: the logits plus two (N, V) fp32 buffers (one without entropy)."""

    @staticmethod
    def forward(ctx, logits, targets, inv_temp: float, with_entropy: bool):
        z = _scaled_fp32(logits, inv_temp)  # (N, V), never aliases a tensor we must keep
        lse = torch.logsumexp(z, dim=-1)  # (N,)
        logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
        if with_entropy:
            log_p = z.sub_(lse[:, None])  # log-softmax, in z's buffer
            entropy = -torch.exp(log_p).mul_(log_p).sum(-1)  # -sum p log p
        else:
            entropy = torch.zeros_like(lse)
        del z
        ctx.save_for_backward(logits, targets, lse)
        ctx.inv_temp = inv_temp
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, _g_entropy):
        logits, targets, lse = ctx.saved_tensors
        # d logp_t / d z_v = onehot(v = target_t) - softmax(z)_v, then the chain rule of z / T.
        grad = _scaled_fp32(logits, ctx.inv_temp).sub_(lse[:, None]).exp_().mul_(-g_logp[:, None])
        grad.scatter_add_(-1, targets[:, None], g_logp[:, None])
        if ctx.inv_temp != 1.0:
            grad.mul_(ctx.inv_temp)
        return grad.to(logits.dtype), None, None, None


def _scaled_fp32(logits, inv_temp: float):
    """A new fp32 tensor logits * inv_temp (a copy even when logits are fp32 and inv_temp 1)."""
    z = logits.float()
    if z is logits:
        return z * inv_temp if inv_temp != 1.0 else z.clone()
    return z.mul_(inv_temp) if inv_temp != 1.0 else z


def chunked_logprobs(hidden, head, targets, temperature: float = 1.0, chunk_size: int = 1024,
                     with_entropy: bool = True):
    """Log-probs of ``targets`` under ``head(hidden)`` (and entropies), chunk by chunk.

    hidden (N, H) final hidden states (after the model's last norm), head: the LM head
    module (called, not read, so DeepSpeed ZeRO-3 gathers its weight), targets (N,) long.
    Returns logp (N,) float32 carrying the gradient to ``hidden`` and the head's weight, and
    entropy (N,) float32 without gradient (None unless ``with_entropy``).

    With gradients on, each chunk is an activation checkpoint: its logits are dropped after
    the forward and recomputed in the backward, so memory holds one chunk's logits at a time.
    The recomputation skips the entropy (a metric, not part of the graph).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be (N, H) and targets (N,), got {tuple(hidden.shape)} "
                         f"and {tuple(targets.shape)}")
    inv_temp = 1.0 / float(temperature)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(
        p.requires_grad for p in head.parameters()))
    logps, ents = [], []
    for s in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[s:s + chunk_size], targets[s:s + chunk_size]
        if grad:
            first = [True]  # the forward computes the entropy, the recomputation does not

            def fn(h, t, first=first):
                ent, first[0] = with_entropy and first[0], False
                return _TargetLogprob.apply(head(h), t, inv_temp, ent)

            lp, ent = checkpoint(fn, h, t, use_reentrant=False)
        else:
            lp, ent = _TargetLogprob.apply(head(h), t, inv_temp, with_entropy)
        logps.append(lp)
        ents.append(ent)
    if not logps:  # N = 0
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    logp = torch.cat(logps) if len(logps) > 1 else logps[0]
    entropy = (torch.cat(ents) if len(ents) > 1 else ents[0]) if with_entropy else None
    return logp, entropy


class LogprobModel(torch.nn.Module):
    """A Hugging Face causal LM whose forward returns log-probs of given next tokens.

    forward(input_ids (B, L), position_ids (B, L) | None, positions (K,), targets (K,),
    attention_mask (B, L) | None) -> logp (K,) float32, entropy (K,) float32 | None.
    ``positions`` index the flattened (B * L) hidden states: position t predicts token
    t + 1 of its row, and ``targets`` are those tokens. Packed rows (several sequences in one
    row, ``position_ids`` restarting at 0 for each, ``attention_mask`` None) attend within
    their own sequence only: transformers builds the block-diagonal causal mask from the
    position ids (``masking_utils.find_packed_sequence_indices``).

    The wrapped model is ``self.policy``: its parameters and state dict (``policy.``-prefixed
    here) are the HF model's, so publish and save from ``self.policy``.
    """

    def __init__(self, policy, temperature: float = 1.0, chunk_size: int = 1024):
        super().__init__()
        cfg = policy.config
        for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
            if getattr(cfg, name, None) not in (None, 1.0):
                raise NotImplementedError(f"{type(policy).__name__} post-processes its logits "
                                          f"({name}); LogprobModel applies the plain LM head")
        self.policy = policy
        self.temperature = float(temperature)
        self.chunk_size = int(chunk_size)

    def forward(self, input_ids, position_ids, positions, targets, attention_mask=None,
                with_entropy: bool = True):
        body = self.policy.base_model  # the decoder without the LM head
        hidden = body(input_ids=input_ids, position_ids=position_ids,
                      attention_mask=attention_mask, use_cache=False).last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)  # (K, H)
        return chunked_logprobs(hidden, self.policy.get_output_embeddings(), targets,
                                self.temperature, self.chunk_size, with_entropy)


def check_packing_support() -> None:
    """Packed rows rely on transformers deriving the block-diagonal mask from position ids
    (``masking_utils.find_packed_sequence_indices``, in transformers 5); fail loudly on an
    older one, whose models would let packed sequences attend to each other."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError as err:
        import transformers

        raise RuntimeError(f"transformers {transformers.__version__} cannot keep packed "
                           "sequences apart (no masking_utils.find_packed_sequence_indices); "
                           "the learner needs a newer transformers") from err
