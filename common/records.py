"""Records the roles hand the driver, each defined once and passed on unchanged: the learner's
``StepResult`` (one optimiser step), the coordinator's ``Accounting`` (every admitted prompt's
fate, the rollouts, the faults and the scorer's ``ScoringCounts``) and a generator's
``GeneratorStats`` (its counters and clocks) and the coordinator's ``WaitingOn`` (for the
trainer's watchdog). Pure dataclasses: no Ray, torch or vLLM import.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from enum import Enum

# The learner's per-token metrics: summed over response tokens on every rank (one all-reduce)
# and divided by the global token count. A ``StepResult`` field each; the loss output
# (``learner.loss``) carries each under the same name.
PER_TOKEN = ("clip_fraction", "approx_kl", "kl", "entropy", "is_weight", "truncated_fraction",
             "dual_clip_fraction")


def named(cls, d: dict, leave: tuple[str, ...] = ()) -> dict:
    """The items of ``d`` named like a field of the dataclass ``cls`` (but those in
    ``leave``): what a record's ``of`` takes from a dict that may hold more, or older, names."""
    names = {f.name for f in fields(cls)} - set(leave)
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class StepResult:
    """One learner step, as rank 0 reports it (every rank computes the same reduced values)."""

    loss: float = math.nan
    grad_norm: float = math.nan   # the global norm before clipping
    grad_noise_to_signal: float = math.nan  # optim.grad_noise: two prompt halves' gradients
    clip_fraction: float = math.nan
    approx_kl: float = math.nan
    kl: float = math.nan
    entropy: float = math.nan
    is_weight: float = math.nan
    truncated_fraction: float = math.nan
    dual_clip_fraction: float = math.nan
    n_tokens: int = 0             # response tokens of the global batch
    n_samples: int = 0            # non-empty responses of the global batch
    skipped: bool = False         # the update was not applied (non-finite loss or gradient)
    skip_reason: str = ""
    updates_applied: int = 0      # optimiser steps applied so far (a skipped step is not one)
    consecutive_skips: int = 0
    learner_step_s: float = 0.0   # this update's time in the learner (the run's step is longer)
    lr: float = math.nan
    micro_batches: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SchedulerCounts:
    """The scheduler's counters (``Scheduler.counts``): each written in one place of the
    scheduler, read by attribute, checkpointed as they are, and carried to summary.json under
    these names (``Accounting.summary``)."""

    prompts_admitted: int = 0
    prompts_handed: int = 0
    rollouts_dispatched: int = 0       # every rollout sent to a generator for training
    rollouts_finished: int = 0
    rollouts_cancelled: int = 0
    cancelled_tokens: int = 0          # tokens of cancelled rollouts: spent, never trained
    extra_rollouts_requested: int = 0  # beyond a prompt's first k_init
    reissued_requests: int = 0         # re-sent after a lost generator or a resume
    stale_regenerated: int = 0         # samples re-generated for being too old
    deadline_cuts: int = 0             # prompts stopped at their deadline with k >= k_init
    generator_losses: int = 0          # generators taken out of service (dead, restarted, hung)
    batch_top_ups: int = 0             # sample-counted batches short of S that took more prompts

    @classmethod
    def of(cls, d: dict) -> "SchedulerCounts":
        """From a dict with these names (a checkpoint's, summary.json); others ignored."""
        return cls(**named(cls, d))


@dataclass
class GeneratorCounts:
    """A generator's counters since its actor (re)started: each written by ``Generator`` where
    its event happens, read by attribute (``GeneratorStats.counts``)."""

    requests: int = 0           # generate calls ended (each asks for n completions)
    rollouts: int = 0           # completions finished
    tokens: int = 0             # their sampled tokens
    cancelled: int = 0          # completions cancelled, before they started or while running
    cancelled_tokens: int = 0   # tokens the cancelled ones had sampled: spent, never trained
    updates: int = 0            # weight updates loaded
    update_s: float = 0.0       # seconds they took

    @property
    def sampled_tokens(self) -> int:
        """Every token it sampled: the finished completions' and the cancelled ones'."""
        return self.tokens + self.cancelled_tokens


