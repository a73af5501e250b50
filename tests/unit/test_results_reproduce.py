"""Every figure in bench/results/ is written by the code that computes it (issue 29, item 6):
for the analyses that are cheap to recompute, the committed figures must equal what the
code computes again from the runs stored in the same file. A hand-edited number, or an
analysis changed without its results being recomputed, fails here.

- bench.learning files: each study's ``summary`` (``summarise``), ``summary.controlled`` and
  ``summary.baselines``, from the study's ``runs`` (budget_learning.json's ``sweep`` block was
  written by ``bench.learning.sweep``, retired with issue 44: its code is at commit 191e63b),
  compared strictly: a key on one side only fails (issue 44, item 5); and the file's top level
  is one of its studies (its newest invocation, as ``bench.learning``'s ``merge`` writes it)
  with ``summary.controlled`` and ``summary.baselines`` gathered from them;
- the per-rollout files (``bench.learning --selection``: learning_selection.json,
  learning_real_model.json): each setting's
  ``summary.settings.<name>`` (``per_rollout.setting_summary``), from ``studies.<name>.runs``,
  compared strictly (``strict_differences``): a key on one side only fails too (issue 44,
  item 5);
- bench/results/prior_truth.json: each snapshot's error figures (the shipped prior and the
  level-mean reference) from its stored points (rounded to 4 decimals when written: the
  tolerance is that rounding's), the level-told predictor out of fold and the generator's
  cross-validated bound refitted on the prompts the points name, and its ``repeats`` block
  from the points of every run;
- bench/results/driver_bytes.json: each config's totals from their parts and its batch's
  shape from the config (the bytes themselves needed Ray's serializer: ``bench.driver_bytes``,
  a one-off study retired with issue 44, measured them at commit 611055a).

Every comparison is key for key (``strict_differences``): rename, add or drop a figure in the
code and the committed files must be summarised again (``grad_norm_variance``, renamed
``grad_norm_var_over_steps`` in 6141c28 with the same values, is renamed in the files).
- bench/results/real_model.json: its prior figures name the ``studies.prior_truth`` run of the
  real model's task that they come from.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.learning.analysis import baselines, controlled, summarise

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
LEARNING = sorted(p.name for p in RESULTS.glob("*.json")
                  if (json.loads(p.read_text()).get("command") or "").startswith(
                      "python -m bench.learning"))


def differences(stored, computed, tol: float, path: str = "", strict: bool = False) -> list[str]:
    """Where ``stored`` and ``computed`` differ, on the keys both hold; ``strict``: a key that
    only one side holds is a difference too (named by its path: ``.a.b[2].c``). Figures within
    ``tol`` (relative, at least absolute) are equal."""
    if isinstance(stored, dict) and isinstance(computed, dict):
        out = [] if not strict else (
            [f"{path}.{k}: stored, not computed" for k in sorted(set(stored) - set(computed))]
            + [f"{path}.{k}: computed, not stored" for k in sorted(set(computed) - set(stored))])
        return out + [d for k in sorted(set(stored) & set(computed))
                      for d in differences(stored[k], computed[k], tol, f"{path}.{k}", strict)]
    if isinstance(stored, list) and isinstance(computed, list):
        if len(stored) != len(computed):
            return [f"{path}: {len(stored)} items, computed {len(computed)}"]
        return [d for i, (a, b) in enumerate(zip(stored, computed))
                for d in differences(a, b, tol, f"{path}[{i}]", strict)]
    if isinstance(stored, (int, float)) and isinstance(computed, (int, float)) \
            and not isinstance(stored, bool):
        a, b = float(stored), float(computed)
        if (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol * max(1.0, abs(a)):
            return []
        return [f"{path}: {stored} stored, {computed} computed"]
    return [] if stored == computed else [f"{path}: {stored!r} stored, {computed!r} computed"]


def strict_differences(stored, computed, tol: float, path: str = "") -> list[str]:
    """``differences`` with every key compared: a renamed or missing key fails."""
    return differences(stored, computed, tol, path, strict=True)


def studies(res: dict) -> dict:
    return res.get("studies") or {res["config"]["start"]: res}


def test_the_learning_results_hold_files():
    assert "learning.json" in LEARNING and "budget_learning.json" in LEARNING


@pytest.mark.parametrize("name", LEARNING)
def test_a_learning_result_is_what_its_runs_give(name):
    """Each study's summary is what ``summarise``, ``controlled`` and ``baselines`` give from
    its runs, key for key. A per-rollout study's summary holds ``final_accuracy`` and its
    setting's figures (``settings``: checked key for key below)."""
    res = json.loads((RESULTS / name).read_text())
    for key, st in studies(res).items():
        s, runs, start = st["summary"], st["runs"], st["config"]["start"]
        own = {k: v for k, v in s.items() if k not in ("controlled", "baselines", "command",
                                                       "date", "settings")}
        computed = summarise(runs)
        if "settings" in s:  # bench.learning --selection: selection_report's summary
            computed = {"final_accuracy": computed["final_accuracy"]}
        diff = strict_differences(own, computed, 1e-9, f"studies.{key}.summary")
        if start in s.get("controlled", {}):
            diff += strict_differences(s["controlled"][start], controlled(runs), 1e-9,
                                       f"studies.{key}.summary.controlled.{start}")
        if start in s.get("baselines", {}):
            diff += strict_differences(s["baselines"][start], baselines(runs), 1e-9,
                                       f"studies.{key}.summary.baselines.{start}")
        assert diff == [], f"{name}:\n  " + "\n  ".join(diff)


