"""Typed run configuration: one YAML file plus dotted overrides on the command line.

    cfg = load_config("v05.yaml", ["run.max_steps=3", "run.name=try1"])

Pure pydantic: parsing and validating a config imports no ML library, so that a bad key fails
in a fraction of a second, before any actor starts. Every field has a description; an unknown
or ill-typed key, a value out of its range and a NaN or infinite number fail with a message
naming the key and the valid choices or range.
"""
from __future__ import annotations

import math
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from cluster.config.sections import (ClusterConfig, ConfigError, GeneratorsConfig,  # noqa: F401
                                  LearnerPlacement, ModelConfig, PriorPlacement, Section,
                                  error_lines)
from estimator.core import DEFAULT_REWARDS
from estimator.registry import ESTIMATORS, EstimatorConfig
from learner.config import LearnerConfig
from tasks import TaskConfig


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
    seed: int = Field(0, description="Seed of the prompt order and the held-out sampling.")
    eval_every: int = Field(5, ge=0, description=(
        "Held-out evaluation every N steps, and after the last step (0: never, unless "
        "eval_every_s)."))
    eval_every_s: float = Field(0.0, ge=0, description=(
        "Also evaluate after the step that brings training wall-clock since the last "
        "evaluation to this many seconds (0: by steps only): curves against time with even "
        "spacing whatever a step costs."))
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
        "later (bench.prior_truth)."))
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
        "Fault injection (bench.chaos): the verifier raises, or never returns, on every "
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


