"""The cluster simulator (bench/sim/): engine timing, priority and aborts, the shipped
scheduler driving every mode (conservation, the sample-age bound), units, calibration."""
from __future__ import annotations

import heapq
import json
import math

import numpy as np
import pytest

from bench.sim import (MODES, RATIOS, DecodeModel, Engine, LearnerModel, LengthModel, PromptModel,
                       Rollout, SimConfig, calibration_config, from_dict, parse_overrides,
                       physical_limit, predict_ratio, ratios, run_modes, simulate, summarise)
from bench.sim.__main__ import build_config
from bench.sim.measured import resolve_best_grpo_g, resolve_prior_error_sd


def toy(**kw) -> SimConfig:
    """4 engines x 16 slots, B = 8, heavy-tailed lengths, a fast learner: runs in ~0.1 s."""
    base = dict(n_gpus=5, prior_gpus=0, n_generators=4, batch_prompts=8, steps=8, warmup_steps=2, seed=3,
                max_staleness=1, dispatch_latency_s=0.0,
                decode=DecodeModel(a_s=0.005, b_s=0.0005, max_num_seqs=16),
                length=LengthModel(median=100, sigma=1.2, prompt_share=0.0, max_tokens=2000,
                                   prompt_tokens=10),
                learner=LearnerModel(s_per_token_gpu=1e-5, step_overhead_s=0.1, sync_s=0.2))
    base.update(kw)
    return SimConfig(**base)


# -- the engine on its own -------------------------------------------------------------------

class Loop:
    """The smallest event loop an Engine needs: schedule, now, on_finished, on_aborted."""

    def __init__(self):
        self.events, self.now, self.n, self.done, self.aborted = [], 0.0, 0, [], []

    def schedule(self, t, fn, *args):
        heapq.heappush(self.events, (t, self.n, fn, args))
        self.n += 1

    def on_finished(self, engine, finished):
        self.done += [(r.position, self.now, r.version) for r in finished]

    def on_aborted(self, engine, aborted):
        self.aborted += [(r.position, self.now, r.tokens) for r in aborted]

    def run_until(self, t_end=math.inf):
        while self.events and self.events[0][0] <= t_end:
            t, _, fn, args = heapq.heappop(self.events)
            self.now = t
            fn(*args)


def R(pos, length, priority=0):
    return Rollout("r", pos, length, 1.0, priority)


def engine(max_num_seqs=4, sync_s=2.0):
    loop = Loop()
    times = np.array([np.nan] + [1.0 + 0.5 * n for n in range(1, max_num_seqs + 1)])
    return Engine(0, times, max_num_seqs, sync_s, loop), loop


def test_engine_join_at_step_boundary_and_batch_dependent_step_time():
    e, loop = engine()
    e.submit(R(0, 4), 0.0)                           # alone: 1.5 s per step
    loop.run_until(1.0)
    loop.now = 1.0
    e.submit(R(1, 2), 1.0)                           # mid-step: joins at 1.5, then 2.0 s per step
    loop.run_until()
    assert loop.done == [(1, 5.5, 0), (0, 7.0, 0)]   # B: 1.5 + 2*2; A: 3 steps left -> 2 at 2.0, 1 at 1.5
    assert e.outstanding == 0 and not e.running


def test_engine_respects_max_num_seqs():
    e, loop = engine(max_num_seqs=1)
    e.submit(R(0, 4), 0.0)
    e.submit(R(1, 2), 0.0)                           # waits for the only slot
    loop.run_until()
    assert loop.done == [(0, 6.0, 0), (1, 9.0, 0)]


def test_engine_weight_sync_pauses_between_steps_and_bumps_version():
    e, loop = engine(sync_s=2.0)
    e.submit(R(0, 4), 0.0)
    loop.run_until(1.0)
    loop.now = 1.0
    e.request_sync(7, 1.0)                            # pauses at the 1.5 boundary until 3.5
    e.submit(R(1, 1), 1.0)                            # joins after the pause, on version 7
    loop.run_until()
    # from 3.5 both run at 2.0 s/step: B ends at 5.5; A's last 2 steps run alone: 5.5 + 2 * 1.5
    assert loop.done == [(1, 5.5, 7), (0, 8.5, 0)]
    assert e.version == 7 and (1.5, 3.5, 1, 1) in e.segments