@pytest.mark.parametrize("name", LEARNING)
def test_a_learning_files_top_level_is_one_of_its_studies(name):
    """One study a file: the top level is one of ``studies`` (not an earlier invocation left
    under a later one's pinned figures), its ``summary.controlled`` / ``summary.baselines``
    gathered from the studies; a per-rollout file's top level names its latest setting and
    pins each setting's figures as its study holds them."""
    res = json.loads((RESULTS / name).read_text())
    held = res.get("studies")
    if not held:
        return
    if "settings" in res["summary"]:  # bench.learning --selection (merge_settings)
        assert (res["command"], res["date"]) in {(st["command"], st["date"])
                                                 for st in held.values()}, name
        assert res["summary"]["settings"] == {
            k: st["summary"]["settings"][k] for k, st in held.items()}, name
        return
    # written onto the top level afterwards by their own commands (bench.learning.sweep,
    # bench.learning.versus --write), or naming the versions a re-run replaced
    later = ("studies", "superseded", "summary", "sweep", "versus")
    top = {k: v for k, v in res.items() if k not in later}
    pins = ("controlled", "baselines")
    same = [k for k, st in held.items()
            if top == {k2: v for k2, v in st.items() if k2 != "summary"}
            and {k2: v for k2, v in res["summary"].items() if k2 not in pins}
            == {k2: v for k2, v in st["summary"].items() if k2 not in pins}]
    assert same, (f"{name}: the top level ({res.get('date')}) is none of its studies "
                  f"({ {k: st.get('date') for k, st in held.items()} })")
    for kind in pins:  # each pinned start's figures are a study's own
        for start, figures in res["summary"].get(kind, {}).items():
            assert any(st["summary"].get(kind, {}).get(start) == figures
                       for st in held.values()), (name, kind, start)


def test_the_real_models_prior_figures_name_the_prior_truth_run_of_its_task():
    """real_model.json's prior figures are studies.prior_truth's snapshots of the run's task, and
    its ``prior_truth.command`` is that task's run (prior_truth.json's ``runs.<task>``), not the
    prior_truth file's latest invocation, which may be another task's."""
    rm = json.loads((RESULTS / "real_model.json").read_text())
    pt = json.loads((RESULTS / "prior_truth.json").read_text())
    run = pt["runs"][rm["task"]]
    assert (rm["prior_truth"]["command"], rm["prior_truth"].get("date")) == (run["command"],
                                                                         run["date"])
    snaps = [s for s in pt["snapshots"] if s["task"] == rm["task"]]
    assert [s["snapshot"] for s in rm["prior_truth"]["snapshots"]] == [
        s["snapshot"] for s in snaps]
    for mine, theirs in zip(rm["prior_truth"]["snapshots"], snaps):
        assert mine["error_sd_noise_removed"] == theirs["error_sd_noise_removed"]
        assert mine["level_only"]["error_sd_noise_removed"] == \
            theirs["level_mean_predictor"]["error_sd_noise_removed"]


