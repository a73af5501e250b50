"""Chunked log-probs (learner/logprobs.py) against the full-logits reference: values,
entropies and gradients (to the hidden states and the LM head), tied and untied heads."""
from __future__ import annotations

import pytest
import torch

from learner.logprobs import LogprobModel, chunked_logprobs, token_logprobs


def _head_case(seed, N=37, H=16, V=50, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=dtype).requires_grad_(True)
    head = torch.nn.Linear(H, V, bias=False).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g, dtype=dtype))
    targets = torch.randint(0, V, (N,), generator=g)
    weights = torch.randn(N, generator=g)  # a generic upstream gradient
    return hidden, head, targets, weights


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
def test_chunked_equals_reference(temperature, chunk):
    hidden, head, targets, w = _head_case(0)
    logp, ent = chunked_logprobs(hidden, head, targets, temperature, chunk)
    g_h, g_w = torch.autograd.grad((logp * w).sum(), [hidden, head.weight])
    ref, ref_ent = token_logprobs(head(hidden), targets, temperature)
    r_h, r_w = torch.autograd.grad((ref * w).sum(), [hidden, head.weight])
    assert logp.dtype == torch.float32 and logp.shape == targets.shape
    torch.testing.assert_close(logp, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    torch.testing.assert_close(g_h, r_h, rtol=1e-5, atol=1e-5)  # fp32 sums of ~10-size terms
    torch.testing.assert_close(g_w, r_w, rtol=1e-5, atol=1e-5)
    assert g_h.abs().max() > 1e-3  # the gradient is not trivially zero


def test_chunked_without_grad_or_entropy():
    hidden, head, targets, _ = _head_case(1)
    with torch.no_grad():
        logp, ent = chunked_logprobs(hidden, head, targets, 1.0, 5, with_entropy=False)
    ref, _ = token_logprobs(head(hidden), targets)
    assert ent is None and not logp.requires_grad
    torch.testing.assert_close(logp, ref.detach(), rtol=0, atol=1e-5)


def test_chunked_handles_bf16_logits():
    """bf16 head (the GPU path): upcast inside the chunk, gradient back in bf16."""
    hidden, head, targets, w = _head_case(2, dtype=torch.bfloat16)
    logp, _ = chunked_logprobs(hidden, head, targets, 1.0, 8)
    ref, _ = token_logprobs(head(hidden), targets)
    torch.testing.assert_close(logp, ref, rtol=0, atol=1e-5)  # same bf16 logits, fp32 math
    g_h, = torch.autograd.grad((logp * w).sum(), [hidden])
    r_h, = torch.autograd.grad((ref * w).sum(), [hidden])
    assert g_h.dtype == torch.bfloat16
    torch.testing.assert_close(g_h.float(), r_h.float(), rtol=2e-2, atol=2e-2)


def test_chunked_rejects_bad_shapes():
    hidden, head, targets, _ = _head_case(3)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs(hidden, head, targets, 1.0, 0)
    with pytest.raises(ValueError, match="targets"):
        chunked_logprobs(hidden, head, targets[:-1], 1.0, 4)


def _tiny_lm(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(cfg).double()


@pytest.mark.parametrize("tied", [False, True])
def test_logprob_model_equals_full_forward(tied):
    """LogprobModel on a HF model (tied or untied head) = token_logprobs on the model's own
    logits, for values and for the gradient of every parameter."""
    model = _tiny_lm(tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, 9), generator=g)
    positions = torch.tensor([2, 3, 7, 9 + 4, 9 + 7])  # flat indices into (2 * 9)
    targets = ids.reshape(-1)[positions + 1]
    w = torch.randn(5, generator=g, dtype=torch.float64)
    lm = LogprobModel(model, temperature=0.8, chunk_size=2)
    logp, ent = lm(ids, None, positions, targets)
    grads = torch.autograd.grad((logp * w).sum(), list(model.parameters()))
    full = model(input_ids=ids).logits.reshape(-1, 64)[positions]
    ref, ref_ent = token_logprobs(full, targets, 0.8)
    ref_grads = torch.autograd.grad((ref * w).sum(), list(model.parameters()))
    torch.testing.assert_close(logp, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert max(float(x.abs().max()) for x in grads) > 1e-3


def test_logprob_model_refuses_logit_post_processing():
    model = _tiny_lm(False)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(NotImplementedError, match="final_logit_softcapping"):
        LogprobModel(model)
