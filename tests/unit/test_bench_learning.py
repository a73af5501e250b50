"""bench.learning's arithmetic on hand-built curves: interpolation, the seeds' mean, first
reach, the pinned summary, zero-advantage share and the prior's quality."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.learning.analysis import (final_stats, first_reach, interp, mean_curve,
                                     prior_quality, read_curve, summarise,
                                     zero_advantage_share)


def run(accs, rollouts_per_eval=100, seconds_per_eval=10.0, grads=(1.0, 2.0, 3.0)):
    pts = [{"step": i, "train_s": i * seconds_per_eval, "rollouts": i * rollouts_per_eval,
            "trained_tokens": i * rollouts_per_eval * 50, "accuracy": a, "se": 0.02}
           for i, a in enumerate(accs)]
    return {"points": pts, "grad_norms": list(grads), "zero_advantage_share": 0.25, "k_mean": 6.0}


def test_interp_is_linear_between_points_and_nan_past_the_end():
    r = run([0.5, 0.7, 0.8])
    got = interp(r["points"], "rollouts", np.array([0, 50, 100, 150, 200, 201]))
    assert got[:5] == pytest.approx([0.5, 0.6, 0.7, 0.75, 0.8])
    assert math.isnan(got[5])


def test_mean_curve_averages_seeds_up_to_the_shortest_run():
    a, b = run([0.5, 0.7, 0.9]), run([0.5, 0.5])
    c = mean_curve([a, b], "train_s", n=3)
    assert c["x"] == [0.0, 5.0, 10.0]
    assert c["mean"] == pytest.approx([0.5, 0.55, 0.6])
    assert c["min"] == pytest.approx([0.5, 0.5, 0.5]) and c["max"] == pytest.approx([0.5, 0.6, 0.7])
    assert c["se"][2] == pytest.approx(np.std([0.7, 0.5], ddof=1) / math.sqrt(2))


def test_first_reach_finds_the_crossing_or_none():
    r = [run([0.5, 0.7, 0.9])]
    assert first_reach(r, "rollouts", 0.8, n=201) == pytest.approx(150, abs=1.0)
    assert first_reach(r, "rollouts", 0.95) is None
    assert first_reach(r, "rollouts", 0.5) == 0.0


def test_final_stats_over_seeds():
    f = final_stats([run([0.5, 0.8]), run([0.5, 0.6])])
    assert f["mean"] == pytest.approx(0.7) and f["seeds"] == [0.8, 0.6]
    assert f["se"] == pytest.approx(np.std([0.8, 0.6], ddof=1) / math.sqrt(2))


def test_summary_uses_the_stronger_grpo16_and_reports_fractions_of_its_totals():
    runs = {
        # V0.5 reaches 0.8 after 150 rollouts / 15 s.
        "async_v05": [run([0.5, 0.7, 0.9, 0.9])],
        # sync GRPO-16 ends at 0.8 after 1000 rollouts and 40 s; async GRPO-16 lower.
        "sync_grpo16": [run([0.5, 0.6, 0.7, 0.75, 0.8], rollouts_per_eval=250)],
        "async_grpo16": [run([0.5, 0.55, 0.6], rollouts_per_eval=250)],
        "async_grpo4": [run([0.5, 0.6, 0.65, 0.7])],
    }
    s = summarise(runs)
    assert s["grpo16_reference"] == "sync_grpo16" and s["grpo16_final_target"] == pytest.approx(0.8)
    assert s["v05_rollouts_to_reach_grpo16_final"] == pytest.approx(150 / 1000, abs=0.01)
    assert s["v05_wallclock_to_reach_grpo16_final"] == pytest.approx(15 / 40, abs=0.01)
    assert s["by_grpo16_mode"]["async_grpo16"]["rollouts"] == pytest.approx(50 / 500, abs=0.01)
    eq = s["v05_minus_grpo4_at_equal_rollouts"]
    assert eq["min"] > 0 and eq["rollouts"][-1] == pytest.approx(300)
    assert s["grad_norm_var_over_steps"]["async_v05"] == pytest.approx(np.var([1.0, 2.0, 3.0]))
    assert s["final_accuracy"]["async_grpo4"]["mean"] == pytest.approx(0.7)


def test_summary_says_none_when_v05_never_reaches():
    s = summarise({"async_v05": [run([0.5, 0.6])], "sync_grpo16": [run([0.5, 0.9])]})
    assert s["v05_rollouts_to_reach_grpo16_final"] is None
    assert s["v05_wallclock_to_reach_grpo16_final"] is None


def test_zero_advantage_share():
    prompts = [{"rewards": [1, 1, 1, 1], "baseline": 1.0},     # all equal: GRPO's zero
               {"rewards": [1, 1, 1, 1], "baseline": 0.6},     # the prior disagrees: signal
               {"rewards": [1, -1, 1, 1], "baseline": 0.5}]
    assert zero_advantage_share(prompts) == pytest.approx(1 / 3)
    assert zero_advantage_share(prompts, zero_uniform=True) == pytest.approx(2 / 3)
    assert zero_advantage_share([]) is None


def test_prior_quality_error_auc_and_reliability():
    # Two steps; the prior ranks each step's prompts in the observed order, offset by +0.1.
    prompts = []
    for step in (1, 2):
        for rate in (0.0, 0.25, 0.5, 1.0):
            wins = round(4 * rate)
            prompts.append({"step": step, "prior_p": min(1.0, rate + 0.1),
                            "rewards": [1.0] * wins + [-1.0] * (4 - wins),
                            "prior_accepted": rate > 0.4})
    q = prior_quality(prompts, bins=2)
    assert q["prompts"] == 8 and q["auc_within_step"] == pytest.approx(1.0)
    assert q["abs_error"] == pytest.approx(np.mean([0.1, 0.1, 0.1, 0.0]))
    low, high = q["reliability"]
    assert (low["count"], high["count"]) == (4, 4)
    assert low["observed_mean"] == pytest.approx(0.125) and high["p_mean"] == pytest.approx(0.8)
    assert q["accepted"] == pytest.approx(0.5)
    assert prior_quality([{"prior_p": None, "rewards": [1.0]}]) is None


def test_prior_quality_uses_the_tasks_reward_range():
    # Every prompt succeeded but one shaped below r_lo (overlong): rates 1, 1 and 0 (clipped),
    # not the run's own min-max rescaling.
    prompts = [{"step": 1, "prior_p": 0.9, "rewards": [1.0, 1.0]},
               {"step": 1, "prior_p": 0.7, "rewards": [1.0, 1.0]},
               {"step": 1, "prior_p": 0.1, "rewards": [-1.5, -1.0]}]
    q = prior_quality(prompts)
    assert q["abs_error"] == pytest.approx(np.mean([0.1, 0.3, 0.1]))
    q = prior_quality([{"prior_p": 0.5, "rewards": [0.0, 1.0]},
                       {"prior_p": 0.5, "rewards": [1.0, 1.0]}], rewards=(0.0, 1.0))
    assert q["abs_error"] == pytest.approx(0.5 * (0.0 + 0.5))


def test_read_curve_from_run_files(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({
        "eval_sampled_initial": 0.5, "eval_sampled_initial_se": 0.03, "eval_greedy_initial": 0.9,
        "prompts_trained": 4, "eval_time_s": 7.0, "rollouts_dispatched": 26,
        "drop_reasons": {"filtered_all_equal": 2}, "prompts_drawn": 9, "prompts_deferred": 3}))
    rows = [{"step": 1, "step_time_s": 2.0, "rollouts": 8, "trained_tokens": 400, "grad_norm": 0.1,
             "generated_rollouts": 12},
            {"step": 2, "step_time_s": 3.0, "rollouts": 10, "trained_tokens": 500, "grad_norm": 0.3,
             "eval_sampled": 0.6, "eval_sampled_se": 0.02, "eval_greedy": 0.95,
             "generated_rollouts": 26}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = [{"k": 4, "rewards": [1, 1, 1, 1], "baseline": 1.0, "prior_p": None, "step": 1},
               {"k": 6, "rewards": [1, -1, 1, 1, 1, 1], "baseline": 0.5, "prior_p": None,
                "step": 2}]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    c = read_curve(tmp_path, "sampled")
    assert [p["accuracy"] for p in c["points"]] == [0.5, 0.6]
    assert c["points"][1] | {} == {"step": 2, "train_s": 5.0, "rollouts": 18, "generated": 26,
                                   "trained_tokens": 900, "accuracy": 0.6, "se": 0.02,
                                   "greedy": 0.95}
    assert c["grad_norms"] == [0.1, 0.3] and c["zero_advantage_share"] == 0.5
    # every generated rollout counted: the uniform group's 4 and the two filtered groups' 4 each
    g = c["generated"]
    assert g["zero_advantage_rollouts"] == 4 + 2 * 4 and g["zero_advantage_share"] == 12 / 26
    assert g["uniform_share"] == 12 / 26 and g["skip_rate"] == 3 / 9
    assert c["k_mean"] == 5.0 and c["prior"] is None


def test_prior_against_levels_scores_both_against_the_rollouts_rates_in_windows():
    from bench.learning.analysis import prior_against_levels

    def row(step, prompt, wins, p):
        return {"step": step, "prompt": prompt, "prior_p": p,
                "rewards": [1.0] * wins + [-1.0] * (4 - wins)}
    level_of = {"a": 1, "b": 1, "c": 2, "d": 2, "e": 1}
    prompts = [row(1, "a", 4, 0.5), row(2, "c", 0, 0.5),          # the first third: no window
               row(3, "a", 2, 0.5), row(4, "b", 2, 0.4), row(4, "c", 1, 0.5),
               row(5, "a", 4, 0.9), row(6, "b", 2, 0.6),          # the end: hand-computed
               row(6, "c", 0, 0.2), row(6, "d", 1, 0.1),
               row(6, "unknown", 4, 0.0), {**row(6, "e", 4, None)}]  # no level; no prior
    w = prior_against_levels(prompts, level_of)
    end = w["end"]
    assert end["steps"] == [5, 6] and end["prompts"] == 4
    # rates 1, .5, 0, .25; the level predictor: the level's other prompts, .5, 1, .25, 0
    d = [0.1 ** 2 - 0.5 ** 2, 0.1 ** 2 - 0.5 ** 2, 0.2 ** 2 - 0.25 ** 2, 0.15 ** 2 - 0.25 ** 2]
    assert end["mse_difference"]["mean"] == pytest.approx(np.mean(d))
    assert end["mse_difference"]["se"] == pytest.approx(np.std(d, ddof=1) / 2)
    noise = np.mean([0.0, 0.25 / 3, 0.0, 0.1875 / 3])      # rate (1 - rate) / (k - 1)
    assert end["prior_rmse_noise_removed"] == 0.0         # below the noise: clipped at 0
    assert end["levels_rmse_noise_removed"] == pytest.approx(
        np.sqrt(np.mean([0.25, 0.25, 0.0625, 0.0625]) - noise))
    # the middle (steps 3-4): level 2 has one prompt, predicted by the window's others
    mid = w["middle"]
    assert mid["prompts"] == 3 and mid["steps"] == [3, 4]
    assert mid["mse_difference"]["mean"] == pytest.approx(np.mean(
        [0.0 - 0.0, (0.4 - 0.5) ** 2 - 0.0, (0.5 - 0.25) ** 2 - (0.5 - 0.25) ** 2]))
    assert prior_against_levels([{**p, "prior_p": None} for p in prompts], level_of) is None
    assert prior_against_levels(prompts, {}) is None


def test_read_curve_reads_the_levels_from_the_runs_task(tmp_path):
    """A run's levels come from its task (its config.yaml); over seeds, the mode's figure is
    the per-run differences' mean and SE."""
    import yaml

    from bench.learning.per_rollout import prior_vs_levels
    from cluster.config.schema import build_config
    from tasks import make_task_from_config

    cfg = build_config({"task": {"name": "word_arithmetic", "difficulties": [1, 5]}})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    train = make_task_from_config(cfg.task).train()[:24]
    (tmp_path / "summary.json").write_text(json.dumps({
        "eval_sampled_initial": 0.5, "eval_sampled_initial_se": 0.03, "prompts_trained": 24,
        "eval_time_s": 1.0}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps(
        {"step": 3, "step_time_s": 1.0, "rollouts": 96, "trained_tokens": 1}) + "\n")
    # the prior says 0.5 everywhere; level 1 always right, level 5 always wrong
    rows = [{"step": 1 + i % 3, "prompt": p.prompt, "prior_p": 0.5, "k": 4, "baseline": 0.0,
             "rewards": [1.0 if p.difficulty == 1 else -1.0] * 4} for i, p in enumerate(train)]
    assert {p.difficulty for p in train} == {1, 5}
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = read_curve(tmp_path, "sampled")["prior_vs_levels"]
    assert w["end"]["mse_difference"]["mean"] == pytest.approx(0.25)   # levels: exact
    assert w["end"]["levels_rmse_noise_removed"] == 0.0
    runs = [{"prior_vs_levels": w}, {"prior_vs_levels": {
        "middle": None, "end": {**w["end"], "mse_difference": {"mean": 0.15, "se": 0.0}}}},
            {"prior_vs_levels": None}]
    m = prior_vs_levels(runs)
    assert m["end"]["mse_difference"]["mean"] == pytest.approx(0.2)
    assert m["end"]["mse_difference"]["seeds"] == pytest.approx([0.25, 0.15])
    assert m["middle"]["mse_difference"]["seeds"] == pytest.approx([0.25])


def seeded(accs_by_seed, **kw):
    out = []
    for seed, accs in enumerate(accs_by_seed):
        r = run(accs, **kw)
        r.update(seed=seed, steps=len(accs) - 1)
        out.append(r)
    return out


def test_controlled_names_the_best_grpo_at_equal_rollouts_and_pairs_by_seed():
    from bench.learning.analysis import controlled

    runs = {
        "async_v05": seeded([[0.5, 0.7, 0.8], [0.5, 0.6, 0.9]]),
        "async_grpo4": seeded([[0.5, 0.65, 0.7], [0.5, 0.55, 0.8]]),
        "async_grpo8": seeded([[0.5, 0.6, 0.6], [0.5, 0.5, 0.7]]),
        # GRPO-2 ran further, but at the common 200 rollouts it is the weakest.
        "async_grpo2": seeded([[0.5, 0.5, 0.55, 0.99], [0.5, 0.5, 0.55, 0.99]]),
        "sync_grpo16": seeded([[0.5, 0.6, 0.7], [0.5, 0.6, 0.7]], rollouts_per_eval=200),
    }
    c = controlled(runs)
    assert c["best_grpo_G"] == 4
    d = c["v05_minus_best_grpo_at_equal_rollouts"]
    assert d["at"] == 200 and d["seeds"] == pytest.approx([0.1, 0.1])
    assert d["mean"] == pytest.approx(0.1) and d["se"] == pytest.approx(0.0, abs=1e-12)
    assert c["grpo_accuracy_at_equal_rollouts"]["G2"] == pytest.approx(0.55)
    # The seeds' mean V0.5 curve (0.5, 0.65, 0.85) crosses sync GRPO-16's final 0.7 at 125 of
    # the 400 rollouts GRPO-16 used.
    assert c["grpo16_reference"] == "sync_grpo16"
    assert c["v05_rollouts_to_reach_grpo16_final"] == pytest.approx(125 / 400, rel=0.02)
    assert c["samples_per_update"]["async_v05"] == pytest.approx(100.0)
    assert c["samples_per_update"]["sync_grpo16"] == pytest.approx(200.0)
    assert c["grad_norm_var_over_steps"]["async_v05"] == pytest.approx(np.var([1.0, 2.0, 3.0]))


def test_the_equal_train_s_difference_is_against_the_best_grpo_at_equal_rollouts():
    """``v05_minus_best_grpo_at_equal_train_s`` pairs V0.5 with GRPO-``best_grpo_G`` (the best
    at equal rollouts) while its ``best_grpo_G_on_this_axis`` names the best at equal train_s,
    another G here (as in learning.json's warm start): the key's meaning, which the committed
    files and docs quote, pinned so that the docstring and the figure cannot part."""
    from bench.learning.analysis import controlled

    runs = {"async_v05": seeded([[0.5, 0.65, 0.8], [0.5, 0.65, 0.8]]),
            "async_grpo4": seeded([[0.5, 0.6, 0.7], [0.5, 0.6, 0.7]]),
            # GRPO-16 makes 4x the rollouts a second: behind at equal rollouts, ahead at
            # equal train_s
            "async_grpo16": seeded([[0.5, 0.6, 0.9], [0.5, 0.6, 0.9]], rollouts_per_eval=400)}
    c = controlled(runs)
    assert c["best_grpo_G"] == 4
    t = c["v05_minus_best_grpo_at_equal_train_s"]
    assert t["best_grpo_G_on_this_axis"] == 16 and t["at"] == 20.0
    assert t["mean"] == pytest.approx(0.8 - 0.7)  # against GRPO-4, not GRPO-16's -0.1
    assert c["grpo_accuracy_at_equal_train_s"]["G16"] == pytest.approx(0.9)
    assert c["v05_minus_best_grpo_at_equal_rollouts"]["best_grpo_G_on_this_axis"] == 4


def test_baselines_pairs_each_mode_with_drgrpo4_at_the_common_update():
    from bench.learning.analysis import baselines

    def study(accs_by_seed, samples, prompts, noise):
        out = seeded(accs_by_seed)
        for r in out:
            r.update(samples_per_update=list(samples), prompts_per_update=list(prompts),
                     grad_noise=list(noise))
        return out

    runs = {
        "async_drgrpo4": study([[0.5, 0.6, 0.7], [0.4, 0.5, 0.6]], [64, 64, 40], [16] * 3,
                               [4.0, 6.0, 5.0]),
        "async_oracle4": study([[0.5, 0.7, 0.8], [0.4, 0.6, 0.75]], [64] * 3, [16] * 3,
                               [2.0, 3.0, 9.0]),
        # V0.5 ran one update further: compared at step 2, where every mode got to.
        "async_v05": study([[0.5, 0.65, 0.75, 0.99], [0.4, 0.5, 0.65, 0.99]], [64] * 4,
                           [12, 11, 13, 9], []),
    }
    b = baselines(runs)
    assert b["at_step"] == 2
    o, v = b["oracle_minus_drgrpo4"], b["v05_minus_drgrpo4"]
    assert o["seeds"] == pytest.approx([0.1, 0.15]) and o["mean"] == pytest.approx(0.125)
    assert o["se"] == pytest.approx(0.025) and v["seeds"] == pytest.approx([0.05, 0.05])
    assert b["v05_share_of_oracle_margin"] == pytest.approx(0.05 / 0.125)
    # per update, each run's last (short) batch left out
    assert b["samples_per_update"]["async_drgrpo4"] == {"mean": 64.0, "min": 64.0, "max": 64.0}
    assert b["prompts_per_update"]["async_v05"]["mean"] == pytest.approx(12.0)
    assert b["grad_noise_to_signal"]["async_oracle4"]["median_mean"] == pytest.approx(3.0)
    assert b["grad_noise_to_signal"]["async_v05"] is None  # not measured
    # the paired study's synchronous, seeded modes: the same figures under the same names
    paired = baselines({m.replace("async_", "sync_"): r for m, r in runs.items()})
    assert paired["oracle_minus_drgrpo4"] == o and paired["v05_minus_drgrpo4"] == v
    assert paired["at_step"] == 2 and "v05_minus_drgrpo4" in paired


def test_the_paired_study_runs_every_mode_synchronous_and_seeded():
    """--baselines --paired: Dr.GRPO-4, the oracle and V0.5 synchronous, each training
    rollout seeded (rollout.seeded), so that at one seed they start on the same responses."""
    from bench.learning.__main__ import PAIRED_MODES, Settings, parse_args, run_config
    from cluster.config.schema import build_config

    st = Settings.of(parse_args(["--baselines", "--paired"]))
    assert st.modes == PAIRED_MODES and st.steps == 60 and st.seeded
    base = build_config({}).model_dump(mode="json")
    for mode in st.modes:
        cfg = run_config(base, mode, 3, "/tmp/unused", st.seeded)
        assert cfg.mode == "sync" and cfg.rollout.seeded and cfg.run.seed == 3
        # the seeding is the study's: the same mode unseeded is bench.throughput's
        assert not run_config(base, mode, 3, "/tmp/unused").rollout.seeded
    oracle = run_config(base, "sync_oracle4", 0, "/tmp/unused")
    assert (oracle.algo.name, oracle.algo.train_k) == ("oracle", 4)


def test_keep_runs_from_takes_the_other_modes_of_a_like_study_and_refuses_an_unlike_one(
        tmp_path):
    """--keep-runs-from FILE: the modes not run now come from FILE's study of this start and
    kind, in its order; a study of other sizes is refused, naming what differs."""
    from bench.learning.__main__ import Settings, kept_runs, parse_args

    runs = {"sync_drgrpo4": seeded([[0.2, 0.3]]), "sync_v05": seeded([[0.2, 0.1]]),
            "sync_oracle4": seeded([[0.2, 0.4]])}
    study = {"config": {"start": "warm", "budget_steps": 48, "seeds": 5, "evals": 2,
                        "eval_prompts": 500, "file": "v05.yaml", "batch_samples": 64},
             "runs": runs, "command": "python -m bench.learning ...", "date": "d",
             "summary": {"baselines": {"warm": {}}}}
    path = tmp_path / "paired.json"
    path.write_text(json.dumps({"studies": {"warm-baselines": study}}))
    args = ["--baselines", "--paired", "--modes", "sync_v05", "--steps", "48", "--seeds", "5",
            "--evals", "2", "--eval-prompts", "500"]
    kept = kept_runs(path, Settings.of(parse_args(args)), "warm-baselines")
    assert kept["modes"] == ["sync_drgrpo4", "sync_oracle4"] and "sync_v05" not in kept["runs"]
    assert kept["order"] == list(runs) and kept["runs"]["sync_oracle4"] == runs["sync_oracle4"]
    with pytest.raises(SystemExit, match="'seeds': \\(5, 3\\)"):
        kept_runs(path, Settings.of(parse_args(args[:-5] + ["3"] + args[-4:])), "warm-baselines")
    with pytest.raises(SystemExit, match="no study 'warm'"):
        kept_runs(path, Settings.of(parse_args(args)), "warm")


def test_add_seeds_from_keeps_every_mode_and_starts_after_its_seeds(tmp_path):
    """--add-seeds-from FILE: every mode's runs of FILE's study kept; the modes asked for run
    from the first seed FILE lacks; a mode FILE lacks, seeds FILE already has or a study of
    other sizes are refused."""
    from bench.learning.__main__ import Settings, kept_runs, parse_args

    runs = {"sync_drgrpo4": seeded([[0.2, 0.3], [0.2, 0.4], [0.1, 0.2]]),
            "sync_v05": seeded([[0.2, 0.1], [0.2, 0.3], [0.1, 0.1]])}
    study = {"config": {"start": "warm", "budget_rollouts": 3072, "seeds": 3, "evals": 6,
                        "eval_prompts": 300, "file": "v05.yaml", "batch_samples": 64},
             "runs": runs, "command": "python -m bench.learning --selection ...", "date": "d"}
    path = tmp_path / "selection.json"
    path.write_text(json.dumps({"studies": {"warm": study}}))
    args = ["--selection", "--modes", "sync_drgrpo4", "--seeds", "5", "--evals", "6",
            "--eval-prompts", "300"]
    kept = kept_runs(path, Settings.of(parse_args(args)), "warm", more_seeds=True)
    assert kept["first_seed"] == 3 and kept["runs"] == runs and kept["order"] == list(runs)
    assert kept["runs_kept_from"] is None  # FILE's study ran all its own runs
    with pytest.raises(SystemExit, match="none after them"):
        kept_runs(path, Settings.of(parse_args(args[:4] + ["3"] + args[5:])), "warm",
                  more_seeds=True)
    with pytest.raises(SystemExit, match="no runs of \\['sync_js4'\\]"):
        kept_runs(path, Settings.of(parse_args(["--selection", "--modes", "sync_js4"]
                                               + args[3:])), "warm", more_seeds=True)
    with pytest.raises(SystemExit, match="'evals': \\(6, 3\\)"):
        kept_runs(path, Settings.of(parse_args(args[:-3] + ["3"] + args[-2:])), "warm",
                  more_seeds=True)


def test_merge_keeps_each_start_and_gathers_their_controlled_summaries(tmp_path):
    from bench.learning.__main__ import merge

    path = tmp_path / "learning.json"
    first = {"config": {"start": "warm"}, "runs": {}, "summary": {"controlled": {"warm": {"x": 1}}}}
    path.write_text(json.dumps(merge(first, path)))
    second = {"config": {"start": "weak"}, "runs": {}, "summary": {"controlled": {"weak": {"x": 2}}}}
    got = merge(second, path)
    assert set(got["studies"]) == {"warm", "weak"}
    assert got["summary"]["controlled"] == {"warm": {"x": 1}, "weak": {"x": 2}}
    assert got["config"]["start"] == "weak"  # the top level is the latest invocation
    # The baseline study of a start sits beside its controlled study, not over it; the top
    # level is the newest invocation, whichever study it was.
    path.write_text(json.dumps(got))
    base = {"config": {"start": "warm"}, "runs": {"async_oracle4": []},
            "summary": {"controlled": {"warm": {"x": 3}}, "baselines": {"warm": {"y": 4}}}}
    got = merge(base, path)
    assert set(got["studies"]) == {"warm", "weak", "warm-baselines"}
    assert got["summary"]["controlled"] == {"warm": {"x": 1}, "weak": {"x": 2}}
    assert got["summary"]["baselines"] == {"warm": {"y": 4}}
    assert got["config"]["start"] == "warm" and "async_oracle4" in got["runs"]
    assert got["studies"]["weak"]["config"]["start"] == "weak"  # still there, pinned


def test_merging_a_baseline_study_rerun_makes_it_the_top_level_and_keeps_superseded(tmp_path):
    """A baseline study re-run into its file (--keep-runs-from, or --out onto an existing
    file): the top level is the new invocation, as its ``studies`` entry and its
    ``summary.baselines`` are (the file no longer contradicts itself, as 8a3867a found), and
    the replaced invocation is appended to the file's ``superseded`` versions, which are kept."""
    from bench.learning.__main__ import merge

    def study(date, runs):
        return {"command": f"python -m bench.learning --baselines --paired # {date}",
                "date": date, "config": {"start": "warm"}, "runs": runs, "curves": {},
                "summary": {"controlled": {"warm": {}}, "baselines": {"warm": {"d": date}}}}

    path = tmp_path / "learning_baselines_paired.json"
    first = study("2026-12-04", {"sync_drgrpo4": [1], "sync_v05": [1]})
    written = merge(first, path)
    assert "superseded" not in written  # nothing replaced yet
    earlier = {"commit": "5e9e08a", "date": "2026-12-03", "command": "python -m ..."}
    path.write_text(json.dumps({**written, "superseded": {"note": "n", "versions": [earlier]}}))
    second = study("2026-12-05", {"sync_drgrpo4": [1], "sync_v05": [2]})
    got = merge(second, path)
    assert (got["command"], got["date"], got["runs"]) == (second["command"], "2026-12-05",
                                                          second["runs"])
    assert {k: v for k, v in got.items() if k not in ("studies", "superseded", "summary")} == {
        k: v for k, v in got["studies"]["warm-baselines"].items() if k != "summary"}
    assert got["summary"]["baselines"] == {"warm": {"d": "2026-12-05"}}
    assert got["summary"]["controlled"] == {}
    assert got["superseded"]["note"] == "n"
    assert got["superseded"]["versions"] == [
        earlier, {"date": "2026-12-04", "command": first["command"], "ran_at_commit": None}]
    # merging the same invocation again replaces nothing
    path.write_text(json.dumps(got))
    assert merge(second, path) == got


def test_merge_from_folds_a_separate_study_file_in_unchanged(tmp_path):
    from bench.learning.__main__ import main

    runs = {"async_drgrpo4": seeded([[0.2, 0.3]]), "async_oracle4": seeded([[0.2, 0.4]])}
    study = {"config": {"start": "warm", "budget_steps": 2, "budget_train_s": None,
                        "seeds": 1, "task": "stepwise", "eval_metric": "sampled",
                        "eval_prompts": 8}, "runs": runs, "curves": {},
             "summary": {"controlled": {"warm": {}}, "baselines": {"warm": {"z": 1}},
                         "final_accuracy": {}}}
    (tmp_path / "b.json").write_text(json.dumps(study))
    (tmp_path / "learning.json").write_text(json.dumps(
        {"config": {"start": "warm"}, "runs": {}, "summary": {"controlled": {"warm": {"x": 1}}}}))
    assert main(["--merge-from", str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "learning.json")]) == 0
    got = json.loads((tmp_path / "learning.json").read_text())
    assert got["studies"]["warm-baselines"]["runs"] == runs
    assert got["summary"]["baselines"] == {"warm": {"z": 1}}
    assert got["summary"]["controlled"] == {"warm": {"x": 1}}
    assert (tmp_path / "learning_baselines.png").is_file()
    # another start's baseline study keeps its own plot: the warm one's is not overwritten
    before = (tmp_path / "learning_baselines.png").read_bytes()
    study["config"]["start"] = "weak"
    study["summary"]["baselines"] = {"weak": {"z": 2}}
    (tmp_path / "b.json").write_text(json.dumps(study))
    assert main(["--merge-from", str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "learning.json")]) == 0
    assert (tmp_path / "learning_weak_baselines.png").is_file()
    assert (tmp_path / "learning_baselines.png").read_bytes() == before
    got = json.loads((tmp_path / "learning.json").read_text())
    assert got["summary"]["baselines"] == {"warm": {"z": 1}, "weak": {"z": 2}}


