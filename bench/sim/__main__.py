"""Discrete-event simulation of the RL system on a GPU cluster: how much training do the GPUs buy?

    python -m bench.sim                      # full: every mode + sensitivity sweeps (minutes)
    python -m bench.sim --quick              # fewer steps, small sweeps (< 1 min)
    python -m bench.sim --config my.yaml n_generators=20 length.sigma=0.9
    python -m bench.sim --calibrate cpu_calibration.json   # predict the measured CPU ratio

Modes (bench/sim/core.py) run the shipped scheduler (actors/scheduler.py) on simulated
engines. Models and their default constants: bench/sim/models.py and docs/simulator.md.
Writes ``<out>.json`` and the plots ``<out>.png`` (Gantt timelines),
``<out>_utilisation.png``, ``<out>_sweeps.png``.
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

from bench.sim.calibration import calibration_config
from bench.sim.core import MODES
from bench.sim.metrics import ratios
from bench.sim.models import SimConfig, from_dict, load_file, parse_overrides
from bench.sim.study import aims, run_modes, run_sweeps

MAIN = SimConfig(steps=30)
# A smaller cluster of the same shape (a smoke test of the whole benchmark in about a minute).
QUICK = SimConfig(steps=12, n_gpus=8, n_generators=4, batch_prompts=256, max_staleness=2)
SWEEP_STEPS = 20
PRIOR_SWEEP = ("prompts.prior", ["sd0.05", "sd0.1", "sd0.2", "sd0.3"],
               ["async_v05", "async_grpo_equal_mse"])
SWEEPS = {
    "prior_quality": PRIOR_SWEEP,
    "batch_prompts": ("batch_prompts", [512, 1024, 2048, 4096],
                      ["sync_grpo16_colocated", "async_v05"]),
    "max_staleness": ("max_staleness", [2, 4, 6, 8], ["async_v05"]),
    "generator_split": ("n_generators", [13, 15, 17, 19, 21], ["async_v05"]),
    "plan": ("plan", ["sequential", "batched"], ["sync_v05", "async_v05"]),
}
QUICK_SWEEPS = {"prior_quality": ("prompts.prior", ["sd0.1", "sd0.3"], PRIOR_SWEEP[2])}


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
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of modes")
    ap.add_argument("--no-sweeps", action="store_true", help="skip the sensitivity sweeps")
    ap.add_argument("--out", default=None, help="output prefix (default bench/results/sim, "
                    "or bench/results/sim_calibrated with --calibrate)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. decode.a_s=0.005")
    args = ap.parse_args(argv)
    cfg = build_config(args)
    from bench.sim import plot  # matplotlib only when plotting (predict_ratio stays light)

    out = Path(args.out or ("bench/results/sim_calibrated" if args.calibrate else "bench/results/sim"))
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    per, results = run_modes(cfg, [m for m in args.modes.split(",") if m], keep=True)
    rat = ratios(per)
    for m, s in per.items():
        print(f"{m:22s} prompts/h {s['prompts_per_hour']:7.0f}  limit {s['fraction_of_limit']:5.1%}"
              f"  slots {s['generator_slot_occupancy']:.2f}  learner {s['learner_busy_fraction']:.2f}"
              f"  k {s['mean_k']:5.2f}  rounds {s['rounds_mean']:.2f}  age max {s['sample_age_max']}",
              flush=True)
    print({k: round(float(v), 3) for k, v in rat.items()}, flush=True)
    report = dict(meta=dict(command="python -m bench.sim " + " ".join(argv if argv is not None else sys.argv[1:]),
                            date=dt.datetime.now().isoformat(timespec="seconds"),
                            python=platform.python_version(), quick=args.quick,
                            calibration=args.calibrate,
                            units="prompts, rollouts and tokens per hour over the steady-state "
                                  "window (after the first max_staleness + 2 learner steps)"),
                  config=asdict(cfg), modes=per, ratios=rat)
    plot.gantt(results, f"{out}.png")
    plot.utilisation(results, f"{out}_utilisation.png")
    prior_sweep = None
    if not (args.no_sweeps or args.calibrate):
        sweeps = dict(QUICK_SWEEPS if args.quick else SWEEPS)
        # The prior sweep holds the pinned aim: it runs on the main budget, since a short
        # window still holds V0.5's pipeline fill (20 steps put sd 0.05 at 0.85 where 30
        # steps give 1.00). The other sensitivity sweeps run shorter.
        report["sweeps"] = run_sweeps(cfg, {"prior_quality": sweeps.pop("prior_quality")})
        base = replace(cfg, steps=min(cfg.steps, SWEEP_STEPS))
        if sweeps:
            report["sweeps"].update(run_sweeps(base, sweeps))
        report["sweep_budget"] = dict(steps=base.steps, warmup=base.warmup,
                                      prior_quality_steps=cfg.steps)
        prior_sweep = report["sweeps"]["prior_quality"]
        # The pinned figure: the smallest share-of-limit ratio over the prior sweep.
        vals = [p["ratios"].get("v05_vs_equal_mse_share_of_limit_ratio")
                for p in prior_sweep["points"]]
        if all(v is not None for v in vals):
            rat["v05_vs_equal_mse_share_of_limit_ratio"] = min(vals)
        plot.sweeps(report["sweeps"], f"{out}_sweeps.png")
    if "async_v05" in per:
        report["aims"] = aims(per, rat, cfg, prior_sweep)
    report["meta"]["wall_s"] = time.perf_counter() - t0
    Path(f"{out}.json").write_text(json.dumps(report, indent=1, default=_plain))
    print(f"wrote {out}.json, {out}.png ({report['meta']['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
