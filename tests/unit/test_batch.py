"""collate's alignment on hand-built samples, and the rank sharding policy."""
from __future__ import annotations

import pytest
import torch

from actors.types import TrainSample
from learner.batch import collate, padding_sample, shard_samples

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


def test_shard_even_split_is_contiguous():
    s = [sample([1], [i + 2]) for i in range(6)]
    shards = shard_samples(s, 3)
    assert shards == [s[0:2], s[2:4], s[4:6]]


def test_shard_uneven_pads_with_empty_responses():
    s = [sample([1], [i + 2]) for i in range(5)]
    shards = shard_samples(s, 3)  # sizes 2, 2, 1 + one filler
    assert [len(x) for x in shards] == [2, 2, 2]
    assert shards[0] == s[0:2] and shards[1] == s[2:4] and shards[2][0] == s[4]
    filler = shards[2][1]
    assert filler.token_ids == [] and filler.logprobs == [] and filler.advantage == 0.0
    # Every real sample appears exactly once.
    real = [x for shard in shards for x in shard if x.token_ids]
    assert real == s


def test_shard_rejects_too_few_samples():
    with pytest.raises(ValueError, match="2 samples cannot feed 3 learner ranks"):
        shard_samples([sample([1], [2])] * 2, 3)
    with pytest.raises(ValueError, match="n_ranks"):
        shard_samples([sample([1], [2])], 0)


def test_padding_sample_keeps_prompt():
    s = sample([4, 5], [6], adv=2.0)
    p = padding_sample(s)
    assert p.prompt_token_ids == [4, 5] and p.token_ids == [] and s.token_ids == [6]
