"""bench.real_model's analysis on a synthetic run directory whose figures are known by hand,
and its plot."""
from __future__ import annotations

import json
import math

import pytest
import yaml

from bench.real_model import analysis
from bench.real_model.plot import plot


def row(step, wait, train, sync, tokens, busy, occ, decode):
    return {"step": step, "step_time_s": wait + train + sync, "learner_wait_s": wait,
            "train_time_s": train, "sync_time_s": sync, "trained_tokens": tokens,
            "generator_busy_fraction": busy, "generator_slot_occupancy": occ,
            "decode_tokens_per_s": decode, "reward_mean": 0.0, "k_mean": 4.0,
            "response_len_mean": 30.0}


@pytest.fixture
def run_dir(tmp_path):
    rows = [row(1, 30.0, 50.0, 5.0, 1000, 0.9, 0.5, 40.0),   # warm-up: left out
            row(2, 0.0, 95.0, 5.0, 5000, 0.25, 0.05, 20.0),
            row(3, 10.0, 85.0, 5.0, 4000, 0.5, 0.10, 30.0)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"eval_metric": "sampled", "eval_prompts": 200, "eval_samples": 4,
               "eval_sampled_initial": 0.20, "eval_sampled_initial_se": 0.03,
               "eval_sampled_final": 0.36, "eval_sampled_final_se": 0.04,
               "eval_greedy_initial": 0.5, "eval_greedy_final": 0.7,
               "eval_greedy_initial_se": 0.03, "eval_greedy_final_se": 0.03,
               "train_s": 285.0, "startup": {"total_s": 46.0}, "prompts_trained": 24,
               "rollouts": 120}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    config = {"generators": {"count": 2, "engine": {"max_num_seqs": 64}},
              "learner": {"threads": 1}, "algo": {"k_init": 4},
              "task": {"difficulties": [1, 2, 3, 4, 5, 6]}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    # six prompts in training order: all wrong, mixed, all right (its 5th rollout, an extra
    # one, is wrong: only the first k_init count), mixed, all wrong, mixed
    groups = [[-1] * 4, [1, -1, -1, -1], [1, 1, 1, 1, -1], [-1, 1, -1, 1], [-1] * 4,
              [1, 1, -1, 1]]
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"uid": f"s{i}", "rewards": g, "k": len(g)}) + "\n"
        for i, g in enumerate(groups)))
    return tmp_path


CURVE = [{"batch": 1, "tokens_per_s": 10.0}, {"batch": 4, "tokens_per_s": 25.0},
         {"batch": 16, "tokens_per_s": 50.0}, {"batch": 64, "tokens_per_s": 80.0}]


def test_figures_over_the_steady_state(run_dir):
    out = analysis.analyse(run_dir, params=1_000_000, matmul={"1": 50.0, "2": 95.0},
                           curve=CURVE, memory_mib={"Generator": 2900.0}, wall_s=400.0)
    split = out["step_split_s"]
    assert split["window"] == "steps 2-3 of 3" and split["steps"] == 2
    assert (split["step_s"], split["generation_wait_s"], split["train_s"], split["sync_s"]) == \
        (100.0, 5.0, 90.0, 5.0)
    learner = out["learner"]
    assert learner["tokens_per_s"] == 50.0  # 9000 tokens in 180 s
    assert learner["model_gflops"] == 0.3 and learner["share_of_matmul_peak"] == 0.006
    gen = out["generators"]
    # 100 s steps, 2 engines: tokens 2000 + 3000; busy 50 + 100 engine-s; sequences in flight
    # 0.05 * 200 * 64 + 0.10 * 200 * 64 = 640 + 1280 sequence-seconds
    assert gen["tokens"] == 5000 and gen["busy_fraction"] == 0.375
    assert gen["tokens_per_busy_s"] == pytest.approx(5000 / 150, abs=0.01)
    assert gen["batch_while_busy"] == pytest.approx(1920 / 150, abs=0.01)
    limit = 25.0 + (1920 / 150 - 4) / 12 * 25.0  # linear between batches 4 and 16
    assert gen["engine_limit_tokens_per_s"] == pytest.approx(limit, abs=0.01)
    assert out["generator_share_of_engine_limit"] == pytest.approx(5000 / 150 / limit, abs=1e-3)
    assert out["start_accuracy"] == 0.2 and out["end_accuracy"] == 0.36
    assert out["heldout_gain_se"] == pytest.approx(0.16 / math.hypot(0.03, 0.04), abs=0.01)
    assert out["accuracy"]["gain_over_end_se"] == pytest.approx(4.0)
    assert out["k_mean"] == 5.0 and out["startup_s"] == 46.0
    assert out["difficulties"] == [1, 2, 3, 4, 5, 6]
    assert out["groups"] == {"k": 4, "prompts": 6, "uniform_share": 0.5,
                             "all_wrong_share": 0.333, "all_right_share": 0.167,
                             "uniform_share_by_part": [0.5, 0.5, 0.5]}


def test_the_engine_limit_is_clamped_beyond_the_measured_batches():
    assert analysis.engine_limit_at(CURVE, 0.5) == 10.0
    assert analysis.engine_limit_at(CURVE, 200) == 80.0


def test_plot(run_dir, tmp_path):
    out = analysis.analyse(run_dir, 1_000_000, {"1": 50.0}, CURVE, {"Generator": 2900.0}, 400.0)
    out.update(model_path="smollm2-135m-instruct", task="word_arithmetic")
    path = plot(out, tmp_path / "real_model.png")
    assert path.stat().st_size > 10_000


