"""The broadcast transport's rebuild protocol on a real local Ray cluster, over gloo.

The generators are the real ``Generator`` class (its ``update_weights`` and
``init_weight_sync``) over a fake engine whose one worker is the real vLLM worker extension
(gloo receive in a thread, as vLLM's engine process would run it); only the model is fake:
``reload_weights`` records what it is given. The sender is the real ``CollectiveSender`` in
the driver, as on learner rank 0. Ray restarts killed actors (``max_restarts``).

The story, one version per step: a generator restarted between two publishes is refused
the old epoch (the coordinator's re-sync) and rejoins at the next publish; a generator that
dies mid-broadcast fails that broadcast, and the survivor, whose in-place reload had begun
(vLLM sets every layer aside before the tensors arrive), is half-loaded and exits too: Ray
restarts both, no retry loads into a half-loaded model, and the next publish reconnects
both; a hung receiver fails the broadcast after the timeout, not never, the receiver beside
it exits half-loaded, and the hung one is left out until its stuck call ends (in a reload
that fails, so it exits too);
``restart_fallback`` lets a restarted generator load at once. (Until 2026-12-06 the survivor
kept its half-loaded model and took the version in a rebuilt epoch of the same publish.)
Synchronisation: Ray calls, the group's timeouts and ``wait_ready``; no sleeps.

Marked ``standin``, not ``integration`` (where nothing is faked): the engine is a stand-in,
because a real one cannot be told to die or hang mid-receive. The real vLLM engine's side of the
same transport (receive, reload, restart, reconnect) is tests/integration/test_weight_sync_vllm.py.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import numpy as np
import pytest

from actors.generator import Generator
from common.records import GeneratorCounts
from common.weight_sync.worker_ext import WeightSyncWorkerExtension

pytestmark = pytest.mark.standin

TIMEOUT_S = 5.0  # the group's step timeout and the probe timeout
CFG = {"type": "gloo", "master_address": "127.0.0.1", "timeout_s": TIMEOUT_S,
       "probe_timeout_s": TIMEOUT_S}


class RecordingWorker(WeightSyncWorkerExtension):
    """vLLM's worker as the extension sees it, plus fault switches for the tests."""

    def __init__(self):
        self.loaded: dict = {}
        self.fault: str | None = None
        self.release = threading.Event()

    def _v05_local_rank(self) -> int:
        return 0

    def reload_weights(self, weights_iterator) -> None:
        self.loaded = {name: t.clone() for name, t in weights_iterator}

    def v05_receive(self, epoch: int, meta: list) -> int:
        fault, self.fault = self.fault, None
        if fault == "die":
            os._exit(1)  # the process dies mid-broadcast; Ray restarts the actor
        if fault == "hang":
            self.release.wait()  # stops taking part until released
        return super().v05_receive(epoch, meta)


class FakeEngine:
    """The parts of vLLM's ``AsyncLLM`` that ``update_weights``/``init_weight_sync`` use."""

    def __init__(self):
        self.worker = RecordingWorker()
        self.pauses = 0

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.pauses += 1

    async def resume_generation(self) -> None:
        pass

    async def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        return True

    async def collective_rpc(self, method: str, args: tuple = ()) -> list:
        # vLLM runs it in the engine process; a thread keeps this actor's loop answering.
        return [await asyncio.to_thread(getattr(self.worker, method), *args)]


class EngineFreeGenerator(Generator):
    """``Generator`` without vLLM: its weight-sync methods are the real ones."""

    def __init__(self, index: int):
        import torch  # noqa: F401 - loaded in a real generator long before any join

        self.index = index
        self._engine = FakeEngine()
        self._version = 0
        self._update_lock = asyncio.Lock()
        self._receivers = {}
        self._counts = GeneratorCounts()
        self._incarnation = f"g{index}-{os.getpid()}-{time.time_ns()}"

    async def ready(self) -> bool:
        return True

    def loaded(self) -> dict:
        return {n: (str(t.dtype), t.float().numpy()) for n, t in self._engine.worker.loaded.items()}

    def pauses(self) -> int:
        return self._engine.pauses

    def fail_next_receive(self, how: str) -> None:
        self._engine.worker.fault = how

    def release(self) -> None:
        self._engine.worker.release.set()


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fakes above
    yield
    ray.shutdown()


@pytest.fixture
def gens(ray_local):
    import ray

    actors = [ray.remote(num_cpus=0, max_restarts=3, max_concurrency=16)(EngineFreeGenerator)
              .remote(i) for i in range(2)]
    ray.get([g.ready.remote() for g in actors])
    yield actors
    for g in actors:
        ray.kill(g)


