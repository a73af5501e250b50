"""Throughput of the training modes, measured side by side on this machine:

    python -m bench.throughput [--quick] [--steps N] [--repeats R] [--batch B]

1. sync_grpo16           sync GRPO, G = 16 (the baseline users name; on this machine every
                         role shares the same cores, so it is also the colocated baseline)
2. sync_v05              V0.5 (k 4..16, batched plan) behind the synchronous barrier
3. async_grpo16          async GRPO, G = 16 (what asynchrony alone buys)
4. async_v05             async V0.5 (the product)
5. async_grpo_equal_mse  async GRPO with the G whose baseline MSE equals V0.5's (the simulator,
                         calibrated with this run, gives G)

One set of long-lived actors serves every run; before each, learner and generators are reset
to the same initial weights and the prior to an empty context. Each mode runs ``--repeats``
times, interleaved. Rates are over the steady-state window (measure.py). Writes
bench/results/throughput.json and plots (utilisation timeline, rates with their spread).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import config_for, round_robin, shared_roles, stamp, write_json
from bench.modes import MODES
from bench.throughput.measure import cpu_limit, spread, steady_state

RESULTS = Path(__file__).resolve().parent.parent / "results"
# This bench's modes (their overrides: bench.modes, the one table).
THROUGHPUT_MODES = ("sync_grpo16", "sync_v05", "async_grpo16", "async_v05", "async_grpo_equal_mse")
RATIOS = [("async_v05", "sync_grpo16"), ("async_v05", "async_grpo16"),
          ("async_v05", "async_grpo_equal_mse"), ("sync_v05", "sync_grpo16"),
          ("async_grpo16", "sync_grpo16")]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs, one repeat")
    ap.add_argument("--steps", type=int, help="learner steps per run")
    ap.add_argument("--repeats", type=int, help="runs per mode (default 3; --quick: 1)")
    ap.add_argument("--batch", type=int, default=8, help="prompts per learner step (B)")
    ap.add_argument("--modes", default=",".join(THROUGHPUT_MODES),
                    help="comma-separated subset of modes")
    ap.add_argument("--out", default=str(RESULTS / "throughput.json"))
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for every mode")
    return ap.parse_args(argv)


def mode_config(base: dict, name: str, run_dir: Path, group: int | None = None):
    spec = MODES[name]
    algo = {**spec["algo"], **({} if group is None else {"k_init": group, "k_max": group})}
    return config_for(base, name, run_dir, mode=spec["mode"], algo=algo)


def run_mode(cfg, shared, mem, warmup: int) -> dict:
    from cluster.records.files import read_lines

    task = shared.task
    mem.reset()
    summary = shared.trainer(cfg).run()
    acct = summary.accounting
    rows = read_lines(cfg.run_dir / "metrics.jsonl")
    prompts = [json.loads(x) for x in (cfg.run_dir / "prompts.jsonl").read_text().splitlines()]
    w = [r for r in rows if r["step"] > warmup]
    t0 = rows[0]["t_start"]
    return {
        "config": {"mode": cfg.mode, "algo": cfg.algo.model_dump(), "steps": cfg.run.max_steps,
                   "batch_prompts": cfg.rollout.batch_prompts},
        "steady_state": steady_state(rows, warmup),
        "prompts_trained": summary.totals.prompts_trained,
        "wall_time_s": summary.wall_time_s, "peak_rss_mib": mem.peaks_mib(),
        "accounting": {"prompts_admitted": acct.scheduler.prompts_admitted,
                       "prompts_trained": summary.totals.prompts_trained,
                       "prompts_dropped": acct.prompts_dropped,
                       "prompts_in_flight_at_end": acct.prompts_in_flight_at_end},
        "k_values": [p["k"] for p in prompts],
        "timeline": timeline(rows, prompts, t0, w[0]["t_start"] - t0 if w else 0.0),
        "response_lengths": [n for p in prompts for n in p["lengths"]],
        "success_rates": [sum(r > 0.5 * sum(task.rewards) for r in p["rewards"]) / p["k"]
                          for p in prompts],
        "prior_probs": [p["prior_p"] for p in prompts if p["prior_p"] is not None],
        "measured": {  # constants for the simulator's calibration, over the window
            "n_generators": cfg.generators.count,
            "max_num_seqs": cfg.generators.engine.max_num_seqs,
            "train_time_s": sum(r["train_time_s"] for r in w),
            "trained_tokens": sum(r["trained_tokens"] for r in w),
            "sync_time_s": sum(r["sync_time_s"] for r in w) / max(1, len(w)),
            "prompt_tokens": sum(p["prompt_tokens"] for p in prompts) / max(1, len(prompts)),
            "max_staleness": cfg.rollout.max_staleness,
            "max_inflight_prompts": cfg.rollout.max_inflight_prompts},
    }


def timeline(rows, prompts, t0: float, window_start: float) -> dict:
    """Busy intervals per generator (union of rollout spans) and the learner's train spans."""
    spans: dict[int, list] = {}
    for p in prompts:
        for g, a, b in p["spans"]:
            spans.setdefault(int(g), []).append((a - t0, b - t0))
    merged = {}
    for g, iv in spans.items():
        iv.sort()
        out = [list(iv[0])]
        for a, b in iv[1:]:
            if a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        merged[str(g)] = out
    return {"generators": merged, "window_start": window_start,
            "learner": [[r["t_train_start"] - t0, r["t_train_end"] - t0] for r in rows]}


