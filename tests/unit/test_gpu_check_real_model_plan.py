"""bench.gpu_check --real-model without running the learner: the model files carried for a lent
GPU machine (they must equal the cached conversion's, and describe SmolLM2-135M), the batches
it trains on (the run config's shape), the parent's error bookkeeping, and the wheel selection
of run_on_device.sh. The learner itself runs in tests/integration/test_gpu_check_real_model.py.
"""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from bench.gpu_check import real_model as rm

ROOT = Path(__file__).resolve().parents[2]


def test_the_carried_files_are_the_cached_conversions(tmp_path):
    """The files in bench/gpu_check/smollm2_135m/ are byte for byte those of the checkpoint
    tasks/pretrained.py converts (when this machine has it): they cannot drift apart."""
    from tasks.pretrained import DIGESTS, cache_problem, pretrained_dir

    assert sorted(p.name for p in rm.MODEL_DIR.iterdir()) == sorted(rm.CARRIED)
    cached = pretrained_dir("smollm2-135m-instruct")
    if cache_problem(cached) is not None:
        pytest.skip(f"no converted checkpoint at {cached} ({cache_problem(cached)})")
    import json

    listed = json.loads((cached / DIGESTS).read_text())["files"]
    for name in rm.CARRIED:
        assert name in listed, name
        assert (rm.MODEL_DIR / name).read_bytes() == (cached / name).read_bytes(), name


