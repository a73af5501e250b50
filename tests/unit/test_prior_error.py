"""The prior's error against the truth, online (cluster.records.metrics): each prompt's first k_init
rewards, which every prompt gets whatever the stopping rule decides, give a noise-corrected
estimate of E[(p - mu)^2] and of the bias E[p - mu]; pooled over steps, the run and a window
of recent steps (the trainer), in the summary, the report's table and the dashboard's gauges."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from common.types import PromptRecord
from cluster.records.metrics import (batch_metrics, pool_prior_error, prior_error_terms,
                             rolling_prior_error, run_prior_error)


def _record(prior_p, rewards) -> PromptRecord:
    k = len(rewards)
    return PromptRecord(
        prompt_id="p", uid="s0", prompt="1+1=", k=k, rewards=list(rewards), baseline=0.0,
        prior_p=prior_p, prior_accepted=False, fallback=False, unparsed=0, admitted_version=0,
        deadline=0, versions=[0], generators=[0], rounds=1, cancelled_rollouts=0,
        cancelled_tokens=0, regenerations=0, tokens=k, lengths=[1] * k, prompt_tokens=1,
        t_admit=0.0, t_done=0.0, spans=[])


def synthetic(n: int, error_sd: float, bias: float, k_init: int = 4, seed: int = 0):
    """Prompts with a known true success rate mu and a prior p = mu + bias + noise (clipped),
    binary {-1, +1} rewards; a prompt whose first k_init rewards disagree with its prior gets
    12 more (a stopping rule that looks at them), which the corrected estimate must ignore.
    Returns (records, the true sqrt E[(p - mu)^2], the true E[p - mu], the true E|p - mu|)."""
    rng = np.random.default_rng(seed)
    mu = rng.beta(2.0, 2.0, n)
    p = np.clip(mu + bias + rng.normal(0.0, error_sd, n), 0.0, 1.0)
    records = []
    for pj, mj in zip(p, mu):
        first = np.where(rng.random(k_init) < mj, 1.0, -1.0)
        more = abs((first.mean() + 1) / 2 - pj) > 0.25
        rest = np.where(rng.random(12 if more else 0) < mj, 1.0, -1.0)
        records.append(_record(float(pj), np.concatenate([first, rest]).tolist()))
    return (records, float(np.sqrt(np.mean((p - mu) ** 2))), float(np.mean(p - mu)),
            float(np.mean(np.abs(p - mu))))


def over_steps(records, batch: int = 16) -> dict:
    """A run's figures: steps of ``batch`` prompts (``batch_metrics``), pooled over the steps
    (``pool_prior_error``; ``prior_abs_error`` weighted by prompts, as the trainer's running
    one). Steps, not one batch of thousands: ``prior_auc`` is quadratic in the prompts."""
    steps = [batch_metrics(records[i:i + batch], 4, (-1.0, 1.0))
             for i in range(0, len(records), batch)]
    assert all("prior_error_sd_corrected" in m for m in steps)
    n = sum(m["prior_prompts"] for m in steps)
    return {**pool_prior_error(steps),
            "prior_abs_error": sum(m["prior_abs_error"] * m["prior_prompts"] for m in steps) / n}


@pytest.mark.parametrize("error_sd,bias", [(0.10, 0.0), (0.05, 0.05), (0.20, -0.03)])
def test_the_corrected_estimate_recovers_the_true_error_and_bias(error_sd, bias):
    records, true_sd, true_bias, _ = synthetic(4000, error_sd, bias)
    m = over_steps(records)
    assert m["prior_error_n"] == 4000
    assert m["prior_error_sd_corrected"] == pytest.approx(true_sd, abs=0.02)
    assert m["prior_bias"] == pytest.approx(true_bias, abs=0.01)
    assert m["prior_error_sd_corrected"] ** 2 == pytest.approx(m["prior_error_var_corrected"])


@pytest.mark.parametrize("error_sd,bias,seed", [(0.10, 0.0, 0), (0.05, 0.05, 0), (0.0, 0.0, 1)])
def test_where_the_abs_error_overstates_the_priors_error(error_sd, bias, seed):
    """|p - observed| counts the observed rate's noise too: for a good prior it is far above
    both the true error sd and the true mean |p - mu|; the corrected estimate is not."""
    records, true_sd, _, true_abs = synthetic(4000, error_sd, bias, seed=seed)
    m = over_steps(records)
    assert abs(m["prior_error_sd_corrected"] - true_sd) < 0.02
    assert m["prior_abs_error"] > true_sd + 0.025 and m["prior_abs_error"] > true_abs + 0.04


def test_an_exact_prior_has_a_corrected_variance_near_zero():
    records, true_sd, _, _ = synthetic(4000, 0.0, 0.0, seed=1)
    assert true_sd == 0.0
    m = over_steps(records)
    assert abs(m["prior_error_var_corrected"]) < 0.002  # may fall below 0: kept raw
    assert abs(m["prior_bias"]) < 0.01


def test_by_hand_and_only_the_first_k_init_rewards_count():
    """p = 0.5 with rewards 1, 1, -1, -1: vbar 0.5, (p - vbar)^2 = 0, minus vbar(1 - vbar) /
    (m - 1) = 1/12; p = 0.9 with four successes: 0.01 - 0, bias -0.1."""
    recs = [_record(0.5, [1.0, 1.0, -1.0, -1.0]), _record(0.9, [1.0, 1.0, 1.0, 1.0])]
    m = batch_metrics(recs, 4, (-1.0, 1.0))
    assert m["prior_error_var_corrected"] == pytest.approx((-1 / 12 + 0.01) / 2)
    assert m["prior_error_sd_corrected"] == 0.0  # the estimate is negative
    assert m["prior_bias"] == pytest.approx(-0.05)
    longer = [_record(0.5, [1.0, 1.0, -1.0, -1.0, 1.0, 1.0]), _record(0.9, [1.0] * 4 + [-1.0] * 12)]
    later = batch_metrics(longer, 4, (-1.0, 1.0))
    for key in ("prior_error_var_corrected", "prior_bias"):
        assert later[key] == pytest.approx(m[key])
    assert later["prior_abs_error"] != pytest.approx(m["prior_abs_error"])  # all rewards


def test_reward_ranges_shaping_and_prompts_it_cannot_use():
    # A {0, 1} task gives the same figures as {-1, +1}; a shaped reward below r_lo is a failure.
    a = batch_metrics([_record(0.3, [0.0, 1.0, 1.0])], 3, (0.0, 1.0))
    b = batch_metrics([_record(0.3, [-1.5, 1.0, 1.0])], 3, (-1.0, 1.0))
    want = (0.3 - 2 / 3) ** 2 - (2 / 3) * (1 / 3) / 2
    assert a["prior_error_var_corrected"] == pytest.approx(want)
    assert b["prior_error_var_corrected"] == pytest.approx(want)
    # No prior (fallback), or fewer rewards than k_init: not counted; k_init 1: no estimate.
    m = batch_metrics([_record(None, [1.0] * 4), _record(0.5, [1.0, -1.0])], 4, (-1.0, 1.0))
    assert "prior_error_n" not in m
    assert "prior_error_n" not in batch_metrics([_record(0.5, [1.0])], 1, (-1.0, 1.0))
    with pytest.raises(ValueError, match="m >= 2"):
        prior_error_terms([0.5], [[1.0]])


def test_pooling_steps_equals_the_estimate_over_their_prompts():
    records, *_ = synthetic(300, 0.1, 0.02, seed=2)
    steps = [batch_metrics(records[i:i + 16], 4, (-1.0, 1.0)) for i in range(0, 300, 16)]
    whole = batch_metrics(records, 4, (-1.0, 1.0))
    pooled = pool_prior_error(steps + [{"prompts": 0}])  # a step without a prior is skipped
    assert pooled["prior_error_n"] == 300
    for key in ("prior_error_var_corrected", "prior_error_sd_corrected", "prior_bias"):
        assert pooled[key] == pytest.approx(whole[key])
    rolled = rolling_prior_error(steps, window=3)
    last3 = pool_prior_error(steps[-3:])
    assert rolled["prior_bias"][-1] == pytest.approx(last3["prior_bias"])
    assert rolled["prior_bias"][0] == pytest.approx(steps[0]["prior_bias"])
    assert np.isnan(rolling_prior_error([{"step": 1}])["prior_error_sd_corrected"][0])
    assert pool_prior_error([]) == {}


def test_the_tally_pools_the_run_and_a_window_and_the_summary_and_gauges_read_them():
    """``Tally.prior_error``: running sums in the totals (a resume
    continues them), a window of the last steps; the run's figures in summary.json; the two
    dashboard gauges read keys the step metrics carry."""
    from actors.telemetry import GAUGES
    from dataclasses import replace

    from cluster.records.metrics import Tally
    from cluster.records.step import StepMetrics
    from cluster.records.summary import Totals

    records, *_ = synthetic(160, 0.1, 0.05, seed=3)
    steps = [batch_metrics(records[i:i + 16], 4, (-1.0, 1.0)) for i in range(0, 160, 16)]
    t = Tally()
    t.prior_window = deque(maxlen=3)
    for m in steps:
        last = t.prior_error(m)
    whole = pool_prior_error(steps)
    assert t.totals.prior_error_n == 160
    assert last["prior_bias_running"] == pytest.approx(whole["prior_bias"])
    assert last["prior_error_sd_corrected_running"] == pytest.approx(whole["prior_error_sd_corrected"])
    assert last["prior_bias_window"] == pytest.approx(pool_prior_error(steps[-3:])["prior_bias"])
    assert last["prior_bias_window"] != pytest.approx(last["prior_bias_running"])
    for name in ("v05_prior_error_sd", "v05_prior_bias"):
        assert GAUGES[name][1] in last and GAUGES[name][1] in StepMetrics.__dataclass_fields__
    # The summary's run-level figures come from the same sums.
    s = run_prior_error(replace(t.totals, prior_error_sum=8.0, prior_error_prompts=160))
    assert s["prior_abs_error"] == 0.05
    assert s["prior_error_sd_corrected"] == pytest.approx(whole["prior_error_sd_corrected"])
    assert run_prior_error(Totals()) == {}
    # A step without a prior leaves the sums alone but still reports the run's figures.
    running = t.prior_error({"prompts": 16})
    assert t.totals.prior_error_n == 160 and "prior_bias_running" in running


def test_prior_truth_keeps_each_tasks_command_when_another_task_is_measured():
    """studies.prior_truth replaces one task's snapshots at a time; the other tasks' runs keep
    the command that measured them (an older file named it only at its top level)."""
    from studies.prior_truth.__main__ import runs_with_commands

    old = {"command": "python -m studies.prior_truth --task arithmetic --per-level 50",
           "date": "2026-12-01", "runs": {"stepwise": {"run_dir": "a", "wall_s": 38},
                                           "arithmetic": {"run_dir": "b", "wall_s": 32}}}
    runs = runs_with_commands(old)
    assert runs["arithmetic"]["command"] == old["command"]
    assert "command" not in runs["stepwise"]  # its command was never recorded
    assert "command" not in old["runs"]["arithmetic"]  # the old result is not changed
    newer = {"command": "python -m studies.prior_truth --task word_arithmetic",
             "runs": {**runs, "stepwise": {"run_dir": "a", "command": "python -m bench."
                                           "prior_truth"}}}
    assert runs_with_commands(newer)["arithmetic"]["command"] == old["command"]
    assert runs_with_commands({"command": "python -m studies.prior_truth --quick",
                               "runs": {"stepwise": {}}})["stepwise"]["command"] \
        == "python -m studies.prior_truth --quick"


def test_prior_truth_asks_about_prompts_the_run_trained_when_they_recur():
    """--recurring: the truth is measured on train prompts the run saw (they recur in its
    window); otherwise on train prompts it never saw. ``times_trained`` tells the two apart."""
    from types import SimpleNamespace as NS

    from studies.prior_truth.__main__ import queries, times_trained

    train = [NS(prompt=f"q{i}", difficulty=1 + i % 2) for i in range(12)]
    task = NS(train=lambda: train)
    seen = {f"q{i}" for i in range(6)}
    fresh = queries(task, seen, per_level=2)
    again = queries(task, seen, per_level=2, recurring=True)
    assert {p.prompt for p in fresh}.isdisjoint(seen) and len(fresh) == 4
    assert {p.prompt for p in again} <= seen and {p.difficulty for p in again} == {1, 2}
    assert times_trained([{"prompt": "a"}, {"prompt": "b"}]) == 1.0
    assert times_trained([{"prompt": "a"}] * 3 + [{"prompt": "b"}]) == 2.0


def test_the_windows_level_means_predict_by_level_and_fall_back_to_the_window_mean():
    from studies.prior_truth.analysis import level_window_predictor

    got = level_window_predictor(np.array([1, 2, 3, 1]), [1, 1, 2, None], [1.0, 0.5, 0.25, 0.0])
    # level 1: (1 + 0.5) / 2; level 2: 0.25; level 3 is not in the window: its mean, 1.75 / 4
    assert got.tolist() == pytest.approx([0.75, 0.25, 0.4375, 0.75])


def test_a_prompts_own_history_weighs_rollouts_and_recency_and_falls_back_to_the_mean():
    from types import SimpleNamespace as O

    from studies.prior_truth.analysis import own_history_predictor

    ctx = [O(prompt="a", score=1.0, version=2, rollouts=4),
           O(prompt="a", score=0.0, version=0, rollouts=4),   # two versions older: half
           O(prompt="b", score=0.5, version=2, rollouts=16)]
    got = own_history_predictor(["a", "b", "c"], ctx, halflife=2.0)
    # a: (4 * 1 + 2 * 0) / (4 + 2); b: its one score; c is not in the window: the mean score
    assert got.tolist() == pytest.approx([4 / 6, 0.5, 0.5])
    assert own_history_predictor(["a"], ctx, halflife=None).tolist() == pytest.approx([0.5])


def test_the_in_sample_fit_bounds_every_linear_predictor_on_its_features():
    """Fitted to the truth itself: no other linear combination of the same features (plus a
    constant) comes closer to the truth in squared error."""
    from studies.prior_truth.analysis import in_sample_fit

    rng = np.random.default_rng(4)
    F = rng.normal(size=(60, 3))
    truth = np.clip(0.5 + 0.2 * F[:, 0] + rng.normal(0, 0.1, 60), 0, 1)
    best = float(np.mean((in_sample_fit(F, truth) - truth) ** 2))
    for _ in range(50):
        other = 0.5 + F @ rng.normal(0, 0.2, 3)
        assert np.mean((other - truth) ** 2) >= best
    assert in_sample_fit(F, F @ [0.1, -0.2, 0.3] + 0.4) == pytest.approx(F @ [0.1, -0.2, 0.3] + 0.4)


def test_the_correlation_ceiling_is_what_the_true_rates_reach_against_a_noisy_truth():
    """400 prompts, true rates p, a truth of 16 samples each: the true rates themselves
    correlate with that truth about as the ceiling says, and no better."""
    from studies.prior_truth.analysis import error_stats

    rng = np.random.default_rng(7)
    p = rng.beta(4, 2, size=400)
    truth = rng.binomial(16, p) / 16
    got = error_stats(p, truth, 16)
    pearson = float(np.corrcoef(p, truth)[0, 1])
    assert 0.6 < got["correlation_ceiling"] < 0.95
    assert pearson == pytest.approx(got["correlation_ceiling"], abs=0.04)
    exact = error_stats(p, p, 10**9)  # a noiseless truth: the ceiling is 1
    assert exact["correlation_ceiling"] == pytest.approx(1.0)


def test_a_cached_truth_is_used_again_only_for_the_same_weights(tmp_path, monkeypatch):
    """A run made again in the same directory has new snapshots: the truth kept beside the
    old run must not be read back for them (it once was)."""
    import studies.prior_truth.__main__ as pt

    calls = []

    def sample(path, task, probs, samples, *a, **k):
        calls.append(path)
        return np.full(len(probs), len(calls)), {"s": 0.0}

    monkeypatch.setattr("studies.prior_truth.truth.sample_truth", sample)
    weights = tmp_path / "snap"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"one")
    probs = [type("P", (), {"id": i})() for i in range(3)]
    args = (tmp_path, "end", str(weights), None, probs, 4, 8, 1.0, None)
    first, _ = pt.sample_truth_cached(*args)
    again, _ = pt.sample_truth_cached(*args)
    assert len(calls) == 1 and list(again) == list(first)     # the same weights: cached
    (weights / "model.safetensors").write_bytes(b"two")       # the run made again
    new, _ = pt.sample_truth_cached(*args)
    assert len(calls) == 2 and list(new) != list(first)


def test_repeats_read_the_prior_against_the_level_told_predictor_run_by_run():
    """studies.prior_truth --repeats: per run the prior's and the level-told predictor's error
    (truth noise removed) from that run's points, and over the runs their difference's mean
    and standard error."""
    from studies.prior_truth.analysis import error_stats, level_mean_predictor, repeats_block

    rng = np.random.default_rng(3)
    level = np.repeat([1, 2, 3, 4], 25)
    points = []
    for shift in (0.00, 0.02, 0.05):   # three runs whose priors err more and more
        mu = np.clip(0.95 - 0.2 * level + rng.normal(0, 0.05, 100), 0.01, 0.99)
        truth = rng.binomial(64, mu) / 64
        p = np.clip(mu + rng.normal(0, 0.02 + shift, 100), 0, 1)
        points.append({"truth": truth.tolist(), "p": p.tolist(), "level": level.tolist()})
    block = repeats_block(points, 64, ["a", "b", "c"], {"other": [0.01, 0.02, 0.03]})
    assert block["runs"] == 3 and block["run_dirs"] == ["a", "b", "c"]
    diffs = []
    for pt, prior, lv in zip(points, block["error_sd_noise_removed"]["values"],
                             block["level_error_sd_noise_removed"]["values"]):
        t = np.array(pt["truth"])
        assert prior == pytest.approx(error_stats(np.array(pt["p"]), t, 64)
                                      ["error_sd_noise_removed"])
        assert lv == pytest.approx(error_stats(level_mean_predictor(t, level), t, 64)
                                   ["error_sd_noise_removed"])
        diffs.append(prior - lv)
    d = block["prior_minus_level"]
    assert d["values"] == pytest.approx(diffs)
    assert d["mean"] == pytest.approx(np.mean(diffs))
    assert d["se"] == pytest.approx(np.std(diffs, ddof=1) / np.sqrt(3))
    assert diffs[0] < 0 < diffs[2]   # a good prior beats the levels, a poor one does not
    other = block["variants"]["other"]   # a variant's errors, against the same runs' levels
    assert other["error_sd_noise_removed"]["mean"] == pytest.approx(0.02)
    assert other["minus_level"]["values"] == pytest.approx(
        [e - lv for e, lv in zip((0.01, 0.02, 0.03),
                                 block["level_error_sd_noise_removed"]["values"])])
    assert block["spearman"]["values"][0] > block["spearman"]["values"][2]
    assert repeats_block(points[:1], 64, ["a"])["prior_minus_level"]["se"] is None


def test_repeats_are_made_with_their_own_seed_and_name(tmp_path, monkeypatch):
    """--repeats makes the runs not given by --run-dir, seeds 1.. (run.seed; the config's
    for the first), each in its own directory, and the headline run's snapshots carry the
    repeats of the same snapshot."""
    import subprocess

    import studies.prior_truth.__main__ as pt

    cmds = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: cmds.append(cmd) or
                        type("R", (), {"returncode": 0})())
    dirs = [pt.make_run("stepwise", tmp_path, 40, seed=s) for s in (0, 2)]
    assert [d.name for d in dirs] == ["prior-truth-stepwise", "prior-truth-stepwise-seed2"]
    assert not any(a.startswith("run.seed=") for a in cmds[0]) and "run.seed=2" in cmds[1]
    entry = lambda name, p: {"snapshot": name, "samples_per_prompt": 4,  # noqa: E731
                             "points": {"truth": [0.25, 0.5, 1.0], "p": p, "level": [1, 1, 2]},
                             "variants": {"v": {"error_sd_noise_removed": p[0]}},
                             "level_window_error_sd_noise_removed": p[1]}
    runs = [[entry("start", [0.2, 0.6, 0.9]), entry("end", [0.3, 0.5, 0.9])],
            [entry("end", [0.1, 0.4, 0.8]), entry("start", [0.3, 0.5, 0.9])]]
    head = pt.with_repeats(runs, dirs)
    assert head is runs[0]
    assert [e["repeats"]["points"][1]["p"] for e in head] == [[0.3, 0.5, 0.9], [0.1, 0.4, 0.8]]
    assert [e["repeats"]["variants"]["v"]["error_sd_noise_removed"]["values"] for e in head] \
        == [[0.2, 0.3], [0.3, 0.1]]  # each run's own snapshot of the same name
    assert [e["repeats"]["bounds"]["level_window_error_sd_noise_removed"]["values"]
            for e in head] == [[0.6, 0.5], [0.5, 0.4]]
    assert not any(k.startswith("generator_") for k in head[0]["repeats"]["bounds"])
    assert "repeats" not in pt.with_repeats([[entry("end", [0.1, 0.2, 0.3])]], dirs[:1])[0]
