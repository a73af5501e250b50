"""Turn ``TrainSample``s into padded tensors, and split a global batch across ranks.

Alignment: a causal LM's logits at position t predict token t + 1. Every per-token tensor
here therefore has T = L - 1 positions, position t standing for the token at input t + 1:
``response_mask[b, t]`` says whether input token t + 1 is a response token and
``behaviour_logprobs[b, t]`` is that token's behaviour log-prob. A response of R tokens after
a prompt of P tokens occupies positions P - 1 .. P + R - 2.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from actors.types import TrainSample


def _check(s: TrainSample, i: int) -> None:
    if len(s.prompt_token_ids) == 0:
        raise ValueError(f"sample {i} has an empty prompt: its first response token would have "
                         "no position to be predicted from")
    if len(s.logprobs) != len(s.token_ids):
        raise ValueError(f"sample {i} has {len(s.token_ids)} response tokens but "
                         f"{len(s.logprobs)} behaviour logprobs")


def collate(samples: Sequence[TrainSample], pad_id: int) -> dict:
    """Right-pad prompt + response into tensors.

    Returns input_ids (B, L) long, attention_mask (B, L) long, response_mask (B, L-1) bool,
    behaviour_logprobs (B, L-1) float32 (0 off the response), advantages (B,) float32,
    versions (B,) long; L is the longest prompt + response in the batch.
    """
    import torch

    if len(samples) == 0:
        raise ValueError("collate needs at least one sample")
    for i, s in enumerate(samples):
        _check(s, i)
    B = len(samples)
    L = max(len(s.prompt_token_ids) + len(s.token_ids) for s in samples)
    input_ids = torch.full((B, L), int(pad_id), dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    response_mask = torch.zeros((B, max(L - 1, 0)), dtype=torch.bool)
    behaviour = torch.zeros((B, max(L - 1, 0)), dtype=torch.float32)
    for b, s in enumerate(samples):
        P, R = len(s.prompt_token_ids), len(s.token_ids)
        input_ids[b, :P + R] = torch.tensor(list(s.prompt_token_ids) + list(s.token_ids))
        attention_mask[b, :P + R] = 1
        if R:
            response_mask[b, P - 1:P - 1 + R] = True
            behaviour[b, P - 1:P - 1 + R] = torch.tensor(s.logprobs, dtype=torch.float32)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "response_mask": response_mask,
        "behaviour_logprobs": behaviour,
        "advantages": torch.tensor([float(s.advantage) for s in samples], dtype=torch.float32),
        "versions": torch.tensor([int(s.version) for s in samples], dtype=torch.long),
    }


def padding_sample(like: TrainSample) -> TrainSample:
    """A filler with ``like``'s prompt and NO response: it runs through forward/backward (so
    every rank issues the same collectives) but has no response token, so it adds exactly
    nothing to the loss, its gradient, or any count."""
    return replace(like, token_ids=[], logprobs=[], advantage=0.0)


def shard_samples(samples: Sequence[TrainSample], n_ranks: int) -> list[list[TrainSample]]:
    """Split a global batch into ``n_ranks`` shards of equal length, deterministically.

    Contiguous slices in order; the first B % n_ranks ranks get one sample more than the
    rest, whose shards are then topped up with one ``padding_sample`` each (never a duplicate
    of a real sample, which would re-weight it). Equal lengths keep every rank's micro-batch
    count, hence its collective calls (ZeRO-2/3 reduce and gather per micro-batch), in lockstep.
    """
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    B = len(samples)
    if B < n_ranks:
        raise ValueError(f"{B} samples cannot feed {n_ranks} learner ranks: "
                         "pass at least one sample per rank")
    q, rem = divmod(B, n_ranks)
    shards, start = [], 0
    for r in range(n_ranks):
        size = q + (1 if r < rem else 0)
        shard = list(samples[start:start + size])
        start += size
        if rem and size == q:
            shard.append(padding_sample(shard[-1]))
        shards.append(shard)
    return shards
