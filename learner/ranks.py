"""R ``LearnerWorker`` ranks as Ray actors behind one handle-like object."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Sequence

from common.names import actor_name
from common.threads import threads_for
from common.types import TrainSample
from common.records import StepResult
from learner.bundles import fill_bundles
from common.sharding import shard_samples
from learner.config import LearnerConfig


def free_port(host: str = "127.0.0.1", port: int = 0) -> int:
    """A TCP port free right now on ``host`` ("": every interface; tiny race accepted):
    ``port`` itself (``learner.rendezvous_port``: a port a firewall lets through), or any
    (0). A given port that is taken is an error naming the setting."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as err:
            raise RuntimeError(f"learner.rendezvous_port {port} is not free on learner rank 0's "
                               f"node ({err.strerror}): choose another, or null for any") from None
        return s.getsockname()[1]


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet (torch.distributed's TCP store, hosted by rank 0)."""

    addr: str     # rank 0's node address, as Ray knows it (127.0.0.1 on a loopback cluster)
    port: int     # free on that node when asked
    node_id: str  # rank 0's Ray node


def rank_options(n_ranks: int, num_cpus: float, num_gpus: float = 0.0, placement_group=None,
                 bundle_offset: int = 0) -> list[dict]:
    """Ray actor options of each rank: its resources and, with a placement group, its bundle.
    Ranks fill the group's bundles from ``bundle_offset`` in order, each bundle taking the
    ranks it holds: one per bundle when the learner shares a node (STRICT_PACK), a node's
    share per bundle when it spans nodes (STRICT_SPREAD; see ``cluster.nodes.placement.layout``)."""
    opts = [{"num_cpus": num_cpus, "num_gpus": num_gpus} for _ in range(n_ranks)]
    if placement_group is None:
        return opts
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    per_rank = {"CPU": num_cpus, "GPU": num_gpus}
    slots = fill_bundles(placement_group.bundle_specs, per_rank, n_ranks, bundle_offset)
    for o, index in zip(opts, slots):
        o["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=index)
    return opts


def _rank0_here(port: int = 0) -> Rendezvous:
    import ray

    return Rendezvous(ray.util.get_node_ip_address(), free_port("", port),
                      ray.get_runtime_context().get_node_id())


def rendezvous(rank0: dict, port: int = 0) -> Rendezvous:
    """Rank 0's node address and a port free there, from a tiny task placed as rank 0 will
    be: in its bundle (asking nothing more, the bundle already holds the resources), or,
    without a placement group, on any node that could hold rank 0 (the caller then pins
    rank 0 to that node). Never the driver's address: the driver may be on another node."""
    import ray

    if "scheduling_strategy" in rank0:
        opts = {"num_cpus": 0, "num_gpus": 0, "scheduling_strategy": rank0["scheduling_strategy"]}
    else:
        opts = {"num_cpus": rank0["num_cpus"], "num_gpus": rank0["num_gpus"]}
    return ray.get(ray.remote(_rank0_here).options(**opts).remote(port))


class Learner:
    """Creates ``n_ranks`` DeepSpeed ranks as Ray actors and drives them in lockstep.

    The ranks meet at rank 0's node (``rendezvous``): with a placement group (the launcher's,
    from ``cluster.nodes.placement``) each rank runs in its bundle; without one, rank 0 is pinned to
    the node the rendezvous was found on and the others go wherever Ray puts them.
    With ``run_name`` each rank's actor is named ``<run>/learner-rank-<r>``
    (``common.names``); without it the ranks are anonymous.
    """

    def __init__(self, model_path: str, n_ranks: int, cfg: LearnerConfig,
                 num_cpus_per_rank: float = 1.0, placement_group=None, bundle_offset: int = 0,
                 num_gpus_per_rank: float = 0.0, threads: int | None = None,
                 log_dir: str | None = None, run_name: str | None = None,
                 rendezvous_port: int | None = None, env: dict | None = None):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from learner.worker import LearnerWorker

        if n_ranks < 1:
            raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
        if num_cpus_per_rank <= 0:
            raise ValueError(f"num_cpus_per_rank must be > 0, got {num_cpus_per_rank}")
        self.n_ranks, self.cfg = n_ranks, cfg
        opts = rank_options(n_ranks, num_cpus_per_rank, num_gpus_per_rank, placement_group,
                            bundle_offset)
        self.rendezvous = rendezvous(opts[0], rendezvous_port or 0)
        if env:  # e.g. the network interface NCCL and gloo use (cluster.network_interface)
            for o in opts:
                o["runtime_env"] = {"env_vars": dict(env)}
        if placement_group is None:
            opts[0]["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                self.rendezvous.node_id, soft=False)
        # torch threads: as given, else the CPU share (a fractional one still needs a thread).
        threads = threads_for(num_cpus_per_rank, threads)
        actor_cls = ray.remote(LearnerWorker)
        if run_name is not None:  # <run>/learner-rank-<r> on the Ray dashboard
            for rank, o in enumerate(opts):
                o["name"] = actor_name(run_name, f"learner-rank-{rank}")
        r = self.rendezvous
        self.workers = [actor_cls.options(**o).remote(
            str(model_path), cfg, rank, n_ranks, r.port, threads, master_addr=r.addr,
            log_path=None if log_dir is None else f"{log_dir}/learner-{rank}.log")
            for rank, o in enumerate(opts)]
        try:
            ray.get([w.ready.remote() for w in self.workers])
        except Exception:
            self.shutdown()
            raise

    def model_fingerprints(self) -> list[tuple[str, str]]:
        """Each rank's (node, model fingerprint), in rank order."""
        return self._every_rank([w.model_fingerprint.remote() for w in self.workers])

    def _every_rank(self, refs: list) -> list:
        """The results of calls on the ranks (``refs`` in rank order), once all are done."""
        import ray

        return ray.get(refs)

    def train_step(self, samples: Sequence[TrainSample]) -> StepResult:
        """One optimiser step on the global batch; see ``shard_samples`` for the split.
        Returns rank 0's metrics (every rank computes the same all-reduced values)."""
        shards = shard_samples(samples, self.n_ranks)
        return self._every_rank([w.train_step.remote(shard)
                                 for w, shard in zip(self.workers, shards)])[0]

    def train_batch(self, batch) -> StepResult:
        """One optimiser step on a coordinator's ``TrainBatch``: each rank is handed its
        shard's object reference (Ray resolves it in the rank: the samples go from the
        coordinator's object store to the rank, not through this process), or, for a batch
        with inline samples, its share of them split here."""
        if batch.shards is None:
            return self.train_step(batch.samples)
        refs = batch.shards.refs
        if len(refs) != self.n_ranks:
            raise ValueError(f"the batch has {len(refs)} shards for {self.n_ranks} learner ranks "
                             "(the coordinator's learner_ranks must be learner.ranks)")
        return self._every_rank([w.train_step.remote(ref)
                                 for w, ref in zip(self.workers, refs)])[0]

    def connect_weight_sync(self, transport: str | dict, generators: list) -> None:
        """Rank 0 becomes the weight sender to ``generators`` (see ``common/weight_sync``)."""
        self._every_rank([self.workers[0].connect_weight_sync.remote(transport, list(generators))])

    def publish_weights(self, generators: list, version: int) -> tuple:
        """Rank 0 sends its weights to ``generators`` as ``version`` (every rank takes part:
        ZeRO-3 gathers). Returns (payload, ObjectRefs of the generators' updates)."""
        generators = list(generators)
        return self._every_rank([w.publish_weights.remote(generators, version)
                                 for w in self.workers])[0]

    def get_weights(self) -> dict:
        """Rank 0's full fp32 state dict {HF name: np.ndarray}."""
        return self._every_rank([w.get_weights.remote() for w in self.workers])[0]

    def get_weights_per_rank(self) -> list[dict]:
        """Every rank's full state dict (to check that the ranks agree)."""
        return self._every_rank([w.get_weights.remote(all_ranks=True) for w in self.workers])

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> str:
        return self._every_rank([w.save_checkpoint.remote(str(ckpt_dir), client_state)
                                 for w in self.workers])[0]

    def load_checkpoint(self, ckpt_dir: str, tag: str | None = None) -> dict:
        return self._every_rank([w.load_checkpoint.remote(str(ckpt_dir), tag)
                                 for w in self.workers])[0]

    def save_hf(self, out_dir: str) -> str:
        return self._every_rank([w.save_hf.remote(str(out_dir)) for w in self.workers])[0]

    def shutdown(self) -> None:
        """Kill the rank actors (by handle, nothing else)."""
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
