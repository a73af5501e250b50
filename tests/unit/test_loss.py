"""policy_loss against an obviously-correct scalar loop, values and gradients."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.loss import LossInputs, policy_loss


def slow_loss(logp, old, adv, mask, ref=None, *, clip_low, clip_high, kl_coef, aggregation,
              normalizer=None):
    """Loop over responses and tokens with scalar tensor ops (autograd still flows)."""
    B, T = logp.shape
    seq_losses, token_losses, n_clipped, n_tok = [], [], 0, 0
    for b in range(B):
        toks = []
        for t in range(T):
            if not mask[b, t]:
                continue
            lr = logp[b, t] - old[b, t]
            lr = torch.clamp(lr, -20.0, 20.0)
            r = torch.exp(lr)
            a = adv[b]
            unclipped = r * a
            clipped = torch.clamp(r, 1 - clip_low, 1 + clip_high) * a
            loss = -torch.minimum(unclipped, clipped)
            if kl_coef > 0:
                d = ref[b, t] - logp[b, t]
                loss = loss + kl_coef * (torch.exp(d) - d - 1)
            if (a > 0 and r > 1 + clip_high) or (a < 0 and r < 1 - clip_low):
                n_clipped += 1
            n_tok += 1
            toks.append(loss)
            token_losses.append(loss)
        if toks:
            seq_losses.append(sum(toks) / len(toks))
    if aggregation == "token_mean":
        denom = normalizer if normalizer is not None else max(n_tok, 1)
        total = sum(token_losses) / denom if token_losses else torch.zeros(())
    else:
        denom = normalizer if normalizer is not None else max(len(seq_losses), 1)
        total = sum(seq_losses) / denom if seq_losses else torch.zeros(())
    return total, (n_clipped / n_tok if n_tok else 0.0)


def make_inputs(seed, B, T, with_ref, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = logp.detach() + spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[0] = False  # one empty response: must count for nothing
    ref = logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64) if with_ref else None
    return logp, old, adv, mask, ref


def check_against_slow(seed, B, T, aggregation, kl_coef, clip_low=0.2, clip_high=0.28,
                       normalizer=None):
    logp, old, adv, mask, ref = make_inputs(seed, B, T, with_ref=kl_coef > 0)
    out = policy_loss(LossInputs(logp, old, adv, mask, ref_logprobs=ref), clip_low=clip_low,
                      clip_high=clip_high, kl_coef=kl_coef, aggregation=aggregation,
                      normalizer=normalizer)
    (g_fast,) = torch.autograd.grad(out.loss, logp, allow_unused=True)
    ref_loss, ref_clip = slow_loss(logp, old, adv, mask, ref, clip_low=clip_low,
                                   clip_high=clip_high, kl_coef=kl_coef, aggregation=aggregation,
                                   normalizer=normalizer)
    if ref_loss.requires_grad:
        (g_slow,) = torch.autograd.grad(ref_loss, logp)
    else:
        g_slow = torch.zeros_like(logp)
    torch.testing.assert_close(out.loss.detach(), ref_loss.detach().to(out.loss.dtype),
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_fast, g_slow, rtol=1e-9, atol=1e-12)
    assert out.clip_fraction.item() == pytest.approx(ref_clip, abs=1e-12)
    assert out.n_tokens.item() == int(mask.sum())


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_matches_slow_reference(aggregation, kl_coef):
    for seed in range(3):
        check_against_slow(seed, B=5, T=7, aggregation=aggregation, kl_coef=kl_coef)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 5), T=st.integers(1, 6),
       aggregation=st.sampled_from(["token_mean", "seq_mean"]),
       kl_coef=st.sampled_from([0.0, 0.05]), clip_low=st.floats(0.01, 0.5),
       clip_high=st.floats(0.01, 0.5))
def test_matches_slow_reference_property(seed, B, T, aggregation, kl_coef, clip_low, clip_high):
    check_against_slow(seed, B, T, aggregation, kl_coef, clip_low, clip_high)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_shards_with_global_normalizer_sum_to_global_loss(aggregation):
    """Two shards each divided by the GLOBAL count add up to the one-batch loss and gradient:
    the property the multi-rank learner relies on."""
    logp, old, adv, mask, _ = make_inputs(7, B=6, T=5, with_ref=False)
    mask[1] = True  # make shard sizes unequal in tokens
    full = policy_loss(LossInputs(logp, old, adv, mask), aggregation=aggregation).loss
    n = mask.sum() if aggregation == "token_mean" else (mask.sum(1) > 0).sum()
    parts = [policy_loss(LossInputs(logp[s], old[s], adv[s], mask[s]), aggregation=aggregation,
                         normalizer=float(n)).loss for s in (slice(0, 2), slice(2, 6))]
    torch.testing.assert_close(parts[0] + parts[1], full)
    g_full = torch.autograd.grad(full, logp)[0]
    g_parts = torch.autograd.grad(parts[0] + parts[1], logp)[0]
    torch.testing.assert_close(g_parts, g_full)


def test_on_policy_gradient_is_policy_gradient():
    """At ratio 1 nothing is clipped and d loss / d logp = -A / n_tokens per token."""
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    out = policy_loss(LossInputs(logp, logp.detach(), adv, mask))
    out.loss.backward()
    expected = torch.tensor([[-2.0, -2.0, 0.0], [1.0, 1.0, 1.0]]) / 5
    torch.testing.assert_close(logp.grad, expected)
    assert out.clip_fraction.item() == 0.0
    assert out.approx_kl.item() == pytest.approx(0.0, abs=1e-7)
    assert out.loss.item() == pytest.approx(-(2 * 2 - 1 * 3) / 5)


def test_clip_fraction_counts_active_clipping_only():
    # ratios: e^0.5 (A>0: clipped high), e^0.5 (A<0: NOT clipped, min picks unclipped),
    #         e^-0.5 (A<0: clipped low), e^-0.5 (A>0: not clipped)
    logp = torch.zeros(4, 1, requires_grad=True)
    old = torch.tensor([[-0.5], [-0.5], [0.5], [0.5]])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    out = policy_loss(LossInputs(logp, old, adv, torch.ones(4, 1, dtype=torch.bool)))
    assert out.clip_fraction.item() == pytest.approx(0.5)
    out.loss.backward()
    # Clipped tokens get no gradient; the others get -A * ratio / n.
    assert logp.grad[0, 0] == 0 and logp.grad[2, 0] == 0
    assert logp.grad[1, 0].item() == pytest.approx(math.exp(0.5) / 4)
    assert logp.grad[3, 0].item() == pytest.approx(-math.exp(-0.5) / 4)


def test_decoupled_clip_bounds():
    """clip_high bounds the ratio above, clip_low below, independently."""
    logp = torch.zeros(2, 1)
    old = torch.tensor([[-1.0], [1.0]])  # ratios e and 1/e
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 1, dtype=torch.bool)
    out = policy_loss(LossInputs(logp, old, adv, mask), clip_low=0.1, clip_high=0.5,
                      aggregation="seq_mean")
    # token 0: -min(e, 1.5) = -1.5; token 1: -min(-1/e, -0.9) = 0.9
    assert out.loss.item() == pytest.approx((-1.5 + 0.9) / 2)


def test_padding_garbage_does_not_leak():
    logp = torch.zeros(1, 3, requires_grad=True)
    old = torch.tensor([[0.0, float("nan"), float("inf")]])
    mask = torch.tensor([[True, False, False]])
    ent = torch.tensor([[1.5, float("nan"), 0.0]])
    out = policy_loss(LossInputs(logp, old, torch.tensor([1.0]), mask, entropy=ent))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logp.grad).all()
    assert out.entropy.item() == pytest.approx(1.5)


def test_nan_in_a_response_token_propagates():
    """NaN in a real token is not hidden: the learner's skip logic must see it."""
    logp = torch.zeros(1, 2, requires_grad=True)
    old = torch.tensor([[0.0, float("nan")]])
    out = policy_loss(LossInputs(logp, old, torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool)))
    assert math.isnan(out.loss.item())


