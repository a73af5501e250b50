"""The weight-sync interface, its config, payloads and errors, and the pure helpers.

No torch, Ray or vLLM import at module level: everything here is testable without them
(torch tensors are recognised by duck typing).
"""
from __future__ import annotations

import os
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

# Wrappers that prefix parameter names: DeepSpeed/DDP ("module."), torch.compile
# ("_orig_mod."), FSDP and activation checkpointing.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.",
                     "_checkpoint_wrapped_module.")
# Buffers that some transformers versions put in the state dict; vLLM recomputes them.
_SKIP_SUFFIXES = ("rotary_emb.inv_freq",)
SAFETENSORS_FILE = "model.safetensors"
# Transport names; the factory in ``__init__`` maps each to its sender and receiver.
TRANSPORT_NAMES = ("object_store", "nccl", "gloo")


class WeightSyncConfig(BaseModel):
    """How new weights travel from the learner to the generators."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field("object_store", description="Transport: 'object_store' (Ray object "
                      "store + safetensors in /dev/shm; CPU default), 'nccl' (broadcast from "
                      "learner rank 0's GPU to every generator's worker) or 'gloo' (the same "
                      "broadcast over TCP between CPU processes; CPU runs and tests).")
    master_address: str | None = Field(None, description="nccl/gloo: address of learner rank "
                                       "0, where each group's rendezvous store listens; None "
                                       "means this node's Ray IP.")
    master_port: int = Field(0, ge=0, le=65535, description="nccl/gloo: rendezvous port, "
                             "reused by every group epoch; 0 binds a fresh free port per "
                             "epoch.")
    timeout_s: float = Field(120.0, gt=0, description="nccl/gloo: bound on each collective "
                             "step (every rank joining a group, each tensor's broadcast, the "
                             "final acknowledgement); a dead or hung receiver fails the step "
                             "after this long instead of blocking rank 0.")
    probe_timeout_s: float = Field(10.0, gt=0, description="nccl/gloo: how long the sender "
                                   "waits for a generator to answer its liveness probe "
                                   "before leaving it out of a publish.")
    max_attempts: int = Field(3, ge=1, description="nccl/gloo: group builds plus broadcasts "
                              "one publish may try; each failure drops the receivers that "
                              "caused it and rebuilds the group with the others.")
    restart_fallback: bool = Field(False, description="nccl/gloo: also put every published "
                                   "version into the object store, so a restarted generator "
                                   "loads it at once (the coordinator's re-sync) instead of "
                                   "waiting to be reconnected at the next publish. Costs a host "
                                   "copy and object-store space per publish.")

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        check_transport(v)
        return v


def check_transport(transport: str) -> None:
    if transport not in TRANSPORT_NAMES:
        raise ValueError(f"unknown weight-sync type {transport!r}; known: "
                         f"{sorted(TRANSPORT_NAMES)}")


# ---------------------------------------------------------------------------- errors

class WeightSyncError(RuntimeError):
    """A weight update could not be delivered."""


class BroadcastError(WeightSyncError):
    """A collective step (join, broadcast, acknowledgement) failed or ran past its timeout."""


class NotInGroupError(WeightSyncError):
    """A receiver was asked for a group epoch it has not joined (it restarted, or left after
    a failed broadcast); the sender reconnects it at its next publish."""


# ---------------------------------------------------------------------------- payloads

@dataclass(frozen=True)
class ObjectStorePayload:
    """``ref``: an ObjectRef to ``dict[str, np.ndarray]`` (checkpoint names)."""

    transport: ClassVar[str] = "object_store"
    version: int
    ref: Any
    num_tensors: int


@dataclass(frozen=True)
class GroupSpec:
    """One epoch of a broadcast group: rank 0 is the sender (learner rank 0), ranks
    1..world_size-1 the generators' workers. A new epoch (new rendezvous port, fresh
    communicators on every rank) is built whenever the membership changes."""

    backend: str        # "nccl" | "gloo": the communicator (see group.COMMUNICATORS)
    address: str        # rank 0's rendezvous store
    port: int
    epoch: int          # strictly increasing per sender
    world_size: int     # 1 + receiving workers
    timeout_s: float    # bound on each collective step
    sender_id: str = ""  # unique per sender: epochs of two senders (a reconnect) never match

    @property
    def name(self) -> str:
        """The group's identity (store keys are prefixed by it, payloads name it)."""
        return group_name(self.sender_id, self.epoch)

    def to_dict(self) -> dict:
        """Plain values: what crosses vLLM's ``collective_rpc`` into the engine process."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GroupSpec:
        return cls(**d)


@dataclass(frozen=True)
class CollectivePayload:
    """What a generator's ``update_weights`` gets from a collective sender: the group
    ``epoch`` the tensors are broadcast in (0: none was built), and ``meta``, ``(name, torch
    dtype name, shape)`` in broadcast order. ``fallback``: the same weights in the object
    store (``restart_fallback``), loaded by a generator that is not in that epoch."""

    version: int
    backend: str  # "nccl" | "gloo"
    epoch: int
    meta: tuple[tuple[str, str, tuple[int, ...]], ...]
    fallback: ObjectStorePayload | None = None
    sender_id: str = ""

    @property
    def transport(self) -> str:
        return self.backend

    @property
    def group(self) -> str:
        """The name of the group the tensors are broadcast in (``GroupSpec.name``)."""
        return group_name(self.sender_id, self.epoch)


def group_name(sender_id: str, epoch: int) -> str:
    return f"{sender_id or 'sender'}/epoch{epoch}"


# ---------------------------------------------------------------------------- interface

class WeightSender(ABC):
    """Learner side: ``connect`` once, then ``send`` each new version."""

    def connect(self, generators: list, workers_per_generator: int = 1) -> None:
        """Set up the channel to ``generators`` (Ray handles of ``Generator`` actors)."""

    @abstractmethod
    def send(self, generators: list, weights: Mapping[str, Any],
             version: int) -> tuple[Any, list]:
        """Ask every generator to load ``weights`` as ``version`` (the caller's: the run's
        policy version is ``Roles.published``, whose ``advance`` checks that it only goes
        forward before anything is sent). Returns (the payload,
        which the coordinator gives a restarted generator later, one ObjectRef per generator
        in order). A ref resolves to the seconds that generator's ``update_weights`` took, or
        raises ``RayActorError`` / stays pending (a ``GetTimeoutError`` for a caller with a
        timeout) when that generator was dead or hung and did not get the weights."""

    def close(self) -> None:
        """Release the channel."""


class WeightReceiver(ABC):
    """Generator side: load a payload into a running vLLM ``AsyncLLM`` in place. One
    receiver per generator and transport (it may hold state, e.g. its group epoch)."""

    def check(self, payload: Any) -> None:
        """Raise now if ``payload`` cannot be loaded here (called before the engine is
        paused, so a refused update costs the running requests nothing)."""

    @abstractmethod
    async def load(self, engine: Any, payload: Any) -> int:
        """Returns the number of tensors loaded."""


def check_payload(payload: Any, cls: type, receiver: str) -> None:
    if not isinstance(payload, cls):
        raise ValueError(f"{receiver} receiver got a {type(payload).__name__}")


# ---------------------------------------------------------------------------- pure helpers

def normalise_name(name: str) -> str:
    """Strip wrapper prefixes so the name is the Hugging Face checkpoint name vLLM loads:
    ``module._orig_mod.model.norm.weight`` -> ``model.norm.weight``."""
    out = name
    stripped = True
    while stripped:
        stripped = False
        for p in _WRAPPER_PREFIXES:
            if out.startswith(p):
                out, stripped = out[len(p):], True
    if not out:
        raise ValueError(f"parameter name {name!r} is empty after removing wrapper prefixes")
    return out


def checkpoint_names(weights: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(raw key, checkpoint name)`` of the entries a generator loads, in ``weights``' order:
    wrapper prefixes stripped, recomputed buffers skipped, collisions refused."""
    if not weights:
        raise ValueError("empty state dict: nothing to publish")
    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for raw in weights:
        name = normalise_name(raw)
        if name.endswith(_SKIP_SUFFIXES):
            continue
        if name in seen:
            raise ValueError(f"two parameters map to the name {name!r} (one is {raw!r})")
        seen[name] = raw
        out.append((raw, name))
    return out


