"""CUDA-only: vLLM generation on a GPU and the NCCL weight sync into a generator.

Skipped without CUDA. The NCCL tests need two GPUs: NCCL refuses two ranks of one
communicator on the same device, and the learner's rank 0 and the generator's worker are
two ranks. Float32 on both sides so greedy decoding can be compared token for token.
The same protocol over gloo runs on the CPU in tests/integration/test_weight_sync_vllm.py;
these tests add the NCCL communicator (PyNccl, polled CUDA events, abort on close).
"""
from __future__ import annotations

import numpy as np
import pytest

from common.types import RolloutRequest, SamplingConfig

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2)
PROMPTS = ["12+34=", "7*8=", "Q: 99-1?"]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _hf_model(seed: int, device: str = "cpu"):
    import torch
    from transformers import LlamaForCausalLM

    from tasks.policy_model import build_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(build_config(**ARCH)).eval().to(device)


def _hf_greedy(model, prompt_ids: list[int], n_new: int) -> list[int]:
    import torch

    from tasks.policy_model import EOS, vocab

    with torch.no_grad():
        ids = torch.tensor([prompt_ids], device=model.device)
        out = model.generate(ids, do_sample=False, max_new_tokens=n_new,
                             eos_token_id=vocab()[EOS], pad_token_id=vocab()[EOS])
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="module")
def ray_gpu():
    n = _gpus()
    if n == 0:
        pytest.skip("needs CUDA")
    import ray

    ray.init(address="local", num_cpus=4, num_gpus=n, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    yield n
    ray.shutdown()


@pytest.fixture(scope="module")
def gen(ray_gpu, tmp_path_factory):
    import ray

    from actors.engine_config import GeneratorConfig
    from actors.generator import Generator
    from tasks.policy_model import build_tokenizer, save_policy

    path = tmp_path_factory.mktemp("gpu_policy")
    save_policy(_hf_model(0), build_tokenizer(), path)
    cfg = GeneratorConfig(dtype="float32", gpu_memory_utilization=0.15, max_num_seqs=16)
    actor = ray.remote(num_cpus=1, num_gpus=1, max_concurrency=64, max_restarts=1)(
        Generator).remote(str(path), 0, cfg, 1, None)
    assert ray.get(actor.ready.remote())
    yield actor
    ray.get(actor.shutdown.remote())
    ray.kill(actor)


def _greedy(gen, tag: str):
    import ray

    reqs = [RolloutRequest(f"{tag}{i}", f"p{i}", p, 1, SamplingConfig(temperature=0.0,
                                                                         max_tokens=16))
            for i, p in enumerate(PROMPTS)]
    return [r[0] for r in ray.get([gen.generate.remote(q) for q in reqs])]


def test_cuda_generation_matches_transformers(gen):
    model = _hf_model(0, "cuda")
    for r in _greedy(gen, "g0-"):
        assert r.version == 0 and len(r.logprobs) == len(r.token_ids)
        assert np.all(np.isfinite(r.logprobs)) and max(r.logprobs) <= 0.0
        assert r.token_ids == _hf_greedy(model, r.prompt_token_ids, 16)[:len(r.token_ids)]


def test_nccl_weight_sync_matches_transformers(ray_gpu, gen, tmp_path):
    """The product path: learner rank 0 (its own GPU) hosts the NCCL sender and broadcasts."""
    if ray_gpu < 2:
        pytest.skip("NCCL weight sync needs 2 GPUs (one per rank)")
    import ray

    from learner.config import LearnerConfig
    from learner.ranks import Learner
    from tasks.policy_model import build_tokenizer, save_policy

    before = [r.token_ids for r in _greedy(gen, "nb-")]
    path = tmp_path / "seed1"
    save_policy(_hf_model(1), build_tokenizer(), path)
    learner = Learner(str(path), 1, LearnerConfig(dtype="fp32"), num_gpus_per_rank=1)
    try:
        learner.connect_weight_sync("nccl", [gen])
        payload, refs = learner.publish_weights([gen], 1)
        (seconds,) = ray.get(refs)
        assert payload.transport == "nccl" and seconds > 0
        assert ray.get(gen.version.remote()) == 1
    finally:
        learner.shutdown()
    new = _hf_model(1, "cuda")
    after = _greedy(gen, "na-")
    for r in after:
        assert r.version == 1
        assert r.token_ids == _hf_greedy(new, r.prompt_token_ids, 16)[:len(r.token_ids)]
    assert [r.token_ids for r in after] != before


def test_nccl_reconnects_a_restarted_generator(ray_gpu, gen, tmp_path):
    """Ray restarts the generator between two publishes: the published payload is refused
    at once (the coordinator's re-sync: ``NotInGroupError``, not a hang), and the next
    publish probes the new incarnation, builds a new NCCL group epoch with it and delivers.
    Last in the module: it restarts the shared generator."""
    if ray_gpu < 2:
        pytest.skip("NCCL weight sync needs 2 GPUs (one per rank)")
    import time

    import ray

    from bench.harness import wait_ready
    from learner.config import LearnerConfig
    from learner.ranks import Learner
    from tasks.policy_model import build_tokenizer, save_policy

    path = tmp_path / "seed2"
    save_policy(_hf_model(2), build_tokenizer(), path)
    learner = Learner(str(path), 1, LearnerConfig(dtype="fp32"), num_gpus_per_rank=1)
    try:
        learner.connect_weight_sync({"type": "nccl", "timeout_s": 120}, [gen])
        version = ray.get(gen.version.remote()) + 1
        payload, refs = learner.publish_weights([gen], version)
        ray.get(refs)
        before = ray.get(gen.incarnation.remote())
        ray.kill(gen, no_restart=False)
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                if ray.get(gen.incarnation.remote(), timeout=900) != before:
                    break
            except ray.exceptions.RayActorError:  # being restarted
                wait_ready([gen], timeout_s=900)
        assert ray.get(gen.ready.remote()) and ray.get(gen.version.remote()) == 0
        with pytest.raises(ray.exceptions.RayTaskError, match="NotInGroupError"):
            ray.get(gen.update_weights.remote(payload, version))
        payload2, refs = learner.publish_weights([gen], version + 1)
        ray.get(refs)
        assert payload2.transport == "nccl" and payload2.epoch == payload.epoch + 1
    finally:
        learner.shutdown()
    new = _hf_model(2, "cuda")
    for r in _greedy(gen, "nr-"):
        assert r.version == version + 1
        assert r.token_ids == _hf_greedy(new, r.prompt_token_ids, 16)[:len(r.token_ids)]
