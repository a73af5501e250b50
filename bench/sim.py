"""Discrete-event simulation of the RL system on a GPU cluster: how much training do the GPUs buy?

    python -m bench.sim                      # full: 4 modes + sensitivity sweeps (minutes)
    python -m bench.sim --quick              # fewer steps, small sweeps (< 1 min)
    python -m bench.sim --config my.yaml n_generators=20 length.sigma=0.9
    python -m bench.sim --calibrate cpu_calibration.json   # predict the measured CPU ratio

Modes: sync_grpo16, sync_v05, async_grpo16, async_v05 (bench/sim_core.py). Models and their
default constants: bench/sim_models.py and docs/simulator.md. Writes ``<out>.json`` and the
plots ``<out>.png`` (Gantt timelines), ``<out>_utilisation.png``, ``<out>_sweeps.png``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench.sim_core import MODES, simulate
from bench.sim_metrics import ratios, summarise
from bench.sim_models import (DecodeModel, LearnerModel, LengthModel, PromptModel, SimConfig,
                              from_dict, load_file, parse_overrides)

SWEEP_STEPS, SWEEP_WARMUP = 20, 5
MAIN = SimConfig(steps=40, warmup_steps=5)
QUICK = SimConfig(steps=12, warmup_steps=3)
# name -> (dotted parameter, values, modes the parameter can change)
SWEEPS = {
    "length_sigma": ("length.sigma", [0.3, 0.5, 0.7, 0.9, 1.1], list(MODES)),
    "prior_quality": ("prompts.prior", ["exact", "sd0.1", "sd0.2", "sd0.3", "halluc0.2", "const0.5"],
                      ["sync_v05", "async_v05"]),
    "max_tokens": ("length.max_tokens", [4096, 8192, 16384], list(MODES)),
    "generator_split": ("n_generators", [16, 20, 24, 28], list(MODES)),
    "max_staleness": ("max_staleness", [0, 1, 2, 4, 8], ["async_grpo16", "async_v05"]),
    "sync_s": ("learner.sync_s", [1.0, 3.0, 6.0], list(MODES)),
}
QUICK_SWEEPS = {"length_sigma": [0.7, 1.1], "prior_quality": ["exact", "sd0.2"],
                "generator_split": [16, 24], "max_staleness": [1, 4], "sync_s": [3.0]}


def set_param(cfg: SimConfig, dotted: str, value) -> SimConfig:
    node: dict = {}
    cur = node
    *parents, leaf = dotted.split(".")
    for p in parents:
        cur = cur.setdefault(p, {})
    cur[leaf] = value
    return from_dict(node, cfg)


def bottleneck(mode: str, s: dict) -> str:
    """What limits a mode's prompts/hour (a reading of its utilisation, see docs/simulator.md)."""
    if mode.startswith("sync"):
        return "serial phases (generate, then train, then sync)"
    if s["learner_busy_fraction"] >= 0.85:
        return "learner"
    if s["generator_throughput_efficiency"] >= 0.8:
        return "generators"
    return "admission (staleness bound leaves engines under-filled)"


def run_modes(cfg: SimConfig, modes=tuple(MODES), keep: bool = False):
    """-> ({mode: summary}, {mode: SimResult} if keep else {})."""
    summaries, results = {}, {}
    for m in modes:
        res = simulate(cfg, m)
        s = summarise(res)
        s["bottleneck"] = bottleneck(m, s)
        s["checks"] = res.checks
        summaries[m] = s
        if keep:
            results[m] = res
    return summaries, results


def _compact(s: dict) -> dict:
    keys = ("prompts_per_hour", "generator_busy_fraction", "generator_slot_occupancy",
            "generator_throughput_efficiency", "learner_busy_fraction", "mean_k", "bottleneck")
    out = {k: s[k] for k in keys}
    out["staleness_mean"], out["staleness_max"] = s["staleness"]["mean"], s["staleness"]["max"]
    return out


