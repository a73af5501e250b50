"""Pure parts of the weight-sync transports, the generators' CPU placement and the
generator's request checks. No Ray cluster, no engine."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from actors.generator import GeneratorConfig, resolve_dtype, validate_request
from actors.threads import cpu_engine_env, omp_binding, parse_cpu_list
from actors.types import RolloutRequest, SamplingConfig
from actors.weight_sync import (NcclPayload, NcclSender, ObjectStorePayload, ObjectStoreReceiver,
                                ObjectStoreSender, WeightSyncConfig, iter_safetensors,
                                make_receiver, make_sender, normalise_name,
                                to_numpy_state_dict, write_safetensors)

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


def test_factory_builds_known_transports():
    assert isinstance(make_sender("object_store"), ObjectStoreSender)
    assert isinstance(make_sender({"type": "nccl", "master_port": 29555}), NcclSender)
    assert isinstance(make_sender(WeightSyncConfig()), ObjectStoreSender)
    assert isinstance(make_receiver("object_store"), ObjectStoreReceiver)


def test_factory_rejects_unknown_type():
    with pytest.raises(ValueError, match="unknown weight-sync type 'carrier_pigeon'"):
        make_sender("carrier_pigeon")
    with pytest.raises(ValueError, match="known: \\['nccl', 'object_store'\\]"):
        make_receiver("carrier_pigeon")
    with pytest.raises(ValueError, match="extra"):
        WeightSyncConfig(type="nccl", port=1)


def test_receiver_rejects_other_transports_payload():
    payload = NcclPayload(version=1, meta=())
    with pytest.raises(ValueError, match="object_store receiver got a NcclPayload"):
        asyncio.run(ObjectStoreReceiver().load(None, payload))
    assert ObjectStorePayload.transport == "object_store" and payload.transport == "nccl"


def test_nccl_publish_announces_broadcast_order():
    sd = {"module.lm_head.weight": torch.zeros(3, 4, dtype=torch.bfloat16),
          "module.model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2),
          "module.model.norm.weight": np.zeros(4, dtype=np.float32)}
    payload = make_sender("nccl").publish(sd, version=3)
    assert payload.version == 3
    assert payload.meta == (("lm_head.weight", "bfloat16", (3, 4)),
                            ("model.norm.weight", "float32", (4,)))
    assert all(hasattr(torch, dtype) for _, dtype, _ in payload.meta)  # receiver allocates


def test_sender_versions_must_increase():
    sender = make_sender("nccl")
    sd = {"w": np.zeros(2, dtype=np.float32)}
    with pytest.raises(ValueError, match="version 0 is not newer"):
        sender.publish(sd, 0)  # 0 is the checkpoint the generators started from
    sender.publish(sd, 2)
    with pytest.raises(ValueError, match="2 is not newer than the last published version 2"):
        sender.publish(sd, 2)


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


def test_cpu_engine_env_errors():
    with pytest.raises(ValueError, match="names cores \\[5\\]"):
        cpu_engine_env(0, 1, "5", [0, 1])
    with pytest.raises(ValueError, match="needs the worker process"):
        cpu_engine_env(0, 1, "auto", [0, 1])


# ---------------------------------------------------------------- generator config/requests


def test_generator_config_and_dtype():
    assert resolve_dtype("auto", on_cpu=True) == "float32"
    assert resolve_dtype("auto", on_cpu=False) == "bfloat16"
    assert resolve_dtype("float16", on_cpu=True) == "float16"
    with pytest.raises(ValueError):
        GeneratorConfig(max_num_seq=4)  # typo: extra fields are refused
    with pytest.raises(ValueError):
        GeneratorConfig(gpu_memory_utilization=1.5)


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