def test_a_mode_with_its_own_prior_options_gets_them_in_its_config(tmp_path):
    from bench.learning.__main__ import run_config
    from cluster.config.schema import load_config

    base = json.loads(json.dumps(load_config("v05.yaml", []).model_dump(mode="json")))
    old = run_config(base, "async_v05_prior1203", 3, tmp_path)
    assert old.prior.options == {"views": ["embedding", "ngram", "both"],
                                 "weigh_rollouts": False}
    assert old.algo.name == "v05" and old.run.seed == 3
    assert run_config(base, "async_v05", 3, tmp_path).prior.options == base["prior"]["options"]


def per_rollout_runs(accs_by_seed, generated_per_eval, zero=0.4, skip=0.0):
    out = seeded(accs_by_seed, rollouts_per_eval=64)
    for r in out:
        for i, q in enumerate(r["points"]):
            q["generated"] = i * generated_per_eval
        r["generated"] = {"zero_advantage_share": zero, "uniform_share": zero, "skip_rate": skip}
    return out


def test_the_per_rollout_reading_picks_the_best_baseline_at_equal_generated_rollouts():
    """Every mode is read at the generated rollouts every run reached (linear between
    evaluations); DAPO generated twice as much per update, so it is read at its half-way
    point; the best baseline is picked after the runs among the baselines only, and the
    selection mode minus it is paired by seed."""
    from bench.learning.per_rollout import setting_summary, verdict

    runs = {"sync_drgrpo4": per_rollout_runs([[0.5, 0.6, 0.7], [0.5, 0.62, 0.72]], 100),
            # over-samples: at 200 generated rollouts it is at its first evaluation
            "sync_dapo4": per_rollout_runs([[0.5, 0.69, 0.9], [0.5, 0.71, 0.95]], 200),
            "sync_v05_k4_sel": per_rollout_runs([[0.5, 0.66, 0.76], [0.5, 0.66, 0.78]], 100,
                                                zero=0.1, skip=0.3),
            # not a baseline: never picked as the one to beat, however good
            "sync_v05": per_rollout_runs([[0.5, 0.9, 0.99], [0.5, 0.9, 0.99]], 100)}
    s = setting_summary(runs, "sync_v05_k4_sel", ("sync_drgrpo4", "sync_dapo4", "sync_js4"),
                        "sync_drgrpo4")
    assert s["at_generated_rollouts"] == 200
    assert s["modes"]["sync_dapo4"]["accuracy_at_equal_rollouts"]["seeds"] == \
        pytest.approx([0.69, 0.71])
    assert s["best_baseline"] == "sync_drgrpo4"   # 0.71 at 200 against DAPO's 0.70
    d = s["selection_minus_best"]
    assert d["seeds"] == pytest.approx([0.06, 0.06]) and d["se"] == pytest.approx(0.0)
    assert verdict(d) == "ahead" and verdict({"mean": -0.01, "se": 0.004}) == "behind"
    assert verdict({"mean": 0.01, "se": 0.006}) == "tie"
    # the area: the mean accuracy over [0, 200] of the linear curve
    auc = s["modes"]["sync_drgrpo4"]["auc"]["seeds"][0]
    assert auc == pytest.approx(np.mean(interp(runs["sync_drgrpo4"][0]["points"], "generated",
                                               np.linspace(0, 200, 400))))
    assert s["zero_advantage_share_vs_reference"] == pytest.approx(0.25)
    assert s["modes"]["sync_v05_k4_sel"]["skip_rate"] == pytest.approx(0.3)


