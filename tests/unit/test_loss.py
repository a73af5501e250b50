"""policy_loss against an obviously-correct scalar loop, values and gradients."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.loss import LossInputs, policy_loss


def slow_loss(logp, old, adv, mask, ref=None, *, clip_low, clip_high, kl_coef, aggregation,
              normalizer=None, objective="ppo", prox=None, tis_cap=None, dual_clip=None,
              seg=None):
    """Loop over responses and tokens with scalar tensor ops (autograd still flows).

    Returns (loss, clip fraction, truncated fraction, dual-clip fraction)."""
    B, T = logp.shape
    per_seq: dict = {}
    token_losses, n_clipped, n_trunc, n_dual, n_tok = [], 0, 0, 0, 0
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            a = adv[b] if adv.dim() == 1 else adv[b, t]
            w = 1.0
            if objective == "decoupled":
                # importance weight to the behaviour policy: a constant, truncated at tis_cap
                w = math.exp(min(max(float(prox[b, t] - old[b, t]), -20.0), 20.0))
                if tis_cap is not None and w > tis_cap:
                    w, n_trunc = tis_cap, n_trunc + 1
                r = torch.exp(torch.clamp(logp[b, t] - prox[b, t], -20.0, 20.0))
            else:
                r = torch.exp(torch.clamp(logp[b, t] - old[b, t], -20.0, 20.0))
                if tis_cap is not None and r.item() > tis_cap:
                    r, n_trunc = r * (tis_cap / r.item()), n_trunc + 1  # value cap, grad weight cap
            unclipped = r * a
            clipped = torch.clamp(r, 1 - clip_low, 1 + clip_high) * a
            loss = -torch.minimum(unclipped, clipped)
            if dual_clip is not None and a < 0 and loss.item() > dual_clip * -a.item():
                loss, n_dual = dual_clip * -a, n_dual + 1  # constant: no gradient
            loss = w * loss
            if kl_coef > 0:
                d = ref[b, t] - logp[b, t]
                loss = loss + kl_coef * (torch.exp(d) - d - 1)
            if (a > 0 and r > 1 + clip_high) or (a < 0 and r < 1 - clip_low):
                n_clipped += 1
            n_tok += 1
            token_losses.append(loss)
            per_seq.setdefault(int(seg[b, t]) if seg is not None else b, []).append(loss)
    seq_losses = [sum(v) / len(v) for v in per_seq.values()]
    if aggregation == "token_mean":
        denom = normalizer if normalizer is not None else max(n_tok, 1)
        total = sum(token_losses) / denom if token_losses else torch.zeros(())
    else:
        denom = normalizer if normalizer is not None else max(len(seq_losses), 1)
        total = sum(seq_losses) / denom if seq_losses else torch.zeros(())
    frac = (lambda n: n / n_tok if n_tok else 0.0)
    return total, frac(n_clipped), frac(n_trunc), frac(n_dual)


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
                       normalizer=None, objective="ppo", tis_cap=None, dual_clip=None,
                       packed=False, spread=0.6):
    logp, old, adv, mask, ref = make_inputs(seed, B, T, with_ref=kl_coef > 0, spread=spread)
    g = torch.Generator().manual_seed(seed + 1)
    # pi_prox: between the behaviour and the current policy, as after a weight update
    prox = (logp.detach() + old) / 2 + spread / 3 * torch.randn(B, T, generator=g,
                                                                 dtype=torch.float64)
    seg = None
    if packed:
        # several responses per row: random contiguous segments with unique ids and one
        # advantage per segment (per-token advantages), as the learner's packed rows have
        cuts = torch.rand(B, T, generator=g) < 0.3
        seg = torch.cumsum(cuts.reshape(-1).long(), 0).reshape(B, T) + torch.arange(B)[:, None] * T
        seg = torch.unique(seg, return_inverse=True)[1]
        adv = torch.randn(int(seg.max()) + 1, generator=g, dtype=torch.float64)[seg]
    kw = dict(clip_low=clip_low, clip_high=clip_high, kl_coef=kl_coef, aggregation=aggregation,
              normalizer=normalizer, objective=objective, tis_cap=tis_cap, dual_clip=dual_clip)
    out = policy_loss(LossInputs(logp, old, adv, mask, ref_logprobs=ref,
                                 proximal_logprobs=prox if objective == "decoupled" else None,
                                 segment_ids=seg), **kw)
    (g_fast,) = torch.autograd.grad(out.loss, logp, allow_unused=True)
    ref_loss, ref_clip, ref_trunc, ref_dual = slow_loss(logp, old, adv, mask, ref, prox=prox,
                                                        seg=seg, **kw)
    if ref_loss.requires_grad:
        (g_slow,) = torch.autograd.grad(ref_loss, logp)
    else:
        g_slow = torch.zeros_like(logp)
    torch.testing.assert_close(out.loss.detach(), ref_loss.detach().to(out.loss.dtype),
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_fast, g_slow, rtol=1e-9, atol=1e-12)
    assert out.clip_fraction.item() == pytest.approx(ref_clip, abs=1e-12)
    assert out.truncated_fraction.item() == pytest.approx(ref_trunc, abs=1e-12)
    assert out.dual_clip_fraction.item() == pytest.approx(ref_dual, abs=1e-12)
    assert out.n_tokens.item() == int(mask.sum())
    return out


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


@pytest.mark.parametrize("objective", ["ppo", "decoupled"])
@pytest.mark.parametrize("tis_cap, dual_clip", [(None, None), (1.5, None), (None, 3.0), (4.0, 2.0)])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_off_policy_options_match_slow_reference(objective, tis_cap, dual_clip, aggregation):
    # log-ratios of sd 1.2: ratios from about e^-3 to e^3, so caps and clips all bite
    outs = [check_against_slow(seed, B=5, T=8, aggregation=aggregation, kl_coef=0.05,
                               objective=objective, tis_cap=tis_cap, dual_clip=dual_clip,
                               spread=1.2) for seed in range(4)]
    assert any(o.clip_fraction > 0 for o in outs)
    assert any(o.truncated_fraction > 0 for o in outs) == (tis_cap is not None)
    assert any(o.dual_clip_fraction > 0 for o in outs) == (dual_clip is not None)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 4), T=st.integers(1, 8),
       aggregation=st.sampled_from(["token_mean", "seq_mean"]),
       objective=st.sampled_from(["ppo", "decoupled"]),
       tis_cap=st.sampled_from([None, 1.0, 1.3, 4.0]), dual_clip=st.sampled_from([None, 1.5, 3.0]),
       packed=st.booleans())
def test_objectives_match_slow_reference_property(seed, B, T, aggregation, objective, tis_cap,
                                                  dual_clip, packed):
    check_against_slow(seed, B, T, aggregation, 0.0, objective=objective, tis_cap=tis_cap,
                       dual_clip=dual_clip, packed=packed)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_packed_rows_equal_one_row_per_response(aggregation):
    """Responses concatenated into one row with segment ids and per-token advantages give
    the loss and gradient of one row per response (the learner's packing)."""
    logp, old, adv, mask, _ = make_inputs(3, B=4, T=6, with_ref=False)
    full = policy_loss(LossInputs(logp, old, adv, mask), aggregation=aggregation, dual_clip=3.0)
    flat = lambda x: x.reshape(1, -1)  # noqa: E731
    seg = torch.arange(4)[:, None].expand(4, 6)
    packed = policy_loss(LossInputs(flat(logp), flat(old), flat(adv[:, None].expand(4, 6)),
                                    flat(mask), segment_ids=flat(seg)),
                         aggregation=aggregation, dual_clip=3.0)
    torch.testing.assert_close(packed.loss, full.loss)
    torch.testing.assert_close(torch.autograd.grad(packed.loss, logp)[0],
                               torch.autograd.grad(full.loss, logp)[0])
    # Without segment ids the row would count as ONE response: seq_mean must then differ.
    if aggregation == "seq_mean":
        one = policy_loss(LossInputs(flat(logp), flat(old), flat(adv[:, None].expand(4, 6)),
                                     flat(mask)), aggregation=aggregation, dual_clip=3.0)
        assert abs(one.loss.item() - full.loss.item()) > 1e-3


def test_dual_clip_bounds_negative_advantage_loss():
    """A < 0 and a ratio of e^5 (the token's probability rose a lot since sampling): PPO's
    loss is r |A| = 148 |A| with gradient; dual clip 3 caps it at 3 |A| with no gradient."""
    logp = torch.zeros(1, 2, requires_grad=True)
    old = torch.tensor([[-5.0, 0.0]])
    adv = torch.tensor([-2.0])
    mask = torch.ones(1, 2, dtype=torch.bool)
    plain = policy_loss(LossInputs(logp, old, adv, mask), aggregation="token_mean")
    assert plain.loss.item() == pytest.approx((math.exp(5) * 2 + 2) / 2)
    dual = policy_loss(LossInputs(logp, old, adv, mask), dual_clip=3.0)
    assert dual.loss.item() == pytest.approx((3 * 2 + 2) / 2)
    dual.loss.backward()
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1].item() == pytest.approx(2 / 2)
    assert dual.dual_clip_fraction.item() == 0.5


