"""Pure parts of the weight-sync transports (names, dtypes, shapes, payload handling on the
receiving side, the factory), the generators' CPU placement and the generator's request
checks. No Ray cluster, no engine: engines and workers are small fakes."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.engine_config import GeneratorConfig, resolve_dtype, resolve_engine_core
from actors.generator import validate_request
from common.threads import bound_cores, cpu_engine_env, omp_binding, parse_cpu_list
from common.types import RolloutRequest, SamplingConfig
from common.weight_sync import (CollectivePayload, CollectiveReceiver, CollectiveSender,
                                GroupSpec, NotInGroupError, ObjectStorePayload,
                                ObjectStoreReceiver, ObjectStoreSender, WeightSyncConfig,
                                broadcast_plan, iter_safetensors, make_receiver, make_sender,
                                normalise_name, to_numpy_state_dict, write_safetensors)
from common.weight_sync.worker_ext import WeightSyncWorkerExtension

# ---------------------------------------------------------------- names and state dicts


@pytest.mark.parametrize("raw, want", [
    ("model.norm.weight", "model.norm.weight"),
    ("module.model.norm.weight", "model.norm.weight"),
    ("module._orig_mod.lm_head.weight", "lm_head.weight"),
    ("_fsdp_wrapped_module.model.embed_tokens.weight", "model.embed_tokens.weight"),
])
def test_normalise_name_strips_wrappers(raw, want):
    assert normalise_name(raw) == want


def test_normalise_name_rejects_empty():
    with pytest.raises(ValueError, match="empty"):
        normalise_name("module.")


def test_state_dict_to_numpy_names_dtypes_and_skips():
    sd = {
        "module.model.norm.weight": torch.ones(4, dtype=torch.bfloat16),
        "module.lm_head.weight": torch.arange(6.0).reshape(2, 3).t(),  # non-contiguous
        "module.model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2),
        "model.embed_tokens.weight": np.full((2, 2), 3.0, dtype=np.float32),
    }
    out = to_numpy_state_dict(sd)
    assert sorted(out) == ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]
    assert out["model.norm.weight"].dtype == np.float32  # bf16 widened
    assert out["lm_head.weight"].flags.c_contiguous
    np.testing.assert_array_equal(out["lm_head.weight"], np.arange(6.0).reshape(2, 3).T)


@pytest.mark.parametrize("sd, match", [
    ({}, "empty state dict"),
    ({"module.a": np.zeros(1), "a": np.zeros(1)}, "two parameters map"),
    ({"a": [1.0, 2.0]}, "numpy array or torch tensor"),
    ({"a": np.array(["x"])}, "non-numeric"),
])
def test_state_dict_errors(sd, match):
    with pytest.raises(ValueError, match=match):
        to_numpy_state_dict(sd)


def test_safetensors_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    sd = {"model.norm.weight": rng.standard_normal(8).astype(np.float32),
          "lm_head.weight": rng.standard_normal((5, 8)).astype(np.float32),
          "model.layers.0.mlp.up_proj.weight": rng.standard_normal((3, 8)).astype(np.float16)}
    path = write_safetensors(sd, tmp_path / "w")
    assert path.is_file()
    back = dict(iter_safetensors(path.parent))
    assert sorted(back) == sorted(sd)
    for k, v in sd.items():
        assert isinstance(back[k], torch.Tensor) and str(back[k].dtype) == f"torch.{v.dtype}"
        np.testing.assert_array_equal(back[k].numpy(), v)


def test_iter_safetensors_empty_dir(tmp_path):
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        list(iter_safetensors(tmp_path))


# ---------------------------------------------------------------- factory and payloads


def test_package_import_is_light():
    """``import common.weight_sync`` (config parsing, the launcher) loads no ML stack."""
    code = ("import sys, common.weight_sync; "
            "print(sorted(m for m in ('torch', 'ray', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


def test_factory_builds_known_transports():
    assert isinstance(make_sender("object_store"), ObjectStoreSender)
    assert isinstance(make_sender({"type": "nccl", "master_port": 29555}), CollectiveSender)
    gloo = make_sender({"type": "gloo", "timeout_s": 5, "restart_fallback": True})
    assert isinstance(gloo, CollectiveSender) and gloo.backend == "gloo"
    assert gloo.cfg.timeout_s == 5 and gloo.cfg.restart_fallback
    assert isinstance(make_sender(WeightSyncConfig()), ObjectStoreSender)
    assert isinstance(make_receiver("object_store"), ObjectStoreReceiver)
    assert isinstance(make_receiver("nccl"), CollectiveReceiver)
    assert make_receiver("gloo") is not make_receiver("gloo")  # one per generator: stateful


def test_factory_rejects_unknown_type():
    with pytest.raises(ValueError, match="unknown weight-sync type 'carrier_pigeon'"):
        make_sender("carrier_pigeon")
    with pytest.raises(ValueError, match="known: \\['gloo', 'nccl', 'object_store'\\]"):
        make_receiver("carrier_pigeon")
    with pytest.raises(ValueError, match="extra"):
        WeightSyncConfig(type="nccl", port=1)
    with pytest.raises(ValueError):
        WeightSyncConfig(type="gloo", timeout_s=0)


def test_receiver_rejects_other_transports_payload():
    payload = CollectivePayload(version=1, backend="nccl", epoch=1, meta=())
    with pytest.raises(ValueError, match="object_store receiver got a CollectivePayload"):
        asyncio.run(ObjectStoreReceiver().load(None, payload))
    with pytest.raises(ValueError, match="collective receiver got a ObjectStorePayload"):
        asyncio.run(CollectiveReceiver().load(None, ObjectStorePayload(1, None, 0)))
    assert ObjectStorePayload.transport == "object_store" and payload.transport == "nccl"


def test_broadcast_plan_names_dtypes_shapes_and_order():
    sd = {"module.lm_head.weight": torch.zeros(3, 4, dtype=torch.bfloat16),
          "module.model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2),
          "module.model.norm.weight": np.zeros(4, dtype=np.float32)}
    meta, order = broadcast_plan(sd)
    assert meta == (("lm_head.weight", "bfloat16", (3, 4)),
                    ("model.norm.weight", "float32", (4,)))
    assert order == ["module.lm_head.weight", "module.model.norm.weight"]
    assert all(hasattr(torch, dtype) for _, dtype, _ in meta)  # receiver allocates
    with pytest.raises(ValueError, match="two parameters map"):
        broadcast_plan({"module.a": torch.zeros(1), "a": torch.zeros(1)})


def test_group_spec_crosses_collective_rpc_as_plain_values():
    spec = GroupSpec("gloo", "127.0.0.1", 29500, epoch=3, world_size=3, timeout_s=5.0,
                     sender_id="ab12")
    d = spec.to_dict()
    assert all(isinstance(v, (str, int, float)) for v in d.values())
    assert GroupSpec.from_dict(d) == spec and spec.name == "ab12/epoch3"
    payload = CollectivePayload(version=1, backend="gloo", epoch=3, meta=(), sender_id="ab12")
    assert payload.group == spec.name
    other = CollectivePayload(version=1, backend="gloo", epoch=3, meta=(), sender_id="cd34")
    assert other.group != spec.name  # a reconnected learner's epoch 3 is another group


def test_each_sender_names_its_own_groups():
    a, b = make_sender("gloo"), make_sender("gloo")
    assert a.sender_id != b.sender_id


def test_a_send_to_no_generator_builds_nothing():
    sender = make_sender("gloo")
    sd = {"w": np.zeros(2, dtype=np.float32)}
    payload, refs = sender.send([], sd, 2)  # no generator: nothing to build, nothing sent
    assert refs == [] and payload.epoch == 0 and payload.meta == (("w", "float32", (2,)),)


def test_the_policy_version_only_goes_forward_at_its_owner():
    """``Roles.published`` owns the version: ``advance`` refuses a version that is not newer
    (before any weights are sent), ``adopt`` never moves it back."""
    from cluster.nodes.roles import Roles

    roles = Roles(generators=[], learner=None)
    with pytest.raises(ValueError, match="version 0 is not newer"):
        roles.advance(0)  # 0 is the checkpoint the generators started from
    assert roles.advance(2) == 2 and roles.published == 2
    with pytest.raises(ValueError, match="2 is not newer than the last published version 2"):
        roles.advance(2)
    roles.adopt(1)
    assert roles.published == 2
    roles.adopt(5)
    assert roles.published == 5


class FakeEngine:
    """Records ``collective_rpc`` calls; answers as one worker would."""

    def __init__(self, answer=3):
        self.calls, self.answer, self.files = [], answer, {}

    async def collective_rpc(self, method, args=()):
        self.calls.append((method, args))
        if method == "v05_load_dir":  # the directory is removed after the call: read it now
            self.files = dict(iter_safetensors(args[0]))
        return [None if method == "v05_join_group" else self.answer]


class FakeRef:
    """An awaitable standing in for the ObjectRef of an object-store payload."""

    def __init__(self, value):
        self.value = value

    def __await__(self):
        yield from asyncio.sleep(0).__await__()
        return self.value


def test_collective_receiver_joins_then_receives_its_epoch():
    rx, eng = CollectiveReceiver(), FakeEngine()
    spec = GroupSpec("gloo", "10.0.0.1", 29500, epoch=2, world_size=3, timeout_s=5.0,
                     sender_id="s1")
    asyncio.run(rx.join(eng, spec, 2))
    assert rx.group == "s1/epoch2" and eng.calls == [("v05_join_group", (spec.to_dict(), 2))]
    meta = (("lm_head.weight", "bfloat16", (3, 4)), ("model.norm.weight", "float32", (4,)))
    payload = CollectivePayload(version=5, backend="gloo", epoch=2, meta=meta, sender_id="s1")
    assert asyncio.run(rx.load(eng, payload)) == 3
    assert eng.calls[-1] == ("v05_receive", ("s1/epoch2",
                                             [["lm_head.weight", "bfloat16", (3, 4)],
                                              ["model.norm.weight", "float32", (4,)]]))


def test_collective_receiver_outside_the_epoch_fails_fast_or_uses_the_fallback():
    """A restarted generator (no epoch) given the published payload by the coordinator:
    NotInGroupError before any worker call; with ``restart_fallback``, the object store."""
    rx, eng = CollectiveReceiver(), FakeEngine()
    meta = (("model.norm.weight", "float32", (4,)),)
    payload = CollectivePayload(version=5, backend="gloo", epoch=2, meta=meta)
    with pytest.raises(NotInGroupError, match="group sender/epoch2, this generator joined: none"):
        rx.check(payload)  # what update_weights asks before it pauses the engine
    with pytest.raises(NotInGroupError):
        asyncio.run(rx.load(eng, payload))
    assert eng.calls == []
    sd = {"model.norm.weight": np.arange(4, dtype=np.float32)}
    fallback = ObjectStorePayload(version=5, ref=FakeRef(sd), num_tensors=1)
    with_fb = CollectivePayload(version=5, backend="gloo", epoch=2, meta=meta,
                                fallback=fallback)
    rx.check(with_fb)
    assert asyncio.run(rx.load(eng, with_fb)) == 3
    assert [c[0] for c in eng.calls] == ["v05_load_dir"]
    np.testing.assert_array_equal(eng.files["model.norm.weight"].numpy(), sd["model.norm.weight"])


def test_collective_receiver_forgets_its_epoch_when_a_receive_fails():
    class Failing(FakeEngine):
        async def collective_rpc(self, method, args=()):
            if method == "v05_receive":
                raise RuntimeError("connection closed by peer")
            return await super().collective_rpc(method, args)

    rx, eng = CollectiveReceiver(), Failing()
    asyncio.run(rx.join(eng, GroupSpec("gloo", "h", 1, 4, 2, 1.0), 1))
    payload = CollectivePayload(version=1, backend="gloo", epoch=4, meta=())
    with pytest.raises(RuntimeError, match="connection closed"):
        asyncio.run(rx.load(eng, payload))
    assert rx.group is None  # the worker left the group; the next load fails fast


class FakeWorker(WeightSyncWorkerExtension):
    """vLLM's worker as the extension sees it: ``reload_weights`` consumes the iterator."""

    def __init__(self):
        self.loaded = {}

    def reload_weights(self, weights_iterator):
        self.loaded.update(weights_iterator)


