"""Messages that cross actor boundaries. Pure dataclasses: no Ray, torch or vLLM import.

Every message is a plain dataclass of Python scalars and lists so that Ray pickles it
cheaply and msgpack can record it (see ``learner/replay.py``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters of one rollout request (a subset of vLLM's SamplingParams)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class RolloutRequest:
    """Ask a generator for ``n`` completions of one prompt."""

    request_id: str
    prompt_id: str
    prompt: str
    n: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass
class Rollout:
    """One completion. ``logprobs[t]`` is the behaviour log-prob of ``token_ids[t]``
    under the policy that generated it. ``version`` is the policy version when generation
    started and ``version_end`` when it finished: they differ when weights were updated in
    place while the request was in flight (its tokens then mix both policies, and the
    behaviour log-probs say exactly which policy produced each token)."""

    request_id: str
    prompt_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    version: int
    version_end: int = -1
    generator: int = -1
    t_start: float = 0.0
    t_end: float = 0.0
    reward: float | None = None
    parsed: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainSample:
    """One response as the learner sees it: tokens, behaviour log-probs, a scalar advantage."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    advantage: float
    version: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainSample":
        return cls(**d)
