"""collate's and pack's alignment on hand-built samples, micro-batch planning by token
budget, and the token-balanced rank sharding policy."""
from __future__ import annotations

import pytest
import torch

from common.types import TrainSample
from common.sharding import n_tokens, shard_samples
from learner.batch import collate, filler_sample, pack, plan_micro_batches, rows_of

PAD = 0


def sample(prompt, resp, lps=None, adv=1.0, version=0):
    lps = lps if lps is not None else [-0.1 * (i + 1) for i in range(len(resp))]
    return TrainSample(prompt_token_ids=prompt, token_ids=resp, logprobs=lps, advantage=adv,
                       version=version)


def test_collate_hand_built():
    a = sample([5, 6, 7], [8, 9], lps=[-1.0, -2.0], adv=0.5, version=3)  # L = 5
    b = sample([5], [10, 11, 12], lps=[-0.5, -0.25, -0.125], adv=-1.0)  # L = 4
    out = collate([a, b], PAD)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 10, 11, 12, PAD]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # Position t predicts input t+1: a's response tokens 8, 9 sit at inputs 3, 4 -> positions 2, 3.
    assert out["response_mask"].tolist() == [[False, False, True, True],
                                             [True, True, True, False]]
    assert out["behaviour_logprobs"].tolist() == [[0.0, 0.0, -1.0, -2.0],
                                                  [-0.5, -0.25, -0.125, 0.0]]
    assert out["advantages"].tolist() == [0.5, -1.0]
    assert out["versions"].tolist() == [3, 0]
    assert out["input_ids"].dtype == torch.long and out["behaviour_logprobs"].dtype == torch.float32


def test_masked_targets_are_the_response_tokens():
    """Gathering input_ids[:, 1:] at response_mask recovers exactly each response, in order."""
    samples = [sample([1, 2], [3, 4, 5]), sample([1, 2, 3, 4], [9]), sample([7], [8, 8])]
    out = collate(samples, PAD)
    targets = out["input_ids"][:, 1:]
    for b, s in enumerate(samples):
        assert targets[b][out["response_mask"][b]].tolist() == s.token_ids
        assert out["behaviour_logprobs"][b][out["response_mask"][b]].tolist() == pytest.approx(s.logprobs)


def test_empty_response_has_no_mask():
    out = collate([sample([1, 2], []), sample([3], [4])], PAD)
    assert out["response_mask"].sum(1).tolist() == [0, 1]


def test_collate_rejects_bad_samples():
    with pytest.raises(ValueError, match="empty prompt"):
        collate([sample([], [1])], PAD)
    with pytest.raises(ValueError, match="2 response tokens but 1 behaviour logprobs"):
        collate([sample([1], [2, 3], lps=[-1.0])], PAD)
    with pytest.raises(ValueError, match="at least one sample"):
        collate([], PAD)


def test_pack_hand_built():
    a = sample([5, 6, 7], [8, 9], lps=[-1.0, -2.0], adv=0.5)  # row 0..4
    b = sample([5], [10, 11, 12], lps=[-0.5, -0.25, -0.125], adv=-1.0)  # row 5..8
    c = sample([4, 4], [], adv=3.0)  # no response: positions only
    p = pack([a, b, c])
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 5, 10, 11, 12, 4, 4]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1]]
    # a's 8 (row 3) is predicted from row 2; b's 10 (row 6) from row 5, its first token.
    assert p.positions.tolist() == [2, 3, 5, 6, 7]
    assert p.targets.tolist() == [8, 9, 10, 11, 12]
    assert p.targets.tolist() == p.input_ids[0, p.positions + 1].tolist()
    assert p.behaviour_logprobs.tolist() == [-1.0, -2.0, -0.5, -0.25, -0.125]
    assert p.advantages.tolist() == [0.5, 0.5, -1.0, -1.0, -1.0]
    assert p.segment_ids.tolist() == [0, 0, 1, 1, 1] and p.mask.all()


def test_pack_into_rows_of_a_token_cap_pads_each_row_as_its_own_segment():
    a = sample([5, 6, 7], [8, 9], adv=0.5)  # 5 tokens
    b = sample([5], [10, 11, 12], adv=-1.0)  # 4 tokens: with a, over the cap of 8
    c = sample([4, 4], [13])  # 3 tokens: fits beside b
    d = sample([1] * 9, [2])  # 10 tokens: longer than the cap, a row of its own
    p = pack([a, b, c, d], row_tokens=8)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 0, 0, 0, 0, 0],
                                    [5, 10, 11, 12, 4, 4, 13, 0, 0, 0],
                                    [1] * 9 + [2]]
    # padding restarts at 0: a segment of its own, which no real token attends to
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4],
                                       [0, 1, 2, 3, 0, 1, 2, 0, 1, 2],
                                       list(range(10))]
    # positions index the flattened rows (row r starts at r * 10)
    assert p.positions.tolist() == [2, 3, 10, 11, 12, 15, 28]
    assert p.targets.tolist() == p.input_ids.flatten()[p.positions + 1].tolist()
    assert p.segment_ids.tolist() == [0, 0, 1, 1, 1, 2, 3]
    assert pack([a, b, c, d]).input_ids.shape == (1, 22)  # no cap: one row, no padding
    assert rows_of([5, 4, 3, 10], 8) == [[0], [1, 2], [3]]
    assert rows_of([5, 4, 3, 10], None) == [[0, 1, 2, 3]]


