"""Broadcast groups: one rank's side of one group epoch, over a pluggable communicator.

Rank 0 (learner rank 0) broadcasts, ranks 1..W-1 (the generators' workers) receive. Every
epoch has its own rendezvous (a ``TCPStore`` that rank 0 hosts, keys prefixed by the epoch)
and its own communicator, so nothing from an earlier, broken epoch can leak into it and
neither side's default ``torch.distributed`` group is touched.

Communicators (``COMMUNICATORS``, keyed by ``GroupSpec.backend``):
- ``nccl``: vLLM's ``PyNcclCommunicator`` on a ``StatelessProcessGroup`` (GPUs). NCCL calls
  do not time out by themselves: each step records a CUDA event and polls it until the
  step's deadline, and on timeout aborts the communicator (``ncclCommAbort``).
- ``gloo``: ``torch.distributed.ProcessGroupGloo`` over TCP (CPU). Its operations take the
  timeout; dropping it closes its connections, so peers blocked on it fail at once.

Every step (join, each tensor, the acknowledgement) is bounded by ``GroupSpec.timeout_s``;
a failure raises ``BroadcastError`` naming the epoch, the rank and the step, and closes this
rank's side (a failed epoch is never reused).

Heavy imports are local: importing ``common.weight_sync`` stays free of torch.
"""
from __future__ import annotations

import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

from common.weight_sync.base import (BroadcastError, GroupSpec, NotInGroupError,
                                     WeightSyncError)

Meta = Iterable[tuple[str, str, Iterable[int]]]


# ---------------------------------------------------------------------------- communicators

class Communicator(ABC):
    """One rank of a group; every operation returns when this rank's part is done, or
    raises after ``timeout_s``."""

    device: Any
    name: str = ""          # in messages: "gloo", "NCCL"
    _handle: Any = None     # the underlying communicator; None once closed

    @abstractmethod
    def broadcast(self, tensor: Any, timeout_s: float) -> None:
        """Rank 0's ``tensor`` into ``tensor`` on every other rank."""

    @abstractmethod
    def all_reduce_sum(self, tensor: Any, timeout_s: float) -> None:
        """In place: the sum of ``tensor`` over all ranks."""

    @abstractmethod
    def close(self) -> None:
        """Release the communicator; peers blocked on it fail (at once or at their timeout)."""

    def _live(self) -> Any:
        """The underlying communicator, or RuntimeError once closed."""
        if self._handle is None:
            raise RuntimeError(f"{self.name} communicator is closed")
        return self._handle


class GlooCommunicator(Communicator):
    name = "gloo"

    def __init__(self, store: Any, rank: int, world_size: int, timeout_s: float,
                 device: Any = None):
        import torch
        from torch.distributed import ProcessGroupGloo

        self.device = torch.device("cpu")
        self._handle = ProcessGroupGloo(store, rank, world_size, timedelta(seconds=timeout_s))

    def broadcast(self, tensor: Any, timeout_s: float) -> None:
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = 0
        self._live().broadcast([tensor], opts).wait(timedelta(seconds=timeout_s))

    def all_reduce_sum(self, tensor: Any, timeout_s: float) -> None:
        self._live().allreduce([tensor]).wait(timedelta(seconds=timeout_s))

    def close(self) -> None:
        # Destroying the gloo context closes its sockets: a peer blocked in an operation
        # fails with "connection closed" at once. (abort()/shutdown() leave them open and
        # the peers wait for their timeout.)
        self._handle = None


class NcclCommunicator(Communicator):
    name = "NCCL"

    def __init__(self, store: Any, rank: int, world_size: int, timeout_s: float,
                 device: Any = None):
        import torch
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        self.device = device if device is not None else torch.device(
            "cuda", torch.cuda.current_device())
        pg = StatelessProcessGroup(rank=rank, world_size=world_size, store=store)
        # ncclCommInitRank has no timeout; every rank was seen alive by the rendezvous
        # barrier just before, and a rank lost in between is caught here.
        self._handle = _bounded(lambda: PyNcclCommunicator(pg, device=self.device), timeout_s,
                                "NCCL communicator init")
        if self._handle.disabled:  # no NCCL library: its broadcast would silently do nothing
            raise RuntimeError("vLLM's PyNcclCommunicator is disabled (NCCL library not "
                               "found, or VLLM_DISABLE_PYNCCL)")

    def broadcast(self, tensor: Any, timeout_s: float) -> None:
        stream = self._stream()
        self._live().broadcast(tensor, src=0, stream=stream)
        self._wait(stream, timeout_s)

    def all_reduce_sum(self, tensor: Any, timeout_s: float) -> None:
        stream = self._stream()
        out = self._live().all_reduce(tensor, stream=stream)
        self._wait(stream, timeout_s)
        tensor.copy_(out)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.destroy()  # ncclCommAbort: also ends an operation stuck on a lost peer
            self._handle = None

    def _stream(self):
        import torch

        # The caller's stream: the worker's weight loader copies from the received buffers
        # on it, after the broadcast.
        return torch.cuda.current_stream(self.device)

    def _wait(self, stream: Any, timeout_s: float) -> None:
        import torch

        done = torch.cuda.Event()
        done.record(stream)
        deadline = time.monotonic() + timeout_s
        while not done.query():  # NCCL has no timeout of its own: poll the stream
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"NCCL operation not finished after {timeout_s:.1f}s")
            time.sleep(2e-4)