def probe_decode(generators, prompt: str, sizes=(1, 8, 32), max_tokens: int = 16) -> list:
    """Seconds per decode step with n sequences on one engine: time n completions of a prompt,
    divided by the longest completion (the number of decode steps the batch took)."""
    import ray

    from common.types import RolloutRequest, SamplingConfig

    out = []
    g = generators[0]
    for n in sizes:
        best = None
        for rep in range(2):
            t = time.perf_counter()
            rs = ray.get(g.generate.remote(RolloutRequest(f"probe{n}-{rep}", "probe", prompt, n,
                                                          SamplingConfig(max_tokens=max_tokens))))
            dt = (time.perf_counter() - t) / max(len(r.token_ids) for r in rs)
            best = dt if best is None else min(best, dt)
        out.append([n, best])
    return out


def measure_probe(roles, task) -> dict:
    import ray

    prompt = task.heldout()[0].prompt
    t = time.perf_counter()
    for _ in range(10):
        ray.get(roles.generators[0].version.remote())
    latency = (time.perf_counter() - t) / 10
    # Every generator at once, every slot busy: the machine's peak decode rate.
    peak = sum(ray.get([g.measure_peak.remote(prompt) for g in roles.generators]))
    return {"decode_step_s": probe_decode(roles.generators, prompt), "dispatch_latency_s": latency,
            "peak_decode_tokens_per_s": peak}


def summarise(runs: dict, probe: dict) -> dict:
    """Per mode: each rate's spread over repeats, and the fraction of the CPU limit."""
    sync = runs.get("sync_grpo16")
    learner_tps = spread([r["steady_state"]["learner_tokens_per_s"] for r in sync])["mean"] \
        if sync else None
    out = {}
    for name, reps in runs.items():
        ss = [r["steady_state"] for r in reps]
        for s in ss:
            s["fraction_of_limit"] = (s["prompts_per_s"] / cpu_limit(
                s["gen_tokens_per_prompt"], s["train_tokens_per_prompt"],
                probe["peak_decode_tokens_per_s"], learner_tps)) if learner_tps else None
        out[name] = {k: spread([s[k] for s in ss]) for k in (
            "prompts_per_s", "rollouts_per_s", "trained_tokens_per_s", "decode_tokens_per_s",
            "generator_slot_occupancy", "generator_busy_fraction", "learner_idle_fraction",
            "k_mean", "rounds_mean", "fraction_of_limit")}
        out[name]["staleness_max"] = max(s["staleness_max"] for s in ss)
    return out


