"""Weight sync from the learner to the generators: one small interface, two transports.

The learner holds a ``WeightSender`` and calls ``sync_weights(sender, generators, weights,
version)``; each generator turns the payload into an in-place reload of its vLLM engine
through a ``WeightReceiver`` picked by the payload's transport. The engine side is the
worker extension ``WeightSyncWorkerExtension``: vLLM mixes it into its worker class
(``worker_extension_cls``), so its methods run inside the process that owns the model and
are reached with ``engine.collective_rpc(name, args=...)``.

Transports (``WeightSyncConfig.type``):
- ``object_store`` (CPU default): the learner ``ray.put``s the NumPy state dict once; each
  generator fetches it, writes safetensors under /dev/shm and asks its worker to load that
  directory. Tensors themselves do not survive ``collective_rpc`` into vLLM's separate
  engine process, a path does.
- ``nccl`` (GPUs): a NCCL group between learner rank 0 and every generator worker (vLLM's
  ``StatelessProcessGroup`` + ``PyNcclCommunicator``, so neither side's default
  ``torch.distributed`` group is touched); the learner broadcasts each tensor.

Heavy imports (torch, ray, vllm) are local so the pure helpers are testable without them.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

WORKER_EXTENSION = "actors.weight_sync.WeightSyncWorkerExtension"
# Wrappers that prefix parameter names: DeepSpeed/DDP ("module."), torch.compile
# ("_orig_mod."), FSDP and activation checkpointing.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.",
                     "_checkpoint_wrapped_module.")
# Buffers that some transformers versions put in the state dict; vLLM recomputes them.
_SKIP_SUFFIXES = ("rotary_emb.inv_freq",)
SAFETENSORS_FILE = "model.safetensors"


class WeightSyncConfig(BaseModel):
    """How new weights travel from the learner to the generators."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field("object_store", description="Transport: 'object_store' (Ray object "
                      "store + safetensors in /dev/shm; CPU default) or 'nccl' (GPU broadcast).")
    master_address: str | None = Field(None, description="nccl: address of learner rank 0; "
                                       "None means this node's Ray IP.")
    master_port: int = Field(0, ge=0, le=65535, description="nccl: rendezvous port; 0 picks "
                             "a free one.")

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        _check_type(v)
        return v


def _check_type(transport: str) -> None:
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown weight-sync type {transport!r}; known: {sorted(TRANSPORTS)}")


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