# the per-rollout studies (``bench.learning --selection``): a setting per invocation each
PER_ROLLOUT = [p for p in LEARNING if "settings" in json.loads((RESULTS / p).read_text())
               .get("summary", {})]


def test_the_per_rollout_files_are_found():
    assert {"learning_selection.json", "learning_real_model.json"} <= set(PER_ROLLOUT)


@pytest.mark.parametrize("name", PER_ROLLOUT)
def test_the_per_rollout_study_is_what_its_runs_give_key_for_key(name):
    """Each setting's pinned figures (``summary.settings.<name>``, and the copy in its study)
    are ``setting_summary`` of the setting's runs, key for key."""
    from bench.learning.__main__ import SELECTION_BASELINES, SELECTION_MODE
    from bench.learning.per_rollout import setting_summary

    res = json.loads((RESULTS / name).read_text())
    pinned, studied = res["summary"]["settings"], res["studies"]
    assert studied and set(pinned) == set(studied), (
        f"{name}: settings pinned {sorted(pinned)}, studied {sorted(studied)}")
    for name, study in studied.items():
        entry = pinned[name]
        again = ("re-summarise the setting with its own command (it reads the setting's runs "
                 f"again{': from ' + study['runs_read_from'] if 'runs_read_from' in study else ''}"
                 f"): {entry.get('command')}")
        computed = setting_summary(study["runs"], entry.get("selection_mode", SELECTION_MODE),
                                   SELECTION_BASELINES, "sync_drgrpo4")
        for where, stored in ((f"summary.settings.{name}", entry),
                              (f"studies.{name}.summary.settings.{name}",
                               study["summary"]["settings"].get(name, {}))):
            own = {k: v for k, v in stored.items() if k not in ("command", "date")}
            diff = strict_differences(own, computed, 1e-9, where)
            assert diff == [], (f"{name}: {where} is not what setting_summary gives "
                                f"from studies.{name}.runs:\n  " + "\n  ".join(diff)
                                + f"\n{again}")


def test_strict_differences_fails_on_a_key_on_one_side_only():
    stored = {"at": 3072.0, "modes": {"a": {"mean": 0.5, "seeds": [0.4, 0.6]}}, "best": "a"}
    same = json.loads(json.dumps(stored))
    assert strict_differences(stored, same, 1e-9) == []
    close = {**same, "at": 3072.0 * (1 + 1e-12)}
    assert strict_differences(stored, close, 1e-9) == [] == differences(stored, close, 1e-9)
    assert strict_differences(stored, {**same, "at": 3073.0}, 1e-9) == [
        ".at: 3072.0 stored, 3073.0 computed"]
    renamed = {**same, "modes": {"a": {"avg": 0.5, "seeds": [0.4, 0.6]}}}
    assert strict_differences(stored, renamed, 1e-9) == [".modes.a.mean: stored, not computed",
                                                         ".modes.a.avg: computed, not stored"]
    assert differences(stored, renamed, 1e-9) == []  # the lenient comparison lets it through
    missing = {k: v for k, v in same.items() if k != "best"}
    assert strict_differences(stored, missing, 1e-9, "s") == ["s.best: stored, not computed"]
    assert strict_differences(missing, stored, 1e-9, "s") == ["s.best: computed, not stored"]
    nested = {**same, "modes": {"a": {**same["modes"]["a"], "seeds": [0.4, {"x": 1}]}}}
    assert strict_differences(nested, {**nested, "modes": {"a": {
        **same["modes"]["a"], "seeds": [0.4, {"y": 1}]}}}, 1e-9) == [
        ".modes.a.seeds[1].x: stored, not computed", ".modes.a.seeds[1].y: computed, not stored"]
    assert strict_differences({"se": None}, {"se": 0.1}, 1e-9) == [
        ".se: None stored, 0.1 computed"]