def test_engine_runs_the_lowest_priority_value_first_when_slots_are_short():
    e, loop = engine(max_num_seqs=1)
    e.submit(R(0, 2, priority=5), 0.0)
    loop.run_until(0.0)                              # takes the only slot at the first step
    e.submit(R(1, 1, priority=9), 0.0)
    e.submit(R(2, 1, priority=1), 0.0)               # arrives later, runs before position 1
    loop.run_until()
    assert [d[0] for d in loop.done] == [0, 2, 1]


def test_engine_abort_frees_the_slot_at_the_next_boundary_and_counts_tokens():
    e, loop = engine(max_num_seqs=1)
    a, b, c = R(0, 10), R(1, 2), R(2, 3)
    for r in (a, b, c):
        e.submit(r, 0.0)
    loop.run_until(3.2)                              # a has run 2 steps of 1.5 s
    loop.now = 3.2
    e.abort(a, 3.2)                                  # leaves at the 4.5 boundary, 3 tokens
    e.abort(c, 3.2)                                  # waiting: gone at once, 0 tokens
    loop.run_until()
    assert loop.aborted == [(2, 3.2, 0), (0, 4.5, 3)]
    assert loop.done == [(1, 7.5, 0)] and e.outstanding == 0


# -- every mode on the shipped scheduler -----------------------------------------------------

def test_determinism_by_seed():
    a = summarise(simulate(toy(), "async_v05"))
    b = summarise(simulate(toy(), "async_v05"))
    c = summarise(simulate(toy(seed=4), "async_v05"))
    assert json.dumps(a, default=float) == json.dumps(b, default=float)
    assert a["prompts_per_hour"] != c["prompts_per_hour"]


@pytest.mark.parametrize("mode", list(MODES))
def test_conservation_fractions_and_the_age_bound(mode):
    cfg = toy(equal_mse_group=6)
    res = simulate(cfg, mode)
    ch = res.checks
    assert ch["trained"] == ch["handed"] == sum(s["prompts"] for s in res.steps)
    if not MODES[mode].select:  # (at this seed: an async batch may train short where a
        # stale prompt moved to a later deadline, as selection's mid-range prompts do here)
        assert ch["trained"] == cfg.steps * cfg.batch_prompts
    assert ch["admitted"] == ch["handed"] + ch["dropped"] + ch["inflight"]
    assert ch["drawn"] == ch["admitted"] + ch["deferred"] + ch["waiting"]
    assert (ch["deferred"] > 0) == MODES[mode].select
    assert res.k_trained.sum() == len(res.staleness)   # every trained rollout has an age
    assert res.staleness.min() >= 0 and res.staleness.max() <= ch["max_staleness_bound"]
    s = summarise(res)
    for key in ("generator_busy_fraction", "generator_sync_fraction", "generator_idle_fraction",
                "generator_slot_occupancy", "learner_busy_fraction"):
        assert 0.0 <= s[key] <= 1.0, (key, s[key])
    total = s["generator_busy_fraction"] + s["generator_sync_fraction"] + s["generator_idle_fraction"]
    assert total == pytest.approx(1.0, abs=1e-9)
    assert 0 < s["fraction_of_limit"] <= 1.0 + 1e-9
    if MODES[mode].algo == "grpo" and MODES[mode].group == 16:
        assert set(res.k_trained) == {16}
    elif mode.endswith("equal_mse"):
        assert set(res.k_trained) == {6}
    elif mode.endswith("best_g"):
        assert set(res.k_trained) == {cfg.best_grpo_group}
    else:  # k comes from the real estimator state: between k_init and k_max, <= 3 rounds
        assert res.k_trained.min() >= 4 and res.k_trained.max() <= 16
        assert res.rounds_trained.max() <= 3
    assert res.n_engines == (cfg.n_gpus if MODES[mode].colocated else cfg.n_generators)