def test_worker_extension_loads_a_directory_and_refuses_unjoined_epochs(tmp_path):
    sd = {"model.norm.weight": np.ones(4, dtype=np.float32),
          "lm_head.weight": np.zeros((2, 4), dtype=np.float16)}
    write_safetensors(sd, tmp_path)
    w = FakeWorker()
    assert w.v05_load_dir(str(tmp_path)) == 2
    assert sorted(w.loaded) == sorted(sd) and w.loaded["lm_head.weight"].dtype == torch.float16
    assert w.v05_group() is None
    with pytest.raises(NotInGroupError, match="group s/epoch1"):
        w.v05_receive("s/epoch1", [["model.norm.weight", "float32", [4]]])


# ---------------------------------------------------------------- CPU placement


def test_parse_cpu_list():
    assert parse_cpu_list("0,2-4") == [0, 2, 3, 4]
    for bad in ("", "1,,2", "a", "3-1", "1,1"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_two_generators_get_different_cores():
    assert [omp_binding(i, 1, [0, 1]) for i in range(3)] == ["0", "1", "0"]
    assert omp_binding(1, 2, [0, 1, 2, 3]) == "2,3"
    assert omp_binding(0, 8, [0, 1]) == "0,1"  # clamped to what exists
    with pytest.raises(ValueError, match="cpu_threads"):
        omp_binding(0, 0, [0, 1])


def test_cpu_engine_env_in_process_and_worker_process():
    env = cpu_engine_env(1, 1, None, [0, 1])
    assert env["OMP_PLACES"] == "{1}" and env["OMP_NUM_THREADS"] == "1"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"  # vLLM must not rebind
    env = cpu_engine_env(0, 2, "0-1", [0, 1], worker_process=True)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and "OMP_PLACES" not in env
    assert env["OMP_NUM_THREADS"] == "2"


def test_cpu_engine_env_caps_onednns_primitive_cache_unless_the_user_set_it():
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in cpu_engine_env(0, 1, None, [0, 1])
    env = cpu_engine_env(0, 1, None, [0, 1], onednn_cache=64)
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"
    env = cpu_engine_env(0, 1, None, [0, 1], onednn_cache=64,
                         environ={"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"})
    assert env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"
    with pytest.raises(ValueError, match="onednn_cache"):
        cpu_engine_env(0, 1, None, [0, 1], onednn_cache=-1)
    assert GeneratorConfig().cpu_onednn_cache == 64


def test_bound_cores_reads_the_in_process_binding_back():
    assert bound_cores(cpu_engine_env(1, 1, None, [0, 1])) == [1]
    assert bound_cores(cpu_engine_env(0, 2, "2-3", [0, 1, 2, 3])) == [2, 3]
    assert bound_cores(cpu_engine_env(0, 1, "nobind", [0, 1])) == []
    assert bound_cores(cpu_engine_env(0, 2, "0-1", [0, 1], worker_process=True)) == []
    assert bound_cores({}) == []


def test_engine_core_in_process_on_cpu_own_process_on_gpus():
    assert GeneratorConfig().engine_core == "auto"
    assert resolve_engine_core("auto", on_cpu=True, cpu_worker_process=False) == "in_process"
    assert resolve_engine_core("auto", on_cpu=True, cpu_worker_process=True) == "own_process"
    assert resolve_engine_core("auto", on_cpu=False, cpu_worker_process=False) == "own_process"
    assert resolve_engine_core("own_process", True, False) == "own_process"
    assert resolve_engine_core("in_process", False, False) == "in_process"
    with pytest.raises(ValueError, match="cpu_worker_process"):
        resolve_engine_core("in_process", on_cpu=True, cpu_worker_process=True)
    with pytest.raises(Exception, match="engine_core"):
        GeneratorConfig(engine_core="thread")


def test_cpu_engine_env_errors():
    with pytest.raises(ValueError, match="names cores \\[5\\]"):
        cpu_engine_env(0, 1, "5", [0, 1])
    with pytest.raises(ValueError, match="needs the worker process"):
        cpu_engine_env(0, 1, "auto", [0, 1])


# ---------------------------------------------------------------- generator config/requests


def test_generator_config_and_dtype(monkeypatch):
    # auto on a CPU follows the probe's answer (common.cpu_dtype), forced either way here
    for forced, engine in (("fp32", "float32"), ("bf16", "bfloat16")):
        monkeypatch.setenv("V05_CPU_DTYPE", forced)
        assert resolve_dtype("auto", on_cpu=True, model_path="m") == engine
    assert resolve_dtype("auto", on_cpu=False, model_path="m") == "bfloat16"
    assert resolve_dtype("float16", on_cpu=True, model_path="m") == "float16"
    with pytest.raises(ValueError):
        GeneratorConfig(max_num_seq=4)  # typo: extra fields are refused
    with pytest.raises(ValueError):
        GeneratorConfig(gpu_memory_utilization=1.5)


def test_generator_config_import_is_light():
    """The engine settings (``actors.engine_config``, which cluster/config/schema.py validates) and
    the engine start-up module load no vLLM, Ray or torch until an engine starts."""
    code = ("import sys, actors.engine_config, actors.engine; "
            "print(sorted(m for m in ('torch', 'ray', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("n, sampling, match", [
    (0, SamplingConfig(), "n must be >= 1"),
    (1, SamplingConfig(max_tokens=0), "max_tokens must be >= 1"),
    (1, SamplingConfig(max_tokens=256), "no room for the prompt"),
    (1, SamplingConfig(top_p=0.0), "bad sampling"),
])
def test_validate_request(n, sampling, match):
    req = RolloutRequest(request_id="r", prompt_id="p", prompt="1+1=", n=n, sampling=sampling)
    with pytest.raises(ValueError, match=match):
        validate_request(req, max_model_len=256)
