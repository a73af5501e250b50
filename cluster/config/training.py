"""The config's training sections: the run (its name, outputs, length, evaluation and
checkpoints), the algorithm (estimator and its bounds), rollouts (sampling and batching),
rewards (scoring and shaping) and logging. Where and with what each role runs is
``cluster.config.sections``'; the whole config and its loading, ``cluster.config.schema``.

Pure pydantic: no ML library is imported.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from cluster.config.sections import Section
from estimator.core import DEFAULT_REWARDS
from estimator.registry import ESTIMATORS, EstimatorConfig


class RunConfig(Section):
    """What this run is called, where it writes, and how long it lasts."""

    name: str = Field("v05-cpu", description="Run name: outputs go to <output_dir>/<name>/.")
    output_dir: str = Field("runs", description=(
        "Parent folder of run outputs: absolute (shared storage on a cluster), or relative to "
        "$V05_OUTPUT_ROOT, else to the current directory (inside a Ray job: ~/v05rl-runs, "
        "not Ray's temporary copy of the working directory; see cluster/config/paths.py)."))
    save_final: bool = Field(True, description=(
        "At the end, save the trained policy in Hugging Face format to <run dir>/final."))
    max_steps: int = Field(20, ge=1, description="Learner steps to train before stopping.")
    max_train_s: float | None = Field(None, gt=0, description=(
        "Also stop at the end of the step that brings training wall-clock (evaluations "
        "excluded; counted over the run and its resumes) to this many seconds; None: "
        "max_steps alone decides. Runs compared on the same wall-clock budget "
        "(bench.learning) use it."))
    max_rollouts: int | None = Field(None, ge=1, description=(
        "Also stop at the end of the step that brings the rollouts generated for training to "
        "this many (every rollout sent to a generator: those of filtered groups, cancelled "
        "extras and the oracle's held-out ones included; evaluations excluded; summary.json's "
        "rollouts_dispatched); None: no rollout budget. Runs compared at equal generated "
        "rollouts (bench.learning --selection) use it."))
    seed: int = Field(0, description="Seed of the prompt order and the held-out sampling.")
    eval_every: int = Field(5, ge=0, description=(
        "Held-out evaluation every N steps, and after the last step (0: never, unless "
        "eval_every_s)."))
    eval_every_s: float = Field(0.0, ge=0, description=(
        "Also evaluate after the step that brings training wall-clock since the last "
        "evaluation to this many seconds (0: by steps only): curves against time with even "
        "spacing whatever a step costs."))
    eval_every_rollouts: int = Field(0, ge=0, description=(
        "Also evaluate after the step that brings the rollouts generated since the last "
        "evaluation to this many (0: not by rollouts): curves against generated rollouts with "
        "even spacing whatever a mode generates per update."))
    eval_prompts: int = Field(64, ge=1, description="Held-out prompts per evaluation.")
    eval_samples: int = Field(4, ge=0, description=(
        "Sampled answers per held-out prompt (at rollout.temperature) besides the greedy one; "
        "0: greedy only."))
    eval_metric: Literal["sampled", "greedy"] = Field("sampled", description=(
        "The headline held-out accuracy (eval_accuracy, summary.json's eval_accuracy_*): the "
        "mean over sampled answers or the greedy answer's accuracy."))
    stall_timeout_s: float = Field(1800.0, gt=0, description=(
        "The watchdog: when no learner step completes for this long, the run stops naming the "
        "role it waits on (summary.json status 'stalled') and exits non-zero."))
    call_timeout_s: float = Field(600.0, gt=0, description=(
        "Longest wait for one remote call on the critical path (a generation request, a "
        "weight update) before its actor is taken for lost."))
    preempt_grace_s: float = Field(25.0, gt=0, description=(
        "After SIGTERM or SIGINT (preemption: SLURM, Kubernetes, spot instances, ray job "
        "stop), the run stops admitting, checkpoints its state with every prompt in flight "
        "and exits 4 (preempted, resumable with run.resume=true); if that takes longer than "
        "this many seconds, or a second signal comes, it exits at once, the last whole "
        "checkpoint kept (cluster/run/preempt.py). Keep it below the scheduler's grace period "
        "(30 s by default in Kubernetes and SLURM; RAY_JOB_STOP_WAIT_TIME_S, 3 s unless set "
        "where the head node starts, for ray job stop)."))
    checkpoint_every: int = Field(0, ge=0, description=(
        "Checkpoint every N steps (0: only at the end): learner state and every admitted, "
        "untrained prompt, written atomically (cluster/records/checkpoints.py)."))
    keep_checkpoints: int = Field(2, ge=1, description="Whole checkpoints kept (newest).")
    snapshot_every: int = Field(0, ge=0, description=(
        "Also save the policy in Hugging Face format every N steps to <run dir>/snapshots/"
        "step<N> (all kept; 0: never): weights to evaluate or to measure the prior against "
        "later (studies.prior_truth)."))
    resume: Literal["auto", True, False] = Field("auto", description=(
        "Continue from the run folder's newest whole checkpoint, with its prompts in flight. "
        "auto: when it has one (a rerun of the command, a requeued job), else start fresh in "
        "an empty folder and refuse (exit 2) where a previous run left results; true: "
        "continue, an error without a checkpoint; false: start fresh, refusing where a "
        "previous run left results (cluster.run.directory.plan_start)."))
    overwrite: bool = Field(False, description=(
        "Delete what a previous run left in the run folder (checkpoints, final/, metrics, "
        "...) and start fresh: the only setting that deletes a run."))
    record_rollouts: bool = Field(False, description="Write finished rollout groups to rollouts.msgpack.")
    progress: bool = Field(True, description="Print a progress line per step.")

    @property
    def evaluates(self) -> bool:
        """Whether the run evaluates on held-out prompts at all (by steps, seconds or
        rollouts; then also at its start and after its last step)."""
        return bool(self.eval_every or self.eval_every_s or self.eval_every_rollouts)

    @field_validator("name")
    @classmethod
    def _names_a_folder(cls, v: str) -> str:
        # '' or '.' would write the run's files straight into output_dir; an absolute name or
        # one that climbs with '..' would write, and with run.overwrite delete, outside it. A
        # nested name (exp1/seed0) is a folder under output_dir too.
        parts = [p for p in v.replace("\\", "/").split("/") if p not in ("", ".")]
        if not parts or v.strip() != v or v.startswith(("/", "~")) or ".." in parts:
            raise ValueError("must name a folder under run.output_dir (a name such as try1 or "
                             "exp1/seed0; not absolute, no '..')")  # error_lines adds "; got"
        return v


_EST = EstimatorConfig()  # the estimator's defaults; its __post_init__ holds the bounds


class AlgoConfig(Section):
    """The advantage estimator and its rollout budget (see docs/estimator.md). Defaults and
    bounds are the estimator's (``estimator.registry.EstimatorConfig``), checked there."""

    name: Literal[tuple(ESTIMATORS)] = Field("v05", description=f"One of {sorted(ESTIMATORS)}.")
    k_init: int = Field(_EST.k_init, description="Rollouts per prompt to start with (group size of fixed-k algos).")
    k_max: int = Field(_EST.k_max, description="Most rollouts per prompt (v05's OSLA cap).")
    cost: float = Field(_EST.cost, description="OSLA cost per rollout (on the {-1,+1} reward scale's units).")
    lookahead: Literal["predictive", "plugin"] = Field(_EST.lookahead, description="OSLA look-ahead.")
    plan: Literal["sequential", "batched"] = Field(_EST.plan, description=(
        "v05: 'batched' plans how many more rollouts to ask for at once and re-plans as rewards "
        "arrive (docs/estimator.md); 'sequential' asks for one at a time (the paper's OSLA)."))
    max_rounds: int | None = Field(_EST.max_rounds, description=(
        "v05 batched plan: most generation rounds per prompt (the last allowed round asks for "
        "the rest of the plan at once); None: no cap."))
    noise: Literal["bound", "bernoulli"] = Field(_EST.noise, description="Noise model of the fusion.")
    scale_by_std: bool | None = Field(None, description="Divide advantages by the group std (None: the algo's own convention).")
    zero_uniform: bool = Field(_EST.zero_uniform, description=(
        "Zero advantage for a group whose rewards are all equal (GRPO's mean does it by "
        "construction; v05's prior-shrunk baseline otherwise pushes down every sample of an "
        "all-fail group). docs/estimator.md, 'Uniform groups'."))
    train_k: int | None = Field(_EST.train_k, description=(
        "oracle only: rollouts trained per prompt; its other k_init - train_k rollouts set "
        "the baseline and are not trained on (bench.learning's reference)."))
    select: Literal["none", "prior", "history"] = Field("none", description=(
        "Which drawn prompts get rollouts at all (actors/scheduler/selection.py): 'prior' "
        "admits each with the chance that its first k_init rollouts would not all be equal, "
        "predicted by the prior's p and its measured error, never below select_floor; "
        "'history' predicts it from the prompt's own rewards when it was last trained "
        "(GRESO-style: where prompts recur); 'none': every prompt drawn is admitted. A "
        "deferred prompt stays in the dataset (the next epoch draws it again); summary.json "
        "counts prompts_drawn = prompts_admitted + prompts_deferred + prompts_waiting_at_end."))
    select_floor: float = Field(0.1, gt=0, le=1, description=(
        "The least admission probability under selection (exploration: every kind of "
        "prompt keeps coming, so the prior keeps seeing the whole distribution)."))
    select_threshold: float | None = Field(None, gt=0, le=1, description=(
        "The admission rule under selection: None admits each candidate with the chance "
        "that its group is informative, max(select_floor, 1 - U) (U: the chance that its "
        "first k_init rollouts are all equal); a number t admits where U < t and at "
        "select_floor elsewhere (sharper; studies.selection_limits)."))
    select_window: int | None = Field(None, ge=1, description=(
        "Candidates drawn ahead of need and scored by the prior in one call (at least one "
        "batch of prompts); None: four batches."))

    @model_validator(mode="after")
    def _valid_for_the_estimator(self) -> "AlgoConfig":
        # The estimator owns its rules (budget, plan, cost); a bad combination fails here, at
        # parse time, with its message.
        try:
            ESTIMATORS[self.name](self.estimator_config(DEFAULT_REWARDS))
        except ValueError as err:
            raise ValueError(f"algo: {err}") from None
        return self

    def estimator_config(self, rewards: tuple[float, float]) -> EstimatorConfig:
        """The estimator's settings for a task's reward range (the estimator rescales the
        cost, stated on the {-1, +1} scale, itself)."""
        return EstimatorConfig(k_init=self.k_init, k_max=self.k_max, cost=self.cost,
                               lookahead=self.lookahead, noise=self.noise, rewards=rewards,
                               scale_by_std=self.scale_by_std, plan=self.plan,
                               max_rounds=self.max_rounds, zero_uniform=self.zero_uniform,
                               train_k=self.train_k)


