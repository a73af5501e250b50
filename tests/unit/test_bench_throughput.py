"""bench.throughput's pure parts: the steady-state window, the CPU limit, the spread over
repeats, and the simulator calibration built from what a run measured."""
import pytest

from bench.sim import calibration_config
from bench.throughput import calibration, cpu_limit, spread, steady_state


def row(step, t0, wait, train, sync, eval_s=0.0, prompts=4, rollouts=16, tokens=100):
    return {"step": step, "t_start": t0, "t_step_end": t0 + wait + train + sync,
            "learner_wait_s": wait, "train_time_s": train, "sync_time_s": sync,
            "eval_time_s": eval_s, "prompts": prompts, "rollouts": rollouts,
            "trained_tokens": tokens, "tokens_generated": tokens // 2,
            "decode_tokens_per_s": 50.0, "generator_busy_fraction": 0.5,
            "generator_slot_occupancy": 0.25, "rounds_mean": 1.0, "staleness_max": 1}


def test_steady_state_drops_the_warm_up_and_excludes_evaluations():
    rows, t = [], 0.0
    for step in range(1, 7):
        r = row(step, t, wait=1.0 if step <= 2 else 0.5, train=1.0, sync=0.5,
                eval_s=30.0 if step == 4 else 0.0)
        rows.append(r)
        t = r["t_step_end"] + r["eval_time_s"]       # the evaluation sits between two steps
    ss = steady_state(rows, warmup=2)
    assert ss["window_steps"] == 4 and ss["window_s"] == pytest.approx(4 * 2.0)
    assert ss["prompts_per_s"] == pytest.approx(16 / 8.0)
    assert ss["trained_tokens_per_s"] == pytest.approx(400 / 8.0)
    assert ss["learner_tokens_per_s"] == pytest.approx(100.0)
    assert ss["k_mean"] == 4.0 and ss["learner_idle_fraction"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="steady-state"):
        steady_state(rows, warmup=6)


def test_cpu_limit_charges_generation_and_training_to_the_same_cores():
    # 100 decode tokens at 100/s + 300 trained tokens at 300/s: 2 s per prompt.
    assert cpu_limit(100, 300, 100.0, 300.0) == pytest.approx(0.5)


def test_spread_over_repeats():
    s = spread([1.0, 2.0, 3.0, None])
    assert s == {"mean": 2.0, "sd": 1.0, "min": 1.0, "max": 3.0, "n": 3}


def fake_run(train_time_s, trained_tokens):
    return {"config": {"batch_prompts": 4}, "response_lengths": [3, 4, 5, 2],
            "success_rates": [0.5, 1.0], "prior_probs": [0.4, 0.9],
            "measured": {"n_generators": 2, "max_num_seqs": 32, "train_time_s": train_time_s,
                         "trained_tokens": trained_tokens, "sync_time_s": 0.1,
                         "prompt_tokens": 5.0, "max_staleness": 2, "max_inflight_prompts": None}}


def test_calibration_is_accepted_by_the_simulator():
    out = {"probe": {"decode_step_s": [[1, 0.01], [8, 0.012]], "dispatch_latency_s": 0.03},
           "steps": 10, "warmup_steps": 4,
           "runs": {"sync_grpo16": [fake_run(2.0, 1000)], "async_v05": [fake_run(3.0, 500)]}}
    cal = calibration(out)
    assert cal["learner_s_per_token"] == pytest.approx(0.002)
    assert cal["overlap_slowdown"] == pytest.approx(3.0)  # 6 ms/token async vs 2 ms sync
    cfg = calibration_config(cal)  # raises ValueError on any key or value it does not accept
    assert cfg.warmup == 4 and cfg.steps == 10


def test_no_calibration_without_both_modes():
    assert calibration({"runs": {"sync_grpo16": [fake_run(1.0, 10)]}}) is None
