"""The learner on real local Ray + real DeepSpeed (CPU, gloo) with a tiny random policy.

One Ray cluster and two learner groups (2 ranks and 1 rank, same config) are shared by the
module; tests that need a fresh state restore the step-0 checkpoint first.
"""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from actors.types import TrainSample

pytestmark = pytest.mark.integration

ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
CPUS_PER_RANK = 0.25


def make_samples(n: int, seed: int) -> list[TrainSample]:
    """Responses of different lengths (so ranks' shards differ in token counts), behaviour
    log-probs near the random policy's (about -log(vocab)), mixed-sign advantages."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        P, R = r.randint(2, 6), r.randint(1, 9)
        out.append(TrainSample(prompt_token_ids=[r.randint(4, 90) for _ in range(P)],
                               token_ids=[r.randint(4, 90) for _ in range(R)],
                               logprobs=[-4.6 + r.gauss(0, 0.2) for _ in range(R)],
                               advantage=r.gauss(0, 1), version=0))
    return out


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from tasks.policy_model import save_random_policy

    return save_random_policy(tmp_path_factory.mktemp("policy"), seed=0, **ARCH)


@pytest.fixture(scope="module")
def cfg():
    from learner.config import LearnerConfig

    # kl_coef > 0 loads a frozen reference on every rank: the KL path is covered as well.
    return LearnerConfig(lr=1e-3, micro_batch_size=2, max_consecutive_nan=1, kl_coef=0.05)


@pytest.fixture(scope="module")
def groups(ray_cluster, policy_dir, cfg, tmp_path_factory):
    """{'two': 2-rank group, 'one': 1-rank group, 'init': step-0 checkpoint dir}."""
    from learner.group import LearnerGroup

    made = {}
    try:
        made["two"] = LearnerGroup(policy_dir, 2, cfg, num_cpus_per_rank=CPUS_PER_RANK)
        made["one"] = LearnerGroup(policy_dir, 1, cfg, num_cpus_per_rank=CPUS_PER_RANK)
        init = tmp_path_factory.mktemp("init_ckpt")
        for name in ("two", "one"):
            made[name].save_checkpoint(init / name, {"step": 0})
        yield {**made, "init": init}
    finally:
        for g in made.values():
            g.shutdown()


def reset(groups):
    for name in ("two", "one"):
        groups[name].load_checkpoint(groups["init"] / name)


def test_two_ranks_equal_one_rank(groups):
    reset(groups)
    two, one = groups["two"], groups["one"]
    w0 = one.get_weights()
    # 5 samples on 2 ranks: shards of 3 and 2 + a padding sample, unequal token counts.
    batches = [make_samples(5, 1), make_samples(5, 2)]
    m2 = [two.train_step(b) for b in batches]
    m1 = [one.train_step(b) for b in batches]
    per_rank = two.get_weights_per_rank()
    w1 = one.get_weights()
    assert max_diff(per_rank[0], per_rank[1]) == 0.0  # DeepSpeed keeps replicas bit-identical
    moved = max_diff(w1, w0)
    assert moved > 5e-4  # Adam moves every touched weight by about lr = 1e-3 per step
    # Same global batch and global normalisation: same loss, gradient and update.
    assert max_diff(per_rank[0], w1) < 2e-3 * moved
    for a, b in zip(m2, m1):
        assert not a["skipped"] and not b["skipped"]
        assert a["n_tokens"] == b["n_tokens"] and a["n_samples"] == b["n_samples"] == 5
        for k in ("loss", "grad_norm", "entropy", "clip_fraction", "approx_kl", "kl"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
    assert m2[-1]["step"] == 2
    # The policy starts AT the reference, then moves away from it.
    assert m2[0]["kl"] == pytest.approx(0.0, abs=1e-6) and m2[1]["kl"] > 1e-6


@pytest.mark.parametrize("poison", ["nan_logprob", "huge_advantage"])
def test_non_finite_step_is_skipped_then_raises(groups, poison):
    two = groups["two"]
    reset(groups)

    def poisoned(seed):
        b = make_samples(5, seed)
        if poison == "nan_logprob":
            b[-1].logprobs[0] = float("nan")  # the last sample lands on rank 1 only
        else:
            b[-1].advantage = 1e38  # a sum of several such tokens overflows float32 to inf
        return b

    before = two.get_weights_per_rank()
    m = two.train_step(poisoned(3))
    assert m["skipped"] and m["step"] == 0
    # A NaN log-prob makes the loss NaN; a huge advantage may overflow the loss or only
    # the gradient, depending on the token counts.
    assert m["skip_reason"] in (("non-finite loss",) if poison == "nan_logprob" else
                                ("non-finite loss", "non-finite gradient norm"))
    after = two.get_weights_per_rank()
    assert max_diff(before[0], after[0]) == 0.0 and max_diff(before[1], after[1]) == 0.0
    good = two.train_step(make_samples(5, 4))  # resets the consecutive counter
    assert not good["skipped"] and good["step"] == 1 and math.isfinite(good["loss"])
    assert max_diff(before[0], two.get_weights()) > 0.0
    assert two.train_step(poisoned(5))["skipped"]
    with pytest.raises(RuntimeError, match="consecutive steps skipped"):
        two.train_step(poisoned(6))  # the 2nd in a row > max_consecutive_nan = 1


def test_checkpoint_restores_weights_and_client_state(groups, tmp_path):
    two = groups["two"]
    reset(groups)
    two.train_step(make_samples(4, 7))
    saved = two.get_weights()
    client = {"step": 1, "data_position": 42, "note": "after one step"}
    two.save_checkpoint(tmp_path / "ckpt", client)
    two.train_step(make_samples(4, 8))
    w_next = two.get_weights()
    assert max_diff(saved, w_next) > 0.0
    assert two.load_checkpoint(tmp_path / "ckpt") == client
    restored = two.get_weights_per_rank()
    assert max_diff(saved, restored[0]) == 0.0 and max_diff(saved, restored[1]) == 0.0
    # Adam's moments came back too: replaying the same step lands on the same weights (a
    # fresh optimiser would take a different, sign-like first step).
    assert two.train_step(make_samples(4, 8))["step"] == 2
    assert max_diff(w_next, two.get_weights()) < 1e-7


def test_save_hf_loads_with_transformers(groups, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    one = groups["one"]
    one.train_step(make_samples(3, 9))
    out = one.save_hf(tmp_path / "hf")
    weights = one.get_weights()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    assert max_diff(sd, weights) == 0.0
    assert len(AutoTokenizer.from_pretrained(out)) == model.config.vocab_size


def test_record_then_replay(groups, policy_dir, tmp_path, capsys):
    from learner.replay import RolloutRecorder, main, read_groups

    path = tmp_path / "rollouts.msgpack"
    recorded = []
    with RolloutRecorder(path) as rec:
        for g in range(3):
            samples = make_samples(4, 100 + g)
            rewards = [1.0, -1.0, 1.0, 1.0]
            rec.append(f"p{g}", f"prompt {g}", rewards, 0.5, g, samples)
            recorded.append(samples)
    back = list(read_groups(path))
    assert [g["prompt_id"] for g in back] == ["p0", "p1", "p2"]
    assert [g["samples"] for g in back] == recorded and back[1]["policy_version"] == 1
    capsys.readouterr()
    summary = main([str(path), "--model", str(policy_dir), "--batch-prompts", "2",
                    "--ranks", "1", "--steps", "3", "--cpus-per-rank", str(CPUS_PER_RANK)])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    steps = [x for x in lines if "step" in x and "summary" not in x]
    assert [x["samples"] for x in steps] == [8, 8, 8]  # 2 groups of 4, wrapping around the file
    assert all(not x["skipped"] and math.isfinite(x["loss"]) for x in steps)
    assert lines[-1]["summary"] == summary
    assert summary["steps"] == 3 and summary["samples"] == 24 and summary["skipped_steps"] == 0
    assert summary["samples_per_s"] > 0


def test_rank0_publishes_its_weights(groups):
    """Rank 0 hosts the weight sender: the payload it publishes holds the group's weights."""
    import numpy as np
    import ray

    two = groups["two"]
    with pytest.raises(ray.exceptions.RayTaskError, match="before connect_weight_sync"):
        two.publish_weights([], 1)
    two.connect_weight_sync("object_store", [])
    payload, refs = two.publish_weights([], 1)
    assert refs == [] and payload.version == 1 and payload.transport == "object_store"
    published, expected = ray.get(payload.ref), two.get_weights()
    assert payload.num_tensors == len(expected) and set(published) == set(expected)
    assert all(np.array_equal(published[k], expected[k]) for k in expected)
    with pytest.raises(ray.exceptions.RayTaskError, match="not newer"):
        two.publish_weights([], 1)  # versions only go forward