def test_selection_trains_more_mixed_groups_per_prompt_than_grpo4_admitting_all():
    """An exact prior: the prompts the selection defers are those whose groups of 4 would be
    uniform, so more of the trained rollouts sit in groups with a contrast."""
    cfg = toy(steps=16, prompts=PromptModel(prior="exact"))
    per = {m: summarise(simulate(cfg, m)) for m in ("async_grpo4", "async_v05_k4_select")}
    share = {m: s["mixed_trained_rollouts_per_hour"] / s["trained_rollouts_per_hour"]
             for m, s in per.items()}
    assert share["async_v05_k4_select"] > share["async_grpo4"] + 0.1
    assert per["async_v05_k4_select"]["nonzero_trained_rollouts_per_hour"] >= \
        per["async_v05_k4_select"]["mixed_trained_rollouts_per_hour"]


def test_the_prior_server_costs_v05_a_gpu():
    cfg = toy(n_gpus=6, prior_gpus=1)
    assert simulate(cfg, "async_v05").learner_gpus == 1       # 6 - 4 generators - 1 prior
    assert simulate(cfg, "async_grpo16").learner_gpus == 2    # no prior
    coloc = simulate(cfg, "sync_grpo16_colocated")
    assert coloc.n_engines == coloc.learner_gpus == 6


@pytest.mark.parametrize("s", [0, 1, 3])
def test_no_trained_sample_is_older_than_max_staleness(s):
    res = simulate(toy(max_staleness=s), "async_v05")
    assert res.staleness.max() <= s
    if s == 3:
        assert res.staleness.max() >= 1  # the bound is used, not just respected by accident


def test_async_fills_engines_that_the_barrier_leaves_idle():
    per, _ = run_modes(toy(), ["sync_v05", "async_v05", "sync_grpo16"])
    assert per["sync_v05"]["generator_busy_fraction"] < per["async_v05"]["generator_busy_fraction"]
    assert per["async_v05"]["prompts_per_hour"] > per["sync_grpo16"]["prompts_per_hour"]


def test_equal_mse_mode_takes_its_group_from_the_v05_run():
    heard: list[str] = []
    per, _ = run_modes(toy(), ["async_grpo_equal_mse", "async_v05"], progress=heard.append)
    # V0.5 runs first (the equal-MSE mode needs its group), each mode told as it ends
    assert [line.split()[1:3] for line in heard] == [["1/2", "async_v05"],
                                                     ["2/2", "async_grpo_equal_mse"]]
    g = per["async_v05"]["equal_mse_group"]
    assert 2 <= g <= 64 and per["async_grpo_equal_mse"]["group_size"] == g
    assert per["async_grpo_equal_mse"]["mean_k"] == g
    with pytest.raises(ValueError, match="equal_mse"):
        run_modes(toy(), ["async_grpo_equal_mse"])


def test_better_prior_needs_fewer_rollouts():
    exact = simulate(toy(prompts=PromptModel(prior="exact")), "async_v05").k_trained.mean()
    flat = simulate(toy(prompts=PromptModel(prior="const0.5")), "async_v05").k_trained.mean()
    assert exact < flat


def test_physical_limit_takes_the_best_split():
    cfg = SimConfig(n_gpus=4, prior_gpus=0, n_generators=2,
                    decode=DecodeModel(a_s=0.0, b_s=0.001, max_num_seqs=10),   # 1000 tok/s
                    learner=LearnerModel(s_per_token_gpu=1e-3))                # 1000 tok/s
    # 1000 decode tokens and 3000 trained tokens per prompt: 1 generator GPU, 3 learner GPUs.
    lim = physical_limit(cfg, 1000, 3000)
    assert lim["best_generator_gpus"] == 1 and lim["prompts_per_hour"] == pytest.approx(3600)