def test_no_tokens_gives_zero_loss():
    logp = torch.zeros(2, 3, requires_grad=True)
    out = policy_loss(LossInputs(logp, logp.detach(), torch.ones(2), torch.zeros(2, 3)),
                      aggregation="seq_mean")
    assert out.loss.item() == 0.0 and out.n_tokens.item() == 0


def test_bad_inputs_raise():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        policy_loss(LossInputs(logp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3)))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(LossInputs(logp, logp, torch.zeros(3), torch.ones(2, 3)))
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(LossInputs(logp, logp, torch.zeros(2), torch.ones(2, 3)), kl_coef=0.1)
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(LossInputs(logp, logp, torch.zeros(2), torch.ones(2, 3)), aggregation="sum")


def test_kl_metric_is_zero_at_reference_and_positive_away():
    logp = torch.log_softmax(torch.randn(3, 4), -1)
    mask = torch.ones(3, 4, dtype=torch.bool)
    same = policy_loss(LossInputs(logp, logp, torch.zeros(3), mask, ref_logprobs=logp))
    other = policy_loss(LossInputs(logp, logp, torch.zeros(3), mask, ref_logprobs=logp - 0.3))
    assert same.kl.item() == pytest.approx(0.0, abs=1e-7)
    assert other.kl.item() > 0.0


@pytest.mark.parametrize("kw, field", [
    (dict(clip_low=1.5), "clip_low"), (dict(zero_stage=4), "zero_stage"),
    (dict(betas=(0.9, 1.0)), "betas"), (dict(aggregation="sum"), "aggregation"),
    (dict(lr=0.0), "lr"), (dict(micro_batch_size=0), "micro_batch_size"),
    (dict(unknown_field=1), "unknown_field"), (dict(clip_low=0.0, clip_high=0.0), "clip_low"),
])
def test_learner_config_rejects_bad_values(kw, field):
    from learner.config import LearnerConfig

    with pytest.raises(ValueError, match=field):
        LearnerConfig(**kw)


def test_learner_config_auto_resolution():
    from learner.config import LearnerConfig

    cfg = LearnerConfig()
    assert (cfg.resolved_dtype(False), cfg.resolved_backend(False)) == ("fp32", "gloo")
    assert (cfg.resolved_dtype(True), cfg.resolved_backend(True)) == ("bf16", "nccl")
    with pytest.raises(ValueError, match="nccl"):
        LearnerConfig(backend="nccl").resolved_backend(False)