COMMUNICATORS: dict[str, type[Communicator]] = {
    "nccl": NcclCommunicator,
    "gloo": GlooCommunicator,
}


def _bounded(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``fn()`` in a daemon thread, waited for at most ``timeout_s`` (for calls that take no
    timeout). A call that runs past it is abandoned, still running."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name=what)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"{what} not finished after {timeout_s:.1f}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


# ---------------------------------------------------------------------------- rendezvous

class Listener:
    """Rank 0's rendezvous socket, bound before the port is announced (no free-port race).
    ``port=0`` binds a free port."""

    def __init__(self, address: str, port: int = 0):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))
        self._sock.listen()
        self.port = self._sock.getsockname()[1]

    def detach(self) -> int:
        """The socket's descriptor, handed over to the store (which then owns it)."""
        return self._sock.detach()

    def close(self) -> None:
        self._sock.close()


def rendezvous(spec: GroupSpec, rank: int, listen_fd: int | None = None) -> Any:
    """This epoch's store, once every rank is present. Rank 0 hosts it on ``listen_fd``."""
    from torch.distributed import PrefixStore, TCPStore

    timeout = timedelta(seconds=spec.timeout_s)
    if rank == 0:
        if listen_fd is None:
            raise ValueError("rank 0 hosts the store: give it the listener's descriptor")
        base = TCPStore(spec.address, spec.port, None, True, timeout, wait_for_workers=False,
                        master_listen_fd=listen_fd, use_libuv=False)
    else:
        base = TCPStore(spec.address, spec.port, None, False, timeout, use_libuv=False)
    store = PrefixStore(f"v05-weight-sync/{spec.name}/", base)
    store.set(f"joined/{rank}", b"1")
    keys = [f"joined/{r}" for r in range(spec.world_size)]
    try:
        store.wait(keys, timeout)
    except Exception as e:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise BroadcastError(f"weight-sync group {spec.name}: ranks {missing} of "
                             f"{spec.world_size} did not join within {spec.timeout_s:.1f}s "
                             f"(rank {rank} waited)") from e
    return store


# ---------------------------------------------------------------------------- one epoch