# -- models and config -----------------------------------------------------------------------

def test_decode_table_interpolates_and_extrapolates():
    t = DecodeModel(max_num_seqs=6, table=((1, 0.01), (3, 0.02))).step_times()
    assert np.isnan(t[0])
    assert t[1:].tolist() == pytest.approx([0.01, 0.015, 0.02, 0.025, 0.03, 0.035])


def test_length_model_truncates_and_reads_empirical_values():
    rng = np.random.default_rng(0)
    z, zr = rng.normal(size=200), rng.normal(size=(200, 16))
    L = LengthModel(median=3000, sigma=1.5, max_tokens=4096).draw(z, zr)
    assert L.max() == 4096 and L.min() >= 16 and L.dtype.kind == "i"
    E = LengthModel(values=(5, 7, 9), max_tokens=9, min_tokens=1).draw(z, zr)
    assert set(np.unique(E)) <= set(range(5, 10))


def test_the_v05_budget_is_the_estimators():
    """Defaults and checks of k_init, k_max, cost, plan and max_rounds come from the estimator."""
    from bench.sim import calibration_config
    from estimator import EstimatorConfig

    keys = ("k_init", "k_max", "cost", "plan", "max_rounds")
    budget = {k: getattr(EstimatorConfig(), k) for k in keys}
    assert {k: getattr(SimConfig(), k) for k in keys} == budget
    cal = calibration_config({"n_generators": 2, "max_num_seqs": 8, "sync_s": 0.1,
                              "decode_step_s": {"a": 0.01, "b": 0.001}, "batch_prompts": 4,
                              "learner_s_per_token": 1e-4, "response_lengths": [5, 9]})
    assert {k: getattr(cal, k) for k in keys} == budget
    for bad, message in [(dict(k_init=5, k_max=4), r"k_init \(5\) must be <= k_max \(4\)"),
                         (dict(k_init=0), "k_init must be >= 1"), (dict(cost=-1.0), "cost must be"),
                         (dict(plan="greedy"), "plan must be one of"),
                         (dict(max_rounds=0), "max_rounds must be")]:
        with pytest.raises(ValueError, match=message):
            SimConfig(**bad)
        with pytest.raises(ValueError, match=message):
            EstimatorConfig(**bad)


def test_bad_config_raises_clear_errors():
    with pytest.raises(ValueError, match="learner GPU"):
        SimConfig(n_gpus=24, n_generators=24)
    with pytest.raises(ValueError, match="prior GPU"):
        SimConfig(n_gpus=25, prior_gpus=1, n_generators=24)
    with pytest.raises(ValueError, match="decode.nope"):
        from_dict({"decode": {"nope": 1}})
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["n_generators"])
    with pytest.raises(ValueError, match="prompts.prior"):
        PromptModel(prior="sdx")
    assert from_dict(parse_overrides(["decode.a_s=0.002", "n_generators=20"])).decode.a_s == 0.002


# -- calibration -----------------------------------------------------------------------------

CAL = {"n_generators": 2, "max_num_seqs": 8, "decode_step_s": [[1, 0.02], [8, 0.05]],
       "learner_s_per_token": 2e-4, "learner_step_overhead_s": 0.3, "sync_s": 0.4,
       "response_lengths": [4, 6, 9, 12, 16, 16, 16], "prompt_tokens": 12,
       "batch_prompts": 4, "max_staleness": 1, "steps": 10, "warmup_steps": 3}


