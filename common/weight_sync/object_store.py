"""The object-store transport (CPU default): one ``ray.put`` of the NumPy state dict per
version; each generator fetches it, writes safetensors under /dev/shm and asks its worker to
load that directory. Tensors themselves do not survive ``collective_rpc`` into vLLM's
engine process, a path does. A restarted generator loads the same payload later (the
coordinator's re-sync): nothing here depends on who was alive at publish time."""
from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from typing import Any

from common.weight_sync.base import (ObjectStorePayload, WeightReceiver, WeightSender,
                                     WeightSyncConfig, check_payload, shm_tempdir,
                                     to_numpy_state_dict, write_safetensors)


def put_state_dict(weights: Mapping[str, Any], version: int) -> ObjectStorePayload:
    """One put for all generators; each fetches it zero-copy from its node's store."""
    import ray

    sd = to_numpy_state_dict(weights)
    return ObjectStorePayload(version=version, ref=ray.put(sd), num_tensors=len(sd))


class ObjectStoreSender(WeightSender):
    def __init__(self, cfg: WeightSyncConfig):
        self.cfg = cfg

    def send(self, generators: list, weights: Mapping[str, Any],
             version: int) -> tuple[ObjectStorePayload, list]:
        payload = put_state_dict(weights, version)
        return payload, [g.update_weights.remote(payload, version) for g in generators]


class ObjectStoreReceiver(WeightReceiver):
    def check(self, payload: Any) -> None:
        check_payload(payload, ObjectStorePayload, "object_store")

    async def load(self, engine: Any, payload: Any) -> int:
        self.check(payload)
        sd = await payload.ref  # awaitable ObjectRef: does not block the actor's loop
        directory = shm_tempdir(f"v{payload.version}")
        try:
            await asyncio.to_thread(write_safetensors, sd, directory)
            counts = await engine.collective_rpc("v05_load_dir", args=(str(directory),))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return int(counts[0])