def test_the_carried_config_is_smollm2_135m():
    """Built on the meta device from the carried config.json: the released model's shape."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(rm.MODEL_DIR)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    # the tiny shape keeps the attention geometry of the config (head_dim, 3 queries per KV)
    t = rm.TINY_SHAPE
    assert t["hidden_size"] // t["num_attention_heads"] == cfg.head_dim
    assert t["num_attention_heads"] // t["num_key_value_heads"] == \
        cfg.num_attention_heads // cfg.num_key_value_heads
    assert rm.SIZES["gpu"]["shape"] == {}  # the GPU measures the real architecture


def test_the_gpu_batches_are_the_run_configs():
    """The learner settings and batch shapes come from configs/smollm2-135m.yaml (whatever
    its values: 8 prompts x 4 to 16 responses of up to 48 tokens when this was written)."""
    from cluster.config.schema import load_config

    cfg = load_config(ROOT / "configs" / "smollm2-135m.yaml")
    run = rm.run_settings()
    assert run["path"].endswith("configs/smollm2-135m.yaml")
    assert run["optim"] == cfg.optim  # lr, micro_batch_size, micro_batch_tokens, ...
    assert cfg.model.path == "smollm2-135m-instruct"  # the model whose config is carried
    plan = {r["name"]: r for r in rm.plan_runs("gpu", run)}
    assert [r[0] for r in rm.RUNS] == list(plan)
    prompts = cfg.rollout.batch_prompts
    assert (plan["k_init"]["prompts"], plan["k_init"]["per_prompt"]) == (prompts, cfg.algo.k_init)
    assert (plan["k_max"]["prompts"], plan["k_max"]["per_prompt"]) == (prompts, cfg.algo.k_max)
    assert plan["large"]["prompts"] == 8 * prompts  # 1,024 responses at 8 x 16
    assert all(r["max_response"] == cfg.rollout.max_tokens for r in plan.values())
    # the run's own micro-batches first, larger budgets only on the large batch
    assert [plan[n]["micro"] for n in ("k_init", "k_max", "large")] == [None] * 3
    assert plan["large_micro16384"]["micro"]["micro_batch_tokens"] == 16384
    tiny = rm.plan_runs("tiny", run)
    k0, k1 = cfg.algo.k_init, cfg.algo.k_max
    assert [r["prompts"] * r["per_prompt"] for r in tiny] == [k0, k1, 2 * k1, 2 * k1, 2 * k1]


def test_real_batch_has_the_runs_lengths():
    samples = rm.real_batch(3, 4, 48, 49152, seed=1)
    assert len(samples) == 12
    for i in range(0, 12, 4):  # the k responses of a prompt share it
        group = samples[i:i + 4]
        assert all(s.prompt_token_ids == group[0].prompt_token_ids for s in group)
        assert abs(len(group[0].prompt_token_ids) - rm.PROMPT_TOKENS) <= 6
    for s in samples:
        assert rm.MIN_RESPONSE <= len(s.token_ids) == len(s.logprobs) <= 48
        assert all(3 <= t < 49152 for t in s.prompt_token_ids + s.token_ids)
        assert abs(sum(s.logprobs) / len(s.logprobs) + math.log(49152)) < 0.1
        assert s.advantage in (-1.0, 1.0)
    assert rm.real_batch(3, 4, 48, 49152, seed=1) == samples  # seeded
    assert rm.real_batch(3, 4, 48, 49152, seed=2) != samples


def test_a_failed_part_or_a_ray_import_is_an_error(monkeypatch):
    """The parent's bookkeeping: the child's errors, a Ray/vLLM import, a dead child."""
    import bench.gpu_learner.core as core
    from bench.gpu_check.cli import real_model_checks

    child = {"errors": {"learner/large": "skipped: past the deadline"}, "seconds": {},
             "loaded_not_needed": ["ray"], "learner": {"runs": []}}
    monkeypatch.setattr(core, "isolated", lambda fn, *args: {**child, "errors":
                                                             dict(child["errors"])})
    out = real_model_checks("tiny", 1.0)
    assert set(out["errors"]) == {"learner/large", "imports"}
    assert out["mode"] == "tiny" and out["sizes"] == rm.SIZES["tiny"]

    def dead(fn, *args):
        raise RuntimeError("A process in the process pool was terminated abruptly")
    monkeypatch.setattr(core, "isolated", dead)
    out = real_model_checks("tiny", 1.0)
    assert list(out["errors"]) == ["real_model"] and "terminated" in out["errors"]["real_model"]


def test_the_wheels_installed_are_the_missing_or_pinned_ones(tmp_path):
    from bench.gpu_check.wheels import PINNED, canonical, to_install, wheel_dist

    names = ["deepspeed-0.19.8-py3-none-any.whl", "py_cpuinfo-9.0.0-py3-none-any.whl",
             "hjson-3.1.0-py3-none-any.whl", "cp312-x86_64/msgpack-1.2.4-cp312-cp312-"
             "manylinux2014_x86_64.manylinux_2_17_x86_64.whl"]
    for n in names:
        (tmp_path / n).parent.mkdir(exist_ok=True)
        (tmp_path / n).write_bytes(b"")
    assert wheel_dist(tmp_path / names[1]) == ("py-cpuinfo", "9.0.0")
    assert canonical("Typing_Inspection") == "typing-inspection"
    assert PINNED["deepspeed"] == "0.19.8"

    def picked(installed: dict) -> list[str]:
        return [p.name.split("-")[0] for p in to_install(tmp_path, installed.get)]
    # a bare machine: everything; a machine that has them: nothing
    assert sorted(picked({})) == ["deepspeed", "hjson", "msgpack", "py_cpuinfo"]
    assert picked({"deepspeed": "0.19.8", "py-cpuinfo": "8.0", "hjson": "3.0",
                   "msgpack": "1.0"}) == []
    # another DeepSpeed is replaced (the pinned one); other versions are left alone
    assert sorted(picked({"deepspeed": "0.18.0", "py-cpuinfo": "8.0", "hjson": "3.0"})) == [
        "deepspeed", "msgpack"]
    with pytest.raises(ValueError, match="not a wheel"):
        wheel_dist(tmp_path / "hjson.tar.gz")


def test_run_on_device_script_parses_and_installs_before_it_runs():
    script = ROOT / "bench" / "gpu_check" / "run_on_device.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert text.index("python -m bench.gpu_check.wheels") < text.index(
        'python -m bench.gpu_check "$@"')
    assert "set -- --real-model" in text


def test_the_same_device_nccl_check_says_refused_only_when_every_rank_failed():
    """``nccl_same_device``'s verdict (the check itself needs CUDA): refused when both ranks
    report an error, not when one got through, and hung when a rank never answered."""
    from bench.gpu_check.real_model import nccl_outcome

    dup = ("error", "DistBackendError: NCCL error: invalid usage, Duplicate GPU detected")
    both = nccl_outcome([dup, dup], 2)
    assert both["refused"] and not both["hung"] and both["errors"] == [dup[1]]
    assert not nccl_outcome([("ok",), ("ok",)], 2)["refused"]
    assert not nccl_outcome([("ok",), dup], 2)["refused"]
    silent = nccl_outcome([dup], 2)
    assert silent["hung"] and silent["answered"] == 1
    assert not nccl_outcome([], 2)["refused"]