def broadcast_plan(weights: Mapping[str, Any]) -> tuple[
        tuple[tuple[str, str, tuple[int, ...]], ...], list[str]]:
    """What a collective sender announces and in which order it broadcasts: ``(meta, raw
    keys)``, ``meta[i] = (checkpoint name, torch dtype name, shape)`` of ``weights[keys[i]]``.
    Tensors keep their dtype (bf16 travels as bf16); NumPy arrays name theirs."""
    meta, order = [], []
    for raw, name in checkpoint_names(weights):
        value = weights[raw]
        dtype = str(value.dtype).removeprefix("torch.")
        meta.append((name, dtype, tuple(int(d) for d in value.shape)))
        order.append(raw)
    return tuple(meta), order


def to_numpy_state_dict(weights: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Checkpoint-named, contiguous NumPy copies of a state dict (torch or NumPy values).

    bfloat16 has no NumPy dtype, so it is widened to float32; the engine casts to its own
    dtype on load."""
    return {name: _as_numpy(raw, weights[raw]) for raw, name in checkpoint_names(weights)}


def _as_numpy(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "detach"):  # a torch.Tensor, without importing torch here
        t = value.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        arr = t.numpy()
    else:
        raise ValueError(f"weight {name!r} is a {type(value).__name__}, "
                         "want a numpy array or torch tensor")
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"weight {name!r} has non-numeric dtype {arr.dtype}")
    return np.ascontiguousarray(arr)


def write_safetensors(weights: Mapping[str, np.ndarray], directory: str | Path) -> Path:
    """Write one safetensors file into ``directory`` (created); returns the file path."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SAFETENSORS_FILE
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(path))
    return path


def iter_safetensors(directory: str | Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, torch.Tensor)`` from every ``*.safetensors`` file in ``directory``."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {directory}")
    for f in files:
        yield from load_file(str(f)).items()


def shm_tempdir(tag: str) -> Path:
    """A fresh directory in RAM (/dev/shm) when there is one, else in the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=f"v05rl-{tag}-{uuid.uuid4().hex[:8]}-", dir=base))
