"""R ``LearnerWorker`` ranks as Ray actors behind one handle-like object."""
from __future__ import annotations

import socket
from typing import Sequence

from actors.types import TrainSample
from learner.batch import shard_samples
from learner.config import LearnerConfig


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (the ranks' rendezvous; tiny race accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LearnerGroup:
    """Creates ``n_ranks`` DeepSpeed ranks as Ray actors and drives them in lockstep.

    The rendezvous is 127.0.0.1 on a port free on the driver: all ranks must run on the
    driver's node (multi-node learners would need rank 0's node address here).
    """

    def __init__(self, model_path: str, n_ranks: int, cfg: LearnerConfig,
                 num_cpus_per_rank: float = 1.0, placement_group=None, bundle_offset: int = 0,
                 num_gpus_per_rank: float = 0.0):
        import ray

        from learner.worker import LearnerWorker

        if n_ranks < 1:
            raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
        if num_cpus_per_rank <= 0:
            raise ValueError(f"num_cpus_per_rank must be > 0, got {num_cpus_per_rank}")
        self.n_ranks, self.cfg = n_ranks, cfg
        port = free_port()
        # torch threads follow the CPU share; a fractional share still needs one thread.
        threads = max(1, int(num_cpus_per_rank))
        actor_cls = ray.remote(LearnerWorker)
        self.workers = []
        for rank in range(n_ranks):
            opts = {"num_cpus": num_cpus_per_rank, "num_gpus": num_gpus_per_rank}
            if placement_group is not None:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=placement_group,
                    placement_group_bundle_index=bundle_offset + rank)
            self.workers.append(actor_cls.options(**opts).remote(
                str(model_path), cfg, rank, n_ranks, port, threads))
        try:
            ray.get([w.ready.remote() for w in self.workers])
        except Exception:
            self.shutdown()
            raise

    def _all(self, method: str, *args, **kwargs) -> list:
        import ray

        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def train_step(self, samples: Sequence[TrainSample]) -> dict:
        """One optimiser step on the global batch; see ``shard_samples`` for the split.
        Returns rank 0's metrics (every rank computes the same all-reduced values)."""
        import ray

        shards = shard_samples(samples, self.n_ranks)
        refs = [w.train_step.remote(shard) for w, shard in zip(self.workers, shards)]
        return ray.get(refs)[0]

    def connect_weight_sync(self, transport: str | dict, generators: list) -> None:
        """Rank 0 becomes the weight sender to ``generators`` (see ``actors/weight_sync``)."""
        import ray

        ray.get(self.workers[0].connect_weight_sync.remote(transport, list(generators)))

    def publish_weights(self, generators: list, version: int) -> tuple:
        """Rank 0 sends its weights to ``generators`` as ``version`` (every rank takes part:
        ZeRO-3 gathers). Returns (payload, ObjectRefs of the generators' updates)."""
        return self._all("publish_weights", list(generators), version)[0]

    def get_weights(self) -> dict:
        """Rank 0's full fp32 state dict {HF name: np.ndarray}."""
        return self._all("get_weights")[0]

    def get_weights_per_rank(self) -> list[dict]:
        """Every rank's full state dict (to check that the ranks agree)."""
        return self._all("get_weights", all_ranks=True)

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> str:
        return self._all("save_checkpoint", str(ckpt_dir), client_state)[0]

    def load_checkpoint(self, ckpt_dir: str, tag: str | None = None) -> dict:
        return self._all("load_checkpoint", str(ckpt_dir), tag)[0]

    def save_hf(self, out_dir: str) -> str:
        return self._all("save_hf", str(out_dir))[0]

    def shutdown(self) -> None:
        """Kill this group's actors (by handle, nothing else)."""
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
