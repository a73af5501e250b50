"""A step's samples split over the learner ranks, and handed over by reference.

``shard_members`` balances ranks by tokens (longest sample first onto the lightest rank).
The coordinator puts each rank's shard in Ray's object store itself (``make_shards``) and
hands the driver a ``Shards``: the object references and the batch's metadata (each sample's
policy version and token count, each shard's positions in the batch). The driver passes the
references on to the ranks and counts from the metadata; the samples go from the
coordinator's object store to each rank without passing through the driver (docs/
architecture.md, "Samples by reference"). Pure: ``put`` is ``ray.put`` in the coordinator and
anything else in a test.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Sequence

from common.types import TrainSample


def n_tokens(s: TrainSample) -> int:
    """Positions the sample occupies in a forward pass (prompt + response)."""
    return len(s.prompt_token_ids) + len(s.token_ids)


def shard_members(samples: Sequence[TrainSample], n_ranks: int) -> list[list[int]]:
    """Each rank's sample positions (ascending) in a balanced split of the global batch.

    Longest sample first, each onto the rank with the fewest tokens so far (ties: lower
    rank), so the largest shard exceeds the mean by at most one sample's tokens. Deterministic.
    Every rank gets at least one sample (a sample has at least one prompt token, so an empty
    rank is always the lightest). Shards may differ in sample count: ranks equalise their
    micro-batch counts themselves.
    """
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    B = len(samples)
    if B < n_ranks:
        raise ValueError(f"{B} samples cannot feed {n_ranks} learner ranks: "
                         "pass at least one sample per rank")
    heap = [(0, r) for r in range(n_ranks)]  # (tokens so far, rank)
    members: list[list[int]] = [[] for _ in range(n_ranks)]
    for i in sorted(range(B), key=lambda i: (-n_tokens(samples[i]), i)):
        load, r = heapq.heappop(heap)
        members[r].append(i)
        heapq.heappush(heap, (load + n_tokens(samples[i]), r))
    return [sorted(m) for m in members]


def shard_samples(samples: Sequence[TrainSample], n_ranks: int) -> list[list[TrainSample]]:
    """The shards of ``shard_members``, each in input order."""
    return [[samples[i] for i in m] for m in shard_members(samples, n_ranks)]


@dataclass
class Shards:
    """A batch's samples by reference: ``refs[r]`` holds rank r's ``list[TrainSample]``
    (a Ray ObjectRef), ``members[r]`` their positions in the batch's order; ``versions`` and
    ``tokens`` (prompt + response) per sample, in that order: what the driver counts."""

    refs: list
    members: list[list[int]]
    versions: list[int]
    tokens: list[int]

    def ordered(self, fetched: Sequence[Sequence[TrainSample]]) -> list[TrainSample]:
        """The batch's samples in order, from each shard's fetched contents (``ray.get`` of
        ``refs``, by the one reader that needs them: the rollout recorder)."""
        out: list[TrainSample | None] = [None] * len(self.versions)
        for members, shard in zip(self.members, fetched):
            if len(members) != len(shard):
                raise ValueError(f"a shard holds {len(shard)} samples, its members list "
                                 f"{len(members)}")
            for i, s in zip(members, shard):
                out[i] = s
        return out  # type: ignore[return-value]


def make_shards(samples: Sequence[TrainSample], n_ranks: int,
                put: Callable[[list[TrainSample]], object]) -> Shards:
    """Split ``samples`` over ``n_ranks`` ranks and ``put`` each shard (``ray.put``)."""
    members = shard_members(samples, n_ranks)
    return Shards(refs=[put([samples[i] for i in m]) for m in members], members=members,
                  versions=[s.version for s in samples], tokens=[n_tokens(s) for s in samples])
