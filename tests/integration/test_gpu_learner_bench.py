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
