"""A packed token-budget step equals the padded one-row-per-response reference.

The learner's path (token-balanced shards, micro-batches by token budget, several responses
packed into one row with position ids restarting, ``packed_loss`` per micro-batch with the
global normaliser) against ``collate`` + a plain HF forward + ``policy_loss`` on the whole
batch at once: same loss, same gradient for every parameter (a tiny float64 Llama;
log-probs in float32).
"""
from __future__ import annotations

import random

import pytest
import torch

from common.types import TrainSample
from common.sharding import shard_samples
from learner.batch import collate, pack, plan_micro_batches
from learner.config import LearnerConfig
from learner.logprobs import LogprobModel, token_logprobs
from learner.loss import LossInputs, policy_loss
from learner.packed_loss import packed_loss

VOCAB = 64


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128)
    return LlamaForCausalLM(cfg).double()


def _samples(seed: int, n: int = 7) -> list[TrainSample]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        P, R = r.randint(1, 6), (0 if i == 3 else r.randint(1, 12))  # one empty response
        out.append(TrainSample([r.randrange(VOCAB) for _ in range(P)],
                               [r.randrange(VOCAB) for _ in range(R)],
                               [-4.0 + r.gauss(0, 0.5) for _ in range(R)], r.gauss(0, 1), 0))
    return out


def _reference(model, samples, cfg):
    """One padded batch, one row per response, the model's own logits."""
    c = collate(samples, pad_id=0)
    logits = model(input_ids=c["input_ids"], attention_mask=c["attention_mask"]).logits
    logp, _ = token_logprobs(logits[:, :-1], c["input_ids"][:, 1:], cfg.temperature)
    prox = logp.detach() if cfg.objective == "decoupled" else None
    out = policy_loss(LossInputs(logp, c["behaviour_logprobs"].double(), c["advantages"],
                                 c["response_mask"], proximal_logprobs=prox),
                      clip_low=cfg.clip_low, clip_high=cfg.clip_high, aggregation=cfg.aggregation,
                      objective=cfg.objective, tis_cap=cfg.tis_cap, dual_clip=cfg.dual_clip)
    return out.loss


def _packed(model, samples, cfg, n_ranks, packed_positions=True, row_tokens=None):
    """The learner's step: shards, token-budget micro-batches, one packed row each; the
    losses (each over the GLOBAL count) add up as the ranks' gradients do."""
    lm = LogprobModel(model, cfg.temperature, cfg.logprob_chunk_tokens)
    n_tok = sum(len(s.token_ids) for s in samples)
    n_seq = sum(1 for s in samples if s.token_ids)
    norm = n_tok if cfg.aggregation == "token_mean" else n_seq
    total, rows = 0.0, []
    for shard in shard_samples(samples, n_ranks):
        for mb in plan_micro_batches(shard, cfg.micro_batch_tokens, cfg.micro_batch_size):
            b = pack(mb, row_tokens)
            if not packed_positions:  # negative control: one sequence per row
                b.position_ids = torch.arange(b.input_ids.shape[1])[None]
            rows.append(len(mb))
            total = total + packed_loss(lm, b, cfg, norm).loss
    return total, rows


CFGS = {
    "token_mean": LearnerConfig(micro_batch_tokens=24, micro_batch_size=4, logprob_chunk_tokens=5),
    "seq_mean": LearnerConfig(micro_batch_tokens=24, micro_batch_size=4, logprob_chunk_tokens=5,
                              aggregation="seq_mean", temperature=0.7),
    "decoupled": LearnerConfig(micro_batch_tokens=30, micro_batch_size=8, objective="decoupled",
                               tis_cap=2.0, dual_clip=3.0),
}


@pytest.mark.parametrize("name", sorted(CFGS))
@pytest.mark.parametrize("n_ranks", [1, 2])
@pytest.mark.parametrize("row_tokens", [None, 9])  # one row; rows of a cap, padded
def test_packed_token_budget_step_equals_padded_reference(name, n_ranks, row_tokens):
    cfg = CFGS[name]
    model = _model()
    samples = _samples(1)
    params = list(model.parameters())
    ref = _reference(model, samples, cfg)
    g_ref = torch.autograd.grad(ref, params)
    got, rows = _packed(model, samples, cfg, n_ranks, row_tokens=row_tokens)
    g_got = torch.autograd.grad(got, params)
    assert max(rows) > 1  # some rows really hold several responses
    # log-probs are computed in float32 (as on the GPU), the rest in float64
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    for a, b in zip(g_got, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_packing_without_restarting_positions_is_caught():
    """Negative control: rows whose sequences may attend to each other give another loss, so
    the equality above would catch cross-sequence attention."""
    cfg = CFGS["token_mean"]
    model = _model()
    samples = _samples(1)
    ref = _reference(model, samples, cfg)
    bad, _ = _packed(model, samples, cfg, 1, packed_positions=False)
    assert abs(bad.item() - ref.item()) > 1e-3  # 1000x the tolerance above


def test_prompt_halves_keep_a_prompts_samples_together_and_the_order():
    from learner.batch import prompt_halves

    prompts = [[i + 3, 7, i % 5 + 1] for i in range(20)]
    samples = [TrainSample(p, [j + 1], [-0.5], 1.0, 0) for p in prompts for j in range(3)]
    a, b = prompt_halves(samples)
    assert len(a) + len(b) == len(samples) and a and b
    for half in (a, b):
        assert half == [s for s in samples if s in half]  # input order kept
    assert not {tuple(s.prompt_token_ids) for s in a} & {tuple(s.prompt_token_ids) for s in b}
    assert prompt_halves(samples) == (a, b)  # deterministic: every rank splits alike