def test_predict_ratio_on_a_tiny_calibration():
    out = predict_ratio(CAL)
    r = out["async_v05_vs_sync_grpo16_prompts_per_s"]
    assert math.isfinite(r) and r > 0
    assert r == pytest.approx(out["prompts_per_s"]["async_v05"] / out["prompts_per_s"]["sync_grpo16"])
    assert out["config"]["n_generators"] == 2 and out["config"]["learner"]["sync_s"] == 0.4
    # learner-bound limit: both modes wait on the learner, so the ratio is the ratio of trained
    # rollouts per prompt, G / mean k (lengths have the same distribution in both modes)
    slow = predict_ratio({**CAL, "learner_s_per_token": 0.5})
    assert min(slow["learner_busy_fraction"].values()) > 0.95
    expect = 16 / slow["mean_k"]["async_v05"]
    assert slow["async_v05_vs_sync_grpo16_prompts_per_s"] == pytest.approx(expect, rel=0.15)


def test_calibration_schema_errors_name_the_key():
    with pytest.raises(ValueError, match="sync_s"):
        calibration_config({k: v for k, v in CAL.items() if k != "sync_s"})
    with pytest.raises(ValueError, match="bogus"):
        calibration_config({**CAL, "bogus": 1})
    with pytest.raises(ValueError, match="response_lengths"):
        calibration_config({**CAL, "response_lengths": [0, 3]})


# -- the colocated barrier with over-sampling and abort ----------------------------------------

def test_oversample_admits_1_1_b_trains_b_and_counts_the_aborted_tokens():
    cfg = toy(oversample=0.25)                      # B = 8: 10 admitted per step, 2 aborted
    assert cfg.oversampled_prompts == 10 and toy().oversampled_prompts == 9   # ceil(8.8)
    res = simulate(cfg, "sync_grpo16_colocated_oversample")
    ch = res.checks
    assert [s["prompts"] for s in res.steps] == [8] * cfg.steps
    assert [s["rollouts"] for s in res.steps] == [8 * 16] * cfg.steps
    assert ch["admitted"] == 10 * cfg.steps         # every step admitted 1.25 B ...
    assert ch["drop_reasons"] == {"aborted": 2 * cfg.steps}   # ... and dropped 0.25 B
    assert res.aborted_prompts == 2 * cfg.steps and ch["inflight"] == 0
    assert res.staleness.max() == 0                 # still a barrier: nothing trains stale
    # Aborted rollouts' tokens are spent: counted in what was generated, never trained.
    trained = sum(s["tokens"] - s["rollouts"] * cfg.length.prompt_tokens for s in res.steps)
    spent = res.gen_tokens_done + res.cancelled_tokens
    assert res.cancelled_tokens > 0
    assert spent > trained
    assert res.token_events[:, 1].sum() == spent
    s = summarise(res)
    assert s["untrained_generated_fraction"] > 0 and s["aborted_prompts"] == 2 * cfg.steps


def test_oversample_with_abort_beats_the_barrier_that_waits_for_its_slowest():
    per, _ = run_modes(toy(), ["sync_grpo16_colocated", "sync_grpo16_colocated_oversample"])
    plain, over = per["sync_grpo16_colocated"], per["sync_grpo16_colocated_oversample"]
    assert over["prompts_per_hour"] > plain["prompts_per_hour"]
    assert over["decode_tokens_per_hour"] / over["prompts_per_hour"] > \
        plain["decode_tokens_per_hour"] / plain["prompts_per_hour"] * 0.9   # pays in tokens
    none = simulate(toy(oversample=0.0), "sync_grpo16_colocated_oversample")
    assert none.aborted_prompts == 0 and none.checks["admitted"] == 8 * none.cfg.steps


def test_best_g_mode_runs_grpo_at_that_g():
    res = simulate(toy(best_grpo_group=3), "async_grpo_best_g")
    assert set(res.k_trained) == {3}


# -- ratios: two units ------------------------------------------------------------------------

