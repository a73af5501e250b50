"""Weight sync from the learner to the generators: one small interface, pluggable transports.

Learner rank 0 holds a ``WeightSender`` (``make_sender(cfg)``), ``connect``s it once and
``send``s each new version; each generator turns the payload into an in-place reload of its
vLLM engine through its ``WeightReceiver`` for the payload's transport (``make_receiver``).
The engine side is the worker extension named by ``WORKER_EXTENSION``.

- ``base``: config, payloads, errors, the interface and the pure helpers;
- ``object_store``: ``ray.put`` once, every generator fetches (CPU default);
- ``collective`` + ``group``: a broadcast from learner rank 0 in a group that is rebuilt
  (a new epoch) when generators restart or die, over NCCL (GPUs) or gloo (CPUs);
- ``worker_ext``: the methods vLLM's worker gains.

Importing this package loads neither torch, Ray nor vLLM. See docs/weight_sync.md.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.weight_sync.base import (TRANSPORT_NAMES, BroadcastError, CollectivePayload,
                                     GroupSpec, NotInGroupError, ObjectStorePayload,
                                     WeightReceiver, WeightSender, WeightSyncConfig,
                                     WeightSyncError, broadcast_plan, check_transport,
                                     iter_safetensors, normalise_name, shm_tempdir,
                                     to_numpy_state_dict, write_safetensors)
from common.weight_sync.collective import CollectiveReceiver, CollectiveSender, SendReport
from common.weight_sync.object_store import ObjectStoreReceiver, ObjectStoreSender

WORKER_EXTENSION = "common.weight_sync.worker_ext.WeightSyncWorkerExtension"

TRANSPORTS: dict[str, tuple[type[WeightSender], type[WeightReceiver]]] = {
    "object_store": (ObjectStoreSender, ObjectStoreReceiver),
    "nccl": (CollectiveSender, CollectiveReceiver),
    "gloo": (CollectiveSender, CollectiveReceiver),
}
assert set(TRANSPORTS) == set(TRANSPORT_NAMES)


def make_sender(cfg: WeightSyncConfig | Mapping[str, Any] | str) -> WeightSender:
    """A sender from a transport name, a config mapping or a ``WeightSyncConfig``."""
    if isinstance(cfg, str):
        cfg = {"type": cfg}
    if not isinstance(cfg, WeightSyncConfig):
        cfg = WeightSyncConfig(**cfg)
    return TRANSPORTS[cfg.type][0](cfg)


def make_receiver(transport: str) -> WeightReceiver:
    """A fresh receiver for ``transport`` (a generator keeps one per transport)."""
    check_transport(transport)
    return TRANSPORTS[transport][1]()


__all__ = [
    "WORKER_EXTENSION", "TRANSPORTS", "make_sender", "make_receiver",
    "WeightSyncConfig", "WeightSender", "WeightReceiver", "ObjectStorePayload",
    "CollectivePayload", "GroupSpec", "SendReport", "WeightSyncError", "BroadcastError",
    "NotInGroupError", "ObjectStoreSender", "ObjectStoreReceiver", "CollectiveSender",
    "CollectiveReceiver", "broadcast_plan", "normalise_name", "to_numpy_state_dict",
    "write_safetensors", "iter_safetensors", "shm_tempdir",
]