class Config(Section):
    """A whole run. `mode: sync` generates a full batch, trains, syncs, repeats; `mode: async`
    runs all actors at once with the per-prompt sequential test streaming to the learner."""

    mode: Literal["sync", "async"] = Field("sync", description="sync or async pipeline.")
    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    generators: GeneratorsConfig = Field(default_factory=GeneratorsConfig)
    learner: LearnerPlacement = Field(default_factory=LearnerPlacement)
    optim: LearnerConfig = Field(default_factory=LearnerConfig)
    prior: PriorPlacement = Field(default_factory=PriorPlacement)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _sampling_matches_the_learner(self) -> "Config":
        """The learner's importance ratios divide its log-probs by the behaviour log-probs the
        engine reports; both must be of the same distribution."""
        r, mode = self.rollout, self.generators.engine.logprobs_mode
        if r.top_p != 1.0:
            raise ValueError(f"rollout.top_p={r.top_p}: the learner does not apply top-p, so "
                             "its log-probs would not match the sampling distribution; use 1.0")
        if mode == "raw_logprobs" and (r.temperature != 1.0 or self.optim.temperature != 1.0):
            raise ValueError(
                f"rollout.temperature={r.temperature}, optim.temperature="
                f"{self.optim.temperature}: with generators.engine.logprobs_mode raw_logprobs "
                "the engine reports log-probs at temperature 1, so both must be 1.0 (or set "
                "logprobs_mode processed_logprobs and optim.temperature = rollout.temperature)")
        if mode == "processed_logprobs" and r.temperature != self.optim.temperature:
            raise ValueError(f"optim.temperature ({self.optim.temperature}) must equal "
                             f"rollout.temperature ({r.temperature}): the engine reports log-probs "
                             "of the tempered distribution it sampled from")
        if self.reward.overlong_buffer >= r.max_tokens:
            raise ValueError(f"reward.overlong_buffer ({self.reward.overlong_buffer}) must be "
                             f"smaller than rollout.max_tokens ({r.max_tokens})")
        if r.max_tokens >= self.generators.engine.max_model_len:
            raise ValueError(f"rollout.max_tokens ({r.max_tokens}) leaves no room for the prompt "
                             f"in generators.engine.max_model_len "
                             f"({self.generators.engine.max_model_len})")
        return self

    @property
    def max_staleness(self) -> int:
        """The scheduler's staleness bound, the one place sync is told from async: ``mode:
        sync`` is the synchronous barrier, 0; async, ``rollout.max_staleness``."""
        return 0 if self.mode == "sync" else self.rollout.max_staleness

    def scheduler_batch_prompts(self) -> int:
        """B the scheduler starts with: batch_prompts, or with batch_samples S the prompts
        that S samples make when every prompt stops at k_init."""
        S = self.rollout.batch_samples
        return self.rollout.batch_prompts if S is None else max(1, S // self.algo.k_init)

    def model_path(self) -> str:
        """The policy checkpoint for this run's task (see ModelConfig.resolve)."""
        return self.model.resolve(self.task.name)

    def score_workers(self) -> int:
        if self.reward.workers is not None:
            return self.reward.workers
        from tasks import TASKS
        return 2 if getattr(TASKS[self.task.name], "slow_verifier", False) else 0

    @property
    def run_dir(self) -> Path:
        """The absolute run directory (cluster/config/paths.py), checked to lie under the output
        folder with its links followed (``cluster.config.paths.inside``)."""
        from cluster.config.paths import inside, output_root
        root = output_root(self.run.output_dir)
        return inside(root / self.run.name, root)


def _model_fields(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_fields


def _sub_model(annotation) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _model_in_union(annotation) -> type[BaseModel] | None:
    """The model of a field typed ``<something> | Model`` (a name or a mapping of settings)."""
    if get_origin(annotation) in (Union, types.UnionType):
        models = [a for a in get_args(annotation) if _sub_model(a) is not None]
        return models[0] if len(models) == 1 else None
    return None


def _wants_number(annotation) -> bool:
    """A field typed int or float (or a Literal of numbers), possibly Optional, never bool."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return all(type(a) in (int, float) for a in args)
    if origin in (Union, types.UnionType):
        return bool not in args and any(_wants_number(a) for a in args)
    return annotation in (int, float)


def _check_keys(data: Any, model: type[BaseModel], where: str) -> None:
    """Reject unknown keys with the list of valid ones (pydantic's message lacks the choices),
    and booleans for numbers (pydantic would take ``run.max_steps=true`` as 1)."""
    if not isinstance(data, dict):
        return
    fields = _model_fields(model)
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            raise ConfigError(f"unknown config key {path!r}; valid keys"
                              f"{' under ' + repr(where) if where else ''}: {sorted(fields)}")
        if isinstance(value, bool) and _wants_number(fields[key].annotation):
            raise ConfigError(f"invalid config: {path}: expected a number, got the boolean "
                              f"{str(value).lower()}")
        sub = _sub_model(fields[key].annotation)
        if sub is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"config key {path!r} must be a mapping of {sorted(_model_fields(sub))}")
            _check_keys(value, sub, path)
        elif isinstance(value, dict) and (alt := _model_in_union(fields[key].annotation)):
            _check_keys(value, alt, path)


def apply_override(data: dict, dotted: str) -> None:
    """Apply one ``a.b.c=value`` override (value parsed as YAML: 3 -> int, true -> bool)."""
    if "=" not in dotted:
        raise ConfigError(f"override {dotted!r} must look like key.sub=value")
    key, raw = dotted.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {dotted!r} has an empty key")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {p!r} is not a section")
    node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""


def _format_validation(err: ValidationError) -> str:
    return "invalid config: " + "; ".join(error_lines(err))


def _non_finite(model: BaseModel, where: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every float field, or tuple/list of floats, that is NaN or
    infinite: no setting means anything at inf or NaN, and bounds such as gt=0 let inf pass.
    Free-form dicts (prior.options) are the backend's to check."""
    for name in type(model).model_fields:
        value, path = getattr(model, name), f"{where}.{name}" if where else name
        if isinstance(value, BaseModel):
            yield from _non_finite(value, path)
        elif any(isinstance(x, float) and not math.isfinite(x)
                 for x in (value if isinstance(value, (tuple, list)) else (value,))):
            yield path, value


def build_config(data: dict | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    data = dict(data or {})
    for o in overrides:
        apply_override(data, o)
    _check_keys(data, Config, "")
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation(err)) from None
    bad = [f"{path}: must be a finite number; got {value!r}" for path, value in _non_finite(cfg)]
    if bad:
        raise ConfigError("invalid config: " + "; ".join(bad))
    return cfg


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return build_config(data, overrides)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
