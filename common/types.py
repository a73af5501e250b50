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
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks, engine probes)


@dataclass(frozen=True)
class RolloutRequest:
    """Ask a generator for ``n`` completions of one prompt. ``priority``: lower is scheduled
    first by engines that support priority scheduling (extra rollouts of a prompt in flight
    go before new prompts). ``messages``: the prompt's chat turns, (role, content) pairs,
    when it is a conversation other than one user turn (``tasks.base.Problem.messages``);
    empty: ``prompt`` is the user turn. ``seeds``: completion i's sampling seed (one per
    completion, ``actors.prompts.rollout_seed``); empty: ``sampling.seed`` + i, or none."""

    request_id: str
    prompt_id: str
    prompt: str
    n: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    priority: int = 0
    messages: tuple[tuple[str, str], ...] = ()
    seeds: tuple[int, ...] = ()


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
    reward_extras: tuple = ()  # (name, value) pairs a reward function returned beside its score
    cancelled: bool = False   # aborted in the engine before it finished (tokens so far kept)
    incarnation: str = ""     # which life of the generator actor served it (restart detection)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PriorObservation:
    """One finished prompt as the coordinator tells the prior (``PriorServer.observe``), one
    item of the window the prior conditions on. ``score``: its observed success rate in
    [0, 1] (``actors.prompts.success_rate``); ``version``: the policy version when it
    finished (the server turns it into the observation's age); ``rollouts``: how many
    sampled responses the score is the mean of (a score of 16 rollouts is four times as
    precise as one of 4, and the prior weighs it so). The server checks every field."""

    prompt: str
    score: float
    version: int
    rollouts: int = 1


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


@dataclass
class PromptRecord:
    """What the run keeps of one finished prompt (a line of ``prompts.jsonl``)."""

    prompt_id: str
    uid: str
    prompt: str
    k: int                     # rewards the baseline used
    rewards: list[float]
    baseline: float
    prior_p: float | None      # the prior's success probability (None: no prior)
    prior_accepted: bool | None  # the real-time test kept the prior (None: no prior)
    fallback: bool             # the prior was missing: empirical-mean fallback
    unparsed: int              # completions with no answer the verifier could read
    admitted_version: int
    deadline: int              # version by which the scheduler had to train it
    versions: list[int]        # policy versions that started its samples
    generators: list[int]
    rounds: int                # generation rounds (waits) it took
    cancelled_rollouts: int
    cancelled_tokens: int
    regenerations: int         # times stale samples were re-generated
    tokens: int                # response tokens of its samples
    lengths: list[int]
    prompt_tokens: int
    t_admit: float
    t_done: float
    spans: list[tuple[int, float, float]]  # (generator, start, end) per sample
    trained_samples: int | None = None  # samples the learner trained of its k (None: all):
                                        # fewer for the oracle and in a trimmed batch
    # a reward function's other returned numbers, each's mean over the prompt's rollouts
    reward_extras: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainBatch:
    """What the coordinator hands the learner for one step. In a run the samples travel by
    reference (``shards``: a ``common.sharding.Shards``, ``samples`` empty), so the driver
    holds only the records and the samples' metadata; inline ``samples`` serve in-process
    callers (a coordinator told of no learner ranks)."""

    records: list[PromptRecord]
    samples: list[TrainSample]
    version: int               # policy version the learner is at when it takes the batch
    inflight_prompts: int      # admitted, not yet handed, after this hand-over
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (uid, reason) since the last
    shards: object | None = None   # common.sharding.Shards: the samples by reference
    # Rollouts generated for training so far, this one's included (the scheduler's
    # rollouts_dispatched: every rollout sent to a generator, trained or not): the cost axis
    # of equal-rollout comparisons and ``run.max_rollouts``
    rollouts_generated: int = 0
    notes: list[str] = field(default_factory=list)  # said once on the run's console
    # (uid, p, admission probability) of the prompts the selection deferred since the last
    deferred: list[tuple] = field(default_factory=list)

    def sample_versions(self) -> list[int]:
        """Each sample's policy version, in the batch's order."""
        return self.shards.versions if self.shards is not None else \
            [s.version for s in self.samples]

    def sample_tokens(self) -> list[int]:
        """Each sample's prompt + response tokens, in the batch's order."""
        return self.shards.tokens if self.shards is not None else \
            [len(s.prompt_token_ids) + len(s.token_ids) for s in self.samples]
