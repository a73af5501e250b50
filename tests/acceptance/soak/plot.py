"""tests.acceptance.soak's plot: each sampled quantity over the run, one panel per kind (resident memory
and open files per process, the object store, the run directory, the coordinator's state,
step time); the warm-up left out of the growth fit shaded."""
from __future__ import annotations

from pathlib import Path

PANELS = [  # (title, which series)
    ("resident memory (MiB)", lambda n: n.startswith("rss_mb/")),
    ("open file descriptors", lambda n: n.startswith("fds/")),
    ("object store (MiB, objects)", lambda n: n.startswith("object_store_")),
    ("run directory (MiB)", lambda n: n in ("run_dir_mb", "checkpoints_mb", "logs_mb")),
    ("coordinator entries", lambda n: n == "coordinator_entries")]


def plot(out: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ser = dict(out["series"])
    t = [x / 60 for x in ser.pop("t_s")]
    growth = out["growth_per_hour"]
    fig, axes = plt.subplots(3, 2, figsize=(13, 10))
    warm = out["warmup_frac"] * (max(t) - min(t)) if t else 0
    for ax, (title, member) in zip(axes.flat, PANELS):
        for n in filter(member, ser):
            g = growth.get(n)
            label = n.split("/", 1)[-1] + ("" if g is None else f" ({g:+.1%}/h)")
            ax.plot(t, ser[n], lw=1, label=label)
        ax.axvspan(min(t, default=0), min(t, default=0) + warm, color="0.9")
        if title.startswith("resident"):
            ax.set_yscale("log")  # the total and every process on one axis
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("minutes")
        ax.legend(fontsize=6, ncol=2)
    st = out["step_series"]
    ax = axes.flat[-1]
    ax.plot([x / 60 for x in st["t_s"]], st["step_time_s"], ".", ms=3, color="0.3")
    g = growth.get("step_s")
    ax.set_title("step time (s)" + ("" if g is None else f", {g:+.1%}/h"), fontsize=10)
    ax.set_xlabel("minutes since the first step")
    fig.suptitle(f"tests.acceptance.soak: {out['steps']} steps, {out['duration_s'] / 60:.0f} min, "
                 f"prompts lost {out['prompts_lost']}; growth per hour after the warm-up "
                 "(shaded)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
