"""The engine side: ``WeightSyncWorkerExtension`` is mixed into vLLM's worker class
(``worker_extension_cls``, named by ``WORKER_EXTENSION``), so its methods run inside the
process that owns the model and are reached with ``engine.collective_rpc(name, args=...)``.
Method names carry a ``v05_`` prefix so they cannot collide with the worker's own."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from common.weight_sync.base import GroupSpec, iter_safetensors
from common.weight_sync.group import GroupMember


class WeightSyncWorkerExtension:
    # ------------------------------------------------------------------ object store
    def v05_load_dir(self, path: str) -> int:
        return self._v05_load(list(iter_safetensors(path)))

    # ------------------------------------------------------------------ broadcast group
    def v05_join_group(self, spec: dict, rank_offset: int) -> None:
        """Leave the current epoch (if any) and join ``spec``'s as rank ``rank_offset`` +
        this worker's rank in its engine (tensor-parallel workers each take a rank)."""
        spec = GroupSpec.from_dict(spec)
        device = getattr(self, "device", None) if spec.backend == "nccl" else None
        self._v05_member().join(spec, rank_offset + self._v05_local_rank(), device)

    def v05_receive(self, group: str, meta: list) -> int:
        """Receive the tensors of ``meta`` broadcast in ``group`` straight into the model,
        then acknowledge; returns how many were loaded."""
        return self._v05_member().receive_into(group, meta, self._v05_load)

    def v05_group(self) -> str | None:
        """The group this worker is in (``GroupSpec.name``), None outside any."""
        return self._v05_member().name

    def v05_half_loaded(self) -> bool:
        """Whether a reload began and did not finish: vLLM's in-place reload moves each
        layer's parameters aside before the weights fill them (initialize_layerwise_reload)
        and restores them only at its end, so a load cut off part way (a broadcast that
        failed, a tensor that does not fit) leaves a model that must never generate."""
        return bool(getattr(self, "_v05_reloading", False))

    # ------------------------------------------------------------------ loading
    def _v05_local_rank(self) -> int:
        """This worker's rank among its engine's workers (0 without tensor parallelism)."""
        from vllm.distributed.parallel_state import get_world_group

        return get_world_group().rank

    def _v05_member(self) -> GroupMember:
        if getattr(self, "_v05_group_member", None) is None:
            self._v05_group_member = GroupMember()
        return self._v05_group_member

    def _v05_load(self, weights: Iterable[tuple[str, Any]]) -> int:
        counted: list[str] = []

        def counting() -> Iterator[tuple[str, Any]]:
            for name, t in weights:
                counted.append(name)
                yield name, t

        reload = getattr(self, "reload_weights", None)
        self._v05_reloading = True  # cleared only by a load that finished (v05_half_loaded)
        if reload is not None:  # vLLM >= 0.2x: in-place reload that also redoes weight processing
            reload(weights_iterator=counting())
        else:  # older vLLM: the loader of an unquantised model copies into the live params
            self.model_runner.model.load_weights(weights=counting())
        self._v05_reloading = False
        return len(counted)