def run_sweeps(base: SimConfig, values_override: dict | None = None, log=print) -> dict:
    """Vary one parameter at a time around ``base``; modes a parameter cannot change reuse the
    base run (same seed, same prompts)."""
    base_modes, _ = run_modes(base)
    out = {}
    for name, (param, values, modes) in SWEEPS.items():
        vals = (values_override or {}).get(name, values)
        default = _get(base, param)
        points = []
        for v in vals:
            if v == default:
                per = dict(base_modes)
            else:
                per = dict(base_modes)
                per.update(run_modes(set_param(base, param, v), modes)[0])
            r = ratios(per)
            points.append(dict(value=v, ratios=r, modes={m: _compact(s) for m, s in per.items()}))
            log(f"  sweep {name} {param}={v}: async_v05/sync_grpo16 = "
                f"{r.get('async_v05_vs_sync_grpo16_prompts_per_hour', float('nan')):.2f}")
        out[name] = dict(param=param, default=default, points=points,
                         finding=_finding(name, param, points))
    return out


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _finding(name: str, param: str, points: list) -> str:
    key = "async_v05_vs_sync_grpo16_prompts_per_hour"
    rs = [(p["ratios"].get(key, float("nan")), p["value"]) for p in points]
    lo, hi = min(rs), max(rs)
    necks = ", ".join(f"{p['value']}: {p['modes']['async_v05']['bottleneck'].split(' (')[0]}"
                      for p in points)
    return (f"{key} ranges {lo[0]:.2f} ({param}={lo[1]}) .. {hi[0]:.2f} ({param}={hi[1]}); "
            f"async V0.5 limited by [{necks}]")


# The team's targets at 32 GPUs: where (split, staleness bound, sync cost) are both met?
TARGET_GRID = dict(n_generators=[20, 24, 28], max_staleness=[2, 4], sync_s=[1.0, 3.0])


def target_grid(base: SimConfig, log=print) -> dict:
    rows = []
    for g in TARGET_GRID["n_generators"]:
        for sync in TARGET_GRID["sync_s"]:
            cfg = set_param(replace(base, n_generators=g), "learner.sync_s", sync)
            ref = run_modes(cfg, ["sync_grpo16"])[0]["sync_grpo16"]["prompts_per_hour"]
            for s in TARGET_GRID["max_staleness"]:
                a = run_modes(replace(cfg, max_staleness=s), ["async_v05"])[0]["async_v05"]
                row = dict(n_generators=g, sync_s=sync, max_staleness=s,
                           async_v05_vs_sync_grpo16=a["prompts_per_hour"] / ref,
                           generator_busy_fraction=a["generator_busy_fraction"],
                           learner_busy_fraction=a["learner_busy_fraction"],
                           staleness_mean=a["staleness"]["mean"], staleness_p99=a["staleness"]["p99"],
                           bottleneck=a["bottleneck"])
                row["both_met"] = bool(row["async_v05_vs_sync_grpo16"] >= 4.0
                                       and row["generator_busy_fraction"] >= 0.95)
                rows.append(row)
                log(f"  grid G={g} sync_s={sync} s={s}: {row['async_v05_vs_sync_grpo16']:.2f}x, "
                    f"busy {row['generator_busy_fraction']:.3f}")
    return dict(grid=TARGET_GRID, rows=rows, met=[r for r in rows if r["both_met"]])


def targets(per: dict, rat: dict) -> dict:
    busy = per["async_v05"]["generator_busy_fraction"]
    r = rat["async_v05_vs_sync_grpo16_prompts_per_hour"]
    return dict(async_v05_generator_busy_fraction=busy, busy_target=0.95, busy_met=bool(busy >= 0.95),
                async_v05_generator_slot_occupancy=per["async_v05"]["generator_slot_occupancy"],
                async_v05_vs_sync_grpo16=r, ratio_target=4.0, ratio_met=bool(r >= 4.0))


# -- calibration -----------------------------------------------------------------------------

CAL_REQUIRED = ("n_generators", "max_num_seqs", "decode_step_s", "learner_s_per_token",
                "sync_s", "response_lengths", "batch_prompts")
