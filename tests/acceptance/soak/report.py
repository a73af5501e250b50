"""tests.acceptance.soak's result: the sampled series, each one's growth per hour, the aims, and the
run's accounting by uid."""
from __future__ import annotations

from tests.acceptance.soak.growth import growth_per_hour, growth_table

RSS_AIM = 0.05        # per hour, every role's resident memory and the run's state
STEP_TIME_AIM = 0.10  # per hour, step time
FULL = {"duration_s": 3600.0, "steps": 1000}  # the full form's least length
SCALARS = ("object_store_mb", "object_store_objects", "run_dir_mb", "checkpoints_mb",
           "logs_mb", "coordinator_entries",
           # gcs_server's own counts (its state dump): reported, not judged
           "gcs_task_events", "gcs_task_events_reported", "gcs_buffered_bytes")
RUN_STATE = ("checkpoints_mb", "coordinator_entries")


def series(samples: list[dict]) -> dict[str, list]:
    """One list per quantity, aligned with the samples (None where a sample lacks it):
    ``rss_mb/<process>``, ``fds/<process>``, ``rss_mb/total`` and the scalars."""
    names = sorted({n for s in samples for n in s["processes"]})
    out: dict[str, list] = {}
    for n in names:
        out[f"rss_mb/{n}"] = [s["processes"].get(n, {}).get("rss_mb") for s in samples]
        out[f"fds/{n}"] = [s["processes"].get(n, {}).get("fds") for s in samples]
    out["rss_mb/total"] = [round(sum(p["rss_mb"] for p in s["processes"].values()), 2)
                           for s in samples]
    for k in SCALARS:
        out[k] = [s.get(k) for s in samples]
    return out


def aims(growth: dict, duration_s: float, steps: int) -> dict:
    """Which aims the run met (a figure of None is not judged: too few samples)."""
    def under(keys, limit, both_ways=False):  # memory may shrink; step time must be flat
        bad = {k: growth[k] for k in keys if growth.get(k) is not None
               and (abs(growth[k]) if both_ways else growth[k]) >= limit}
        return not bad, bad

    rss_ok, rss_bad = under([k for k in growth if k.startswith("rss_mb/")], RSS_AIM)
    state_ok, state_bad = under(RUN_STATE, RSS_AIM)
    step_ok, step_bad = under(["step_s"], STEP_TIME_AIM, both_ways=True)
    long_enough = duration_s >= FULL["duration_s"] and steps >= FULL["steps"]
    return {"rss_under_5pct_per_hour": rss_ok, "run_state_under_5pct_per_hour": state_ok,
            "step_time_within_10pct_per_hour": step_ok, "long_enough": long_enough,
            "over_the_aim": {**rss_bad, **state_bad, **step_bad},
            "met": rss_ok and state_ok and step_ok and long_enough}


def summarise(got: dict, args) -> dict:
    """soak.json's body from ``tests.acceptance.soak.__main__.soak``'s output."""
    from cluster.records.files import prompt_fates

    cfg, summary, samples, steps = got["cfg"], got["summary"], got["samples"], got["steps"]
    fates = prompt_fates(cfg.run_dir)
    t = [s["t_s"] for s in samples]
    ser = series(samples)
    growth = growth_table(t, ser, args.warmup)
    t_steps = [x["t_end"] - steps[0]["t_end"] for x in steps] if steps else []
    step_s = [x["step_time_s"] for x in steps]
    g = growth_per_hour(t_steps, step_s, args.warmup) if steps else None
    growth["step_s"] = None if g is None else round(g, 4)
    keys = ("prompts_admitted", "prompts_trained", "prompts_dropped", "prompts_in_flight_at_end")
    acct = {k: summary.get(k) for k in keys}
    acct["identity_holds"] = acct["prompts_admitted"] == sum(acct[k] for k in keys[1:])
    duration = float(summary.get("wall_time_s", 0.0))
    return {
        "config": {"file": "v05.yaml", "overrides": got["overrides"],
                   "minutes": args.minutes, "steps": args.steps, "every_s": args.every_s,
                   "eval_every_s": args.eval_every_s, "checkpoint_every": args.checkpoint_every,
                   "batch_prompts": cfg.rollout.batch_prompts, "env": args.env},
        "quick": bool(args.quick),
        "duration_s": round(duration, 1),
        "train_wall_time_s": summary.get("train_wall_time_s"),
        "eval_time_s": summary.get("eval_time_s"),
        "steps": summary.get("steps"),
        "setup_s": got["setup_s"], "wall_s": got["wall_s"],
        "prompts_lost": len(fates["lost"]),
        "prompts_trained_twice": len(fates["trained_twice"]) + len(fates["trained_and_dropped"]),
        "accounting": acct,
        "warmup_frac": args.warmup,
        "growth_per_hour": growth,
        "aims": aims(growth, duration, int(summary.get("steps", 0))),
        "object_store_error": got.get("object_store_error"),
        "process_titles": got.get("process_titles", {}),
        "level": {k: _mean_after(t, v, args.warmup) for k, v in ser.items()},
        "series": {"t_s": t, **ser},
        "step_series": {"t_s": [round(x, 2) for x in t_steps], "step_time_s": step_s},
        "coordinator_state": [s.get("coordinator_state") for s in samples],
    }


def _mean_after(t: list, values: list, warmup: float) -> float | None:
    """The mean level after the warm-up (what growth is a fraction of)."""
    if not t:
        return None
    cut = min(t) + warmup * (max(t) - min(t))
    kept = [v for x, v in zip(t, values) if x >= cut and v is not None]
    return round(sum(kept) / len(kept), 3) if kept else None