def test_rollouts_per_hour_ratio_is_prompts_ratio_times_rollouts_per_prompt_ratio():
    per, _ = run_modes(toy(), list(MODES))
    r = ratios(per)
    k = {m: s["trained_rollouts_per_hour"] / s["prompts_per_hour"] for m, s in per.items()}
    for stem, a, b in RATIOS:
        assert r[f"{stem}_rollouts_per_hour"] == pytest.approx(
            r[f"{stem}_prompts_per_hour"] * k[a] / k[b], rel=1e-12)
    assert k["async_grpo16"] == 16 and k["sync_grpo16_colocated_oversample"] == 16
    # V0.5 against GRPO-16: the rollouts ratio is the prompts ratio times about mean k / 16
    assert r["async_v05_vs_async_grpo16_rollouts_per_hour"] == pytest.approx(
        r["async_v05_vs_async_grpo16_prompts_per_hour"] * per["async_v05"]["mean_k"] / 16, rel=0.1)
    for key in ("async_v05_vs_async_grpo_equal_mse_prompts_per_hour",
                "async_v05_vs_async_grpo_best_g_prompts_per_hour",
                "async_v05_vs_sync_grpo16_colocated_oversample_prompts_per_hour",
                "async_v05_vs_sync_grpo16_colocated_rollouts_per_hour"):
        assert key in r


# -- the prior's error and GRPO's best G from measurements --------------------------------------

def truth(task, snapshot, error_sd, noise, bias=0.0):
    return dict(task=task, snapshot=snapshot, n_prompts=200, samples_per_prompt=16,
                error_sd=error_sd, bias=bias, mae=0.8 * error_sd, spearman=0.7,
                truth_sd=0.3, truth_noise_sd=noise)


def test_prior_error_sd_is_the_largest_stepwise_snapshot_with_the_truths_noise_removed(tmp_path):
    path = tmp_path / "prior_truth.json"
    path.write_text(json.dumps({"snapshots": [
        truth("stepwise", "start", 0.10, 0.06),     # prior's own error 0.08
        truth("stepwise", "middle", 0.13, 0.05),    # 0.12: the largest once noise is removed
        truth("stepwise", "end", 0.14, 0.10),       # 0.098: largest before removal, not after
        truth("arithmetic", "end", 0.40, 0.01),     # another task: ignored
    ]}))
    sd, source, detail = resolve_prior_error_sd(None, path)
    assert sd == pytest.approx(0.12)
    assert str(path) in source and "snapshot middle" in source and "stepwise" in source
    assert [r["snapshot"] for r in detail["per_snapshot"]] == ["start", "middle", "end"]
    # a bias adds in quadrature (the simulator's error is zero-mean)
    path.write_text(json.dumps({"snapshots": [truth("stepwise", "end", 0.10, 0.06, bias=0.06)]}))
    assert resolve_prior_error_sd(None, path)[0] == pytest.approx(0.1)
    # the command line wins; without a file the old assumption, said so
    assert resolve_prior_error_sd(0.07, path)[:2] == (0.07, "--prior-error-sd")
    assert resolve_prior_error_sd(None, tmp_path / "absent.json")[:2] == (0.2, "assumed")
    path.write_text(json.dumps({"snapshots": [truth("arithmetic", "end", 0.1, 0.0)]}))
    with pytest.raises(ValueError, match="stepwise"):
        resolve_prior_error_sd(None, path)


def test_a_snapshot_of_repeated_runs_counts_with_the_mean_of_its_runs(tmp_path):
    """studies.prior_truth --repeats: each run's prior error (noise removed, bias added in
    quadrature) from its own points, their mean the snapshot's figure."""
    from studies.prior_truth.analysis import error_stats

    rng = np.random.default_rng(0)
    runs, figures = [], []
    for shift, spread in ((0.0, 0.03), (0.04, 0.06), (-0.02, 0.09)):
        t = rng.binomial(64, rng.uniform(0.2, 0.9, 100)) / 64
        p = np.clip(t + shift + rng.normal(0, spread, 100), 0, 1)
        runs.append({"truth": t.tolist(), "p": p.tolist(), "level": [1] * 100})
        e = error_stats(p, t, 64)
        figures.append(np.hypot(e["error_sd_noise_removed"], e["bias"]))
    end = {**truth("stepwise", "end", 0.01, 0.0), "samples_per_prompt": 64,
           "repeats": {"points": runs}}   # the headline figures alone would say 0.01
    path = tmp_path / "prior_truth.json"
    path.write_text(json.dumps({"snapshots": [truth("stepwise", "start", 0.02, 0.0), end]}))
    sd, source, detail = resolve_prior_error_sd(None, path)
    assert sd == pytest.approx(np.mean(figures)) and detail["snapshot"] == "end"
    assert "the mean of 3 runs" in source and detail["per_snapshot"][1]["runs"] == 3


