"""bench.real_model's plot: where a step's time goes, the generators against the engine alone,
each role's memory, and held-out accuracy at both ends."""
from __future__ import annotations

from pathlib import Path


def plot(out: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    fig.suptitle(f"{out['model_path']} on {out['task']}: {out['steps']} steps, "
                 f"{out['train_s']:.0f} s of training", fontsize=11)

    ax = axes[0][0]  # seconds per step, stacked
    steps = [c["step"] for c in out["curve"]]
    bottom = [0.0] * len(steps)
    for key, label, color in (("learner_wait_s", "waiting for generation", "#f4a261"),
                              ("train_time_s", "training", "#2a9d8f"),
                              ("sync_time_s", "weight sync", "#264653")):
        vals = [c[key] for c in out["curve"]]
        ax.bar(steps, vals, bottom=bottom, color=color, label=label, width=0.85)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(xlabel="learner step", ylabel="seconds", title="seconds per step")
    ax.legend(fontsize=8)

    ax = axes[0][1]  # the engine alone against the run
    g = out["generators"]
    xs = [c["batch"] for c in out["engine_curve"]]
    ax.plot(xs, [c["tokens_per_s"] for c in out["engine_curve"]], "o-", color="0.3",
            label="one engine alone (fixed batch)")
    ax.plot([g["batch_while_busy"]], [g["tokens_per_busy_s"]], "*", ms=14, color="#e76f51",
            label=f"during the run, per busy engine: {g['share_of_engine_limit']:.0%} of alone")
    ax.set(xscale="log", xlabel="sequences in the batch", ylabel="tokens / s",
           title="generator decode rate")
    ax.legend(fontsize=8)

    ax = axes[1][0]  # memory per role
    mem = out.get("memory_peak_mib") or {}
    if mem:
        roles = sorted(mem)
        ax.barh(roles, [mem[r] / 1024 for r in roles], color="#8ab17d")
        for i, r in enumerate(roles):
            ax.text(mem[r] / 1024, i, f" {mem[r] / 1024:.2f}", va="center", fontsize=8)
    ax.set(xlabel="peak resident memory (GiB)", title="memory per role")

    ax = axes[1][1]  # held-out accuracy
    acc = out["accuracy"]
    greedy = acc["greedy"]
    ax.errorbar([0, 1], [acc["start_accuracy"], acc["end_accuracy"]],
                yerr=[acc["start_se"], acc["end_se"]], fmt="o-", capsize=4, color="#e76f51",
                label=f"sampled (headline): {acc['heldout_gain_se']:+.1f} SE")
    if greedy.get("end") is not None:
        ax.errorbar([0, 1], [greedy["start"], greedy["end"]],
                    yerr=[greedy["start_se"], greedy["end_se"]], fmt="s--", capsize=4,
                    color="0.4", label="greedy")
    ax.set(xticks=[0, 1], xticklabels=["start", "end"], ylim=(0, 1), ylabel="accuracy",
           title=f"held-out accuracy, {acc['prompts']} prompts")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