def test_ppo_tis_caps_the_gradient_weight():
    """ppo + tis_cap C: a token with ratio e^5 and A < 0 weighs C, not e^5."""
    logp = torch.zeros(1, 1, requires_grad=True)
    old = torch.tensor([[-5.0]])
    out = policy_loss(LossInputs(logp, old, torch.tensor([-1.0]), torch.ones(1, 1)), tis_cap=2.0)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(2.0) and logp.grad.item() == pytest.approx(2.0)
    assert out.truncated_fraction.item() == 1.0
    assert out.is_weight.item() == pytest.approx(math.exp(5))


def test_decoupled_on_fresh_proximal_is_weighted_policy_gradient():
    """pi_prox = pi (the learner's own log-probs): the ratio is 1, nothing is clipped, and the
    gradient is -w A / n with w = min(pi / pi_behaviour, tis_cap)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.0, -3.0, -0.2]])  # w = 1, e, e^-0.3
    adv = torch.tensor([1.5])
    out = policy_loss(LossInputs(logp, old, adv, torch.ones(1, 3), proximal_logprobs=logp.detach()),
                      objective="decoupled", tis_cap=2.0)
    out.loss.backward()
    w = torch.tensor([[1.0, 2.0, math.exp(-0.3)]])
    torch.testing.assert_close(logp.grad, -1.5 * w / 3)
    assert out.clip_fraction.item() == 0.0 and out.truncated_fraction.item() == pytest.approx(1 / 3)


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
    with pytest.raises(ValueError, match="proximal_logprobs"):
        policy_loss(LossInputs(logp, logp, torch.zeros(2), torch.ones(2, 3)), objective="decoupled")
    with pytest.raises(ValueError, match="objective"):
        policy_loss(LossInputs(logp, logp, torch.zeros(2), torch.ones(2, 3)), objective="grpo")
    with pytest.raises(ValueError, match="tis_cap"):
        policy_loss(LossInputs(logp, logp, torch.zeros(2), torch.ones(2, 3)), tis_cap=0.5)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(LossInputs(logp, logp, torch.zeros(2), torch.ones(2, 3)), dual_clip=1.0)
    with pytest.raises(ValueError, match="segment_ids"):
        policy_loss(LossInputs(logp, logp, torch.zeros(2), torch.ones(2, 3),
                               segment_ids=torch.zeros(2, 4, dtype=torch.long)))


def test_kl_metric_is_zero_at_reference_and_positive_away():
    logp = torch.log_softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), -1)
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
    (dict(objective="grpo"), "objective"), (dict(tis_cap=0.5), "tis_cap"),
    (dict(dual_clip=1.0), "dual_clip"), (dict(micro_batch_tokens=0), "micro_batch_tokens"),
    (dict(logprob_chunk_tokens=0), "logprob_chunk_tokens"),
    (dict(lr_schedule="cosine"), "lr_decay_steps"), (dict(lr=1e-5, lr_min=1e-4), "lr_min"),
    (dict(lr_warmup_steps=-1), "lr_warmup_steps"), (dict(lr_schedule="linear"), "lr_schedule"),
])
def test_learner_config_rejects_bad_values(kw, field):
    from learner.config import LearnerConfig

    with pytest.raises(ValueError, match=field):
        LearnerConfig(**kw)


def test_learner_config_auto_resolution(monkeypatch):
    from learner.config import LearnerConfig

    cfg = LearnerConfig()
    for forced in ("fp32", "bf16"):  # auto on a CPU: the probe's answer, forced either way
        monkeypatch.setenv("V05_CPU_DTYPE", forced)
        assert (cfg.resolved_dtype(False, "m"), cfg.resolved_backend(False)) == (forced, "gloo")
    assert (cfg.resolved_dtype(True, "m"), cfg.resolved_backend(True)) == ("bf16", "nccl")
    with pytest.raises(ValueError, match="nccl"):
        LearnerConfig(backend="nccl").resolved_backend(False)
