"""dtype auto on a CPU chooses by measurement (common/cpu_dtype.py): the probe's figures and
its margin on the model's own architecture, the cache per machine, torch version and model
shape, the forcing switch both ways, and what the learner, the engine and a run's summary
take from it."""
from __future__ import annotations

import json

import pytest

import common.cpu_dtype as cd


def tiny_model(root, hidden=32, vocab=64):
    """A model directory with only a config.json: all the probe reads."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 4, "vocab_size": vocab, "max_position_embeddings": 128}))
    return str(root)


def test_the_probe_measures_both_dtypes_on_the_model_and_chooses_by_its_margin(tmp_path):
    r = cd.probe(tiny_model(tmp_path / "m"), n=64, batch=2, length=8, reps=1)
    for key in ("fp32_gflops", "bf16_gflops", "fp32_fwd_bwd_tokens_per_s",
                "bf16_fwd_bwd_tokens_per_s", "matmul_ratio", "fwd_bwd_ratio"):
        assert r[key] > 0
    assert r["chosen"] == ("bf16" if min(r["matmul_ratio"], r["fwd_bwd_ratio"]) >= cd.MARGIN
                           else "fp32")


def test_the_choice_is_cached_per_machine_and_model_and_probed_again_for_another(
        tmp_path, monkeypatch):
    monkeypatch.delenv(cd.FORCE_ENV, raising=False)
    monkeypatch.setenv("V05_CACHE", str(tmp_path))
    small, large = tiny_model(tmp_path / "small"), tiny_model(tmp_path / "large", hidden=64)
    calls = []
    monkeypatch.setattr(cd, "probe", lambda path: calls.append(path) or {
        "chosen": "bf16" if path == large else "fp32", "matmul_ratio": 2.0,
        "fwd_bwd_ratio": 1.8 if path == large else 1.0})
    monkeypatch.setattr(cd, "machine_key", lambda: "cpu-a|torch x")
    first = cd.cpu_dtype(large)
    assert (first["chosen"], first["source"], calls) == ("bf16", "probe", [large])
    assert cd.cpu_dtype(large)["source"] == "cache" and len(calls) == 1
    other = cd.cpu_dtype(small)  # another model on the same CPU: its own answer, both kept
    assert (other["chosen"], other["source"], len(calls)) == ("fp32", "probe", 2)
    kept = json.loads((tmp_path / "cpu_dtype.json").read_text())
    assert len(kept) == 2 and all(k.startswith("cpu-a|torch x|") for k in kept)
    assert cd.cpu_dtype(large)["source"] == "cache" and len(calls) == 2
    monkeypatch.setattr(cd, "machine_key", lambda: "cpu-b|torch x")  # another CPU, same home
    assert cd.cpu_dtype(large)["source"] == "probe" and len(calls) == 3


def test_a_model_without_a_config_is_refused_naming_the_settings(tmp_path, monkeypatch):
    monkeypatch.delenv(cd.FORCE_ENV, raising=False)
    monkeypatch.setenv("V05_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="no readable config.json.*optim.dtype"):
        cd.cpu_dtype(str(tmp_path / "nowhere"))


def test_the_switch_forces_either_way_and_refuses_anything_else(monkeypatch):
    for want in ("bf16", "fp32"):
        monkeypatch.setenv(cd.FORCE_ENV, want)
        assert cd.cpu_dtype("any") == {"chosen": want, "source": "forced", "key": None}
    monkeypatch.setenv(cd.FORCE_ENV, "fp16")
    with pytest.raises(ValueError, match="V05_CPU_DTYPE='fp16': must be one of"):
        cd.cpu_dtype("any")


def test_learner_engine_and_summary_follow_the_choice_and_an_explicit_setting_wins(monkeypatch):
    from actors.engine_config import resolve_dtype
    from learner.config import LearnerConfig

    monkeypatch.setenv(cd.FORCE_ENV, "bf16")
    assert LearnerConfig().resolved_dtype(cuda=False, model_path="m") == "bf16"
    assert resolve_dtype("auto", on_cpu=True, model_path="m") == "bfloat16"
    assert LearnerConfig(dtype="fp32").resolved_dtype(cuda=False, model_path="m") == "fp32"
    assert resolve_dtype("float32", on_cpu=True, model_path="m") == "float32"
    d = cd.run_dtypes("auto", "auto", on_gpu=False, model_path="m")
    assert (d["learner"], d["engine"], d["cpu_probe"]["source"]) == ("bf16", "bfloat16", "forced")
    assert "forced by $V05_CPU_DTYPE" in cd.dtype_line(d)
    monkeypatch.setenv(cd.FORCE_ENV, "fp32")
    assert LearnerConfig().resolved_dtype(cuda=False, model_path="m") == "fp32"
    assert resolve_dtype("auto", on_cpu=True, model_path="m") == "float32"
    assert cd.run_dtypes("fp32", "float32", on_gpu=False, model_path="m") == {"learner": "fp32",
                                                              "engine": "float32"}
    assert cd.run_dtypes("auto", "auto", on_gpu=True, model_path="m") == {"learner": "bf16",
                                                          "engine": "bfloat16"}
    line = cd.dtype_line({"learner": "bf16", "engine": "bfloat16", "cpu_probe": {
        "source": "probe", "matmul_ratio": 2.3, "fwd_bwd_ratio": 1.9}})
    assert "bf16 matmul 2.3x float32" in line and "forward and backward 1.9x" in line
