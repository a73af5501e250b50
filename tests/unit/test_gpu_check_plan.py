"""The learner's memory plan (bench/gpu_check/plan.py) and what it rests on: the committed CPU
measurement (bench/results/gpu_check_memory_cpu.json), the plan table recomputed from its
inputs, and the shipped 32-GPU config's learner projected under an H100's 80 GiB. A
PROJECTION from CPU figures: no GPU measured any of it. Also: the device check notes any Ray
or vLLM import (it must need only torch, transformers and DeepSpeed)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench.gpu_check.plan import GIB, config_memory, memory_plan
from cluster.config.schema import load_config

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "bench" / "results" / "gpu_check_memory_cpu.json"
PAPER = ROOT / "configs" / "qwen3-4b-dapo-32gpu.yaml"
H100_GIB = 80.0


@pytest.fixture(scope="module")
def measured() -> dict:
    return json.loads(MEASURED.read_text())


@pytest.fixture(scope="module")
def qwen():
    from bench.gpu_check.cli import count_params
    from bench.gpu_learner import SHAPES

    return SHAPES["qwen3-4b"], count_params(SHAPES["qwen3-4b"])


def plan_inputs(measured) -> tuple[float, float]:
    inp = measured["plan_inputs"]
    return (inp["layer_work_bytes_per_token_bf16"],
            inp["logprob_bytes_per_chunk_element_bf16_assumed"])


def test_the_cpu_measurement_compares_chunked_to_full_logits_at_a_150k_vocabulary(measured):
    assert measured["device"] == "cpu"
    assert measured["command"] == "python -m bench.gpu_check --memory-cpu"
    steps = {r["kind"]: r for r in measured["logprob_step"]}
    chunked, full = steps["chunked"], steps["reference"]
    assert chunked["vocab"] == full["vocab"] >= 150_000
    assert chunked["tokens"] == full["tokens"] > chunked["chunk"]
    assert chunked["mean_entropy"] == pytest.approx(full["mean_entropy"], rel=1e-5)  # same step
    # full logits: ~20 bytes per (position x vocab) entry (fp32 copies and their gradients);
    # chunked: one chunk's worth, whatever the positions
    assert full["bytes_per_position_vocab"] > 16
    assert chunked["peak_mib"] < full["peak_mib"] / 4


def test_the_plan_in_the_results_is_the_plan_code_on_the_measured_inputs(measured, qwen):
    layer_work, _ = plan_inputs(measured)
    assert layer_work == measured["layer_derived_fp32"]["working_bytes_per_token"] / 2  # bf16
    assert memory_plan(*qwen, layer_work) == measured["plan"]


def test_the_32_gpu_configs_learner_fits_an_h100_at_dapo_length(measured, qwen):
    cfg = load_config(PAPER)
    shape, n_params = qwen
    assert cfg.rollout.max_tokens == 20480  # DAPO's response length
    assert 0 < cfg.reward.overlong_buffer < cfg.rollout.max_tokens
    # any sample (prompt + response <= max_model_len) fits one micro-batch's token budget
    assert cfg.optim.micro_batch_tokens >= cfg.generators.engine.max_model_len > \
        cfg.rollout.max_tokens
    assert cfg.optim.gradient_checkpointing and cfg.optim.zero_stage == 3
    m = config_memory(cfg, shape, n_params, *plan_inputs(measured))
    assert m["model_states"] == pytest.approx(20 * n_params / cfg.learner.ranks / GIB)
    assert m["packed_attention_mask"] > 0  # the budget packs several shorter responses
    assert m["total"] < H100_GIB
    assert m["total"] == pytest.approx(21.76, abs=0.01)  # the figure docs/learner.md quotes
    # the same learner without ZeRO would not fit: the sharding is what the plan rests on
    unsharded = load_config(PAPER, ["optim.zero_stage=0"])
    assert config_memory(unsharded, shape, n_params, *plan_inputs(measured))["total"] > H100_GIB
    with pytest.raises(ValueError, match="gradient checkpointing"):
        config_memory(load_config(PAPER, ["optim.gradient_checkpointing=false"]), shape,
                      n_params, *plan_inputs(measured))


def test_plan_command_prints_the_configs_projection(qwen, capsys):
    from bench.gpu_check import main

    out = main(["--plan", str(PAPER), "--out", str(MEASURED.parent)])
    assert out["projection"] is True and out["ranks"] == 14 and out["zero_stage"] == 3
    assert json.loads(capsys.readouterr().out) == out
    assert out["gib"]["total"] < H100_GIB


def test_the_device_check_notes_a_ray_or_vllm_import(monkeypatch):
    from bench.gpu_check.checks import noting_imports

    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert noting_imports(dict, [("x", 1)]) == {"x": 1, "loaded_not_needed": []}
    monkeypatch.setitem(sys.modules, "vllm", ModuleType("vllm"))
    assert noting_imports(dict)["loaded_not_needed"] == ["vllm"]


def test_the_qwen3_shapes_are_the_released_ones(qwen):
    from bench.gpu_learner import SHAPES

    released = {"qwen3-4b": (2560, 9728, 36, 32), "qwen3-1.7b": (2048, 6144, 28, 16),
                "qwen3-0.6b": (1024, 3072, 28, 16)}
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    for name, dims in released.items():
        s = SHAPES[name]
        assert tuple(s[k] for k in keys) == dims, name
        assert (s["num_key_value_heads"], s["head_dim"], s["vocab_size"],
                s["tie_word_embeddings"]) == (8, 128, 151936, True), name
    assert 4.0e9 < qwen[1] < 4.1e9  # Qwen3-4B: 4.02B parameters


def test_timed_steps_times_every_step_and_fails_on_a_skip():
    """``timed_steps`` (bench.gpu_learner's measurement and bench.gpu_check's learner check):
    every step timed, the last step's metrics returned, a skipped step fails."""
    from bench.gpu_learner import timed_steps
    from common.records import StepResult

    class Worker:
        def __init__(self, skip_at=None):
            self.calls, self.skip_at = 0, skip_at

        def train_step(self, samples):
            self.calls += 1
            return StepResult(skipped=self.calls == self.skip_at, updates_applied=self.calls,
                              n_samples=len(samples))

    w = Worker()
    times, last = timed_steps(w, [1, 2], 3)
    assert len(times) == 3 and all(t >= 0 for t in times)
    assert (last.skipped, last.updates_applied, last.n_samples) == (False, 3, 2) and w.calls == 3
    with pytest.raises(AssertionError):
        timed_steps(Worker(skip_at=2), [1], 3)
