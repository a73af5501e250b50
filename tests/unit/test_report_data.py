"""Crafted run directories for the report's tests (``make_run``), written with the run's own
writers (``RunFiles``, ``batch_metrics``, ``PromptRecord``) so that their format is the one a
real run writes; and the check that they are faithful (every prompt's fate adds up under
``prompt_fates``, the evidence the resume tests use)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common.types import PromptRecord
from cluster.records.metrics import batch_metrics, pool_prior_error
from cluster.records.files import RunFiles, prompt_fates
from cluster.records.step import StepMetrics
from cluster.records.summary import RunSummary

CONFIG = """mode: async
run:
  eval_metric: sampled
task:
  reward_low: -1.0
  reward_high: 1.0
algo:
  name: v05
  k_init: 4
rollout:
  max_staleness: 2
"""
T0 = 1_800_000_000.0


def _record(rng, uid: int, step: int, t: float, gens: int) -> PromptRecord:
    k = int(rng.choice([4, 4, 8, 16]))
    p = float(rng.uniform(0.02, 0.98))
    rewards = [1.0 if rng.random() < p else -1.0 for _ in range(k)]
    g = uid % gens
    spans = [(g, t + 0.01 * j, t + 0.3 + 0.05 * j) for j in range(k)]
    return PromptRecord(
        prompt_id=f"arith/{uid}", uid=f"s{uid}", prompt=f'{uid}+1= "quoted"', k=k, rewards=rewards,
        baseline=float(np.mean(rewards)), prior_p=p, prior_accepted=bool(rng.random() < 0.6),
        fallback=False, unparsed=0, admitted_version=max(0, step - 2), deadline=step,
        versions=[max(0, step - 1)] * k, generators=[g] * k, rounds=1 + (k > 4), cancelled_rollouts=0,
        cancelled_tokens=0, regenerations=0, tokens=3 * k, lengths=[3] * k, prompt_tokens=6,
        t_admit=t, t_done=t + 0.4, spans=spans)


def make_run(root: Path, steps: int = 8, prompts_per_step: int = 8, gens: int = 2,
             eval_every: int = 4, dropped: int = 3, in_flight: int = 5, broken_by: int = 0,
             stalled: bool = False) -> Path:
    """A run directory with every file and key a finished run writes. ``broken_by``: the
    summary admits that many prompts more than the files account for. ``stalled``: the
    summary the watchdog writes instead."""
    rng = np.random.default_rng(0)
    run = Path(root)
    w = RunFiles(run, CONFIG, progress=False)
    uid, t, rows = 0, T0, []
    with (run / "prompts.jsonl").open("w") as plog:
        for step in range(1, steps + 1):
            recs = [_record(rng, uid + i, step, t + 0.05 * i, gens) for i in range(prompts_per_step)]
            uid += prompts_per_step
            wait, train, sync = 0.2 + 0.1 * (step % 3), 0.5, 0.1
            ev = {}
            if eval_every and step % eval_every == 0:
                ev = {"eval_greedy": 0.3 + 0.02 * step, "eval_greedy_se": 0.05,
                      "eval_sampled": 0.25 + 0.02 * step, "eval_sampled_se": 0.05,
                      "eval_accuracy": 0.25 + 0.02 * step, "eval_accuracy_se": 0.05,
                      "eval_time_s": 0.7}
            m = {"step": step, "policy_version": step, **batch_metrics(recs, 4, (-1.0, 1.0)),
                 "loss": 0.1, "grad_norm": 1.0, "entropy": 0.5, "lr": 3e-5,
                 "staleness_mean": min(step - 1, 1.5), "staleness_max": min(step - 1, 2),
                 "step_time_s": wait + train + sync, "learner_wait_s": wait, "train_time_s": train,
                 "sync_time_s": sync, "eval_time_s": 1e-6, "learner_idle_fraction": wait / 0.9,
                 "generator_busy_fraction": 0.8, "generator_slot_occupancy": 0.4 + 0.03 * step,
                 "decode_tokens_per_s": 900.0 + 10 * step, "inflight_prompts": in_flight,
                 "t_start": t, "t_train_start": t + wait, "t_train_end": t + wait + train,
                 "t_step_end": t + wait + train + sync, "prompts_per_s": 8.0, **ev}
            w.step(StepMetrics.from_json(m))
            rows.append(m)
            for r in recs:
                plog.write(json.dumps({**r.to_dict(), "step": step, "t_trained": t + wait}) + "\n")
            t += wait + train + sync + ev.get("eval_time_s", 0.0)
    reasons = {"filtered_all_equal": dropped - 1, "stale": 1 if dropped else 0, "learner_nan_skip": 0}
    with (run / "dropped.jsonl").open("w") as f:
        for reason, n in reasons.items():
            for _ in range(n):
                f.write(json.dumps({"uid": f"s{uid}", "reason": reason, "step": steps}) + "\n")
                uid += 1
    (run / "inflight_at_end.json").write_text(
        json.dumps({"step": steps, "uids": [f"s{uid + i}" for i in range(in_flight)]}) + "\n")
    uid += in_flight
    trained = steps * prompts_per_step
    if stalled:
        w.summary(RunSummary.from_json({"status": "stalled", "stalled_on": "generators (evaluation)",
                   "stall_report": {"seconds_since_last_step": 600.0, "step": steps},
                   "steps": steps, "policy_version": steps, "prompts_trained": trained}))
        return run
    w.summary(RunSummary.from_json({"prompts_admitted": uid + broken_by, "prompts_handed": trained,
               "prompts_dropped": dropped, "drop_reasons": reasons,
               "prompts_in_flight_at_end": in_flight, "data_pos": uid + broken_by,
               "prompts_trained": trained, "steps": steps, "policy_version": steps,
               "mode": "async", "algo": "v05", "wall_time_s": t - T0, "train_wall_time_s": t - T0 - 1.4,
               "prompts_per_s": 8.0, "rollouts_per_s": 60.0, "generator_busy_fraction": 0.8,
               "generator_slot_occupancy": 0.5, "decode_tokens_per_s": 950.0,
               "learner_idle_fraction": 0.3, "t_start": T0, "eval_metric": "sampled",
               "eval_accuracy_initial": 0.2, "eval_accuracy_initial_se": 0.05,
               "eval_accuracy_final": 0.25 + 0.02 * steps, "eval_accuracy_final_se": 0.05,
               "prior_abs_error": float(np.mean([m["prior_abs_error"] for m in rows])),
               **pool_prior_error(rows),
               "generators": [{"index": i, "alive": True, "busy_fraction": 0.8 - 0.1 * i,
                               "slot_occupancy": 0.5, "decode_tokens_per_s": 950.0,
                               "peak_decode_tokens_per_s": 2000.0, "fraction_of_peak": 0.475}
                              for i in range(gens)]}))
    return run


def test_crafted_run_accounts_for_every_prompt(tmp_path):
    fates = prompt_fates(make_run(tmp_path / "run"))
    assert (fates["admitted"], fates["trained"], fates["dropped"], fates["in_flight"]) == (72, 64, 3, 5)
    assert not (fates["lost"] or fates["trained_twice"] or fates["trained_and_dropped"]
                or fates["unknown"])


def test_every_drawn_prompt_has_one_fate_deferred_and_waiting_included(tmp_path):
    """Admission by selection draws prompts it never admits: each deferred one is in
    deferred.jsonl, each still waiting at the end in inflight_at_end.json; a uid in neither
    is lost, one deferred and trained has two fates."""
    import json

    from common.records import Accounting
    from cluster.records.summary import RunSummary

    run = tmp_path / "sel"
    w = RunFiles(run, CONFIG, progress=False)
    w.deferred([("s1", 0.97, 0.12), ("s3", None, 0.1)], 1)
    (run / "prompts.jsonl").write_text("".join(json.dumps({"uid": u, "step": 1}) + "\n"
                                               for u in ("s0", "s2")))
    w.end(Accounting(data_pos=6, inflight_uids=["s4"], waiting_uids=["s5"],
                     deferred_since_last_batch=[]), 1)
    (run / "summary.json").write_text(json.dumps(
        RunSummary.from_json({"data_pos": 6, "prompts_admitted": 3}).to_json()))
    fates = prompt_fates(run)
    assert (fates["drawn"], fates["admitted"], fates["deferred"], fates["waiting"]) == (6, 3, 2, 1)
    assert fates["lost"] == [] and fates["deferred_twice"] == []
    lines = [json.loads(x) for x in (run / "deferred.jsonl").read_text().splitlines()]
    assert lines[0] == {"uid": "s1", "p": 0.97, "admit_probability": 0.12, "step": 1}
    w.end(Accounting(data_pos=6, inflight_uids=["s4"], waiting_uids=[]), 1)  # s5 nowhere
    assert prompt_fates(run)["lost"] == ["s5"]
    w.deferred([("s0", 0.5, 0.9)], 2)  # s0 was trained: a second fate
    assert prompt_fates(run)["deferred_twice"] == ["s0"]