def test_the_err_prior_has_the_error_sd_it_names():
    """'errX': the sd of (prior - p) on the probability scale is X (clipping at 0 and 1
    included); the old 'sdX' names the scale before clipping (sd0.2 errs by 0.161)."""
    for x in (0.05, 0.1, 0.2):
        m = PromptModel(prior=f"err{x}")
        assert m.prior_error_sd() == pytest.approx(x, abs=0.002)
        assert m.noise_scale() > x
    assert PromptModel(prior="sd0.2").prior_error_sd() == pytest.approx(0.161, abs=0.003)
    assert PromptModel(prior="exact").prior_error_sd() == 0.0


def test_build_config_records_the_prior_and_best_g_with_their_sources(tmp_path):
    import argparse

    truth_file, learning = tmp_path / "prior_truth.json", tmp_path / "learning.json"
    truth_file.write_text(json.dumps({"snapshots": [truth("stepwise", "start", 0.10, 0.06)]}))
    learning.write_text(json.dumps({"summary": {"controlled": {
        "cold": {"best_grpo_G": 6}, "warm": {"best_grpo_G": 8}}}}))
    args = argparse.Namespace(quick=True, calibrate=None, config=None, overrides=[],
                              prior_error_sd=None, prior_truth=str(truth_file),
                              best_grpo_g=None, learning=str(learning))
    cfg, prov = build_config(args)
    assert cfg.prompts.prior == "err0.08" and prov["prior_error_sd"] == pytest.approx(0.08)
    assert "snapshot start" in prov["prior_error_sd_source"]
    assert prov["prior_error_sd_realised"] == pytest.approx(0.08, abs=0.002)
    assert cfg.best_grpo_group == 6
    assert prov["best_grpo_group_source"].endswith("summary.controlled.cold.best_grpo_G")
    args.prior_error_sd, args.best_grpo_g = 0.1, 5
    cfg, prov = build_config(args)
    assert (cfg.prompts.prior, prov["prior_error_sd_source"]) == ("err0.1", "--prior-error-sd")
    assert (cfg.best_grpo_group, prov["best_grpo_group_source"]) == (5, "--best-grpo-g")
    args.prior_error_sd, args.overrides = None, ["prompts.prior=sd0.2"]
    cfg, prov = build_config(args)
    assert "prompts.prior=sd0.2" in prov["prior_error_sd_source"]
    assert prov["prior_error_sd"] == pytest.approx(0.161, abs=0.003)
    assert resolve_best_grpo_g(None, tmp_path / "absent.json")[0] == 4


def test_a_mode_the_simulator_and_the_benches_both_name_is_the_same_mode():
    """bench.modes is the one table of the modes the benches run; the simulator's table says
    how each is simulated. A name both hold means one mode: barrier or not, the algorithm,
    GRPO's group."""
    from bench.modes import MODES as RUN
    from bench.sim import MODES as SIM

    shared = sorted(set(SIM) & set(RUN))
    assert {"sync_grpo16", "sync_v05", "async_grpo16", "async_v05", "async_grpo_equal_mse",
            "async_grpo4"} <= set(shared)
    for name in shared:
        sim, run = SIM[name], RUN[name]
        assert sim.barrier == (run["mode"] == "sync"), name
        assert sim.algo.removesuffix("_k4") == run["algo"]["name"], name
        if isinstance(sim.group, int) and sim.algo == "grpo":
            assert run["algo"]["k_init"] == run["algo"]["k_max"] == sim.group, name