def test_the_prior_truth_figures_are_what_their_points_give():
    from studies.prior_truth.analysis import (error_stats, level_cv_predictor,
                                            level_mean_predictor, repeats_block)
    from studies.prior_truth.bounds import cross_validated_bound, generator_variables

    res = json.loads((RESULTS / "prior_truth.json").read_text())
    assert res["snapshots"]
    for s in res["snapshots"]:
        pts, n = s["points"], s["samples_per_prompt"]
        truth, p, level = (np.array(pts[k]) for k in ("truth", "p", "level"))
        shipped = error_stats(p, truth, n)
        for k in ("error_sd", "bias", "mae", "rmse", "error_sd_noise_removed",
                  *(["correlation_ceiling"] if "correlation_ceiling" in s else [])):
            assert s[k] == pytest.approx(shipped[k], abs=2e-4), (s["task"], s["snapshot"], k)
        lm = error_stats(level_mean_predictor(truth, level), truth, n)
        assert s["level_mean_predictor"]["error_sd_noise_removed"] == pytest.approx(
            lm["error_sd_noise_removed"], abs=2e-4)
        assert s["truth_mean"] == pytest.approx(truth.mean(), abs=1e-4)
        if "level_cv_predictor" in s:
            cv = error_stats(level_cv_predictor(truth, level), truth, n)
            assert s["level_cv_predictor"]["error_sd_noise_removed"] == pytest.approx(
                cv["error_sd_noise_removed"], abs=2e-4)
        if "generator_bound" in s:  # refitted on the prompts the points name
            names, F = generator_variables(s["task"], pts["prompts"], level)
            again = cross_validated_bound(F, exact(truth, n), n)
            assert names == s["generator_bound"]["variables"]
            for k in ("error_sd_noise_removed", "spearman"):
                assert s["generator_bound"][k] == pytest.approx(again[k], abs=2e-4), k
        if "repeats" in s:  # the runs' figures, from each run's points (the first: these)
            rep = s["repeats"]
            assert rep["points"][0] == pts and rep["runs"] == len(rep["points"]) > 1
            again = repeats_block(rep["points"], n, rep["run_dirs"])
            k_cv = "level_cv_error_sd_noise_removed"
            for k in ("error_sd_noise_removed", "level_error_sd_noise_removed",
                      "prior_minus_level", "spearman", "level_spearman",
                      *(["level_cv_error_sd_noise_removed"] if k_cv in rep else [])):
                assert rep[k]["values"] == pytest.approx(again[k]["values"], abs=1e-9), k
                assert (rep[k]["mean"], rep[k]["se"]) == pytest.approx(
                    (again[k]["mean"], again[k]["se"]), abs=1e-9), k
            for name, got in rep.get("bounds", {}).items():  # each run's, from its prompts
                if not name.startswith("generator_"):  # the window's: needs the run itself
                    continue
                k = name.removeprefix("generator_")
                refit = [cross_validated_bound(generator_variables(s["task"], pt["prompts"],
                                                                   pt["level"])[1],
                                               exact(np.array(pt["truth"]), n), n)[k]
                         for pt in rep["points"]]
                assert got["values"] == pytest.approx(refit, abs=2e-4), name
            if "shipped" in rep.get("variants", {}):  # its variant figures: the same prior's
                assert rep["variants"]["shipped"]["error_sd_noise_removed"]["values"] == \
                    pytest.approx(rep["error_sd_noise_removed"]["values"], abs=2e-4)


def exact(truth: np.ndarray, n: int) -> np.ndarray:
    """A truth written to 4 decimals, back to its exact c / n (c correct of n samples): a
    fit's best-of-grid rank correlation can move by 1e-3 on the rounded one."""
    return np.round(truth * n) / n


def test_the_driver_bytes_figures_add_up_at_each_configs_batch():
    from cluster.config.schema import load_config

    res = json.loads((RESULTS / "driver_bytes.json").read_text())
    assert res["command"].startswith("python -m bench.driver_bytes")
    for r in res["configs"]:
        cfg = load_config(Path(__file__).resolve().parents[2] / r["config"])
        assert r["batch_prompts"] == cfg.scheduler_batch_prompts()
        assert r["samples"] == r["batch_prompts"] * cfg.algo.k_init
        assert (r["learner_ranks"], r["max_tokens"]) == (cfg.learner.ranks, cfg.rollout.max_tokens)
        for when in ("before", "after"):
            parts = r[f"{when}_received_bytes"] + r[f"{when}_sent_bytes"]
            assert abs(r[f"{when}_bytes_per_step"] - parts) <= 1, (r["config"], when)
        assert r["after_bytes_per_step"] < r["before_bytes_per_step"] / 10
