"""bench.real_model --fp32-baseline's side-by-side figures: the pinned keys at the top level,
the ratios the issue's aims read (each from the two figures it names), the learner's same-batch
rate set against the plain step in the dtype the probe chose."""
from bench.real_model.dtypes import FP32, side_by_side


def run(tokens_per_s, step_s, gain_se):
    return {"learner_tokens_per_s": tokens_per_s, "step_time_s": step_s,
            "heldout_gain_se": gain_se}


def test_the_pinned_figures_and_their_ratios():
    batch = {"plain_tokens_per_s": {"fp32": 100.0, "bf16": 160.0},
             "learner_same_batch_tokens_per_s": {"fp32_one_row": 60.0, "fp32": 90.0,
                                                 "auto": 128.0}}
    out = side_by_side(run(120.0, 35.0, 9.0), run(50.0, 100.0, 4.0), batch,
                       {"chosen": "bf16", "matmul_ratio": 2.0})
    assert out["learner_tokens_per_s"] == {"fp32": 50.0, "auto": 120.0}
    assert out["step_time_s"] == {"fp32": 100.0, "auto": 35.0}
    assert out["heldout_gain_se_combined"] == 9.0 and out["dtype_probe"]["chosen"] == "bf16"
    r = out["ratios"]
    assert (r["learner_auto_over_fp32"], r["step_time_fp32_over_auto"]) == (2.4, 2.86)
    assert r["learner_same_batch_auto_over_fp32_one_row"] == 2.13
    # auto's learner against the plain step in the dtype auto chose (bf16 here)
    assert r["learner_over_plain_same_dtype"] == {"fp32": 0.9, "auto": 0.8}
    probe_fp32 = side_by_side(run(1, 1, 1), run(1, 1, 1), batch, {"chosen": "fp32"})
    assert probe_fp32["ratios"]["learner_over_plain_same_dtype"]["auto"] == 1.28
    assert set(out["by_dtype"]) == {"auto", "fp32"}


def test_the_baseline_is_the_learner_before_rows_and_bf16():
    assert FP32 == ["optim.dtype=fp32", "generators.engine.dtype=float32",
                    "optim.pack_row_tokens=null"]
