"""bench.gpu_learner end to end on whatever device there is (CPU here: the tiny shape only).

On the CPU it checks the same things as on a GPU except the bf16/NCCL choice: the learner's
log-probs match an fp32 transformers forward, steps move the weights, a checkpoint restores
them exactly; then it measures the tiny shape and writes the JSON the docs quote.
"""
import json

import pytest

pytestmark = pytest.mark.integration


def test_gpu_learner_bench_runs_and_reports(tmp_path):
    from bench.gpu_learner import main

    out = main(["--out", str(tmp_path), "--steps", "1"])
    saved = json.loads((tmp_path / "gpu_learner.json").read_text())
    assert saved["check"] == out["check"]
    assert saved["check"]["steps_applied"] == 3
    assert saved["check"]["first_step"]["approx_kl"] < 5e-3
    (m,) = saved["measure"] if saved["gpu"] is None else saved["measure"][:1]
    assert m["tokens_per_s"] > 0 and m["s_per_token_gpu"] == pytest.approx(
        sum(m["step_s"]) / len(m["step_s"]) / m["trained_tokens_per_step"], rel=0.05)  # step_s: ms


def test_gpu_learner_rejects_unknown_shape(tmp_path):
    from bench.gpu_learner import main

    with pytest.raises(SystemExit, match="unknown.*qwen9"):
        main(["--out", str(tmp_path), "--shapes", "qwen9"])


def test_gpu_check_tiny_runs_every_check(tmp_path):
    """bench.gpu_check's three device checks on tiny shapes (what an H200 runs at Qwen3-4B)."""
    from bench.gpu_check import main

    out = main(["--tiny", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_check_tiny.json").read_text())
    assert saved["errors"] == {} and saved["mode"] == "tiny"
    for check in ("learner", "logprob", "decoupled"):  # torch, transformers, DeepSpeed only
        assert saved[check]["loaded_not_needed"] == [], check
    runs = saved["learner"]["runs"]
    assert [r["resp_len"] for r in runs] == saved["sizes"]["resp_lens"]
    for r in runs:  # one response per micro-batch: the token budget is one response
        assert r["micro_batches"] == r["responses"] and r["tokens_per_s"] > 0
        assert r["peak_gib"] >= r["rest_gib"] > 0
    lp = saved["logprob"]
    assert lp["chunked"]["seconds"] > 0 and lp["full_logits"]["seconds"] > 0
    d = saved["decoupled"]
    assert d["applied"] == 4 and d["losses"] == sorted(d["losses"], reverse=True)
    assert out["decoupled"] == d


def test_gpu_check_memory_cpu_tiny(tmp_path):
    """The CPU memory measurements and the plan they feed, at tiny sizes."""
    from bench.gpu_check import main

    out = main(["--memory-cpu", "--tiny", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_check_memory_cpu_tiny.json").read_text())
    assert saved == json.loads(json.dumps(out))
    peaks = {r["kind"]: r["peak_mib"] for r in saved["logprob_step"]}
    assert 0 < peaks["chunked"] < peaks["reference"]
    d = saved["layer_derived_fp32"]
    # (what one more layer keeps, H * 4 bytes a token, is below page granularity here)
    assert d["working_bytes_per_token"] > 1000
    plan = {(r["tokens"], r["zero_stage"], r["packed"]): r for r in saved["plan"]}
    # more tokens need more memory; sharding the states needs less
    assert plan[21504, 3, False]["total"] > plan[17408, 3, False]["total"]
    assert plan[17408, 0, False]["model_states"] > plan[17408, 2, False]["model_states"] > \
        plan[17408, 3, False]["model_states"]
