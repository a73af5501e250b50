"""The learning benchmark's arithmetic: curves from a run's files, their mean over seeds, and
the summary figures (pure: NumPy and the standard library only).

A curve is a list of evaluation points; each point holds the held-out accuracy with its
standard error and where the run was when it was measured, on three axes:

    step            updates applied
    train_s         training wall-clock (evaluations excluded) since the run's start
    rollouts        rollouts of the prompts trained so far
    generated       rollouts generated for training so far: every rollout sent to a generator
                    (filtered groups, cancelled extras, the oracle's held-out ones included)
    trained_tokens  prompt + response tokens the learner trained on so far

The point before any update (the initial evaluation) is at 0 on every axis.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

AXES = ("step", "train_s", "rollouts", "generated", "trained_tokens")


def read_curve(run_dir: Path, metric: str, rewards: tuple[float, float] = (-1.0, 1.0)) -> dict:
    """The run's evaluation points and per-step learner figures, from its summary.json and
    metrics.jsonl: ``{"points": [...], "grad_norms": [...], "prompts": [...]}``
    (``rewards``: the task's range, for ``prior_quality``)."""
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    points = [{"step": 0, "train_s": 0.0, "rollouts": 0, "generated": 0, "trained_tokens": 0,
               "accuracy": summary[f"eval_{metric}_initial"],
               "se": summary[f"eval_{metric}_initial_se"],
               "greedy": summary.get("eval_greedy_initial")}]
    train_s = rollouts = tokens = 0.0
    for r in rows:
        train_s += r["step_time_s"]
        rollouts += r["rollouts"]
        tokens += r["trained_tokens"]
        if r.get(f"eval_{metric}") is not None:
            points.append({"step": r["step"], "train_s": train_s, "rollouts": int(rollouts),
                           # runs written before it was recorded: the trained prompts' rollouts
                           "generated": int(r.get("generated_rollouts") or rollouts),
                           "trained_tokens": int(tokens), "accuracy": r[f"eval_{metric}"],
                           "se": r[f"eval_{metric}_se"], "greedy": r.get("eval_greedy")})
    prompts = [json.loads(x) for x in (run_dir / "prompts.jsonl").read_text().splitlines() if x]
    return {"points": points,
            "grad_norms": [r["grad_norm"] for r in rows if r.get("grad_norm") is not None],
            # per update: what the learner trained (trained_samples: rollouts less those the
            # batch's cap or the oracle left out) and the gradient's noise-to-signal
            "samples_per_update": [r.get("trained_samples", r["rollouts"]) for r in rows],
            "prompts_per_update": [r.get("prompts") for r in rows],
            "grad_noise": [r["grad_noise_to_signal"] for r in rows
                           if r.get("grad_noise_to_signal") is not None
                           and math.isfinite(r["grad_noise_to_signal"])],
            "zero_advantage_share": zero_advantage_share(prompts,
                                                         zero_uniform=_zero_uniform(run_dir)),
            "generated": generated_figures(summary, prompts, _algo(run_dir)),
            "k_mean": float(np.mean([p["k"] for p in prompts])) if prompts else None,
            "steps": len(rows), "prompts_trained": summary["prompts_trained"],
            "prior": prior_quality(prompts, rewards=rewards),
            # the task is built for its levels only where the run had a prior to judge
            "prior_vs_levels": prior_against_levels(
                prompts, _levels(run_dir) if any(p.get("prior_p") is not None
                                                 for p in prompts) else {}, rewards),
            "eval_time_s": summary["eval_time_s"],
            # the run's own training clock, which its budget (run.max_train_s) reads: the
            # points' train_s sum the steps' times, without the bookkeeping between them
            "train_wall_s": summary.get("train_wall_time_s"),
            "initial_eval_reused": bool(summary.get("eval_initial_reused"))}


def _algo(run_dir: Path) -> dict:
    """The run's ``algo`` section (its config.yaml; {} where absent)."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    cfg = yaml.safe_load(path.read_text()) if path.is_file() else None
    return (cfg or {}).get("algo") or {}


def _levels(run_dir: Path) -> dict[str, int]:
    """Each train prompt's difficulty level, from the run's task (its config.yaml); {} where
    the run has no config or its task no levels (every ``difficulty`` 0)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    from cluster.config.schema import load_config
    from tasks import make_task_from_config

    task = make_task_from_config(load_config(path, []).task)
    levels = {p.prompt: p.difficulty for p in task.train()}
    return levels if any(levels.values()) else {}


def prior_against_levels(prompts: list[dict], level_of: dict[str, int],
                         rewards: tuple[float, float] = (-1.0, 1.0),
                         windows: dict[str, tuple[float, float]] | None = None) -> dict | None:
    """The prior's error on a run's own prompts against a predictor told each prompt's level,
    in windows of the run's updates (default: its middle and last thirds).

    Both are scored against the rate each prompt's rollouts then showed (its mean reward on
    ``rewards``, clipped: the rate the prior learns), which carries the k rollouts' sampling
    noise; the prior's p was given before those rollouts and the level predictor is the mean
    of the other prompts of the level in the window (leave one out), so that noise is
    independent of both and adds the same variance to each squared error: the per-prompt
    difference of squared errors (``mse_difference``, prior minus levels, mean and SE over the
    window's prompts) estimates the difference against the true rates. ``*_rmse_noise_removed``:
    each error with the noise's estimate (rate (1 - rate) / (k - 1) a prompt) taken out. The
    level predictor reads the window's rates, not the policy's exact level means, so it carries
    a little noise of its own (1 / n of the level's spread, n its prompts in the window). None
    where the run had no prior or no levels."""
    from estimator.core import reward_to_prob

    rows = [p for p in prompts if p.get("prior_p") is not None and p["rewards"]
            and p["prompt"] in level_of and len(p["rewards"]) > 1]
    if not rows or not level_of:
        return None
    last = max(r["step"] for r in rows)
    windows = windows or {"middle": (1 / 3, 2 / 3), "end": (2 / 3, 1.0)}
    out = {}
    for name, (lo, hi) in windows.items():
        w = [r for r in rows if lo * last < r["step"] <= hi * last]
        levels = np.array([level_of[r["prompt"]] for r in w])
        rate = np.array([float(reward_to_prob(np.mean(r["rewards"]), rewards)) for r in w])
        if len(w) < 2:
            out[name] = None
            continue
        _, group = np.unique(levels, return_inverse=True)
        n = np.bincount(group)[group]                    # each prompt's level: its prompts
        if (n < 2).all():
            out[name] = None
            continue
        total = np.bincount(group, weights=rate)[group]  # and the sum of their rates
        p = np.array([r["prior_p"] for r in w])
        # leave one out: the level's other prompts (the window's others where it has none)
        level = np.where(n > 1, (total - rate) / np.maximum(n - 1, 1),
                         (rate.sum() - rate) / (len(w) - 1))
        noise = rate * (1 - rate) / (np.array([len(r["rewards"]) for r in w]) - 1)
        d = (p - rate) ** 2 - (level - rate) ** 2
        out[name] = {
            "steps": [int(math.floor(lo * last)) + 1, int(hi * last)], "prompts": len(w),
            "mse_difference": {"mean": float(d.mean()),
                               "se": float(d.std(ddof=1) / math.sqrt(len(d)))},
            "prior_rmse_noise_removed": float(math.sqrt(max(
                0.0, ((p - rate) ** 2 - noise).mean()))),
            "levels_rmse_noise_removed": float(math.sqrt(max(
                0.0, ((level - rate) ** 2 - noise).mean())))}
    return out


def _zero_uniform(run_dir: Path) -> bool:
    """The run's ``algo.zero_uniform`` (False where absent)."""
    return bool(_algo(run_dir).get("zero_uniform", False))


def generated_figures(summary: dict, prompts: list[dict], algo: dict, tol: float = 1e-9) -> dict:
    """Where a run's generated rollouts went (summary.json's ``rollouts_dispatched``: every
    rollout sent to a generator for training): ``zero_advantage_share``, the share that landed
    in groups that gave the learner nothing (a trained prompt whose every advantage is 0, and
    every rollout of a group filtered out as all-equal, k_init each); the selection's
    ``prompts_drawn`` / ``prompts_deferred`` and its ``skip_rate``; ``uniform_share``, the
    share in groups whose rewards were all equal (filtered ones included): V0.5's baseline
    gives such a group a nonzero advantage where the prior disagrees with it, so its zero
    share alone would flatter it."""
    zero_uniform = bool(algo.get("zero_uniform", False))
    zero = sum(p["k"] for p in prompts
               if all(abs(r - p["baseline"]) <= tol for r in p["rewards"])
               or (zero_uniform and max(p["rewards"]) - min(p["rewards"]) <= tol))
    uniform = sum(p["k"] for p in prompts if max(p["rewards"]) - min(p["rewards"]) <= tol)
    filtered = (summary.get("drop_reasons") or {}).get("filtered_all_equal", 0)
    total = summary.get("rollouts_dispatched") or 0
    k = algo.get("k_init", 4)
    drawn = summary.get("prompts_drawn") or summary.get("prompts_admitted") or 0
    deferred = summary.get("prompts_deferred") or 0
    return {"rollouts": total, "zero_advantage_rollouts": zero + filtered * k,
            "zero_advantage_share": (zero + filtered * k) / total if total else None,
            "uniform_share": (uniform + filtered * k) / total if total else None,
            "prompts_drawn": drawn, "prompts_deferred": deferred,
            "skip_rate": deferred / drawn if drawn else None,
            "prior_fallbacks": summary.get("prior_fallbacks") or 0}


def zero_advantage_share(prompts: list[dict], tol: float = 1e-9,
                         zero_uniform: bool = False) -> float | None:
    """Share of trained prompts whose every advantage is 0 (each reward equals the baseline):
    GRPO's all-equal groups; V0.5's only when the prior agrees with them exactly, or, with
    ``zero_uniform`` (``algo.zero_uniform``), every all-equal group."""
    if not prompts:
        return None
    return float(np.mean([all(abs(r - p["baseline"]) <= tol for r in p["rewards"])
                          or (zero_uniform and max(p["rewards"]) - min(p["rewards"]) <= tol)
                          for p in prompts]))


def prior_quality(prompts: list[dict], bins: int = 5,
                  rewards: tuple[float, float] = (-1.0, 1.0)) -> dict | None:
    """The prior against what the rollouts then showed, over a run's trained prompts: mean
    absolute error of p against the observed success rate, the mean within-step AUC, and a
    binned reliability table (mean p and mean observed rate per bin of p, with counts).
    ``rewards``: the task's (r_lo, r_hi); the observed rate is a prompt's mean reward on that
    range, clipped (``estimator.core.reward_to_prob``), the rate the prior is trained on."""
    from cluster.records.metrics import pair_auc
    from estimator.core import reward_to_prob

    rows = [p for p in prompts if p.get("prior_p") is not None and p["rewards"]]
    if not rows:
        return None
    p = np.array([r["prior_p"] for r in rows])
    obs = np.array([float(reward_to_prob(np.mean(r["rewards"]), rewards)) for r in rows])
    by_step: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_step.setdefault(r.get("step", 0), []).append(i)
    aucs = [pair_auc(p[ix], obs[ix]) for ix in by_step.values() if len(ix) > 1]
    aucs = [a for a in aucs if not math.isnan(a)]
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    table = [{"bin": [float(edges[b]), float(edges[b + 1])], "count": int((which == b).sum()),
              "p_mean": float(p[which == b].mean()) if (which == b).any() else None,
              "observed_mean": float(obs[which == b].mean()) if (which == b).any() else None}
             for b in range(bins)]
    return {"prompts": len(rows), "abs_error": float(np.abs(p - obs).mean()),
            "auc_within_step": float(np.mean(aucs)) if aucs else None,
            "auc_steps": len(aucs), "reliability": table,
            "accepted": float(np.mean([bool(r.get("prior_accepted")) for r in rows]))}


def interp(points: list[dict], axis: str, grid: np.ndarray) -> np.ndarray:
    """Accuracy of one run at ``grid`` on ``axis``, linear between evaluation points (NaN past
    the run's last point)."""
    x = np.array([q[axis] for q in points], dtype=float)
    y = np.array([q["accuracy"] for q in points], dtype=float)
    out = np.interp(grid, x, y)
    out[grid > x[-1] + 1e-9] = np.nan
    return out


def mean_curve(runs: list[dict], axis: str, n: int = 60) -> dict:
    """The seeds' mean accuracy on a common grid of ``axis`` (up to the shortest run's last
    point), with the spread (min, max, and the standard error over seeds)."""
    end = min(r["points"][-1][axis] for r in runs)
    grid = np.linspace(0.0, end, n)
    ys = np.stack([interp(r["points"], axis, grid) for r in runs])  # (seeds, n)
    se = ys.std(axis=0, ddof=1) / math.sqrt(len(runs)) if len(runs) > 1 else np.zeros(n)
    return {"x": grid.tolist(), "mean": ys.mean(axis=0).tolist(), "min": ys.min(axis=0).tolist(),
            "max": ys.max(axis=0).tolist(), "se": se.tolist()}


def mean_curves(runs: dict[str, list[dict]]) -> dict:
    """Each mode's ``mean_curve`` on every axis its runs have (``generated`` is absent from
    runs written before 2026-12-06)."""
    return {m: {axis: mean_curve(r, axis) for axis in AXES
                if all(axis in x["points"][-1] for x in r)}
            for m, r in runs.items() if r}


def first_reach(runs: list[dict], axis: str, target: float, n: int = 400) -> float | None:
    """Where on ``axis`` the seeds' mean curve first reaches ``target`` (None: never)."""
    curve = mean_curve(runs, axis, n)
    for x, y in zip(curve["x"], curve["mean"]):
        if y >= target:
            return float(x)
    return None


def final_stats(runs: list[dict]) -> dict:
    """Final accuracy over seeds: mean, standard error over seeds, each seed's value, and the
    mean of the runs' own (evaluation) standard errors."""
    finals = np.array([r["points"][-1]["accuracy"] for r in runs])
    se = float(finals.std(ddof=1) / math.sqrt(len(finals))) if len(finals) > 1 else None
    return {"mean": float(finals.mean()), "se": se, "seeds": finals.tolist(),
            "eval_se_mean": float(np.mean([r["points"][-1]["se"] for r in runs]))}


def totals(runs: list[dict], axis: str) -> float:
    """The mean over seeds of where the runs ended on ``axis``."""
    return float(np.mean([r["points"][-1][axis] for r in runs]))


def summarise(runs: dict[str, list[dict]], v05: str = "async_v05",
              grpo16: tuple[str, ...] = ("sync_grpo16", "async_grpo16"),
              grpo4: str = "async_grpo4") -> dict:
    """The pinned summary. The GRPO-16 reference is whichever of ``grpo16`` ends with the higher
    mean accuracy (the strongest); V0.5's rollouts and wall-clock to first reach its final mean
    accuracy are fractions of that reference's totals (None where never reached). At equal
    rollouts: V0.5's mean curve minus GRPO-4's at the rollouts both reached."""
    final = {m: final_stats(r) for m, r in runs.items() if r}
    out: dict = {"final_accuracy": final}
    out["grad_norm_var_over_steps"] = {m: float(np.mean([np.var(x["grad_norms"]) for x in r]))
                                       for m, r in runs.items() if r}
    out["zero_advantage_share"] = {m: float(np.mean([x["zero_advantage_share"] for x in r]))
                                   for m, r in runs.items() if r}
    out["mean_k"] = {m: float(np.mean([x["k_mean"] for x in r])) for m, r in runs.items() if r}
    refs = [m for m in grpo16 if runs.get(m)]
    if runs.get(v05) and refs:
        ref = max(refs, key=lambda m: final[m]["mean"])
        target = final[ref]["mean"]
        out["grpo16_reference"] = ref
        out["grpo16_final_target"] = target
        for axis, key in (("rollouts", "v05_rollouts_to_reach_grpo16_final"),
                          ("train_s", "v05_wallclock_to_reach_grpo16_final")):
            x = first_reach(runs[v05], axis, target)
            out[key] = None if x is None else x / totals(runs[ref], axis)
        out["by_grpo16_mode"] = {
            m: {axis: (None if (x := first_reach(runs[v05], axis, final[m]["mean"])) is None
                       else x / totals(runs[m], axis)) for axis in ("rollouts", "train_s")}
            for m in refs}
    if runs.get(v05) and runs.get(grpo4):
        end = min(totals(runs[v05], "rollouts"), totals(runs[grpo4], "rollouts"))
        grid = np.linspace(0, end, 11)[1:]
        a = np.nanmean(np.stack([interp(r["points"], "rollouts", grid) for r in runs[v05]]), 0)
        b = np.nanmean(np.stack([interp(r["points"], "rollouts", grid) for r in runs[grpo4]]), 0)
        out["v05_minus_grpo4_at_equal_rollouts"] = {
            "rollouts": grid.tolist(), "difference": (a - b).tolist(),
            "min": float(np.nanmin(a - b)), "mean": float(np.nanmean(a - b))}
    return out


def accuracy_at(runs: list[dict], axis: str, x: float) -> np.ndarray:
    """Each seed's accuracy at ``x`` on ``axis`` (linear between its evaluations), (seeds,)."""
    return np.array([float(interp(r["points"], axis, np.array([x]))[0]) for r in runs])


def paired_difference(a: list[dict], b: list[dict], axis: str, x: float) -> dict:
    """Mean and standard error over seeds of a's accuracy minus b's at ``x`` on ``axis``,
    paired by seed (the runs of a seed share their starting weights and evaluation prompts)."""
    by_seed = {r["seed"]: r for r in b}
    pairs = [(r, by_seed[r["seed"]]) for r in a if r["seed"] in by_seed]
    d = (accuracy_at([p for p, _ in pairs], axis, x)
         - accuracy_at([q for _, q in pairs], axis, x))
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None
    return {"mean": float(d.mean()), "se": se, "seeds": d.tolist(), "at": float(x),
            "axis": axis}


def controlled(runs: dict[str, list[dict]], v05: str = "async_v05") -> dict:
    """The controlled study's pinned figures (every update on the same number of samples).

    ``best_grpo_G``: the async GRPO-G with the highest mean accuracy at the rollouts every
    compared mode reached (equal rollouts), the baseline to beat;
    ``v05_minus_best_grpo_at_equal_rollouts``: V0.5 minus that GRPO-``best_grpo_G``, paired
    by seed, at those common rollouts; ``v05_minus_best_grpo_at_equal_train_s``: V0.5 minus
    the SAME GRPO-``best_grpo_G`` (the best at equal rollouts, not the best at equal
    wall-clock), paired by seed at the training seconds every compared mode reached. In each
    block ``best_grpo_G_on_this_axis`` names the GRPO-G with the highest mean accuracy on that
    block's own axis: in the ``train_s`` block it may be another G than the one the difference
    is taken against (learning.json's warm start: the difference is against GRPO-4, the best
    at equal train_s is GRPO-16); V0.5 against that G is in no pinned key (its mean accuracy
    is ``grpo_accuracy_at_equal_train_s``). ``v05_rollouts_to_reach_grpo16_final``: V0.5's
    rollouts to first reach the stronger GRPO-16's (sync or async) final accuracy, as a
    fraction of that GRPO-16's rollouts; per mode: the variance over steps of the pre-clip
    gradient norm (not the noise of the gradient: ``baselines`` has that), updates and
    samples per update."""
    runs = {m: r for m, r in runs.items() if r}
    grpo = {int(m.removeprefix("async_grpo")): m for m in runs if m.startswith("async_grpo")}
    out: dict = {"modes": sorted(runs),
                 "grad_norm_var_over_steps": {
                     m: float(np.mean([np.var(x["grad_norms"]) for x in r]))
                     for m, r in runs.items()},
                 "updates": {m: float(np.mean([x["steps"] for x in r])) for m, r in runs.items()},
                 "samples_per_update": {
                     m: float(np.mean([x["points"][-1]["rollouts"] / max(1, x["steps"])
                                       for x in r])) for m, r in runs.items()},
                 "final_accuracy": {m: final_stats(r) for m, r in runs.items()}}
    if not grpo or v05 not in runs:
        return out
    for axis in ("rollouts", "train_s"):
        common = min(min(x["points"][-1][axis] for x in runs[m])
                     for m in [v05, *grpo.values()])
        at = {G: float(np.nanmean(accuracy_at(runs[m], axis, common)))
              for G, m in grpo.items()}
        out[f"grpo_accuracy_at_equal_{axis}"] = {f"G{G}": a for G, a in sorted(at.items())}
        best = max(at, key=at.get)
        if axis == "rollouts":
            out["best_grpo_G"] = best
        out[f"v05_minus_best_grpo_at_equal_{axis}"] = {
            **paired_difference(runs[v05], runs[grpo[out["best_grpo_G"]]], axis, common),
            "best_grpo_G_on_this_axis": best}
    refs = [m for m in ("sync_grpo16", "async_grpo16") if m in runs]
    if refs:
        ref = max(refs, key=lambda m: out["final_accuracy"][m]["mean"])
        x = first_reach(runs[v05], "rollouts", out["final_accuracy"][ref]["mean"])
        out["grpo16_reference"] = ref
        out["v05_rollouts_to_reach_grpo16_final"] = (
            None if x is None else x / totals(runs[ref], "rollouts"))
    return out


# The baseline study (issue 29): every mode trains 4 samples per prompt and S per update;
# its modes are async_<name>, or sync_<name> in the paired study (common random numbers).
DRGRPO4, ORACLE, V05_ADAPTIVE = "drgrpo4", "oracle4", "v05"


def per_update(runs: list[dict], key: str) -> dict:
    """A per-update series (``samples_per_update``, ``prompts_per_update``) over every
    update of every seed but each run's last (a run's last batch may be short: the budget
    ended it): mean, min and max (None: not recorded)."""
    xs = ([v for r in runs for v in r[key][:-1] if v is not None]
          or [v for r in runs for v in r[key] if v is not None])
    if not xs:
        return None
    return {"mean": float(np.mean(xs)), "min": float(np.min(xs)), "max": float(np.max(xs))}


def noise_to_signal(runs: list[dict]) -> dict | None:
    """The gradient's noise-to-signal (``optim.grad_noise``): each seed's median over its
    updates (the per-step ratio is heavy-tailed where the mean gradient nearly cancels),
    then the mean and standard error over seeds."""
    meds = [float(np.median(r["grad_noise"])) for r in runs if r.get("grad_noise")]
    if not meds:
        return None
    se = float(np.std(meds, ddof=1) / math.sqrt(len(meds))) if len(meds) > 1 else None
    return {"median_mean": float(np.mean(meds)), "se": se, "seeds": meds}


def baselines(runs: dict[str, list[dict]]) -> dict:
    """The baseline study's pinned figures, at equal updates (the step every run of every
    mode reached; each update trains the same S samples, 4 per prompt): each mode minus
    Dr.GRPO-4 (``<mode>_minus_drgrpo4``: mean, se and seeds, paired by seed), with the
    oracle's and adaptive V0.5's under the issue's names ``oracle_minus_drgrpo4`` and
    ``v05_minus_drgrpo4``; V0.5's share of the oracle's margin; per mode: samples and
    prompts per update, the gradient's noise-to-signal, rollouts per update."""
    runs = {m: r for m, r in runs.items() if r}
    out: dict = {"modes": sorted(runs),
                 "samples_per_update": {m: per_update(r, "samples_per_update")
                                        for m, r in runs.items()},
                 "prompts_per_update": {m: per_update(r, "prompts_per_update")
                                        for m, r in runs.items()},
                 "grad_noise_to_signal": {m: noise_to_signal(r) for m, r in runs.items()},
                 "rollouts_per_update": {
                     m: float(np.mean([x["points"][-1]["rollouts"] / max(1, x["points"][-1]["step"])
                                       for x in r])) for m, r in runs.items()},
                 "final_accuracy": {m: final_stats(r) for m, r in runs.items()}}
    prefix = "sync_" if "sync_" + DRGRPO4 in runs else "async_"
    ref = prefix + DRGRPO4
    if ref not in runs:
        return out
    step = min(x["points"][-1]["step"] for r in runs.values() for x in r)
    out["at_step"] = step
    for m in runs:
        if m != ref:
            d = paired_difference(runs[m], runs[ref], "step", step)
            out[f"{m.removeprefix(prefix)}_minus_drgrpo4"] = d
    for m, key in ((ORACLE, "oracle_minus_drgrpo4"), (V05_ADAPTIVE, "v05_minus_drgrpo4")):
        if prefix + m in runs:
            out[key] = out[f"{m}_minus_drgrpo4"]
    if "oracle_minus_drgrpo4" in out and "v05_minus_drgrpo4" in out:
        margin = out["oracle_minus_drgrpo4"]["mean"]
        out["v05_share_of_oracle_margin"] = (out["v05_minus_drgrpo4"]["mean"] / margin
                                             if margin > 0 else None)
    return out
