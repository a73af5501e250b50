"""What one learner step reports: ``StepMetrics``, a line of metrics.jsonl, and ``HeldOut``,
one held-out evaluation. Built once per step (``cluster.records.metrics.step_metrics``) and
read, never changed, by everything that shows it: the console line, metrics.jsonl,
TensorBoard and W&B (``scalars``), the report (``from_json``). The JSON keys are the field
names; a held-out evaluation's are its fields with ``eval_`` in front, named here only."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from common.records import named


def numeric(m: dict, prefix: str = "") -> dict:
    """The numbers of a JSON record (booleans, None, lists and text left out), as W&B and
    TensorBoard get them; a nested table of numbers (held-out accuracy by difficulty) becomes
    one series per entry, ``eval_sampled_by_difficulty/3``."""
    out: dict = {}
    for k, v in m.items():
        if isinstance(v, dict):
            out.update(numeric(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def clean(v):
    """JSON-safe: NaN and infinities become null, so that every line parses."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    return v


@dataclass(frozen=True)
class HeldOut:
    """One held-out evaluation (``cluster.run.evaluation``): accuracy of greedy answers and the
    mean over sampled ones, each with its standard error over prompts and by difficulty;
    ``accuracy``/``accuracy_se`` are the run's ``run.eval_metric``'s. A kind that was not
    measured (``run.eval_samples=0``: no sampled answers) is None."""

    accuracy: float | None = None
    accuracy_se: float | None = None
    sampled: float | None = None
    sampled_se: float | None = None
    sampled_by_difficulty: dict = field(default_factory=dict)
    greedy: float | None = None
    greedy_se: float | None = None
    greedy_by_difficulty: dict = field(default_factory=dict)
    score_timeouts: int = 0
    score_errors: int = 0
    prompts: int = 0
    samples: int = 0
    failed_requests: int = 0
    generators_lost: list = field(default_factory=list)
    duration_s: float = 0.0       # the evaluation's own wall-clock

    PREFIX = "eval_"
    KINDS = ("sampled", "greedy")

    def of(self, kind: str) -> tuple[float | None, float | None]:
        """(accuracy, SE) of ``kind``: "sampled" or "greedy"."""
        if kind not in self.KINDS:
            raise ValueError(f"no held-out kind {kind!r}; the kinds are {self.KINDS}")
        return getattr(self, kind), getattr(self, f"{kind}_se")

    def to_json(self) -> dict:
        return {self.PREFIX + f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> HeldOut | None:
        """The evaluation in a metrics line; None when the step had none."""
        if d.get(cls.PREFIX + "accuracy") is None and d.get(cls.PREFIX + "greedy") is None:
            return None
        own = {k[len(cls.PREFIX):]: v for k, v in d.items() if k.startswith(cls.PREFIX)}
        return cls(**{k: v for k, v in named(cls, own).items() if v is not None})


@dataclass(frozen=True)
class StepMetrics:
    """One learner step. Times are seconds; ``t_*`` are wall-clock marks (seconds since the
    epoch); rates (``*_per_s``) are over training wall-clock, evaluations excluded, over the
    run and its resumes. The trainer fills every field (a figure the step has not, such as
    the prior's on a run without one, is None); a line read from an older or cut-short file
    leaves the fields it lacks None."""

    step: int
    policy_version: int
    # the trained prompts (cluster.records.metrics.batch_metrics)
    prompts: int | None = None
    reward_mean: float | None = None
    rollouts: int | None = None
    tokens_generated: int | None = None
    k_mean: float | None = None
    k_hist: list | None = None
    extra_rollouts: int | None = None
    rounds_mean: float | None = None
    cancelled_rollouts: int | None = None
    prior_accept_rate: float | None = None
    unparsed_fraction: float | None = None
    reward_extras: dict | None = None  # a reward function's other numbers (tasks/reward_function)
    response_len_mean: float | None = None
    # the prior on this step's prompts: |error|, ranking (AUC), noise-corrected error
    prior_abs_error: float | None = None
    prior_auc: float | None = None
    prior_prompts: int | None = None
    prior_error_var_corrected: float | None = None
    prior_error_sd_corrected: float | None = None
    prior_bias: float | None = None
    prior_error_n: int | None = None
    # the learner's update
    trained_samples: int | None = None
    rollouts_not_trained: int | None = None
    trained_tokens: int | None = None
    # rollouts generated for training since the run's start, this step's batch's included
    # (trained or not: filtered groups, cancelled extras, held-out ones; TrainBatch's)
    generated_rollouts: int | None = None
    # the learner's result, every field of it (cluster.records.metrics.LEARNER_FIELDS)
    loss: float | None = None
    grad_norm: float | None = None
    grad_noise_to_signal: float | None = None
    entropy: float | None = None
    clip_fraction: float | None = None
    approx_kl: float | None = None
    kl: float | None = None                  # against the reference policy (optim.kl_coef)
    is_weight: float | None = None           # mean importance weight (the off-policy correction)
    truncated_fraction: float | None = None  # tokens whose IS weight was truncated
    dual_clip_fraction: float | None = None  # tokens under the dual clip
    lr: float | None = None
    skipped: bool | None = None
    skip_reason: str | None = None
    consecutive_skips: int | None = None
    updates_applied: int | None = None       # optimiser updates so far (skipped steps not)
    micro_batches: int | None = None
    learner_tokens: int | None = None        # response tokens the learner's loss counted
    learner_samples: int | None = None       # non-empty responses it trained
    learner_step_s: float | None = None      # the learner's own time for the step
    staleness_mean: float | None = None
    staleness_max: int | None = None
    # where the step's time went
    step_time_s: float | None = None
    learner_wait_s: float | None = None
    train_time_s: float | None = None
    sync_time_s: float | None = None
    learner_idle_fraction: float | None = None
    inflight_prompts: int | None = None
    generator_busy_fraction: float | None = None
    generator_slot_occupancy: float | None = None
    decode_tokens_per_s: float | None = None
    nodes_alive: int | None = None    # Ray nodes alive after the step (cluster.nodes.watch)
    t_start: float | None = None
    t_train_start: float | None = None
    t_train_end: float | None = None
    t_step_end: float | None = None
    eval_time_s: float | None = None
    # over the run so far (cluster.records.metrics.Tally)
    prior_abs_error_running: float | None = None
    prior_error_sd_corrected_running: float | None = None
    prior_error_var_corrected_running: float | None = None
    prior_bias_running: float | None = None
    prior_error_sd_corrected_window: float | None = None
    prior_error_var_corrected_window: float | None = None
    prior_bias_window: float | None = None
    prompts_per_s: float | None = None
    rollouts_per_s: float | None = None
    tokens_per_s: float | None = None
    held_out: HeldOut | None = None   # when the step ended with an evaluation

    def to_json(self) -> dict:
        """metrics.jsonl's line: the figures the step has (a NaN one as null)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "held_out" and getattr(self, f.name) is not None}
        if self.held_out is not None:
            out.update(self.held_out.to_json())
        return clean(out)

    @classmethod
    def from_json(cls, d: dict) -> StepMetrics:
        """A metrics.jsonl line (unknown keys ignored, missing ones at their defaults)."""
        own = named(cls, d)
        return cls(**{"step": 0, "policy_version": 0, **own, "held_out": HeldOut.from_json(d)})

    def scalars(self) -> dict:
        """The numbers TensorBoard and W&B get, by the same names as in the file."""
        return numeric(self.to_json())