class RolloutConfig(Section):
    """Sampling and batching of rollouts."""

    batch_prompts: int = Field(8, ge=1, description="B: finished prompts per learner step.")
    batch_samples: int | None = Field(None, ge=1, description=(
        "S: samples (rollouts) per learner step instead of B prompts, whatever each prompt's "
        "k: every algorithm then makes one update per S rollouts (bench.learning's controlled "
        "study). The batch takes finished prompts, earliest due first, until they hold S "
        "samples; prompts per deadline follow S / the recent mean k. None: batch_prompts."))
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    seeded: bool = Field(False, description=(
        "Seed each training rollout from (run.seed, the prompt's admission, the rollout's "
        "index): the same seed then draws the same responses for the same prompt and weights "
        "in every run and algorithm (common random numbers: bench.learning's paired study). "
        "mode: sync only (a weight update never lands mid-request there). False: the "
        "engine's own randomness."))
    max_tokens: int = Field(16, ge=1, description="Most tokens per response.")
    max_staleness: int = Field(2, ge=0, description=(
        "Async: no trained sample is older than this many policy versions (version trained "
        "minus the version that started it); each prompt is admitted with a deadline version "
        "at most this far ahead. Not read in sync mode, whose barrier is 0 "
        "(``Config.max_staleness``)."))
    max_inflight_prompts: int | None = Field(None, ge=1, description=(
        "Most prompts admitted and not yet trained (None: bounded by engine slots and the "
        "staleness calendar only)."))


