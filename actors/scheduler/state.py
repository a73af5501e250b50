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

    @property
    def done(self) -> bool:
        return self.state.done

    def oldest_version(self) -> int:
        return min(self.start_version.values(), default=self.admitted_version)


@dataclass
class Request:
    dispatch: Dispatch
    live: set[int]                                     # positions whose result is awaited
    cancelled: set[int] = field(default_factory=set)   # cancelled, their report awaited


def up_to_samples(order: list[PromptInFlight], S: int, V: int) -> list[PromptInFlight]:
    """The first prompts of ``order`` (earliest due first) until they hold ``S`` samples;
    every prompt due at or before ``V`` is taken even past S (it must be trained now)."""
    out, total = [], 0
    for g in order:
        if total >= S and g.deadline > V:
            break
        out.append(g)
        total += g.state.k
    return out