class BroadcastGroup:
    """One rank's side of one epoch: rank 0 ``send``s, the others ``receive`` and
    ``confirm``. A failed step closes it for good."""

    def __init__(self, spec: GroupSpec, rank: int, comm: Communicator, store: Any):
        self.spec, self.rank = spec, rank
        self._comm: Communicator | None = comm
        self._store = store  # rank 0: the store's server lives as long as this reference

    @classmethod
    def open(cls, spec: GroupSpec, rank: int, device: Any = None,
             listen_fd: int | None = None) -> BroadcastGroup:
        """Join epoch ``spec.epoch`` as ``rank``; returns once every rank has joined."""
        if spec.backend not in COMMUNICATORS:
            raise ValueError(f"unknown communicator {spec.backend!r}; known: "
                             f"{sorted(COMMUNICATORS)}")
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} is outside world_size {spec.world_size}")
        t0 = time.monotonic()
        try:
            store = rendezvous(spec, rank, listen_fd)
            comm = COMMUNICATORS[spec.backend](store, rank, spec.world_size, spec.timeout_s,
                                               device)
        except BroadcastError:
            raise
        except Exception as e:
            raise BroadcastError(f"{_where(spec, rank)}: joining failed after "
                                 f"{time.monotonic() - t0:.1f}s: {type(e).__name__}: {e}") from e
        return cls(spec, rank, comm, store)

    @property
    def closed(self) -> bool:
        return self._comm is None

    def send(self, tensors: Iterable[Any]) -> None:
        """Rank 0: broadcast ``tensors`` in order, then wait for every receiver's
        acknowledgement (a receiver that stopped listening fails it: a broadcast alone can
        complete into socket buffers)."""
        import torch

        if self.rank != 0:
            raise ValueError("only rank 0 sends")
        comm = self._open_comm()
        for i, t in enumerate(tensors):
            buf = torch.as_tensor(t).detach().to(comm.device).contiguous()
            self._step(f"broadcast of tensor {i}", comm.broadcast, buf)
        acks = torch.zeros(1, dtype=torch.float32, device=comm.device)
        self._step("acknowledgement", comm.all_reduce_sum, acks)
        if int(acks.item()) != self.spec.world_size - 1:
            self.close()
            raise BroadcastError(f"{_where(self.spec, 0)}: {int(acks.item())} of "
                                 f"{self.spec.world_size - 1} receivers acknowledged")

    def receive(self, meta: Meta) -> Iterator[tuple[str, Any]]:
        """Ranks > 0: yield ``(name, tensor)`` as each arrives (allocated from ``meta``)."""
        import torch

        comm = self._open_comm()
        for i, (name, dtype, shape) in enumerate(meta):
            buf = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=comm.device)
            self._step(f"broadcast of tensor {i} ({name})", comm.broadcast, buf)
            yield name, buf

    def confirm(self) -> None:
        """Ranks > 0: acknowledge the whole broadcast (after loading it)."""
        import torch

        comm = self._open_comm()
        self._step("acknowledgement", comm.all_reduce_sum,
                   torch.ones(1, dtype=torch.float32, device=comm.device))

    def close(self) -> None:
        comm, self._comm, self._store = self._comm, None, None
        if comm is not None:
            comm.close()

    def _open_comm(self) -> Communicator:
        if self._comm is None:
            raise BroadcastError(f"{_where(self.spec, self.rank)} is closed (a step failed)")
        return self._comm

    def _step(self, what: str, op: Callable[[Any, float], None], tensor: Any) -> None:
        t0 = time.monotonic()
        try:
            op(tensor, self.spec.timeout_s)
        except Exception as e:
            self.close()
            raise BroadcastError(f"{_where(self.spec, self.rank)}: {what} failed after "
                                 f"{time.monotonic() - t0:.1f}s (timeout "
                                 f"{self.spec.timeout_s:.1f}s): {type(e).__name__}: "
                                 f"{_first_line(e)}") from e


def _where(spec: GroupSpec, rank: int) -> str:
    return f"weight-sync group {spec.name} ({spec.backend}, rank {rank} of {spec.world_size})"


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else ""


# ---------------------------------------------------------------------------- receivers

class GroupMember:
    """A receiving rank's membership (one per generator worker): at most one epoch at a
    time. The vLLM worker extension holds one; so do the tests' plain receiver processes."""

    def __init__(self) -> None:
        self.group: BroadcastGroup | None = None

    @property
    def name(self) -> str | None:
        """The group this member is in (``GroupSpec.name``), None outside any."""
        return None if self.group is None or self.group.closed else self.group.spec.name

    def join(self, spec: GroupSpec, rank: int, device: Any = None) -> None:
        """Leave the current epoch (if any) and join ``spec``'s; returns once all ranks
        have joined."""
        if rank < 1:
            raise ValueError(f"receivers have ranks >= 1, got {rank}")
        self.leave()
        self.group = BroadcastGroup.open(spec, rank, device)

    def receive_into(self, group: str, meta: Meta,
                     load: Callable[[Iterator[tuple[str, Any]]], int]) -> int:
        """Receive the broadcast announced by ``meta`` in ``group`` (a ``GroupSpec.name``),
        streaming each tensor into ``load`` (returns how many it loaded), then acknowledge.
        On any failure this member leaves its epoch (the sender rebuilds the group) and the
        error is raised."""
        if self.name != group:
            raise NotInGroupError(f"not a member of weight-sync group {group} (joined: "
                                  f"{self.name or 'none'}); the sender reconnects this "
                                  "receiver at its next publish")
        meta = list(meta)
        try:
            n = load(self.group.receive(meta))
            if n != len(meta):
                raise WeightSyncError(f"loaded {n} of the {len(meta)} tensors broadcast")
            self.group.confirm()
            return n
        except BaseException:
            self.leave()
            raise

    def leave(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
