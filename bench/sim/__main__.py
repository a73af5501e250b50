"""Discrete-event simulation of the RL system on a GPU cluster: how much training do the GPUs buy?

    python -m bench.sim                      # full: every mode + sensitivity sweeps (minutes)
    python -m bench.sim --quick              # fewer steps, small sweeps (< 1 min)
    python -m bench.sim --config my.yaml n_generators=20 length.sigma=0.9
    python -m bench.sim --calibrate cpu_calibration.json   # predict the measured CPU ratio
    python -m bench.sim --prior-error-sd 0.1 --best-grpo-g 4  # instead of the measured files

Modes (bench/sim/core.py) run the shipped scheduler (actors/scheduler.py) on simulated
engines. Models and their default constants: bench/sim/models.py and docs/simulator.md.
The prior's error sd (on the probability scale) comes from bench/results/prior_truth.json when
it exists (bench/sim/measured.py), else from --prior-error-sd, else the old assumption 0.2;
GRPO's best G from bench/results/learning.json, else --best-grpo-g, else 4.
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
from bench.sim.measured import (LEARNING, PRIOR_TRUTH, resolve_best_grpo_g,
                                resolve_prior_error_sd)
from bench.sim.metrics import ratios
from bench.sim.models import SimConfig, from_dict, load_file, parse_overrides
from bench.sim.study import aims, run_modes, run_sweeps, selection_summary

MAIN = SimConfig(steps=30)
# A smaller cluster of the same shape (a smoke test of the whole benchmark in about a minute).
QUICK = SimConfig(steps=12, n_gpus=8, n_generators=4, batch_prompts=256, max_staleness=2)
SWEEP_STEPS = 20
# The prior's error sd (probability scale, 'errX' priors): where V0.5 pays and where not.
PRIOR_ERROR_SDS = [0.05, 0.07, 0.1, 0.15, 0.2, 0.25]
QUICK_PRIOR_ERROR_SDS = [0.1, 0.25]
PRIOR_MODES = ["async_v05", "async_grpo_equal_mse"]  # the GRPO baselines have no prior
SWEEPS = {
    "batch_prompts": ("batch_prompts", [512, 1024, 2048, 4096],
                      ["sync_grpo16_colocated", "sync_grpo16_colocated_oversample", "async_v05"]),
    "max_staleness": ("max_staleness", [2, 4, 6, 8], ["async_v05"]),
    "generator_split": ("n_generators", [13, 15, 17, 19, 21], ["async_v05"]),
    "plan": ("plan", ["sequential", "batched"], ["sync_v05", "async_v05"]),
}


def prior_label(sd: float) -> str:
    """The 'errX' prior of error sd X (to 4 decimals, so that sweep points match the run's)."""
    return f"err{round(sd, 4):g}"


def prior_sweep_spec(sds: list[float], measured: float) -> tuple:
    """The prior-error sweep, with the run's own (measured) value among its points."""
    vals = sorted({round(x, 4) for x in [*sds, measured]})
    return ("prompts.prior", [prior_label(x) for x in vals], PRIOR_MODES)


def _plain(o):
    """JSON for NumPy scalars (np.bool_ stays a bool, np.float64 a float)."""
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def build_config(args) -> tuple[SimConfig, dict]:
    """-> (config, provenance): the prior's error sd and GRPO's best G with their sources."""
    sd, sd_source, detail = resolve_prior_error_sd(args.prior_error_sd, args.prior_truth)
    g, g_source = resolve_best_grpo_g(args.best_grpo_g, args.learning)
    cfg = QUICK if args.quick else MAIN
    cfg = replace(cfg, best_grpo_group=g, prompts=replace(cfg.prompts, prior=prior_label(sd)))
    if args.calibrate:
        cfg = replace(calibration_config(load_file(args.calibrate)), best_grpo_group=g)
    if args.config:
        cfg = from_dict(load_file(args.config), cfg)
    if args.overrides:
        cfg = from_dict(parse_overrides(args.overrides), cfg)
    if cfg.prompts.prior != prior_label(sd) or cfg.prompts.p_values is not None:
        # The calibration, a config file or an override set the prior: report what it is.
        sd = cfg.prompts.prior_error_sd()
        sd_source, detail = f"the simulator's config (prompts.prior={cfg.prompts.prior}" + (
            ", measured pairs" if cfg.prompts.prior_values is not None else "") + ")", None
    if cfg.best_grpo_group != g:
        g_source = "the simulator's config (best_grpo_group)"
    prov = dict(prior_error_sd=sd, prior_error_sd_source=sd_source,
                prior_error_sd_realised=cfg.prompts.prior_error_sd(),
                prior_noise_scale=cfg.prompts.noise_scale(),
                best_grpo_group_source=g_source)
    if detail is not None:
        prov["prior_error_sd_snapshots"] = detail["per_snapshot"]
    return cfg, prov


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps and small sweeps (< 1 min)")
    ap.add_argument("--config", help="YAML/JSON file of SimConfig fields (nested sections)")
    ap.add_argument("--calibrate", help="JSON of measured constants (docs/simulator.md schema)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of modes")
    ap.add_argument("--no-sweeps", action="store_true", help="skip the sensitivity sweeps")
    ap.add_argument("--out", default=None, help="output prefix (default bench/results/sim, "
                    "or bench/results/sim_calibrated with --calibrate)")
    ap.add_argument("--prior-error-sd", type=float, default=None,
                    help="the prior's error sd on the probability scale (sd of p - true success "
                    "rate); default: from --prior-truth, else 0.2 (assumed)")
    ap.add_argument("--prior-truth", default=str(PRIOR_TRUTH),
                    help="prior_truth.json to read the prior's error from (stepwise task, the "
                    "largest over snapshots, the truth's sampling noise removed)")
    ap.add_argument("--best-grpo-g", type=int, default=None,
                    help="G of the async_grpo_best_g baseline; default: from --learning, else 4")
    ap.add_argument("--learning", default=str(LEARNING),
                    help="learning.json whose summary.controlled.<start>.best_grpo_G is read")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. decode.a_s=0.005")
    args = ap.parse_args(argv)
    cfg, prov = build_config(args)
    print(f"prior error sd {prov['prior_error_sd']:.4g} ({prov['prior_error_sd_source']}); "
          f"best GRPO G {cfg.best_grpo_group} ({prov['best_grpo_group_source']})", flush=True)
    from bench.sim import plot  # matplotlib only when plotting (predict_ratio stays light)

    out = Path(args.out or ("bench/results/sim_calibrated" if args.calibrate else "bench/results/sim"))
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    per, results = run_modes(cfg, [m for m in args.modes.split(",") if m], keep=True,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
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
                                  "window (after the first max_staleness + 2 learner steps); "
                                  "ratios: *_prompts_per_hour of prompts trained, "
                                  "*_rollouts_per_hour of rollouts trained"),
                  config={**asdict(cfg), **prov}, modes=per, ratios=rat,
                  summary={"selection": selection_summary(per, rat)})
    plot.gantt(results, f"{out}.png")
    plot.utilisation(results, f"{out}_utilisation.png")
    prior_sweep = None
    if not (args.no_sweeps or args.calibrate):
        sds = QUICK_PRIOR_ERROR_SDS if args.quick else PRIOR_ERROR_SDS
        # The prior sweep holds pinned aims: it runs on the main budget, since a short window
        # still holds V0.5's pipeline fill (20 steps put sd 0.05 at 0.85 where 30 steps give
        # 1.00), and reuses the main run's modes (the GRPO baselines have no prior).
        spec = prior_sweep_spec(sds, prov["prior_error_sd"])
        report["sweeps"] = run_sweeps(cfg, {"prior_error_sd": spec}, base_modes=per)
        prior_sweep = report["sweeps"]["prior_error_sd"]
        for pt in prior_sweep["points"]:
            pt["prior_error_sd"] = float(pt["value"][len("err"):])
        if not args.quick:  # the other sensitivity sweeps run shorter
            base = replace(cfg, steps=min(cfg.steps, SWEEP_STEPS))
            report["sweeps"].update(run_sweeps(base, SWEEPS))
            report["sweep_budget"] = dict(steps=base.steps, warmup=base.warmup,
                                          prior_error_sd_steps=cfg.steps)
        # The pinned figure: the smallest share-of-limit ratio over the prior sweep.
        vals = [p["ratios"].get("v05_vs_equal_mse_share_of_limit_ratio")
                for p in prior_sweep["points"]]
        if all(v is not None for v in vals):
            rat["v05_vs_equal_mse_share_of_limit_ratio"] = min(vals)
        plot.sweeps(report["sweeps"], f"{out}_sweeps.png", measured=prov["prior_error_sd"])
    if "async_v05" in per:
        report["aims"] = aims(per, rat, cfg, prior_sweep)
    report["meta"]["wall_s"] = time.perf_counter() - t0
    Path(f"{out}.json").write_text(json.dumps(report, indent=1, default=_plain))
    print(f"wrote {out}.json, {out}.png ({report['meta']['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
