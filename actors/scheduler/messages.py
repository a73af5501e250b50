"""The scheduler's config and the actions its driver carries out (``Dispatch``, ``Cancel``)
or reports back (``Finished``): pure, frozen dataclasses."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.scheduler.selection import SelectionConfig


def priority(deadline: int, first: bool) -> int:
    """Engine priority of a request (vLLM runs lower values first): earliest deadline first,
    and among prompts due at the same version, extra rollouts before new prompts."""
    return 2 * deadline + int(first)


@dataclass(frozen=True)
class SchedulerConfig:
    """The knobs of the policy (built from the run config by the coordinator)."""

    # No defaults for these three: the run config states them (rollout.batch_prompts,
    # rollout.max_staleness, generators.engine.max_num_seqs), the simulator its own.
    batch_prompts: int                # B: prompts per learner step (= prompts per deadline)
    max_staleness: int                # versions a sample may age before it is trained
    slots_per_generator: int          # engine sequence slots (vLLM max_num_seqs)
    max_inflight_prompts: int | None = None  # cap on admitted, not yet handed prompts
    max_regenerations: int = 2        # stale re-generations of one prompt before it is dropped
    max_refill_factor: int = 4        # barrier: accept a short batch after this many x B drops
    # S: samples (rollouts) per learner step, whatever each prompt's k (None: B prompts). The
    # batch closes once its prompts hold S samples; each deadline's quota is then S over the
    # recent mean k (``batch_prompts`` until prompts have finished), so that every algorithm,
    # fixed-k or not, makes one update per S rollouts.
    batch_samples: int | None = None
    # Admission by selection (``actors.scheduler.selection``): which drawn prompts get
    # rollouts at all. None: every prompt drawn is admitted, in the stream's order.
    selection: SelectionConfig | None = None

    def __post_init__(self):
        if self.batch_prompts < 1:
            raise ValueError(f"batch_prompts must be >= 1, got {self.batch_prompts}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.slots_per_generator < 1:
            raise ValueError(f"slots_per_generator must be >= 1, got {self.slots_per_generator}")
        if self.batch_samples is not None and self.batch_samples < 1:
            raise ValueError(f"batch_samples must be >= 1, got {self.batch_samples}")
        if self.max_inflight_prompts is not None and self.max_inflight_prompts < self.batch_prompts:
            raise ValueError(f"max_inflight_prompts ({self.max_inflight_prompts}) must be >= "
                             f"batch_prompts ({self.batch_prompts}): else no batch can form")
        if self.selection is not None and self.selection.window < self.batch_prompts:
            raise ValueError(f"the selection window ({self.selection.window}) must hold at "
                             f"least one batch ({self.batch_prompts} prompts)")


# -- what the driver does ------------------------------------------------------------------

@dataclass(frozen=True)
class Dispatch:
    """Generate rollouts ``indices`` of prompt ``uid`` on ``generator`` (one engine request
    of n = len(indices) completions; completion j is rollout ``indices[j]``)."""

    request_id: str
    uid: str
    indices: tuple[int, ...]
    generator: int
    priority: int
    round: int


@dataclass(frozen=True)
class Cancel:
    """Abort completions ``positions`` of request ``request_id`` in its engine."""

    request_id: str
    uid: str
    positions: tuple[int, ...]
    generator: int


@dataclass(frozen=True)
class Finished:
    """One completion of a request as the driver scored it. ``cancelled``: it was aborted
    before finishing (its ``tokens`` are spent compute, its reward is meaningless)."""

    position: int
    reward: float
    tokens: int
    start_version: int
    payload: Any = None
    cancelled: bool = False