@dataclass(frozen=True)
class GeneratorStats:
    """One generator's ``stats()``: where it stands now and its counters since its actor
    (re)started. The driver reads two samples' differences (``cluster.records.metrics``:
    busy fraction, slot occupancy, decode tokens/s) and the engine's start-up time."""

    index: int
    version: int                # the weights it serves
    in_flight: int              # generate calls in progress
    sequences: int              # engine requests in progress (completions)
    seq_s: float                # sequence-seconds in the engine, each capped at max_num_seqs
    max_num_seqs: int           # the engine's sequence slots
    counts: GeneratorCounts
    busy_s: float               # seconds with at least one generate call in progress
    uptime_s: float             # seconds since the actor (re)started
    engine_start_s: float       # seconds its engine took to start
    env: dict[str, str]         # the environment it set for its engine (threads, binding)
    engine_core: str            # "in_process" or "own_process"

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.uptime_s if self.uptime_s > 0 else 0.0


@dataclass
class ScoringCounts:
    """The scorer's counters (``actors.scoring.Scorer.counts``), each written where its event
    happens, read by attribute; summary.json's ``scoring`` carries them under these names."""

    scored: int = 0            # answers scored
    faults_injected: int = 0   # answers given an injected verifier fault (reward.inject_fault)
    overlong_shaped: int = 0   # rewards the overlong term changed
    score_error: int = 0       # verifier raised (or its worker died): the low reward
    score_timeout: int = 0     # verifier missed its deadline (its worker killed): the low reward

    @classmethod
    def of(cls, d: dict) -> "ScoringCounts":
        """From summary.json's ``scoring`` (its names; others ignored)."""
        return cls(**named(cls, d))


class DropReason(str, Enum):
    """Why an admitted prompt was dropped: a ``DropCounts`` field each, and dropped.jsonl's
    ``reason`` (followed there by ``: <exception type>`` for the two errors)."""

    FILTERED_ALL_EQUAL = "filtered_all_equal"  # its group's rewards all equal (algo.filter)
    STALE = "stale"                            # too old after max_regenerations re-generations
    GENERATOR_ERROR = "generator_error"        # its requests raised in the engine, repeatedly
    COORDINATOR_ERROR = "coordinator_error"    # handling its completions raised (the coordinator)
    LEARNER_NAN_SKIP = "learner_nan_skip"      # its step's update was skipped (a NaN loss)
    ABORTED = "aborted"                        # its driver gave it up (over-sampling's abort)

    @staticmethod
    def kind(text: str) -> str:
        """The kind named by dropped.jsonl's ``reason`` (``kind`` or ``kind: detail``)."""
        return text.split(":", 1)[0].strip()

    def line(self, detail: str = "") -> str:
        """dropped.jsonl's ``reason``: the kind, then ``: detail`` where there is one."""
        return f"{self.value}: {detail}" if detail else self.value


@dataclass
class DropCounts:
    """Prompts dropped, by ``DropReason`` (a field each, under its value): the scheduler's
    (``Scheduler.drops``), the accounting's ``drop_reasons``; summary.json carries them under
    these names."""

    filtered_all_equal: int = 0
    stale: int = 0
    generator_error: int = 0
    coordinator_error: int = 0
    learner_nan_skip: int = 0
    aborted: int = 0

    def add(self, reason: DropReason, n: int = 1) -> None:
        setattr(self, reason.value, getattr(self, reason.value) + n)

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    @classmethod
    def of(cls, d: dict) -> "DropCounts":
        """From summary.json's ``drop_reasons`` or a checkpoint's ``drops``; files written
        before the counts were typed name the errors ``kind: <exception type>``, each folded
        into its kind."""
        known = {r.value: r for r in DropReason}
        out = cls()
        for text, n in d.items():
            reason = known.get(DropReason.kind(text))
            if reason is not None:
                out.add(reason, n)
        return out


