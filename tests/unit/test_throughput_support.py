"""bench.throughput's calibration of the simulator: keys the simulator accepts, measured slowdown."""
import pytest

from bench._throughput_support import calibration
from bench.sim import calibration_config


def fake_run(train_time_s, trained_tokens, k=16):
    return {"config": {"batch_prompts": 4}, "response_lengths": [3, 4, 5, 2],
            "success_rates": [0.5, 1.0], "prior_probs": [0.4, 0.9],
            "measured": {"n_generators": 2, "max_num_seqs": 32, "train_time_s": train_time_s,
                         "trained_tokens": trained_tokens, "sync_time_s": 0.1,
                         "prompt_tokens": 5.0, "max_staleness": 2, "max_inflight_prompts": 32}}


def test_calibration_is_accepted_by_the_simulator():
    out = {"probe": {"decode_step_s": [[1, 0.01], [8, 0.012]], "dispatch_latency_s": 0.03},
           "runs": {"sync_grpo16": fake_run(2.0, 1000), "async_v05": fake_run(3.0, 500)}}
    cal = calibration(out)
    assert cal["learner_s_per_token"] == pytest.approx(0.002)
    assert cal["overlap_slowdown"] == pytest.approx(3.0)  # 6 ms/token async vs 2 ms sync
    calibration_config(cal)  # raises ValueError on any key or value it does not accept


def test_no_calibration_without_both_modes():
    assert calibration({"runs": {"sync_grpo16": fake_run(1.0, 10)}}) is None
