"""prior_truth.png: per task and snapshot, the prior's p against the truth (each prompt a
point, coloured by level) with the reliability curve; a bar panel of error sd (noise removed)
per variant against the level-mean reference and the window's level means (with repeated
runs, the shipped prior's and the reference's mean over them, +- SE, in red)."""
from __future__ import annotations

from pathlib import Path


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    snaps = [{**s, "row": s["task"] + (" recurring" if s.get("recurring") else "")}
             for s in res["snapshots"]]  # a row per task and setting (prompts recurring or not)
    tasks = sorted({s["row"] for s in snaps})
    cols = max(len([s for s in snaps if s["row"] == t]) for t in tasks) + 1
    fig, axes = plt.subplots(len(tasks), cols, figsize=(3.6 * cols, 3.4 * len(tasks)),
                             squeeze=False)
    for row, task in zip(axes, tasks):
        mine = [s for s in snaps if s["row"] == task]
        for ax in row[len(mine) + 1:]:  # a task with fewer snapshots than the widest row
            ax.axis("off")
        for ax, s in zip(row, mine):
            pts = s["points"]
            ax.scatter(pts["truth"], pts["p"], c=pts["level"], s=6, cmap="viridis", alpha=0.7)
            rel = [b for b in s["reliability"] if b["count"]]
            ax.plot([b["truth_mean"] for b in rel], [b["p_mean"] for b in rel], "r-o", ms=3,
                    lw=1, label="bin means")
            ax.plot([0, 1], [0, 1], "k:", lw=0.8)
            ax.set_title(f"{task} {s['snapshot']} (step {s['step']}): sd {s['error_sd']:.3f}, "
                         f"bias {s['bias']:+.3f}, rho {s['spearman']:.2f}", fontsize=7)
            ax.set_xlabel(f"truth ({s['samples_per_prompt']} samples)", fontsize=7)
            ax.set_ylabel("prior p", fontsize=7)
        ax = row[len(mine)]
        names = list(mine[0]["variants"])
        w = 0.8 / (len(names) + 1)
        for i, name in enumerate(names):
            ax.bar([j + i * w for j in range(len(mine))],
                   [s["variants"][name]["error_sd_noise_removed"] for s in mine], w, label=name)
        ax.bar([j + len(names) * w for j in range(len(mine))],
               [s["level_mean_predictor"]["error_sd_noise_removed"] for s in mine], w,
               color="grey", label="level means (reference)")
        for j, s in enumerate(mine):  # over the repeated runs: the mean and its SE
            rep = s.get("repeats")
            if rep:
                for x, k in ((j, "error_sd_noise_removed"),
                             (j + len(names) * w, "level_error_sd_noise_removed")):
                    ax.errorbar(x, rep[k]["mean"], yerr=rep[k]["se"], fmt="D", ms=3, color="r",
                                capsize=2, zorder=4,
                                label=f"mean of {rep['runs']} runs +- SE" if x == j == 0 else None)
        window = [(j, s["level_window_error_sd_noise_removed"]) for j, s in enumerate(mine)
                  if s.get("level_window_error_sd_noise_removed") is not None]
        if window:  # what a prior reading each level perfectly learns from its window
            ax.scatter([j + 0.4 for j, _ in window], [v for _, v in window], marker="_", s=400,
                       color="k", zorder=3, label="the window's level means")
        ax.axhline(0.07, color="k", ls=":", lw=0.8)
        top = max(max(s["variants"][n]["error_sd_noise_removed"] for n in names)
                  for s in mine)
        ax.set_ylim(0, 2.4 * top)  # room above the bars for the legend (17 variants)
        ax.set_xticks([j + 0.4 for j in range(len(mine))], [s["snapshot"] for s in mine])
        ax.set_title(f"{task}: error sd, truth noise removed", fontsize=7)
        ax.legend(fontsize=6, ncol=2, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
