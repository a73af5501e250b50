"""The broadcast group over gloo, with plain processes: rank 0 here, two receivers in
spawned processes driven through queues (no Ray, no vLLM).

What it proves: tensors arrive exactly (names, dtypes incl. bf16, shapes); a receiver that
dies or stops listening makes rank 0's broadcast fail with a clear ``BroadcastError`` within
the step timeout instead of blocking; a new epoch with the survivors works; the dead one,
started again, rejoins a later epoch and receives the next weights exactly; a receiver
never takes part in an epoch it did not join. Synchronisation is by queue replies and the
group's own timeouts, never by sleeping.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import time

import numpy as np
import pytest
import torch

from common.weight_sync import BroadcastError, GroupSpec, NotInGroupError, broadcast_plan
from common.weight_sync.group import BroadcastGroup, GlooCommunicator, GroupMember, Listener

TIMEOUT_S = 3.0    # the group's step timeout
REPLY_S = 60.0     # how long the test waits for a receiver's reply (spawn + import torch)


def _receiver_main(commands, replies) -> None:
    """A receiving rank: joins and receives when told, replies with what happened."""
    member = GroupMember()
    replies.put(("ready",))

    def collect(into: dict):
        def load(stream) -> int:
            for name, t in stream:
                into[name] = (str(t.dtype), t.float().numpy().copy())
            return len(into)
        return load

    while True:
        cmd, args = commands.get()
        try:
            if cmd == "join":
                member.join(GroupSpec.from_dict(args[0]), args[1])
                replies.put(("joined", member.name))
            elif cmd == "receive":
                got: dict = {}
                member.receive_into(args[0], args[1], collect(got))
                replies.put(("received", got))
            elif cmd == "exit":
                return
        except Exception as e:  # reported to the test, which asserts on it
            replies.put(("error", type(e).__name__, str(e), member.name))


class Receiver:
    """A receiver process and its command/reply queues."""

    def __init__(self, ctx):
        self.commands, self.replies = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_receiver_main, args=(self.commands, self.replies),
                                daemon=True)
        self.proc.start()
        assert self.reply() == ("ready",)  # started and imported: timing starts after this

    def tell(self, cmd: str, *args) -> None:
        self.commands.put((cmd, args))

    def reply(self, timeout: float = REPLY_S):
        return self.replies.get(timeout=timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()

    def stop(self) -> None:
        if self.proc.is_alive():
            self.tell("exit")
            self.proc.join(REPLY_S)
        if self.proc.is_alive():
            self.kill()


@pytest.fixture(scope="module")
def ctx():
    """Receivers fork from a server that imported torch once (a spawn would pay it each)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "numpy", "pytest", "common.weight_sync.group"])
    return ctx


@pytest.fixture
def receivers(ctx):
    started: list[Receiver] = []

    def start() -> Receiver:
        r = Receiver(ctx)
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


def _weights(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"module.model.embed_tokens.weight": torch.randn(7, 4, generator=g),
            "module.model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2),  # skipped
            "module.model.norm.weight": torch.randn(4, generator=g).to(torch.bfloat16),
            "module.lm_head.weight": torch.randn(4, 7, generator=g).t(),  # non-contiguous
            "module.model.layers.0.mlp.up_proj.weight": torch.randn(3, 4, generator=g).half(),
            "module.model.big.weight": torch.randn(600_000, generator=g)}  # > socket buffers


def _expected(weights: dict) -> dict:
    meta, order = broadcast_plan(weights)
    return {name: (f"torch.{dtype}", weights[raw].float().numpy())
            for (name, dtype, _), raw in zip(meta, order)}


def _open(epoch: int, members: list[Receiver]) -> BroadcastGroup:
    """Rank 0 of a new epoch with ``members`` as ranks 1..; returns once all joined."""
    listener = Listener("127.0.0.1")
    spec = GroupSpec(backend="gloo", address="127.0.0.1", port=listener.port, epoch=epoch,
                     world_size=1 + len(members), timeout_s=TIMEOUT_S, sender_id="test")
    for rank, r in enumerate(members, start=1):
        r.tell("join", spec.to_dict(), rank)
    group = BroadcastGroup.open(spec, 0, listen_fd=listener.detach())
    for r in members:
        assert r.reply() == ("joined", f"test/epoch{epoch}")
    return group


def _broadcast(group: BroadcastGroup, members: list[Receiver], weights: dict) -> None:
    """A successful broadcast: every member receives ``weights`` exactly."""
    meta, order = broadcast_plan(weights)
    for r in members:
        r.tell("receive", group.spec.name, meta)
    group.send(weights[k] for k in order)
    want = _expected(weights)
    for r in members:
        kind, got = r.reply()
        assert kind == "received" and list(got) == list(want)  # names, in broadcast order
        for name, (dtype, value) in want.items():
            assert got[name][0] == dtype, name          # dtype kept (bf16 travels as bf16)
            assert got[name][1].shape == value.shape, name
            np.testing.assert_array_equal(got[name][1], value, err_msg=name)


