"""Turn ``TrainSample``s into tensors, plan micro-batches, and split a global batch across ranks.

Alignment: a causal LM's logits at position t predict token t + 1. Every per-token tensor
of ``collate`` therefore has T = L - 1 positions, position t standing for the token at input
t + 1: ``response_mask[b, t]`` says whether input token t + 1 is a response token and
``behaviour_logprobs[b, t]`` is that token's behaviour log-prob. A response of R tokens after
a prompt of P tokens occupies positions P - 1 .. P + R - 2.

The learner trains on ``pack``ed micro-batches instead: the samples of one micro-batch are
concatenated into ONE row (no padding), position ids restart at 0 for each sample (the model
then attends within each sample only), and the per-token tensors list the response tokens
alone, with the row position that predicts each. ``collate`` (padded, one row per sample)
stays as the plain reference that tests compare the packed path against.

Who goes where: ``common.sharding.shard_samples`` balances ranks by tokens (longest first onto the lightest
rank), ``plan_micro_batches`` fills each rank's micro-batches up to a token budget (first fit,
longest first); ranks then pad to the same micro-batch count (``filler_sample``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from common.sharding import n_tokens
from common.types import TrainSample


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


@dataclass
class PackedBatch:
    """One micro-batch packed into R rows of L tokens each. N = R x L, K = response tokens
    (K = 1 with ``mask`` False when there are none: a position that keeps the LM head in the
    graph, so that every rank's backward touches every parameter)."""

    input_ids: "torch.Tensor"  # (R, L) long: the samples' prompt + response, back to back
    position_ids: "torch.Tensor"  # (R, L) long: 0 .. len - 1 within each sample (and padding)
    positions: "torch.Tensor"  # (K,) long: flattened (R x L) position predicting each token
    targets: "torch.Tensor"  # (K,) long: the response tokens (input_ids.flatten()[positions + 1])
    behaviour_logprobs: "torch.Tensor"  # (K,) float32
    advantages: "torch.Tensor"  # (K,) float32: the token's response's advantage
    segment_ids: "torch.Tensor"  # (K,) long: which sample of the micro-batch (0 .. S - 1)
    mask: "torch.Tensor"  # (K,) bool: False only for the placeholder of an empty micro-batch

    def to(self, device) -> "PackedBatch":
        return PackedBatch(**{k: getattr(self, k).to(device) for k in self.__dataclass_fields__})


def rows_of(lengths: Sequence[int], row_tokens: int | None) -> list[list[int]]:
    """Sample indices per row: in order, a row closed when the next sample would take it past
    ``row_tokens`` (a sample longer than that has a row of its own); None: one row."""
    rows: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        if row_tokens is not None and rows[-1] and used + n > row_tokens:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += n
    return rows


def pack(samples: Sequence[TrainSample], row_tokens: int | None = None) -> PackedBatch:
    """Concatenate ``samples`` into rows of at most ``row_tokens`` tokens (see ``rows_of``;
    None: one row, nothing padded). Attention is over whole rows (transformers masks it to
    each sample from the position ids, ``LogprobModel``), so its cost grows with the square
    of a row's length: several short rows cost less than one long one. Shorter rows are
    padded to the longest with token 0, position ids restarting at 0 (a segment of their
    own that no real token attends to, and no loss position reads)."""
    import torch

    if len(samples) == 0:
        raise ValueError("pack needs at least one sample")
    for i, s in enumerate(samples):
        _check(s, i)
    lengths = [len(s.prompt_token_ids) + len(s.token_ids) for s in samples]
    rows = rows_of(lengths, row_tokens)
    L = max(sum(lengths[i] for i in row) for row in rows)
    ids, pos, positions, targets, behaviour, adv, seg = [], [], [], [], [], [], []
    for r, row in enumerate(rows):
        row_ids, row_pos = [], []
        for i in row:
            s = samples[i]
            P, R = len(s.prompt_token_ids), len(s.token_ids)
            off = r * L + len(row_ids)
            row_ids += list(s.prompt_token_ids) + list(s.token_ids)
            row_pos += range(P + R)
            positions += range(off + P - 1, off + P - 1 + R)
            targets += s.token_ids
            behaviour += s.logprobs
            adv += [float(s.advantage)] * R
            seg += [i] * R
        ids.append(row_ids + [0] * (L - len(row_ids)))
        pos.append(row_pos + list(range(L - len(row_pos))))
    mask = [True] * len(positions)
    if not positions:  # placeholder: predict the first token from itself, weight 0
        positions, targets, behaviour, adv, seg, mask = [0], [ids[0][0]], [0.0], [0.0], [0], \
            [False]
    long = dict(dtype=torch.long)
    return PackedBatch(
        input_ids=torch.tensor(ids, **long), position_ids=torch.tensor(pos, **long),
        positions=torch.tensor(positions, **long), targets=torch.tensor(targets, **long),
        behaviour_logprobs=torch.tensor(behaviour, dtype=torch.float32),
        advantages=torch.tensor(adv, dtype=torch.float32), segment_ids=torch.tensor(seg, **long),
        mask=torch.tensor(mask, dtype=torch.bool))


def plan_micro_batches(samples: Sequence[TrainSample], max_tokens: int | None,
                       max_seqs: int) -> list[list[TrainSample]]:
    """Group samples into micro-batches of at most ``max_tokens`` tokens (prompt + response;
    None: no budget) and ``max_seqs`` samples, deterministically: longest first, each into
    the first micro-batch it fits (first-fit decreasing), ties by input order. A sample
    longer than the budget gets a micro-batch of its own."""
    if max_seqs < 1:
        raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
    order = sorted(range(len(samples)), key=lambda i: (-n_tokens(samples[i]), i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        n = n_tokens(samples[i])
        for b, members in enumerate(bins):
            if len(members) < max_seqs and (max_tokens is None or loads[b] + n <= max_tokens):
                members.append(i)
                loads[b] += n
                break
        else:
            bins.append([i])
            loads.append(n)
    return [[samples[i] for i in members] for members in bins]


def filler_sample(like: TrainSample) -> TrainSample:
    """The one sample of a filler micro-batch: ``like``'s first prompt token, no response.
    A rank with fewer micro-batches than the others runs these so that every rank issues the
    same forward/backward calls (ZeRO gathers and reduces per micro-batch); it adds nothing
    to the loss, the gradient or any count."""
    return replace(like, prompt_token_ids=list(like.prompt_token_ids[:1]), token_ids=[],
                   logprobs=[], advantage=0.0)


def prompt_halves(samples: Sequence[TrainSample]) -> tuple[list[TrainSample], list[TrainSample]]:
    """Split samples in two by prompt for the gradient-noise measure (``optim.grad_noise``):
    a sample goes to half A or B by the parity of a hash of its prompt's token ids, so every
    rank puts a prompt's samples (which share the prompt and its baseline: they are not
    independent) in the same half, with no collective. Input order is kept in each half."""
    import zlib

    halves: tuple[list[TrainSample], list[TrainSample]] = ([], [])
    for s in samples:
        key = ",".join(map(str, s.prompt_token_ids)).encode()
        halves[zlib.crc32(key) & 1].append(s)
    return halves