CAL_OPTIONAL = {"learner_step_overhead_s": 0.0, "prompt_tokens": 0, "max_staleness": 1,
                "max_inflight_prompts": None, "group_size": 16, "k_init": 4, "k_max": 16,
                "cost": 0.0039, "success_beta": [0.3, 0.3], "prior": "sd0.2",
                "success_rates": None, "prior_probs": None, "overlap_slowdown": 1.0,
                "dispatch_latency_s": 0.005,
                "steps": 30, "warmup_steps": 5, "seed": 0}


def calibration_config(cal: dict) -> SimConfig:
    """A measured-constants dict (schema in docs/simulator.md) -> SimConfig."""
    if not isinstance(cal, dict):
        raise ValueError(f"calibration must be a JSON object, got {type(cal).__name__}")
    missing = [k for k in CAL_REQUIRED if k not in cal]
    unknown = sorted(set(cal) - set(CAL_REQUIRED) - set(CAL_OPTIONAL) - {"comment", "source"})
    if missing:
        raise ValueError(f"calibration is missing required key(s) {missing}")
    if unknown:
        raise ValueError(f"calibration has unknown key(s) {unknown}")
    c = {**CAL_OPTIONAL, **cal}
    ds = c["decode_step_s"]
    if isinstance(ds, dict) and set(ds) == {"a", "b"}:
        decode = DecodeModel(a_s=float(ds["a"]), b_s=float(ds["b"]), max_num_seqs=int(c["max_num_seqs"]))
    elif isinstance(ds, list) and ds:
        decode = DecodeModel(max_num_seqs=int(c["max_num_seqs"]), table=tuple(tuple(p) for p in ds))
    else:
        raise ValueError("decode_step_s must be {'a': s, 'b': s} or a list of [n, seconds] pairs")
    rl = c["response_lengths"]
    if isinstance(rl, list):
        if not rl or any(not isinstance(x, int) or x < 1 for x in rl):
            raise ValueError("response_lengths must be a non-empty list of integers >= 1")
        length = LengthModel(values=tuple(rl), max_tokens=max(rl), min_tokens=1,
                             prompt_tokens=int(c["prompt_tokens"]))
    elif isinstance(rl, dict):
        length = from_dict({**rl, "prompt_tokens": int(c["prompt_tokens"])}, LengthModel(), LengthModel,
                           "response_lengths.")
    else:
        raise ValueError("response_lengths must be a list of integers or a log-normal {median, sigma, max_tokens}")
    a, b = c["success_beta"]
    sr, pp = c["success_rates"], c["prior_probs"]
    prompts = PromptModel(beta_a=float(a), beta_b=float(b), prior=c["prior"],
                          p_values=None if sr is None else tuple(sr),
                          prior_values=None if pp is None else tuple(pp))
    learner = LearnerModel(s_per_token_gpu=float(c["learner_s_per_token"]),
                           step_overhead_s=float(c["learner_step_overhead_s"]), sync_s=float(c["sync_s"]))
    n_gen = int(c["n_generators"])
    return SimConfig(n_gpus=n_gen + 1, n_generators=n_gen, batch_prompts=int(c["batch_prompts"]),
                     group_size=int(c["group_size"]), k_init=int(c["k_init"]), k_max=int(c["k_max"]),
                     cost=float(c["cost"]), max_staleness=int(c["max_staleness"]),
                     max_inflight_prompts=c["max_inflight_prompts"], steps=int(c["steps"]),
                     warmup_steps=int(c["warmup_steps"]), overlap_slowdown=float(c["overlap_slowdown"]),
                     dispatch_latency_s=float(c["dispatch_latency_s"]),
                     seed=int(c["seed"]), decode=decode, length=length, prompts=prompts, learner=learner)


