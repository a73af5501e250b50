"""The real-model run's figures, from its run directory and the limits measured beside it.
Pure: reads files and numbers, imports nothing heavy.

Windows: the steady state is steps 2..N (step 1 pays the first generation round with nothing
to overlap it, and the engines' first shapes); evaluations are never inside a step's time
(the trainer times them apart). Units are in the key names.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def read_run(run_dir: Path) -> tuple[list[dict], dict, dict]:
    """(metrics.jsonl rows, summary.json, config.yaml as data) of a run."""
    import yaml

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    summary = json.loads((run_dir / "summary.json").read_text())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return rows, summary, config


def uniform_groups(prompts: list[dict], k: int, rewards: tuple[float, float] = (-1.0, 1.0),
                   parts: int = 3) -> dict:
    """How many trained prompts' first ``k`` rollouts (k_init: what every admitted prompt
    gets) all had the same reward, all right or all wrong: the groups that teach a
    group-mean baseline nothing. Over the run and over its thirds in training order (the
    level mix's share at the start, and how training moves it)."""
    def share(group: list[dict], which=lambda first: len(set(first)) == 1) -> float | None:
        return round(float(np.mean([which(p["rewards"][:k]) for p in group])), 3) \
            if group else None

    lo, hi = rewards  # the task's range: a run never right still has all-wrong groups only
    cut = np.array_split(np.arange(len(prompts)), parts) if prompts else []
    return {"k": k, "prompts": len(prompts), "uniform_share": share(prompts),
            "all_wrong_share": share(prompts, lambda first: set(first) == {lo}),
            "all_right_share": share(prompts, lambda first: set(first) == {hi}),
            "uniform_share_by_part": [share([prompts[i] for i in idx]) for idx in cut]}


def steady(rows: list[dict]) -> list[dict]:
    """Steps 2..N (all of them for a run of one step)."""
    return rows[1:] if len(rows) > 1 else rows


def step_split(rows: list[dict]) -> dict:
    """Mean seconds per step and its parts: waiting for generation (what training did not
    hide), training, weight sync (publish to every generator)."""
    w = steady(rows)

    def mean(key: str) -> float:
        return round(float(np.mean([r[key] for r in w])), 2)

    return {"window": f"steps {w[0]['step']}-{w[-1]['step']} of {len(rows)}",
            "steps": len(w), "step_s": mean("step_time_s"), "generation_wait_s":
            mean("learner_wait_s"), "train_s": mean("train_time_s"), "sync_s": mean("sync_time_s")}


def learner_rate(rows: list[dict], params: int, peak_gflops: float) -> dict:
    """Trained tokens/s (prompt and response tokens through forward and backward) and the
    achieved model FLOP/s, 6 x parameters x tokens / s (attention's own FLOPs, under 3% at
    these lengths, left out), against the measured float32 matmul peak."""
    w = steady(rows)
    tokens = sum(r["trained_tokens"] for r in w)
    seconds = sum(r["train_time_s"] for r in w)
    rate = tokens / seconds
    gflops = 6 * params * rate / 1e9
    return {"tokens_per_s": round(rate, 1), "model_gflops": round(gflops, 1),
            "matmul_peak_gflops": peak_gflops, "share_of_matmul_peak": round(gflops / peak_gflops, 3)}


def generator_rate(rows: list[dict], n_generators: int, max_num_seqs: int) -> dict:
    """What the generators did over the steady state, from each step's generator figures
    (``cluster.records.metrics.generator_delta``: summed over the generators): tokens per second of
    busy engine time (an engine is busy while it holds a request) and the mean batch while
    busy (sequences in flight), per engine."""
    w = steady(rows)
    wall = np.array([r["step_time_s"] for r in w])
    tokens = float(np.sum(np.array([r["decode_tokens_per_s"] for r in w]) * wall))
    engine_s = wall * n_generators
    busy = float(np.sum(np.array([r["generator_busy_fraction"] for r in w]) * engine_s))
    seq_s = float(np.sum(np.array([r["generator_slot_occupancy"] for r in w]) * engine_s
                         * max_num_seqs))
    return {"tokens": round(tokens), "busy_fraction": round(busy / float(engine_s.sum()), 3),
            "tokens_per_busy_s": round(tokens / busy, 2) if busy else 0.0,
            "batch_while_busy": round(seq_s / busy, 2) if busy else 0.0,
            "tokens_per_wall_s": round(tokens / float(wall.sum()), 2)}


def engine_limit_at(curve: list[dict], batch: float) -> float:
    """The engine's measured tokens/s at ``batch``, linear between the measured batches
    (clamped at the ends)."""
    xs = [c["batch"] for c in curve]
    ys = [c["tokens_per_s"] for c in curve]
    return float(np.interp(batch, xs, ys))


def accuracy(summary: dict) -> dict:
    """Held-out accuracy at both ends (the headline metric, and greedy), with the gain in
    standard errors two ways: over the end's SE (the launcher's figure), and over
    sqrt(se_start^2 + se_end^2), which ignores that the same prompts are measured twice (the
    pairing would shrink it), so it is the conservative one: ``heldout_gain_se``."""
    metric = summary["eval_metric"]
    a0, se0 = summary[f"eval_{metric}_initial"], summary[f"eval_{metric}_initial_se"]
    a1, se1 = summary[f"eval_{metric}_final"], summary[f"eval_{metric}_final_se"]
    gain = a1 - a0
    return {"metric": metric, "prompts": summary["eval_prompts"],
            "samples_per_prompt": summary["eval_samples"],
            "start_accuracy": round(a0, 4), "start_se": round(se0, 4),
            "end_accuracy": round(a1, 4), "end_se": round(se1, 4), "gain": round(gain, 4),
            "heldout_gain_se": round(gain / math.hypot(se0, se1), 2),
            "gain_over_end_se": round(gain / se1, 2),
            "greedy": {"start": summary.get("eval_greedy_initial"),
                       "end": summary.get("eval_greedy_final"),
                       "start_se": summary.get("eval_greedy_initial_se"),
                       "end_se": summary.get("eval_greedy_final_se")}}


def analyse(run_dir: Path, params: int, matmul: dict, curve: list[dict],
            memory_mib: dict, wall_s: float) -> dict:
    """Every figure of the real-model section. ``matmul``: GFLOP/s by thread count (str);
    ``curve``: the engine alone, [{batch, tokens_per_s}]; ``memory_mib``: peak RSS by role."""
    rows, summary, config = read_run(run_dir)
    prompts = [json.loads(x) for x in (run_dir / "prompts.jsonl").read_text().splitlines() if x]
    gens, learner = config["generators"], config["learner"]
    gen = generator_rate(rows, gens["count"], gens["engine"]["max_num_seqs"])
    limit = engine_limit_at(curve, gen["batch_while_busy"])
    gen.update(engine_limit_tokens_per_s=round(limit, 2),
               share_of_engine_limit=round(gen["tokens_per_busy_s"] / limit, 3))
    acc = accuracy(summary)
    return {
        "run_dir": str(run_dir), "steps": len(rows), "train_s": round(summary["train_s"], 1),
        "wall_s": round(wall_s, 1), "startup_s": round(summary["startup"]["total_s"], 1),
        "startup": summary["startup"], "prompts_trained": summary["prompts_trained"],
        "rollouts": summary["rollouts"], "k_mean": round(summary["rollouts"] / max(1, summary[
            "prompts_trained"]), 2),
        "step_split_s": step_split(rows),
        "learner": learner_rate(rows, params, matmul[str(learner["threads"])]),
        "generators": gen, "engine_curve": curve, "memory_peak_mib": memory_mib,
        "accuracy": acc, "difficulties": config["task"]["difficulties"],
        "groups": uniform_groups(prompts, config["algo"]["k_init"],
                                 (config["task"].get("reward_low", -1.0),
                                  config["task"].get("reward_high", 1.0))),
        # The pinned figures, at the top level.
        "start_accuracy": acc["start_accuracy"], "end_accuracy": acc["end_accuracy"],
        "heldout_gain_se": acc["heldout_gain_se"],
        "generator_share_of_engine_limit": gen["share_of_engine_limit"],
        "curve": [{"step": r["step"], "reward_mean": r["reward_mean"], "k_mean": r["k_mean"],
                   "response_len_mean": r.get("response_len_mean"),
                   "step_time_s": r["step_time_s"], "learner_wait_s": r["learner_wait_s"],
                   "train_time_s": r["train_time_s"], "sync_time_s": r["sync_time_s"]}
                  for r in rows],
    }


def units(temperature: float) -> str:
    """What the numbers of real_model.json are measured in; ``temperature``: the run's
    rollout.temperature, at which its held-out samples are drawn (cluster/run/evaluation.py)."""
    return ("seconds; tokens/s (engine tokens generated, or trained prompt + response tokens "
            "for the learner); GFLOP/s = 1e9 FLOP/s; MiB of resident memory; accuracy: "
            "held-out, mean over prompts of the share of correct sampled answers (T = "
            f"{temperature:g}, the run's rollout.temperature), one sampling seed per prompt "
            "and sample")


PRIOR_KEYS = ("snapshot", "step", "n_prompts", "samples_per_prompt", "truth_mean", "truth_sd",
              "truth_noise_sd", "truth_by_level", "truth_within_level_sd", "error_sd",
              "error_sd_noise_removed", "bias", "spearman")


def prior_figures(prior_truth: dict, task: str) -> dict:
    """The prior against the truth on the real model's task, from ``studies.prior_truth``'s
    result: each snapshot of ``task``'s run (``runs.<task>``: not its recurring setting's,
    ``runs.<task>_recurring``) side by side with the predictor told each level's true mean,
    and the pinned pair (``prior_error_sd_noise_removed``,
    ``level_only_error_sd_noise_removed``) at the last snapshot measured (the trained policy
    when the end was measured). ``prior_truth.command`` and ``.date`` are that run's
    (``runs.<task>``), not the file's latest invocation, which may have measured another
    task."""
    snaps = [s for s in prior_truth["snapshots"]
             if s["task"] == task and not s.get("recurring")]
    if not snaps:
        raise ValueError(f"studies.prior_truth's result has no snapshot of task {task!r} "
                         f"(it has {sorted({s['task'] for s in prior_truth['snapshots']})}); "
                         f"run python -m studies.prior_truth --task {task} first")
    run = prior_truth.get("runs", {}).get(task, {})
    if not run.get("command"):
        raise ValueError(f"studies.prior_truth's result names no command for task {task!r} "
                         f"(runs.{task}.command); run python -m studies.prior_truth "
                         f"--task {task} again")
    order = {"start": 0, "middle": 1, "end": 2}
    snaps.sort(key=lambda s: order.get(s["snapshot"], 3))
    rows = [{**{k: s[k] for k in PRIOR_KEYS if k in s},
             "level_only": {k: s["level_mean_predictor"][k] for k in
                            ("error_sd", "error_sd_noise_removed", "bias", "spearman")}}
            for s in snaps]
    last = rows[-1]
    return {"prior_truth": {"command": run["command"], "date": run.get("date"),
                            "snapshots": rows},
            "prior_error_sd_noise_removed": round(last["error_sd_noise_removed"], 4),
            "level_only_error_sd_noise_removed":
                round(last["level_only"]["error_sd_noise_removed"], 4),
            "prior_snapshot": last["snapshot"]}