def to_numpy_state_dict(weights: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Checkpoint-named, contiguous NumPy copies of a state dict (torch or NumPy values).

    bfloat16 has no NumPy dtype, so it is widened to float32; the engine casts to its own
    dtype on load."""
    if not weights:
        raise ValueError("empty state dict: nothing to publish")
    out: dict[str, np.ndarray] = {}
    for raw, value in weights.items():
        name = normalise_name(raw)
        if name.endswith(_SKIP_SUFFIXES):
            continue
        if name in out:
            raise ValueError(f"two parameters map to the name {name!r} (one is {raw!r})")
        out[name] = _as_numpy(raw, value)
    return out


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


# ---------------------------------------------------------------------------- payloads

@dataclass(frozen=True)
class ObjectStorePayload:
    """``ref``: an ObjectRef to ``dict[str, np.ndarray]`` (checkpoint names)."""

    transport: ClassVar[str] = "object_store"
    version: int
    ref: Any
    num_tensors: int


@dataclass(frozen=True)
class NcclPayload:
    """``meta``: ``(name, torch dtype name, shape)`` in the order the learner broadcasts."""

    transport: ClassVar[str] = "nccl"
    version: int
    meta: tuple[tuple[str, str, tuple[int, ...]], ...]


# ---------------------------------------------------------------------------- interface

class WeightSender(ABC):
    """Learner side. ``connect`` once, then per update ``publish`` (cheap: what each
    generator's ``update_weights`` receives) and ``push`` (the collective part, run after
    the generators were asked to receive; a no-op for the object store)."""

    def connect(self, generators: list, workers_per_generator: int = 1) -> None:
        """Set up the channel to ``generators`` (Ray handles of ``Generator`` actors)."""

    @abstractmethod
    def publish(self, weights: Mapping[str, Any], version: int) -> Any: ...

    def _advance(self, version: int) -> None:
        """Versions published by one sender strictly increase (0 is the initial checkpoint).
        Checked here, before any generator is asked: a generator refusing a stale version
        would otherwise leave a collective transport waiting for it forever."""
        last = getattr(self, "_last_version", 0)
        if version <= last:
            raise ValueError(f"weight version {version} is not newer than the last "
                             f"published version {last}")
        self._last_version = version

    def push(self, weights: Mapping[str, Any]) -> None:
        """Send the tensors themselves, for transports that stream them."""

    def close(self) -> None:
        """Release the channel."""


class WeightReceiver(ABC):
    """Generator side: load a payload into a running vLLM ``AsyncLLM`` in place."""

    @abstractmethod
    async def load(self, engine: Any, payload: Any) -> int:
        """Returns the number of tensors loaded."""


class ObjectStoreSender(WeightSender):
    def __init__(self, cfg: WeightSyncConfig):
        self.cfg = cfg

    def publish(self, weights: Mapping[str, Any], version: int) -> ObjectStorePayload:
        import ray

        self._advance(version)
        sd = to_numpy_state_dict(weights)
        # One put for all generators; each fetches it zero-copy from its node's store.
        return ObjectStorePayload(version=version, ref=ray.put(sd), num_tensors=len(sd))


class ObjectStoreReceiver(WeightReceiver):
    async def load(self, engine: Any, payload: Any) -> int:
        _check_payload(payload, ObjectStorePayload)
        sd = await payload.ref  # awaitable ObjectRef: does not block the actor's loop
        directory = shm_tempdir(f"v{payload.version}")
        try:
            await asyncio.to_thread(write_safetensors, sd, directory)
            counts = await engine.collective_rpc("v05_load_dir", args=(str(directory),))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return int(counts[0])


class NcclSender(WeightSender):
    def __init__(self, cfg: WeightSyncConfig):
        self.cfg = cfg
        self._comm = None
        self._order: list[str] = []

    def connect(self, generators: list, workers_per_generator: int = 1) -> None:
        import ray
        import torch

        if not generators:
            raise ValueError("nccl weight sync needs at least one generator")
        addr = self.cfg.master_address or ray.util.get_node_ip_address()
        port = self.cfg.master_port or _free_port(addr)
        world = 1 + len(generators) * workers_per_generator
        refs = [g.init_weight_sync.remote(addr, port, 1 + i * workers_per_generator, world)
                for i, g in enumerate(generators)]
        self._device = torch.device("cuda", torch.cuda.current_device())
        # Rank 0 hosts the rendezvous store; this blocks until every worker has joined.
        self._comm = _nccl_group(addr, port, 0, world, self._device)
        ray.get(refs)

    def publish(self, weights: Mapping[str, Any], version: int) -> NcclPayload:
        self._advance(version)
        meta = []
        for raw, t in weights.items():
            name = normalise_name(raw)
            if not name.endswith(_SKIP_SUFFIXES):
                meta.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        self._order = [raw for raw in weights if not normalise_name(raw).endswith(_SKIP_SUFFIXES)]
        return NcclPayload(version=version, meta=tuple(meta))

    def push(self, weights: Mapping[str, Any]) -> None:
        import torch

        if self._comm is None:
            raise RuntimeError("NcclSender.push before connect()")
        stream = torch.cuda.current_stream()
        for raw in self._order:  # the order publish() announced
            t = torch.as_tensor(weights[raw]).detach().to(self._device).contiguous()
            self._comm.broadcast(t, src=0, stream=stream)
        stream.synchronize()

    def close(self) -> None:
        self._comm = None


class NcclReceiver(WeightReceiver):
    async def load(self, engine: Any, payload: Any) -> int:
        _check_payload(payload, NcclPayload)
        counts = await engine.collective_rpc("v05_recv_nccl", args=(list(payload.meta),))
        return int(counts[0])


def _check_payload(payload: Any, cls: type) -> None:
    if not isinstance(payload, cls):
        raise ValueError(f"{cls.transport} receiver got a {type(payload).__name__}")


TRANSPORTS: dict[str, tuple[type[WeightSender], type[WeightReceiver]]] = {
    "object_store": (ObjectStoreSender, ObjectStoreReceiver),
    "nccl": (NcclSender, NcclReceiver),
}


def make_sender(cfg: WeightSyncConfig | Mapping[str, Any] | str) -> WeightSender:
    if isinstance(cfg, str):
        cfg = {"type": cfg}
    if not isinstance(cfg, WeightSyncConfig):
        cfg = WeightSyncConfig(**cfg)
    return TRANSPORTS[cfg.type][0](cfg)


def make_receiver(transport: str) -> WeightReceiver:
    _check_type(transport)
    return TRANSPORTS[transport][1]()


def send_weights(sender: WeightSender, generators: list, weights: Mapping[str, Any],
                 version: int) -> tuple[Any, list]:
    """Ask every generator to load ``weights`` as ``version``. Returns (the payload, which a
    restarted generator can be given later, the ObjectRefs of the generators'
    ``update_weights`` calls, each resolving to the seconds that generator took)."""
    payload = sender.publish(weights, version)
    refs = [g.update_weights.remote(payload, version) for g in generators]
    sender.push(weights)  # collective transports: after every generator was asked to receive
    return payload, refs


def sync_weights(sender: WeightSender, generators: list, weights: Mapping[str, Any],
                 version: int) -> list:
    """``send_weights`` without the payload: the ObjectRefs of the generators' updates."""
    return send_weights(sender, generators, weights, version)[1]


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _nccl_group(host: str, port: int, rank: int, world_size: int, device: Any):
    """A NCCL communicator outside torch.distributed's global state (vLLM's RLHF pattern)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup

    pg = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
    return PyNcclCommunicator(pg, device=device)


# ---------------------------------------------------------------------------- engine side

class WeightSyncWorkerExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``); runs in the model's process.
    Method names carry a ``v05_`` prefix so they cannot collide with the worker's own."""

    def v05_load_dir(self, path: str) -> int:
        return self._v05_load(list(iter_safetensors(path)))

    def v05_init_nccl(self, master_address: str, master_port: int, rank_offset: int,
                      world_size: int) -> None:
        from vllm.distributed.parallel_state import get_world_group

        rank = get_world_group().rank + rank_offset
        self._v05_comm = _nccl_group(master_address, master_port, rank, world_size, self.device)

    def v05_recv_nccl(self, meta: list) -> int:
        import torch

        comm = getattr(self, "_v05_comm", None)
        if comm is None:
            raise RuntimeError("v05_recv_nccl before v05_init_nccl")

        def received() -> Iterator[tuple[str, Any]]:
            for name, dtype, shape in meta:
                buf = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=self.device)
                comm.broadcast(buf, src=0, stream=torch.cuda.current_stream())
                yield name, buf

        return self._v05_load(received())

    def _v05_load(self, weights: Iterable[tuple[str, Any]]) -> int:
        counted: list[str] = []

        def counting() -> Iterator[tuple[str, Any]]:
            for name, t in weights:
                counted.append(name)
                yield name, t

        reload = getattr(self, "reload_weights", None)
        if reload is not None:  # vLLM >= 0.2x: in-place reload that also redoes weight processing
            reload(weights_iterator=counting())
        else:  # older vLLM: the loader of an unquantised model copies into the live params
            self.model_runner.model.load_weights(weights=counting())
        return len(counted)
