"""Plots of bench.throughput: a utilisation timeline per mode and the rates with their spread."""
from __future__ import annotations

from pathlib import Path


def plots(out: dict, stem: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = out["runs"]
    names = list(runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.6 + 1.3 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        r = runs[name][0]  # the first repeat
        tl = r["timeline"]
        gens = sorted(tl["generators"], key=int)
        for y, g in enumerate(gens):
            ax.broken_barh([(a, b - a) for a, b in tl["generators"][g]], (y - 0.4, 0.8),
                           color="tab:blue")
        ax.broken_barh([(a, b - a) for a, b in tl["learner"]], (len(gens) - 0.4, 0.8),
                       color="tab:orange")
        ax.axvline(tl["window_start"], color="grey", ls=":", lw=1)
        ax.set_yticks(range(len(gens) + 1), [f"gen {g}" for g in gens] + ["learner"])
        ss = r["steady_state"]
        ax.set_title(f"{name}: {ss['prompts_per_s']:.2f} prompts/s (steady state), slots "
                     f"{ss['generator_slot_occupancy']:.0%}, learner idle "
                     f"{ss['learner_idle_fraction']:.0%}; dotted: end of warm-up",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the mode started (first repeat)")
    fig.tight_layout()
    fig.savefig(f"{stem}_timeline.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, label in zip(axes, ("prompts_per_s", "rollouts_per_s", "fraction_of_limit"),
                              ("prompts / s", "trained rollouts / s", "fraction of the CPU limit")):
        s = [out["summary"][n][key] for n in names]
        ax.bar(range(len(names)), [x["mean"] for x in s],
               yerr=[[x["mean"] - x["min"] for x in s], [x["max"] - x["mean"] for x in s]],
               capsize=4, color="tab:blue", alpha=0.8)
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
        ax.set_title(f"{label}\n(mean of {s[0]['n']} repeats, bars: min-max)", fontsize=9)
    fig.tight_layout()
    fig.savefig(f"{stem}_rates.png", dpi=110)
    plt.close(fig)