class RewardConfig(Section):
    """How completions are scored (the task's verifier) and shaped."""

    workers: int | None = Field(None, ge=0, description=(
        "Verifier worker processes (each answer with a deadline, a hung one killed); 0 scores "
        "inline on the coordinator's loop; None: 2 for tasks with a slow verifier "
        "(the math task's math-verify), else 0."))
    timeout_s: float = Field(10.0, gt=0, description=(
        "Per-answer deadline in a worker; a timed-out answer gets the low reward, counted."))
    overlong_buffer: int = Field(0, ge=0, description=(
        "DAPO overlong shaping: the last this-many tokens before rollout.max_tokens cost up to "
        "overlong_penalty, linearly (0: off)."))
    overlong_penalty: float = Field(1.0, ge=0, description="The largest overlong penalty.")
    inject_fault: Literal["none", "raise", "hang"] = Field("none", description=(
        "Fault injection (tests.acceptance.chaos): the verifier raises, or never returns, on every "
        "inject_every-th answer. 'hang' needs workers >= 1."))
    inject_every: int = Field(0, ge=0, description="See inject_fault (0: never).")


class LoggingConfig(Section):
    """What the run shows and writes besides its outputs."""

    tensorboard: bool = Field(False, description="Also write TensorBoard scalars to <run>/tb/.")
    wandb: bool = Field(False, description=(
        "Also log to Weights & Biases: the config, every metrics.jsonl number at its step, the "
        "summary, report.html. Offline under <run>/wandb/ (then `wandb sync`) when no "
        "WANDB_API_KEY or `wandb login` is set up (cluster/records/wandb_log.py)."))
    wandb_project: str = Field("v05rl", description="W&B project.")
    wandb_entity: str | None = Field(None, description="W&B entity (team or user); None: yours.")
    wandb_name: str | None = Field(None, description="W&B run name; None: run.name.")
    verbose: bool = Field(False, description=(
        "Every role's output on the console; by default it goes to <run>/logs/<role>.log and "
        "the console shows one progress line per step, warnings and errors (with the role)."))