def predict_ratio(calibration: dict, modes=("sync_grpo16", "async_v05")) -> dict:
    """Simulate the calibrated machine. Returns
    {"async_v05_vs_sync_grpo16_prompts_per_s": float, "prompts_per_s": {mode: float},
     "mean_k": {mode: float}, "generator_busy_fraction": {...}, "learner_busy_fraction": {...},
     "ratios": {...prompts_per_hour ratios...}, "config": resolved SimConfig as a dict}."""
    cfg = calibration_config(calibration)
    per, _ = run_modes(cfg, modes)
    pick = lambda key: {m: float(s[key]) for m, s in per.items()}  # noqa: E731
    pps = {m: float(s["prompts_per_hour"]) / 3600.0 for m, s in per.items()}
    out = dict(prompts_per_s=pps, mean_k=pick("mean_k"),
               generator_busy_fraction=pick("generator_busy_fraction"),
               learner_busy_fraction=pick("learner_busy_fraction"),
               ratios={k: float(v) for k, v in ratios(per).items()}, config=asdict(cfg))
    if "async_v05" in pps and "sync_grpo16" in pps and pps["sync_grpo16"] > 0:
        out["async_v05_vs_sync_grpo16_prompts_per_s"] = pps["async_v05"] / pps["sync_grpo16"]
    return out


# -- entry point -----------------------------------------------------------------------------

def _plain(o):
    """JSON for NumPy scalars (np.bool_ stays a bool, np.float64 a float)."""
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def build_config(args) -> SimConfig:
    cfg = QUICK if args.quick else MAIN
    if args.calibrate:
        cfg = calibration_config(load_file(args.calibrate))
    if args.config:
        cfg = from_dict(load_file(args.config), cfg)
    if args.overrides:
        cfg = from_dict(parse_overrides(args.overrides), cfg)
    return cfg


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps and small sweeps (< 1 min)")
    ap.add_argument("--config", help="YAML/JSON file of SimConfig fields (nested sections)")
    ap.add_argument("--calibrate", help="JSON of measured constants (docs/simulator.md schema)")
    ap.add_argument("--no-sweeps", action="store_true", help="skip the sensitivity sweeps")
    ap.add_argument("--out", default=None, help="output prefix (default bench/results/sim, "
                    "or bench/results/sim_calibrated with --calibrate)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. decode.a_s=0.005")
    args = ap.parse_args(argv)
    cfg = build_config(args)
    from bench import sim_plot  # matplotlib only when plotting (predict_ratio stays light)
    out = Path(args.out or ("bench/results/sim_calibrated" if args.calibrate else "bench/results/sim"))
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    per, results = run_modes(cfg, keep=True)
    rat = ratios(per)
    for m, s in per.items():
        print(f"{m:13s} prompts/h {s['prompts_per_hour']:8.0f}  gen busy {s['generator_busy_fraction']:.3f}"
              f"  slots {s['generator_slot_occupancy']:.3f}  learner {s['learner_busy_fraction']:.3f}"
              f"  k {s['mean_k']:.2f}  staleness {s['staleness']['mean']:.2f}/{s['staleness']['max']}")
    print({k: round(float(v), 3) for k, v in rat.items()})
    report = dict(meta=dict(command="python -m bench.sim " + " ".join(argv if argv is not None else sys.argv[1:]),
                            date=dt.datetime.now().isoformat(timespec="seconds"),
                            python=platform.python_version(), quick=args.quick,
                            calibration=args.calibrate),
                  config=asdict(cfg), modes=per, ratios=rat, targets=targets(per, rat) if "async_v05" in per else {})
    sim_plot.gantt(results, f"{out}.png")
    sim_plot.utilisation(results, f"{out}_utilisation.png")
    if not (args.no_sweeps or args.calibrate):
        base = replace(cfg, steps=min(cfg.steps, SWEEP_STEPS if not args.quick else 10),
                       warmup_steps=min(cfg.warmup_steps, SWEEP_WARMUP if not args.quick else 3))
        report["sweeps"] = run_sweeps(base, QUICK_SWEEPS if args.quick else None)
        report["sweep_budget"] = dict(steps=base.steps, warmup_steps=base.warmup_steps)
        sim_plot.sweeps(report["sweeps"], f"{out}_sweeps.png")
        if not args.quick:
            report["target_grid"] = target_grid(base)
    report["meta"]["wall_s"] = time.perf_counter() - t0
    Path(f"{out}.json").write_text(json.dumps(report, indent=1, default=_plain))
    print(f"wrote {out}.json, {out}.png ({report['meta']['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
