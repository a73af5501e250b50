"""Throughput of the four modes, measured side by side on this machine:

    python -m bench.throughput [--quick] [--steps N] [--batch B]

1. sync_grpo16   sync GRPO, G = 16 (the baseline users name)
2. sync_v05      V0.5 (k 4..16), batch-synchronous: every batch waits for its slowest prompt
3. async_grpo16  async GRPO, G = 16 fixed (what asynchrony alone buys)
4. async_v05     async V0.5 (the product)

One set of actors serves all four (engine start dominates on 2 cores); before each mode the
learner and generators are reset to the same initial weights and the prior to an empty
context, so each mode starts from the same policy. Budget: the same number of learner steps
of B prompts each, i.e. the same number of trained prompts. Writes
bench/results/throughput.json and plots (utilisation timeline, accuracy vs wall-clock, k).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODES = {
    "sync_grpo16": {"mode": "sync", "algo": {"name": "grpo", "k_init": 16, "k_max": 16}},
    "sync_v05": {"mode": "sync", "algo": {"name": "v05", "k_init": 4, "k_max": 16}},
    "async_grpo16": {"mode": "async", "algo": {"name": "grpo", "k_init": 16, "k_max": 16}},
    "async_v05": {"mode": "async", "algo": {"name": "v05", "k_init": 4, "k_max": 16}},
}


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (under 10 min on 2 cores)")
    ap.add_argument("--steps", type=int, help="learner steps per mode")
    ap.add_argument("--batch", type=int, default=8, help="prompts per learner step (B)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of modes")
    ap.add_argument("--out", default=str(RESULTS / "throughput.json"))
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for every mode")
    return ap.parse_args(argv)


def mode_config(base: dict, name: str, run_dir: Path):
    from cluster.config import build_config

    spec = MODES[name]
    data = json.loads(json.dumps(base))
    data["mode"] = spec["mode"]
    data["algo"] = {**data.get("algo", {}), **spec["algo"]}
    data["run"] = {**data.get("run", {}), "name": name, "output_dir": str(run_dir)}
    return build_config(data)


def reset(roles, init_dir: str, cfg) -> None:
    """Same starting point for every mode: initial learner state, generators re-synced to it,
    a fresh prior with an empty context."""
    import ray

    from actors.weight_sync import make_sender, sync_weights
    from cluster.runtime import start_prior

    roles.learner.load_checkpoint(init_dir)
    version = max(ray.get([g.version.remote() for g in roles.generators])) + 1
    ray.get(sync_weights(make_sender("object_store"), roles.generators,
                         roles.learner.get_weights(), version))
    if roles.prior is not None:
        ray.kill(roles.prior)
        roles.prior = start_prior(cfg, roles.groups["prior"])
        ray.get(roles.prior.ready.remote())


def run_mode(name, cfg, roles, task, mem) -> dict:
    from cluster.metrics import read_metrics
    from cluster.trainer import Trainer

    mem.reset()
    summary = Trainer(cfg, roles, task).run()
    rows = read_metrics(cfg.run_dir)
    prompts = [json.loads(x) for x in (cfg.run_dir / "prompts.jsonl").read_text().splitlines()]
    ks = [p["k"] for p in prompts]
    st = [r["staleness_mean"] for r in rows]
    out = {
        "config": {"mode": cfg.mode, "algo": cfg.algo.model_dump(), "steps": cfg.run.max_steps,
                   "batch_prompts": cfg.rollout.batch_prompts},
        "prompts_trained": summary["prompts_trained"], "wall_time_s": summary["wall_time_s"],
        "prompts_per_s": summary["prompts_per_s"], "rollouts_per_s": summary["rollouts_per_s"],
        "tokens_per_s": summary["tokens_generated"] / summary["wall_time_s"],
        "generator_busy_fraction": summary["generator_busy_fraction"],
        "learner_idle_fraction": summary["learner_idle_fraction"],
        "staleness_mean": sum(st) / len(st), "staleness_max": max(r["staleness_max"] for r in rows),
        "k_mean": sum(ks) / len(ks), "k_max": max(ks), "k_values": ks,
        "peak_rss_mib": mem.peaks_mib(),
        "eval": [{"t": r["t_step_end"] - summary["t_start"], "step": r["step"],
                  "accuracy": r["eval_accuracy"]} for r in rows if r.get("eval_accuracy") is not None],
        "eval_accuracy_initial": summary["eval_accuracy_initial"],
        "accounting": {k: summary[k] for k in ("prompts_admitted", "prompts_trained",
                                               "prompts_dropped", "prompts_in_flight_at_end")},
        "timeline": timeline(rows, prompts, summary["t_start"]),
        "response_lengths": [n for p in prompts for n in p["lengths"]],
        "success_rates": [sum(r > 0.5 * sum(task.rewards) for r in p["rewards"]) / p["k"]
                          for p in prompts],
        "prior_probs": [p["prior_p"] for p in prompts if p["prior_p"] is not None],
        "measured": {  # constants for the simulator's calibration
            "n_generators": cfg.generators.count,
            "max_num_seqs": cfg.generators.engine.get("max_num_seqs", 64),
            "train_time_s": sum(r["train_time_s"] for r in rows),
            "trained_tokens": sum(r["tokens_generated"] for r in rows)
                              + sum(p["prompt_tokens"] * p["k"] for p in prompts),
            "sync_time_s": sum(r["sync_time_s"] for r in rows) / len(rows),
            "prompt_tokens": sum(p["prompt_tokens"] for p in prompts) / max(1, len(prompts)),
            "max_staleness": cfg.rollout.max_staleness,
            "max_inflight_prompts": cfg.rollout.max_inflight_prompts},
    }
    if len(out["prior_probs"]) != len(out["success_rates"]):
        out["prior_probs"] = []
    return out


def timeline(rows, prompts, t0) -> dict:
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
    learner = [[r["t_train_start"] - t0, r["t_train_end"] - t0] for r in rows]
    return {"generators": merged, "learner": learner}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from cluster.runtime import prefer_loopback

    prefer_loopback("local")  # before ray is imported: this bench starts its own cluster
    from bench._throughput_support import MemorySampler, plots, sim_check
    from cluster.config import load_config
    from cluster.placement import plan
    from cluster.runtime import connect, start_roles
    from tasks import make_task_from_config

    import ray

    steps = args.steps or (6 if args.quick else 30)
    modes = [m for m in args.modes.split(",") if m]
    base_cfg = load_config(Path(__file__).resolve().parent.parent / "v05.yaml", [
        f"run.max_steps={steps}", f"rollout.batch_prompts={args.batch}",
        f"run.eval_every={max(1, steps // 3)}", "run.eval_prompts=32",
        "rollout.max_inflight_prompts=32", "cluster.address=local", *args.overrides])
    base = base_cfg.model_dump(mode="json")
    shape = mode_config(base, "async_v05", Path(tempfile.mkdtemp()))
    model_path = shape.model.resolve()
    p = plan(shape)
    started = connect(shape, p)
    roles = start_roles(shape, p, model_path)
    task = make_task_from_config(shape.task)
    run_dir = Path(tempfile.mkdtemp(prefix="v05-throughput-"))
    init_dir = str(run_dir / "init")
    roles.learner.save_checkpoint(init_dir, {"step": 0})
    mem = MemorySampler()
    results = {}
    probe = measure_probe(roles, task)
    try:
        for name in modes:
            print(f"== {name}: {steps} steps x {args.batch} prompts", file=sys.stderr, flush=True)
            cfg = mode_config(base, name, run_dir)
            reset(roles, init_dir, cfg)
            results[name] = run_mode(name, cfg, roles, task, mem)
            r = results[name]
            print(f"   {r['prompts_per_s']:.2f} prompts/s, busy {r['generator_busy_fraction']:.0%}, "
                  f"k {r['k_mean']:.1f}, {r['wall_time_s']:.0f}s", file=sys.stderr, flush=True)
    finally:
        mem.stop()
        roles.shutdown()
        if started:
            ray.shutdown()
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "cpus": __import__("os").cpu_count()},
           "budget": f"{steps} learner steps x {args.batch} prompts per mode "
                     f"(= {steps * args.batch} trained prompts each)",
           "quick": args.quick, "probe": probe, "runs": results, "ratios": ratios(results)}
    out["simulator"] = sim_check(out)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    plots(out, Path(args.out).with_suffix(""))
    print(json.dumps(out["ratios"], indent=1))
    return 0


def measure_probe(roles, task) -> dict:
    import ray

    from bench._throughput_support import probe_decode

    prompt = task.heldout()[0].prompt
    t = time.perf_counter()
    for _ in range(10):
        ray.get(roles.generators[0].version.remote())
    return {"decode_step_s": probe_decode(roles.generators, prompt),
            "dispatch_latency_s": (time.perf_counter() - t) / 10}


def ratios(results: dict) -> dict:
    def r(a, b, key="prompts_per_s"):
        if a in results and b in results and results[b][key] > 0:
            return results[a][key] / results[b][key]
        return None

    return {"async_v05_vs_sync_grpo16_prompts_per_s": r("async_v05", "sync_grpo16"),
            "async_v05_vs_async_grpo16_prompts_per_s": r("async_v05", "async_grpo16"),
            "sync_v05_vs_sync_grpo16_prompts_per_s": r("sync_v05", "sync_grpo16"),
            "async_grpo16_vs_sync_grpo16_prompts_per_s": r("async_grpo16", "sync_grpo16")}


if __name__ == "__main__":
    from cluster.runtime import run_main

    run_main(main)  # exits without C++ static destructors: see exit_process