def test_broadcast_survives_a_dead_receiver_and_its_restart(receivers):
    """(a) The whole story: epoch 1 with A and B; B dies -> the next broadcast fails fast
    with a clear error, and A's receive fails too instead of hanging; epoch 2 with A alone
    works; B starts again, and epoch 3 with A and B delivers the next weights exactly."""
    a, b = receivers(), receivers()
    group = _open(1, [a, b])
    _broadcast(group, [a, b], _weights(1))

    b.kill()
    meta, order = broadcast_plan(_weights(2))
    a.tell("receive", "test/epoch1", meta)
    t0 = time.monotonic()
    with pytest.raises(BroadcastError, match=r"group test/epoch1 \(gloo, rank 0 of 3\).* "
                                             "failed after"):
        group.send(_weights(2)[k] for k in order)
    assert time.monotonic() - t0 < 2 * TIMEOUT_S
    assert group.closed
    kind, name, msg, epoch = a.reply()  # rank 0's close ended A's receive too
    assert (kind, name, epoch) == ("error", "BroadcastError", None) and "test/epoch1" in msg

    group = _open(2, [a])
    _broadcast(group, [a], _weights(3))

    b = receivers()  # B "restarted": a new process, no group
    b.tell("receive", "test/epoch2", meta)
    assert b.reply()[:2] == ("error", "NotInGroupError")  # never receives an unjoined epoch
    group.close()
    group = _open(3, [a, b])
    _broadcast(group, [a, b], _weights(4))
    group.close()


def test_a_receiver_that_stops_listening_fails_the_broadcast_after_the_timeout(receivers):
    """A hung receiver (alive, joined, not receiving): the broadcast may complete into
    socket buffers, the acknowledgement cannot; rank 0 fails within the step timeout."""
    a, b = receivers(), receivers()
    group = _open(1, [a, b])
    weights = _weights(5)
    meta, order = broadcast_plan(weights)
    a.tell("receive", "test/epoch1", meta)  # B is told nothing: it hangs
    t0 = time.monotonic()
    with pytest.raises(BroadcastError, match=r"timeout 3\.0s"):
        group.send(weights[k] for k in order)
    elapsed = time.monotonic() - t0
    assert elapsed > TIMEOUT_S * 0.9  # it waited out the timeout (no upper bound: load)
    kind, name, _, _ = a.reply()
    assert (kind, name) == ("error", "BroadcastError")
    group = _open(2, [a, b])  # B's next join leaves the broken epoch; both work again
    _broadcast(group, [a, b], _weights(6))
    group.close()


def test_join_fails_clearly_when_a_rank_never_comes(receivers):
    a = receivers()
    listener = Listener("127.0.0.1")
    spec = GroupSpec(backend="gloo", address="127.0.0.1", port=listener.port, epoch=7,
                     world_size=3, timeout_s=TIMEOUT_S, sender_id="test")
    a.tell("join", spec.to_dict(), 1)  # rank 2 never joins
    with pytest.raises(BroadcastError, match=r"group test/epoch7: ranks \[2\] of 3 did not "
                                             "join"):
        BroadcastGroup.open(spec, 0, listen_fd=listener.detach())
    kind, name, _, epoch = a.reply()
    assert (kind, name, epoch) == ("error", "BroadcastError", None)


def test_member_refuses_epochs_it_did_not_join():
    member = GroupMember()
    assert member.name is None
    with pytest.raises(NotInGroupError, match="not a member of weight-sync group s/epoch4 "
                                              r"\(joined: none\)"):
        member.receive_into("s/epoch4", [("w", "float32", (2,))], lambda it: 0)
    with pytest.raises(ValueError, match="ranks >= 1"):
        member.join(GroupSpec("gloo", "127.0.0.1", 1, 1, 2, 1.0), 0)


def test_open_rejects_unknown_backend_and_bad_rank():
    with pytest.raises(ValueError, match="unknown communicator 'mpi'"):
        BroadcastGroup.open(GroupSpec("mpi", "127.0.0.1", 1, 1, 2, 1.0), 1)
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        BroadcastGroup.open(GroupSpec("gloo", "127.0.0.1", 1, 1, 2, 1.0), 2)


def test_a_closed_communicator_refuses_every_operation():
    """A one-rank gloo communicator works until closed, then each operation says so (and
    closing twice is harmless)."""
    comm = GlooCommunicator(torch.distributed.HashStore(), 0, 1, TIMEOUT_S)
    t = torch.ones(2)
    comm.all_reduce_sum(t, TIMEOUT_S)
    assert t.tolist() == [1.0, 1.0]
    comm.close()
    comm.close()
    for op in (comm.broadcast, comm.all_reduce_sum):
        with pytest.raises(RuntimeError, match="^gloo communicator is closed$"):
            op(t, TIMEOUT_S)


def test_receivers_exit_cleanly(receivers):
    r = receivers()
    r.stop()
    assert r.proc.exitcode == 0
    with pytest.raises(queue.Empty):
        r.replies.get_nowait()