def test_the_row_cap_resolves_by_device_and_an_explicit_value_wins():
    from learner.config import LearnerConfig

    assert (LearnerConfig().resolved_pack_rows(cuda=False),
            LearnerConfig().resolved_pack_rows(cuda=True)) == (256, None)
    assert LearnerConfig(pack_row_tokens=64).resolved_pack_rows(cuda=True) == 64
    assert LearnerConfig(pack_row_tokens=None).resolved_pack_rows(cuda=False) is None
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        LearnerConfig(pack_row_tokens=0)


def test_pack_matches_collate():
    """Packed response tokens are collate's masked tokens, in order, with the same values."""
    samples = [sample([1, 2], [3, 4, 5], adv=0.1), sample([1, 2, 3, 4], [9], adv=0.2),
               sample([7], [8, 8], adv=0.3)]
    c, p = collate(samples, PAD), pack(samples)
    m = c["response_mask"]
    assert p.targets.tolist() == c["input_ids"][:, 1:][m].tolist()
    assert p.behaviour_logprobs.tolist() == c["behaviour_logprobs"][m].tolist()
    assert p.advantages.tolist() == c["advantages"][:, None].expand_as(m)[m].tolist()


def test_pack_without_responses_keeps_a_zero_weight_position():
    p = pack([filler_sample(sample([4, 5, 6], [7, 8]))])
    assert p.input_ids.tolist() == [[4]] and p.position_ids.tolist() == [[0]]
    assert p.positions.tolist() == [0] and p.mask.tolist() == [False]
    assert p.advantages.tolist() == [0.0]


def test_plan_micro_batches_respects_budget_and_count():
    lengths = [(3, 9), (2, 2), (5, 20), (1, 1), (4, 6), (2, 7), (1, 3)]  # tokens 12 4 25 2 10 9 4
    s = [sample([1] * p, [2] * r) for p, r in lengths]
    micro = plan_micro_batches(s, max_tokens=16, max_seqs=3)
    # every sample exactly once
    assert sorted(id(x) for mb in micro for x in mb) == sorted(id(x) for x in s)
    for mb in micro:
        assert len(mb) <= 3
        assert sum(n_tokens(x) for x in mb) <= 16 or len(mb) == 1  # 25 tokens: alone
    assert [[n_tokens(x) for x in mb] for mb in micro] == [[25], [12, 4], [10, 4, 2], [9]]
    assert plan_micro_batches(s, max_tokens=16, max_seqs=3) == micro  # deterministic
    # no token budget: count only
    assert [len(mb) for mb in plan_micro_batches(s, None, 3)] == [3, 3, 1]
    with pytest.raises(ValueError, match="max_seqs"):
        plan_micro_batches(s, 16, 0)


def test_shard_balances_tokens():
    """Longest first onto the lightest rank: one long response and many short ones."""
    s = [sample([1], [2] * 40)] + [sample([1], [2] * 9) for _ in range(8)]  # 41 + 8 x 10
    shards = shard_samples(s, 2)
    loads = [sum(n_tokens(x) for x in sh) for sh in shards]
    assert sorted(loads) == [60, 61]  # equal response counts would give 41+30 vs 50
    assert sorted(id(x) for sh in shards for x in sh) == sorted(id(x) for x in s)
    assert shards == shard_samples(s, 2)  # deterministic


def test_shard_balance_bound_property():
    """LPT bound: the heaviest rank carries at most the mean plus one sample's tokens."""
    import random

    for seed in range(20):
        r = random.Random(seed)
        n_ranks = r.randint(1, 5)
        s = [sample([1] * r.randint(1, 8), [2] * r.randint(0, 60))
             for _ in range(r.randint(n_ranks, 30))]
        shards = shard_samples(s, n_ranks)
        loads = [sum(n_tokens(x) for x in sh) for sh in shards]
        assert len(shards) == n_ranks and all(shards)
        assert max(loads) <= sum(loads) / n_ranks + max(n_tokens(x) for x in s)
        # each shard keeps the input order
        for sh in shards:
            idx = [next(i for i, y in enumerate(s) if y is x) for x in sh]
            assert idx == sorted(idx)


def test_shard_rejects_too_few_samples():
    with pytest.raises(ValueError, match="2 samples cannot feed 3 learner ranks"):
        shard_samples([sample([1], [2])] * 2, 3)
    with pytest.raises(ValueError, match="n_ranks"):
        shard_samples([sample([1], [2])], 0)


def test_filler_sample_is_one_prompt_token():
    s = sample([4, 5], [6], adv=2.0)
    f = filler_sample(s)
    assert f.prompt_token_ids == [4] and f.token_ids == [] and f.advantage == 0.0
    assert s.token_ids == [6] and s.prompt_token_ids == [4, 5]