def _weights(seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {"module.model.embed_tokens.weight": torch.randn(11, 8, generator=g),
            "module.model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
            "module.lm_head.weight": torch.randn(8, 11, generator=g).t(),
            "module.model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}


def _assert_has(gen, weights: dict, object_store: bool = False) -> None:
    """``gen``'s worker loaded exactly ``weights`` (names, dtypes, shapes, values); through
    the object store bf16 arrives widened to fp32."""
    import ray

    from common.weight_sync import broadcast_plan

    meta, order = broadcast_plan(weights)
    got = ray.get(gen.loaded.remote())
    names = [m[0] for m in meta]  # a broadcast loads in its order, safetensors sorted
    assert list(got) == (sorted(names) if object_store else names)
    for (name, dtype, shape), raw in zip(meta, order):
        want = "float32" if object_store and dtype == "bfloat16" else dtype
        assert got[name][0] == f"torch.{want}" and got[name][1].shape == shape
        np.testing.assert_array_equal(got[name][1], weights[raw].float().numpy(), err_msg=name)


def _kill_and_wait_restart(gen) -> None:
    """Kill ``gen``'s process and return once Ray's restart of it answers (a new
    incarnation; ``ray.kill`` returns before the old one is gone)."""
    import ray

    before = ray.get(gen.incarnation.remote())
    ray.kill(gen, no_restart=False)
    _wait_restart(gen, before)


def _wait_restart(gen, before: str) -> None:
    import ray

    from bench.harness import wait_ready

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if ray.get(gen.incarnation.remote(), timeout=60) != before:
                return
        except ray.exceptions.RayActorError:  # being restarted: answers once it is up
            wait_ready([gen], timeout_s=120)
    raise TimeoutError("the generator was not restarted")


def test_group_rebuilds_around_restarted_dead_and_hung_generators(gens):
    import ray

    from common.weight_sync import make_sender

    sender = make_sender(CFG)
    sender.connect(gens)
    assert sender.epoch == 1
    p1, refs = sender.send(gens, _weights(1), 1)
    assert p1.epoch == 1 and all(s > 0 for s in ray.get(refs))
    for g in gens:
        _assert_has(g, _weights(1))

    # Restart between publishes: the old epoch is refused (the coordinator's re-sync),
    # the next publish rebuilds with it.
    _kill_and_wait_restart(gens[1])
    with pytest.raises(ray.exceptions.RayTaskError, match="NotInGroupError.*joined: none"):
        ray.get(gens[1].update_weights.remote(p1, 1))
    assert ray.get(gens[1].pauses.remote()) == 0  # refused before pausing the engine
    p2, refs = sender.send(gens, _weights(2), 2)
    ray.get(refs)
    assert (p2.epoch, sender.reports[-1].rebuilds, sender.reports[-1].failed) == (2, 1, [])
    for g in gens:
        _assert_has(g, _weights(2))

    # Dies mid-broadcast: the broadcast fails; the survivor had begun its reload, so it is
    # half-loaded and exits too; both updates fail, neither is retried into a broken model.
    before = [ray.get(g.incarnation.remote()) for g in gens]
    ray.get(gens[1].fail_next_receive.remote("die"))
    t0 = time.monotonic()
    p3, refs = sender.send(gens, _weights(3), 3)
    assert time.monotonic() - t0 < 4 * TIMEOUT_S
    report = sender.reports[-1]
    assert (report.updated, sorted(report.failed)) == ([], [0, 1]), report
    assert f"group {sender.sender_id}/epoch2 (gloo, rank 0 of 3)" in report.errors[0]
    for ref in refs:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(ref)

    # Back again, both from their starting state: reconnected by the next publish.
    for g, b in zip(gens, before):
        _wait_restart(g, b)
    with pytest.raises(ray.exceptions.RayTaskError, match="NotInGroupError"):
        ray.get(gens[1].update_weights.remote(p3, 3))
    p4, refs = sender.send(gens, _weights(4), 4)
    ray.get(refs)
    assert p4.epoch > p3.epoch, sender.reports[-1]
    for g in gens:
        _assert_has(g, _weights(4))

    # Hung (alive, not receiving): the broadcast fails after the timeout; the receiver
    # beside it had begun its reload and exits half-loaded; the hung one is left out while
    # its call is stuck, its model untouched.
    before1 = ray.get(gens[1].incarnation.remote())
    ray.get(gens[0].fail_next_receive.remote("hang"))
    t0 = time.monotonic()
    p5, refs = sender.send(gens, _weights(5), 5)
    elapsed = time.monotonic() - t0
    report = sender.reports[-1]
    assert elapsed > TIMEOUT_S * 0.9  # it waited out the timeout (no upper bound: load)
    assert report.updated == [] and 0 in report.failed, report
    assert any("(timeout 5.0s)" in e for e in report.errors), report.errors
    assert ray.wait([refs[0]], timeout=0)[0] == []  # pending: the caller's timeout counts it
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(refs[1])
    _wait_restart(gens[1], before1)

    # Released, its stuck update goes on into its reload and fails there (its epoch is
    # gone): half-loaded in turn, it exits and is restarted; the next publish takes both in.
    before0 = ray.get(gens[0].incarnation.remote())
    ray.get(gens[0].release.remote())
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(refs[0])
    _wait_restart(gens[0], before0)
    p6, refs = sender.send(gens, _weights(6), 6)
    ray.get(refs)
    assert p6.epoch > p5.epoch and ray.get([g.version.remote() for g in gens]) == [6, 6]
    for g in gens:
        _assert_has(g, _weights(6))
    sender.close()


def test_restart_fallback_loads_a_restarted_generator_at_once(gens):
    import ray

    from common.weight_sync import make_sender

    sender = make_sender({**CFG, "restart_fallback": True})
    sender.connect(gens)
    payload, refs = sender.send(gens, _weights(7), 1)
    ray.get(refs)
    assert payload.fallback is not None and payload.fallback.num_tensors == 3
    _kill_and_wait_restart(gens[0])
    assert ray.get(gens[0].update_weights.remote(payload, 1)) > 0  # the coordinator's re-sync
    _assert_has(gens[0], _weights(7), object_store=True)
    sender.close()