def test_from_runs_reads_only_finished_runs_of_this_invocations_configs(tmp_path, monkeypatch):
    """--from-runs DIR: an interrupted invocation's runs stand in for this one's only where
    each finished (summary.json) and is the run this invocation would make (its config)."""
    import yaml

    from bench.learning.__main__ import Settings, parse_args, run_config, runs_from
    from cluster.config.schema import build_config

    st = Settings.of(parse_args(["--selection", "--seeds", "1", "--modes", "sync_drgrpo4"]))
    base = build_config({}).model_dump(mode="json")
    cfg = run_config(base, "sync_drgrpo4", 0, tmp_path, seeded=True)  # --selection seeds
    where = tmp_path / "sync_drgrpo4-seed0"
    where.mkdir()
    with pytest.raises(SystemExit, match="sync_drgrpo4-seed0 did not finish"):
        runs_from(st, base, tmp_path)
    (where / "summary.json").write_text("{}")
    other = run_config(base, "sync_grpo4", 0, tmp_path, seeded=True).model_dump(mode="json")
    other["run"]["name"] = "sync_drgrpo4-seed0"  # same place, another mode's algorithm
    (where / "config.yaml").write_text(yaml.safe_dump(other))
    with pytest.raises(SystemExit, match="not the run this invocation would make"):
        runs_from(st, base, tmp_path)
    (where / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    import bench.learning.__main__ as cli  # the curve reader has its own tests: here, where
    monkeypatch.setattr(cli, "read_curve", lambda d, metric, rewards: {"dir": str(d)})
    assert runs_from(st, base, tmp_path) == {
        "sync_drgrpo4": [{"dir": str(where), "mode": "sync_drgrpo4", "seed": 0}]}


def test_run_dir_reads_the_runs_finished_there_and_starts_roles_only_for_the_rest(
        tmp_path, monkeypatch):
    """--run-dir DIR: the same command run again reads every run that finished in DIR (no
    roles started when all did) and starts the roles for those that did not."""
    from pathlib import Path

    import yaml

    import bench.learning.__main__ as cli
    from cluster.config.schema import build_config

    st = cli.Settings.of(cli.parse_args(["--selection", "--seeds", "2", "--modes",
                                         "sync_drgrpo4"]))
    base = build_config({}).model_dump(mode="json")
    plan = cli.planned(st, base, tmp_path)
    assert [(seed, mode) for seed, mode, _ in plan] == [(0, "sync_drgrpo4"), (1, "sync_drgrpo4")]

    class Started(Exception):
        pass

    def roles(*a, **kw):
        raise Started
    monkeypatch.setattr(cli, "shared_roles", roles)
    monkeypatch.setattr(cli, "read_curve", lambda d, metric, rewards: {"dir": str(d)})
    for _, _, cfg in plan[:1]:  # the first finished, the second not
        Path(cfg.run_dir).mkdir()
        (Path(cfg.run_dir) / "summary.json").write_text("{}")
        (Path(cfg.run_dir) / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    with pytest.raises(Started):
        cli.run_all(st, base, tmp_path)
    last = Path(plan[1][2].run_dir)
    last.mkdir()
    (last / "config.yaml").write_text(yaml.safe_dump(plan[1][2].model_dump(mode="json")))
    (last / "summary.json").write_text('{"status": "preempted"}')  # stopped early: run again
    with pytest.raises(Started):
        cli.run_all(st, base, tmp_path)
    (last / "summary.json").write_text('{"status": "finished"}')
    (last / "config.yaml").write_text(yaml.safe_dump(plan[1][2].model_dump(mode="json")))
    assert cli.run_all(st, base, tmp_path) == {"sync_drgrpo4": [
        {"dir": str(Path(c.run_dir)), "mode": "sync_drgrpo4", "seed": seed}
        for seed, _, c in plan]}
    # the folder moved (a later sitting's clone): its runs are still the ones this makes
    moved = tmp_path.parent / "moved"
    tmp_path.rename(moved)
    assert cli.run_all(st, base, moved) == {"sync_drgrpo4": [
        {"dir": str(moved / c.run.name), "mode": "sync_drgrpo4", "seed": seed}
        for seed, _, c in plan]}


def test_a_run_dir_records_each_invocation_that_wrote_there(tmp_path):
    from bench.learning.__main__ import record_invocation

    where = tmp_path / "study"
    record_invocation(where, ["--selection", "--seeds", "5"])
    record_invocation(where, ["--selection", "--seeds", "5", "learner.threads=2"])
    lines = [json.loads(x) for x in (where / "invocations.jsonl").read_text().splitlines()]
    assert [x["command"] for x in lines] == [
        "python -m bench.learning --selection --seeds 5",
        "python -m bench.learning --selection --seeds 5 learner.threads=2"]
    assert all(x["date"] and "commit" in x for x in lines)


def test_merge_from_folds_each_setting_of_a_per_rollout_study_in_unchanged(tmp_path):
    """--merge-from with the per-rollout study (--selection): each setting written to a file
    of its own folds into --out beside the others, figures unchanged, a plot each."""
    from bench.learning.__main__ import RESULTS, main

    whole = json.loads((RESULTS / "learning_selection.json").read_text())
    names = list(whole["studies"])
    assert len(names) >= 2
    for name in names:
        one = {"summary": {"settings": {name: whole["summary"]["settings"][name]}},
               "studies": {name: whole["studies"][name]}}
        (tmp_path / f"{name}.json").write_text(json.dumps(one))
        assert main(["--merge-from", str(tmp_path / f"{name}.json"),
                     "--out", str(tmp_path / "sel.json")]) == 0
        assert (tmp_path / f"sel_{name}.png").is_file()
    got = json.loads((tmp_path / "sel.json").read_text())
    assert got["summary"]["settings"] == whole["summary"]["settings"]
    assert got["studies"] == whole["studies"]
