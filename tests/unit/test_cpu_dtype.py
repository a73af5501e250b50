"""dtype auto on a CPU chooses by measurement (common/cpu_dtype.py): the probe's figures and
its margin, the cache per machine and torch version, the forcing switch both ways, and what
the learner, the engine and a run's summary take from it."""
from __future__ import annotations

import json

import pytest

import common.cpu_dtype as cd


def test_the_probe_measures_both_dtypes_and_chooses_by_its_margin():
    r = cd.probe(n=64, tokens=32, hidden=32, inner=64, reps=1)
    for key in ("fp32_gflops", "bf16_gflops", "fp32_fwd_bwd_tokens_per_s",
                "bf16_fwd_bwd_tokens_per_s", "matmul_ratio", "fwd_bwd_ratio"):
        assert r[key] > 0
    assert r["chosen"] == ("bf16" if min(r["matmul_ratio"], r["fwd_bwd_ratio"]) >= cd.MARGIN
                           else "fp32")


def test_the_choice_is_cached_per_machine_and_probed_again_for_another(tmp_path, monkeypatch):
    monkeypatch.delenv(cd.FORCE_ENV, raising=False)
    monkeypatch.setenv("V05_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(cd, "probe", lambda: calls.append(1) or {
        "chosen": "bf16", "matmul_ratio": 2.0, "fwd_bwd_ratio": 1.8})
    monkeypatch.setattr(cd, "machine_key", lambda: "cpu-a|torch x")
    first = cd.cpu_dtype()
    assert (first["chosen"], first["source"], len(calls)) == ("bf16", "probe", 1)
    assert cd.cpu_dtype()["source"] == "cache" and len(calls) == 1
    assert json.loads((tmp_path / "cpu_dtype.json").read_text())["key"] == "cpu-a|torch x"
    monkeypatch.setattr(cd, "machine_key", lambda: "cpu-b|torch x")  # another CPU, same home
    assert cd.cpu_dtype()["source"] == "probe" and len(calls) == 2


def test_the_switch_forces_either_way_and_refuses_anything_else(monkeypatch):
    for want in ("bf16", "fp32"):
        monkeypatch.setenv(cd.FORCE_ENV, want)
        assert cd.cpu_dtype() == {"chosen": want, "source": "forced", "key": None}
    monkeypatch.setenv(cd.FORCE_ENV, "fp16")
    with pytest.raises(ValueError, match="V05_CPU_DTYPE='fp16': must be one of"):
        cd.cpu_dtype()


def test_learner_engine_and_summary_follow_the_choice_and_an_explicit_setting_wins(monkeypatch):
    from actors.engine_config import resolve_dtype
    from learner.config import LearnerConfig

    monkeypatch.setenv(cd.FORCE_ENV, "bf16")
    assert LearnerConfig().resolved_dtype(cuda=False) == "bf16"
    assert resolve_dtype("auto", on_cpu=True) == "bfloat16"
    assert LearnerConfig(dtype="fp32").resolved_dtype(cuda=False) == "fp32"
    assert resolve_dtype("float32", on_cpu=True) == "float32"
    d = cd.run_dtypes("auto", "auto", on_gpu=False)
    assert (d["learner"], d["engine"], d["cpu_probe"]["source"]) == ("bf16", "bfloat16", "forced")
    assert "forced by $V05_CPU_DTYPE" in cd.dtype_line(d)
    monkeypatch.setenv(cd.FORCE_ENV, "fp32")
    assert LearnerConfig().resolved_dtype(cuda=False) == "fp32"
    assert resolve_dtype("auto", on_cpu=True) == "float32"
    assert cd.run_dtypes("fp32", "float32", on_gpu=False) == {"learner": "fp32",
                                                              "engine": "float32"}
    assert cd.run_dtypes("auto", "auto", on_gpu=True) == {"learner": "bf16",
                                                          "engine": "bfloat16"}
    line = cd.dtype_line({"learner": "bf16", "engine": "bfloat16", "cpu_probe": {
        "source": "probe", "matmul_ratio": 2.3, "fwd_bwd_ratio": 1.9}})
    assert "bf16 matmul 2.3x float32" in line and "forward and backward 1.9x" in line
