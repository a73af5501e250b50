"""What a run reports at its end: ``RunSummary``, summary.json, with the run's counters
(``Totals``, which ``cluster.records.metrics.Tally`` alone changes and every checkpoint
saves). Written by ``cluster.records.files.RunFiles.summary``, read by the launcher's last
lines, the report and W&B's run summary through ``from_json``. The JSON keys are the field
names; the coordinator's accounting and the counters are flattened in; the held-out
evaluations at the start and the end are ``eval_<kind>_<initial|final>[_se]`` for the kinds
``accuracy`` (the run's ``run.eval_metric``), ``sampled`` and ``greedy``, named here only."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from cluster.records.step import HeldOut, clean
from common.records import Accounting, named


@dataclass
class Totals:
    """The run's counters, over the run and its resumes: prompts trained and skipped (a NaN
    step's), rollouts, tokens, steps skipped, failed weight updates, the learner's waits,
    evaluation time, training wall-clock (``train_s``, evaluations excluded) and where the last
    evaluation was on it, and the sums behind the prior's error over the run."""

    prompts_trained: int = 0
    prompts_skipped_nan: int = 0
    rollouts: int = 0
    tokens_generated: int = 0
    nan_skipped_steps: int = 0
    generator_update_failures: int = 0
    learner_wait_s: float = 0.0
    eval_time_s: float = 0.0
    train_s: float = 0.0
    last_eval_train_s: float = 0.0
    # rollouts generated for training (the scheduler's rollouts_dispatched, as of the last
    # batch; run.max_rollouts reads it) and as of the last evaluation
    rollouts_generated: int = 0
    last_eval_rollouts: int = 0
    prior_error_sum: float = 0.0       # sum of |p - observed| over prior_error_prompts prompts
    prior_error_prompts: int = 0
    prior_error_sq_sum: float = 0.0    # sums of the corrected terms over prior_error_n prompts
    prior_bias_sum: float = 0.0
    prior_error_n: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict | None) -> Totals:
        return cls(**named(cls, d or {}))


WHEN = ("initial", "final")
SUMMARY_KINDS = ("accuracy",) + HeldOut.KINDS


def held_out_json(initial: HeldOut | None, final: HeldOut | None) -> dict:
    """summary.json's held-out keys."""
    out = {}
    for when, ev in zip(WHEN, (initial, final)):
        for kind in SUMMARY_KINDS:
            out[f"eval_{kind}_{when}"] = getattr(ev, kind) if ev else None
            out[f"eval_{kind}_{when}_se"] = getattr(ev, f"{kind}_se") if ev else None
    out["eval_time_initial_s"] = initial.duration_s if initial else None
    out["eval_prompts"] = final.prompts if final else None
    out["eval_samples"] = final.samples if final else None
    return out


def held_out_from_json(d: dict, when: str) -> HeldOut | None:
    """The evaluation at ``when`` ("initial" or "final") as summary.json holds it."""
    vals = {k: d.get(f"eval_{k}_{when}") for k in SUMMARY_KINDS}
    if all(v is None for v in vals.values()):
        return None
    ses = {f"{k}_se": d.get(f"eval_{k}_{when}_se") for k in SUMMARY_KINDS}
    time_s = d.get("eval_time_initial_s") if when == "initial" else None
    return HeldOut(**vals, **ses, prompts=d.get("eval_prompts") or 0,
                   samples=d.get("eval_samples") or 0, duration_s=time_s or 0.0)


@dataclass(frozen=True)
class RunSummary:
    """A run's end: "finished", or stopped early ("preempted", "stalled",
    "checkpoint_failed", with why). Rates are over training wall-clock (``train_wall_time_s``,
    evaluations excluded, over the run and its resumes); ``wall_time_s`` is this process's.
    A run stopped early has no accounting, rates or evaluations (None)."""

    steps: int
    policy_version: int
    totals: Totals
    status: str = "finished"
    accounting: Accounting | None = None
    mode: str | None = None
    algo: str | None = None
    wall_time_s: float | None = None
    train_wall_time_s: float | None = None
    prompts_per_s: float | None = None
    rollouts_per_s: float | None = None
    learner_idle_fraction: float | None = None
    # the generators over the run (cluster.run.start.run_extras)
    generator_busy_fraction: float | None = None
    generator_slot_occupancy: float | None = None
    decode_tokens_per_s: float | None = None
    decode_peak_tokens_per_s: float | None = None
    generators: list = field(default_factory=list)
    generator_update_failed: list = field(default_factory=list)
    t_start: float | None = None
    startup: dict = field(default_factory=dict)
    # the cluster's nodes (cluster.nodes.watch): where each role actor was at the start,
    # and every node lost or joined during the run
    role_nodes: dict = field(default_factory=dict)
    node_events: list = field(default_factory=list)
    # each generator replaced after its node was lost (cluster.nodes.replace): its group
    # asked for anew ("regrouped"), its new actor started ("started", on which node)
    generators_replaced: list = field(default_factory=list)
    resumed_from: int | None = None
    skipped_checkpoints: list = field(default_factory=list)
    # held-out accuracy at the start and the end (``eval_initial_reused``: the start's was
    # measured by an earlier run from the same weights)
    eval_metric: str | None = None
    eval_initial: HeldOut | None = None
    eval_final: HeldOut | None = None
    eval_initial_reused: bool = False
    # the prior's error over every trained prompt of the run (metrics.run_prior_error)
    prior_abs_error: float | None = None
    prior_error_var_corrected: float | None = None
    prior_error_sd_corrected: float | None = None
    prior_bias: float | None = None
    # why a run stopped early
    stalled_on: str | None = None
    stall_report: str | None = None
    error: str | None = None
    signal: str | None = None
    checkpoint: str | None = None
    checkpoint_s: float | None = None
    signal_to_checkpoint_s: float | None = None
    batch_wait_cancelled: bool | None = None
    run_file_failures: int = 0       # run files whose write failed (RunFiles)
    # what the learner and the engines computed in, and on a CPU the probe that chose it
    dtypes: dict = field(default_factory=dict)

    _NESTED = ("totals", "accounting", "eval_initial", "eval_final")

    def to_json(self) -> dict:
        """summary.json's object (NaN as null)."""
        acct = self.accounting.summary() if self.accounting is not None else {}
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self._NESTED}
        return clean({**acct, **self.totals.to_json(), **own,
                      **held_out_json(self.eval_initial, self.eval_final)})

    @classmethod
    def from_json(cls, d: dict) -> RunSummary:
        """summary.json (unknown keys ignored, missing ones at their defaults)."""
        own = {k: v for k, v in named(cls, d).items() if k not in cls._NESTED and v is not None}
        acct = Accounting.of(d) if "prompts_admitted" in d else None
        return cls(**{"steps": 0, "policy_version": 0, **own, "totals": Totals.from_json(d),
                      "accounting": acct, "eval_initial": held_out_from_json(d, "initial"),
                      "eval_final": held_out_from_json(d, "final")})
