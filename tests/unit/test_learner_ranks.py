"""The learner's driver-facing calls reach every rank's own method (no Ray: the rank actors
are fakes that answer each ``.remote`` call at once)."""
from __future__ import annotations

import pytest

from common.types import TrainSample
from learner.config import LearnerConfig
from learner.ranks import Learner


class _Call:
    def __init__(self, rank: int, name: str, log: list):
        self.rank, self.name, self.log = rank, name, log

    def remote(self, *args, **kwargs):
        self.log.append((self.rank, self.name, args, kwargs))
        return {"rank": self.rank, "method": self.name, "args": args, "kwargs": kwargs}


class _Rank:
    """A rank actor's handle: every attribute is a remote method that records its call."""

    def __init__(self, rank: int, log: list):
        self.rank, self.log = rank, log

    def __getattr__(self, name):
        return _Call(self.rank, name, self.log)


def learner(n_ranks: int) -> tuple[Learner, list]:
    log: list = []
    lrn = Learner.__new__(Learner)  # no actors started
    lrn.n_ranks, lrn.cfg = n_ranks, LearnerConfig()
    lrn.workers = [_Rank(r, log) for r in range(n_ranks)]
    lrn._every_rank = lambda results: list(results)  # the fakes answered already
    return lrn, log


@pytest.mark.parametrize("call, method, args, kwargs", [
    (lambda l: l.publish_weights(iter(["g0", "g1"]), 7), "publish_weights", (["g0", "g1"], 7), {}),
    (lambda l: l.get_weights(), "get_weights", (), {}),
    (lambda l: l.save_checkpoint("/ckpt", {"step": 3}), "save_checkpoint", ("/ckpt", {"step": 3}), {}),
    (lambda l: l.load_checkpoint("/ckpt", "tag"), "load_checkpoint", ("/ckpt", "tag"), {}),
    (lambda l: l.save_hf("/hf"), "save_hf", ("/hf",), {}),
])
def test_every_rank_takes_part_and_rank0_answers(call, method, args, kwargs):
    lrn, log = learner(3)
    got = call(lrn)
    assert got == {"rank": 0, "method": method, "args": args, "kwargs": kwargs}
    assert log == [(r, method, args, kwargs) for r in range(3)]


def test_per_rank_weights_connect_and_sharded_steps():
    lrn, log = learner(2)
    assert [w["rank"] for w in lrn.get_weights_per_rank()] == [0, 1]
    assert log == [(r, "get_weights", (), {"all_ranks": True}) for r in range(2)]
    log.clear()
    lrn.connect_weight_sync("gloo", ("g0",))  # rank 0 alone holds the sender
    assert log == [(0, "connect_weight_sync", ("gloo", ["g0"]), {})]
    log.clear()
    samples = [TrainSample(prompt_token_ids=[1], token_ids=[2, 3], logprobs=[-0.1, -0.2],
                           advantage=1.0, version=0) for _ in range(3)]
    assert lrn.train_step(samples)["rank"] == 0
    shards = [args[0] for _, name, args, _ in log if name == "train_step"]
    assert len(shards) == 2 and sum(len(s) for s in shards) == 3


def test_a_batch_by_reference_hands_each_rank_its_own_shard():
    """The coordinator's shard references go to the ranks as they are (Ray resolves each in
    its rank); a batch with inline samples is split here as ``train_step`` splits it."""
    from common.sharding import Shards
    from common.types import TrainBatch

    lrn, log = learner(2)
    shards = Shards(refs=["ref-0", "ref-1"], members=[[0], [1]], versions=[0, 0], tokens=[3, 3])
    batch = TrainBatch(records=[], samples=[], version=0, inflight_prompts=0, shards=shards)
    assert lrn.train_batch(batch)["rank"] == 0
    assert [(r, name, args) for r, name, args, _ in log] == [
        (0, "train_step", ("ref-0",)), (1, "train_step", ("ref-1",))]
    with pytest.raises(ValueError, match="3 shards for 2 learner ranks"):
        lrn.train_batch(TrainBatch(records=[], samples=[], version=0, inflight_prompts=0,
                                   shards=Shards(["a", "b", "c"], [[0], [1], [2]], [0] * 3,
                                                 [3] * 3)))
    log.clear()
    samples = [TrainSample(prompt_token_ids=[1], token_ids=[2], logprobs=[-0.1], advantage=1.0,
                           version=0) for _ in range(3)]
    lrn.train_batch(TrainBatch(records=[], samples=samples, version=0, inflight_prompts=0))
    assert sorted(len(args[0]) for _, _, args, _ in log) == [1, 2]


def test_a_rendezvous_port_given_is_used_and_a_taken_one_is_named():
    import socket

    from learner.ranks import free_port

    port = free_port()
    assert free_port("127.0.0.1", port) == port
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(RuntimeError, match=f"learner.rendezvous_port {port} is not free"):
            free_port("127.0.0.1", port)
