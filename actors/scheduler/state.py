"""What the scheduler keeps of each prompt in flight and of each engine request."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actors.scheduler.messages import Dispatch
from estimator.state import PromptState


@dataclass
class PromptInFlight:
    """A prompt in flight: its estimator state, its rollouts by index, when and where."""

    uid: str
    problem: Any
    state: PromptState
    admitted_version: int
    deadline: int
    home: int                                   # generator holding its prefix
    t_admit: float
    payloads: dict[int, Any] = field(default_factory=dict)       # index -> rollout
    start_version: dict[int, int] = field(default_factory=dict)  # index -> version at start
    t_done: float = 0.0
    regenerations: int = 0
    cancelled_rollouts: int = 0
    cancelled_tokens: int = 0
    requests: set[str] = field(default_factory=set)             # its requests in flight
    train_n: int | None = None  # set at hand-over: samples the learner trains (see up_to_samples)

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def trainable(self) -> int:
        """Samples the learner may train of this prompt: all k rollouts, but for an
        estimator that holds some out for its baseline (the oracle)."""
        return self.state.est.trained(self.state.k)

    @property
    def trained(self) -> int:
        """Samples the learner trains of this prompt (after the batch's trim)."""
        return self.trainable if self.train_n is None else self.train_n

    def oldest_version(self) -> int:
        return min(self.start_version.values(), default=self.admitted_version)


@dataclass
class Request:
    dispatch: Dispatch
    live: set[int]                                     # positions whose result is awaited
    cancelled: set[int] = field(default_factory=set)   # cancelled, their report awaited


def up_to_samples(order: list[PromptInFlight], S: int, V: int) -> list[PromptInFlight]:
    """The batch of a sample-counted step: the first prompts of ``order`` (earliest due first)
    until they hold ``S`` trainable samples, and every prompt due at or before ``V`` (it must
    be trained now) even past S; then trimmed to exactly S samples (``cap_samples``) when
    they hold more. Short only when ``order`` holds fewer."""
    out, total = [], 0
    for g in order:
        if total >= S and g.deadline > V:
            break
        out.append(g)
        total += g.trainable
    cap_samples(out, S)
    return out


def cap_samples(batch: list[PromptInFlight], S: int) -> None:
    """Trim a batch holding more than ``S`` trainable samples to exactly S by one cap on the
    samples trained per prompt (water-filling: the prompts with the most samples give up
    theirs first, each keeps at least min(its own, cap)); the remainder below the cap goes one
    each to the earliest prompts over it. Sets ``train_n`` on the prompts trimmed. A prompt's
    baseline still uses all its rollouts; only its trained samples are fewer. So every update
    trains S samples whatever k each prompt reached (issue 29: V0.5 took every prompt due
    and trained 12-14% more samples per update than GRPO, hence fewer updates per rollout);
    and the prompts that asked for the most rollouts are not the ones cut out."""
    sizes = [g.trainable for g in batch]
    if sum(sizes) <= S:
        return
    cap = max(c for c in range(max(sizes) + 1) if sum(min(n, c) for n in sizes) <= S)
    left = S - sum(min(n, cap) for n in sizes)
    for g, n in zip(batch, sizes):
        m = min(n, cap)
        if n > cap and left > 0:
            m, left = m + 1, left - 1
        if m < n:
            g.train_n = m
