"""Helpers of bench/throughput.py: per-actor peak memory, plots, the simulator cross-check."""
from __future__ import annotations

import threading
import time
from pathlib import Path

ROLES = ("Generator", "LearnerWorker", "PriorServer", "Coordinator")


class MemorySampler:
    """Samples the RSS of each Ray actor process (and its children, e.g. vLLM's engine core)
    every ``period`` seconds; Ray names actor processes ``ray::<Class>``. Reads only."""

    def __init__(self, period: float = 0.5):
        import psutil

        self._psutil, self.period = psutil, period
        self._peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        ps = self._psutil
        for proc in ps.process_iter(["cmdline"]):
            cmd = " ".join(proc.info.get("cmdline") or [])
            role = next((r for r in ROLES if cmd.startswith(f"ray::{r}")), None)
            if role is None:
                continue
            try:
                rss = proc.memory_info().rss + sum(c.memory_info().rss
                                                   for c in proc.children(recursive=True))
            except ps.Error:
                continue
            key = f"{role}:{proc.pid}"
            self._peaks[key] = max(self._peaks.get(key, 0.0), rss / 2**20)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def reset(self) -> None:
        self._peaks = {}

    def peaks_mib(self) -> dict[str, float]:
        """Peak RSS (MiB) per role: the largest over that role's actor processes."""
        out: dict[str, float] = {}
        for key, v in self._peaks.items():
            role = key.split(":")[0]
            out[role] = round(max(out.get(role, 0.0), v), 1)
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def plots(out: dict, stem: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = out["runs"]
    names = list(runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.6 + 1.3 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        tl = runs[name]["timeline"]
        rows = sorted(tl["generators"], key=int)
        for y, g in enumerate(rows):
            ax.broken_barh([(a, b - a) for a, b in tl["generators"][g]], (y - 0.4, 0.8), color="tab:blue")
        ax.broken_barh([(a, b - a) for a, b in tl["learner"]], (len(rows) - 0.4, 0.8), color="tab:orange")
        ax.set_yticks(range(len(rows) + 1), [f"gen {g}" for g in rows] + ["learner"])
        r = runs[name]
        ax.set_title(f"{name}: {r['prompts_per_s']:.2f} prompts/s, generators busy "
                     f"{r['generator_busy_fraction']:.0%}, learner idle {r['learner_idle_fraction']:.0%}",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the mode started")
    fig.tight_layout()
    fig.savefig(f"{stem}_timeline.png", dpi=110)
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for name in names:
        ev = runs[name]["eval"]
        ts = [0.0] + [e["t"] for e in ev]
        acc = [runs[name]["eval_accuracy_initial"]] + [e["accuracy"] for e in ev]
        a1.plot(ts, acc, marker="o", label=name)
        a2.hist(runs[name]["k_values"], bins=range(1, 18), alpha=0.5, label=name, align="left")
    a1.set(xlabel="wall-clock seconds", ylabel="held-out greedy accuracy", title="accuracy vs wall-clock")
    a2.set(xlabel="rollouts per prompt (k)", ylabel="prompts", title="distribution of k")
    a1.legend(fontsize=8)
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{stem}_accuracy_k.png", dpi=110)
    plt.close(fig)


def sim_check(out: dict) -> dict | None:
    """Calibrate bench/sim.py with constants measured in this run; compare its predicted
    async_v05 / sync_grpo16 ratio with the measured one."""
    from bench.sim import predict_ratio

    cal = calibration(out)
    if cal is None:
        return None
    pred = predict_ratio(cal)
    measured = out["ratios"]["async_v05_vs_sync_grpo16_prompts_per_s"]
    predicted = pred.get("async_v05_vs_sync_grpo16_prompts_per_s")
    return {"calibration": cal, "predicted_ratio": predicted, "measured_ratio": measured,
            "relative_error": abs(predicted - measured) / measured if measured and predicted else None}


def probe_decode(generators, prompt: str, sizes=(1, 8, 32), max_tokens: int = 8) -> list:
    """Seconds per decode step with n sequences on one engine: time n completions of a prompt,
    divided by the longest completion (the number of decode steps the batch took)."""
    import ray

    from actors.types import RolloutRequest, SamplingConfig

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


def calibration(out: dict) -> dict | None:
    """bench/sim.py's calibration (docs/simulator.md) from what this run measured."""
    runs = out["runs"]
    if not {"sync_grpo16", "async_v05"} <= set(runs):
        return None
    sync, av = runs["sync_grpo16"], runs["async_v05"]
    m, ma = sync["measured"], av["measured"]
    per_token = m["train_time_s"] / max(1, m["trained_tokens"])
    # Generators and learner share the cores in async mode: the learner's time per token
    # there, over its time in sync mode, is the measured slowdown of overlapping work.
    overlap = max(1.0, ma["train_time_s"] / max(1, ma["trained_tokens"]) / per_token)
    return {
        "n_generators": m["n_generators"], "max_num_seqs": m["max_num_seqs"],
        "decode_step_s": out["probe"]["decode_step_s"],
        "learner_s_per_token": per_token,
        "overlap_slowdown": overlap,
        "sync_s": m["sync_time_s"],
        "response_lengths": sync["response_lengths"],
        "prompt_tokens": m["prompt_tokens"], "batch_prompts": sync["config"]["batch_prompts"],
        "max_staleness": m["max_staleness"], "max_inflight_prompts": m["max_inflight_prompts"],
        "success_rates": av["success_rates"], "prior_probs": av["prior_probs"],
        "dispatch_latency_s": out["probe"]["dispatch_latency_s"],
        "source": "measured by bench/throughput.py on this machine",
    }