def ratios(summary: dict) -> dict:
    out = {}
    for a, b in RATIOS:
        if a in summary and b in summary and summary[b]["prompts_per_s"]["mean"]:
            out[f"{a}_vs_{b}_prompts_per_s"] = (summary[a]["prompts_per_s"]["mean"]
                                                / summary[b]["prompts_per_s"]["mean"])
    return out


def run_modes(base: dict, modes: list[str], steps: int, repeats: int, batch: int,
              warmup: int) -> tuple[dict, int | None]:
    """Every mode ``repeats`` times, interleaved, on one set of long-lived actors reset
    before each run (``bench.harness``): (the probe and the runs, the equal-MSE group)."""
    from bench.throughput.calibration import sim_check
    from bench.throughput.memory import MemorySampler

    run_dir = Path(tempfile.mkdtemp(prefix="v05-throughput-"))
    runs: dict[str, list] = {m: [] for m in modes}
    group = None
    with shared_roles(mode_config(base, "async_v05", run_dir), run_dir) as shared:
        startup = shared.roles.startup.to_json()
        print(shared.roles.startup.line(), file=sys.stderr, flush=True)
        out = {"steps": steps, "warmup_steps": warmup, "startup": startup}
        mem = MemorySampler()
        try:
            out["probe"] = measure_probe(shared.roles, shared.task)
            for rep, name in round_robin(modes, repeats):  # spread load drift
                if name == "async_grpo_equal_mse" and group is None:
                    if not runs.get("async_v05") or not runs.get("sync_grpo16"):
                        continue  # G comes from the simulator calibrated on those two
                    out["runs"] = {k: v for k, v in runs.items() if v}
                    out["ratios"] = {}
                    group = sim_check(out)["equal_mse_group"]
                cfg = mode_config(base, name, run_dir, group if name.endswith("equal_mse") else None)
                shared.reset(cfg)
                print(f"== {name} (repeat {rep + 1}/{repeats}): {steps} steps x {batch} "
                      "prompts", file=sys.stderr, flush=True)
                r = run_mode(cfg, shared, mem, warmup)
                runs[name].append(r)
                ss = r["steady_state"]
                print(f"   {ss['prompts_per_s']:.2f} prompts/s, {ss['trained_tokens_per_s']:.0f} "
                      f"trained tokens/s, slots {ss['generator_slot_occupancy']:.0%}, "
                      f"k {ss['k_mean']:.1f}", file=sys.stderr, flush=True)
        finally:
            mem.stop()
    out["runs"] = {k: v for k, v in runs.items() if v}
    return out, group


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from common.rayproc import prefer_loopback

    prefer_loopback("local")  # before ray is imported: this bench starts its own cluster
    from bench.throughput.calibration import sim_check
    from bench.throughput.plots import plots
    from cluster.config.schema import load_config

    steps = args.steps or (8 if args.quick else 20)
    repeats = args.repeats or (1 if args.quick else 3)
    base_cfg = load_config(Path(__file__).resolve().parents[2] / "v05.yaml", [
        f"run.max_steps={steps}", f"rollout.batch_prompts={args.batch}", "run.eval_every=0",
        "cluster.address=local", "run.progress=false", *args.overrides])
    warmup = base_cfg.rollout.max_staleness + 2
    modes = [m for m in args.modes.split(",") if m]
    out, group = run_modes(base_cfg.model_dump(mode="json"), modes, steps, repeats, args.batch,
                           warmup)
    out["summary"] = summarise(out["runs"], out["probe"])
    out["ratios"] = ratios(out["summary"])
    out["equal_mse_group"] = group
    out.update({**stamp("bench.throughput", argv),
                "budget": f"{steps} learner steps x {args.batch} prompts per run, {repeats} "
                          f"repeats per mode; rates over steps {warmup + 1}..{steps} "
                          "(evaluations excluded)",
                "quick": args.quick})
    out["simulator"] = sim_check(out)
    write_json(args.out, out)
    plots(out, Path(args.out).with_suffix(""))
    print(json.dumps(out["ratios"], indent=1))
    return 0


if __name__ == "__main__":
    from common.rayproc import run_main

    run_main(main)  # exits without C++ static destructors: see exit_process