def snapshot(task, name, err, level_err):
    return {"task": task, "snapshot": name, "step": 0 if name == "start" else 8,
            "n_prompts": 80, "samples_per_prompt": 64, "truth_mean": 0.3, "truth_sd": 0.15,
            "truth_noise_sd": 0.05, "truth_by_level": {"1": 0.5}, "truth_within_level_sd": 0.1,
            "error_sd": err + 0.01, "error_sd_noise_removed": err, "bias": 0.2,
            "spearman": 0.4, "reliability": [], "points": [],
            "level_mean_predictor": {"error_sd": level_err + 0.01, "bias": 0.0, "mae": 0.1,
                                     "rmse": 0.1, "spearman": 0.6,
                                     "error_sd_noise_removed": level_err}}


def test_prior_figures_take_the_tasks_last_snapshot_side_by_side_with_level_only():
    """The pinned pair is the last snapshot's (end after start, whatever the file's order),
    only the named task's snapshots are taken, and each keeps the level-only predictor."""
    result = {"command": "python -m studies.prior_truth --task word_arithmetic",
              "snapshots": [snapshot("word_arithmetic", "end", 0.12, 0.10),
                            snapshot("stepwise", "end", 0.5, 0.5),
                            snapshot("word_arithmetic", "start", 0.15, 0.14)],
              "runs": {"word_arithmetic": {"command": "python -m studies.prior_truth "
                                                      "--task word_arithmetic", "date": "d"}}}
    out = analysis.prior_figures(result, "word_arithmetic")
    assert out["prior_snapshot"] == "end"
    assert out["prior_error_sd_noise_removed"] == 0.12
    assert out["level_only_error_sd_noise_removed"] == 0.10
    rows = out["prior_truth"]["snapshots"]
    assert [r["snapshot"] for r in rows] == ["start", "end"]
    assert rows[0]["level_only"]["error_sd_noise_removed"] == 0.14
    assert "points" not in rows[0]


PT = "python -m studies.prior_truth"


def prior_truth_file():
    """A prior_truth result whose latest invocation measured another task (stepwise, where
    prompts recur) after the word_arithmetic run: each run's command and date under
    ``runs.<task>``, the latest at the top level."""
    recurring = [{**snapshot("word_arithmetic", n, 0.9, 0.9), "recurring": True}
                 for n in ("start", "end")]
    return {"command": f"{PT} --task stepwise --recurring 64", "date": "2026-12-05T06:34",
            "snapshots": [snapshot("word_arithmetic", "start", 0.15, 0.14),
                          snapshot("word_arithmetic", "end", 0.12, 0.10), *recurring,
                          {**snapshot("stepwise", "end", 0.5, 0.5), "recurring": True}],
            "runs": {"word_arithmetic": {"command": f"{PT} --task word_arithmetic",
                                         "date": "2026-12-04T22:44"},
                     "word_arithmetic_recurring": {"command": f"{PT} --task word_arithmetic "
                                                   "--recurring 64", "date": "2026-12-05T01:00"},
                     "stepwise_recurring": {"command": f"{PT} --task stepwise --recurring 64",
                                            "date": "2026-12-05T06:34"}}}


def test_prior_figures_credit_the_run_of_their_own_task_not_the_files_latest_command():
    """The figures are ``runs.<task>``'s: its command and date (the file's top-level command
    measured another task), its snapshots (not the task's recurring setting's)."""
    out = analysis.prior_figures(prior_truth_file(), "word_arithmetic")
    assert out["prior_truth"]["command"] == f"{PT} --task word_arithmetic"
    assert out["prior_truth"]["date"] == "2026-12-04T22:44"
    assert [r["snapshot"] for r in out["prior_truth"]["snapshots"]] == ["start", "end"]
    assert out["prior_error_sd_noise_removed"] == 0.12  # not the recurring run's 0.9
    no_run = {**prior_truth_file(), "runs": {}}
    with pytest.raises(ValueError, match="no command for task 'word_arithmetic'"):
        analysis.prior_figures(no_run, "word_arithmetic")


def test_add_prior_truth_writes_the_tasks_run_into_real_model_json(tmp_path):
    """``python -m bench.real_model --prior-truth FILE``: real_model.json's ``prior_truth``
    block names the run of its own task, as test_results_reproduce checks of the committed
    file."""
    from bench.real_model.__main__ import add_prior_truth

    pt = tmp_path / "prior_truth.json"
    pt.write_text(json.dumps(prior_truth_file()))
    rm = tmp_path / "real_model.json"
    rm.write_text(json.dumps({"config": "configs/smollm2-135m.yaml", "overrides": [],
                              "task": "word_arithmetic"}))
    assert add_prior_truth(rm, pt, ["--prior-truth", str(pt)]) == 0
    got = json.loads(rm.read_text())
    run = prior_truth_file()["runs"][got["task"]]
    assert (got["prior_truth"]["command"], got["prior_truth"]["date"]) == (run["command"],
                                                                         run["date"])
    assert got["prior_error_sd_noise_removed"] == 0.12


def test_prior_figures_name_a_missing_task():
    with pytest.raises(ValueError, match="no snapshot of task 'word_arithmetic'.*stepwise"):
        analysis.prior_figures({"snapshots": [snapshot("stepwise", "start", 0.1, 0.1)]},
                               "word_arithmetic")


def test_units_name_the_runs_sampling_temperature():
    assert "T = 0.7" in analysis.units(0.7) and "T = 1," in analysis.units(1.0)