# Accounting's lists of uids: to dropped.jsonl, deferred.jsonl and inflight_at_end.json
UID_LISTS = ("inflight_uids", "dropped_since_last_batch", "deferred_since_last_batch",
             "waiting_uids")


@dataclass(frozen=True)
class Accounting:
    """What the coordinator accounts for when it stops (``Coordinator.stop``): the scheduler's
    counters (``scheduler``) and the rest; the identity ``prompts_admitted = prompts_trained +
    prompts_dropped + prompts_in_flight_at_end`` holds with the trainer's ``prompts_trained``.
    summary.json carries every field, the scheduler's flat beside the others, but the uid
    lists (``UID_LISTS``), which go to dropped.jsonl, deferred.jsonl and
    inflight_at_end.json."""

    scheduler: SchedulerCounts = field(default_factory=SchedulerCounts)
    drop_reasons: DropCounts = field(default_factory=DropCounts)  # prompts_dropped: their total
    prompts_in_flight_at_end: int = 0
    # Admission by selection (``algo.select``): prompts_drawn = prompts_admitted +
    # prompts_deferred + prompts_waiting_at_end (without selection drawn = admitted)
    prompts_drawn: int = 0
    prompts_deferred: int = 0
    prompts_waiting_at_end: int = 0
    prior_fallbacks: int = 0
    requests_per_generator: list = field(default_factory=list)
    data_pos: int = 0             # the sampler's stream position up to which prompts were admitted
    generator_events: list = field(default_factory=list)
    scoring: ScoringCounts = field(default_factory=ScoringCounts)
    inflight_uids: list = field(default_factory=list)
    dropped_since_last_batch: list = field(default_factory=list)  # (uid, reason)
    deferred_since_last_batch: list = field(default_factory=list)  # (uid, p, probability)
    waiting_uids: list = field(default_factory=list)  # candidates undecided at the end

    @property
    def prompts_dropped(self) -> int:
        return self.drop_reasons.total

    def summary(self) -> dict:
        """summary.json's fields: the scheduler's counters flat, then the others (the uid
        lists left out; ``drop_reasons`` and ``scoring`` objects of their counters' names)."""
        own = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in UID_LISTS and f.name != "scheduler"}
        return {**asdict(self.scheduler), "prompts_dropped": self.prompts_dropped, **own,
                "drop_reasons": asdict(self.drop_reasons), "scoring": asdict(self.scoring)}

    @classmethod
    def of(cls, d: dict) -> "Accounting":
        """From summary.json's flat object (unknown keys ignored)."""
        return cls(scheduler=SchedulerCounts.of(d),
                   drop_reasons=DropCounts.of(d.get("drop_reasons") or {}),
                   scoring=ScoringCounts.of(d.get("scoring") or {}),
                   **named(cls, d, leave=("scheduler", "drop_reasons", "scoring")))


def mean_extras(extras: list[dict], weights: list[int] | None = None) -> dict | None:
    """Each key's mean over the dicts that have it (weighted; None: no dict has a key)."""
    weights = weights or [1] * len(extras)
    sums: dict[str, list[float]] = {}
    for d, w in zip(extras, weights):
        for k, v in (d or {}).items():
            s = sums.setdefault(k, [0.0, 0.0])
            s[0], s[1] = s[0] + w * v, s[1] + w
    return {k: s / n for k, (s, n) in sums.items()} or None


@dataclass(frozen=True)
class WaitingOn:
    """The coordinator's answer to the trainer's watchdog (``Coordinator.waiting_on``): the
    role a stalled hand-over waits for, and what the coordinator knows that a person reading
    the stall's message needs (``detail``: the rest, as printed)."""

    role: str
    version: int
    prompts_due_unfinished: int      # prompts the current version still waits for
    ready: int                       # finished prompts not yet handed over
    in_flight: int
    room: int
    paused: bool
    outstanding_per_generator: dict[int, int]  # rollouts outstanding, by generator index
    alive: list[bool]
    seconds_since_generator_answered: list[float]
    events: list[tuple]              # the last few faults (FaultLog.events)
    last_prior_error: str | None
    last_error: str | None

    def detail(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "role"}
