"""One panel per scenario: when each learner step ended (a NaN-skipped step hollow), the
fault (red) and the recovery as the scenario defines it (green), in seconds since the run's
first step. A resumed run shows the steps kept from before the crash, the gap, the rest."""
from __future__ import annotations

import math
from pathlib import Path


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    cols = min(5, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 2.7 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, rows):
        tl = r["detail"].get("timeline") or {}
        t, s = tl.get("step_end_s", []), tl.get("step", [])
        sk = tl.get("skipped", [False] * len(s))
        ax.plot([x for x, k in zip(t, sk) if not k], [y for y, k in zip(s, sk) if not k],
                "o-", ms=3, lw=1, color="0.2")
        ax.plot([x for x, k in zip(t, sk) if k], [y for y, k in zip(s, sk) if k], "o",
                ms=6, mfc="none", color="tab:red")
        if tl.get("fault_s") is not None:
            ax.axvline(tl["fault_s"], color="tab:red", lw=1.2, label="fault")
        if tl.get("recovered_s") is not None:
            ax.axvline(tl["recovered_s"], color="tab:green", lw=1.2, ls="--", label="recovered")
        verdict = "ok" if r["clean"] else "NOT CLEAN"
        rec = "-" if r["recovery_time_s"] is None else f"{r['recovery_time_s']:.1f}s"
        ax.set_title(f"{r['name']}\n{verdict}, recovery {rec}", fontsize=8)
        ax.set_xlabel("s since first step", fontsize=7)
        ax.set_ylabel("step", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in axes.flat:
        h, lab = ax.get_legend_handles_labels()
        if len(h) > len(handles):
            handles, labels = h, lab
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    fig.tight_layout(rect=(0, 0.07 / nrows, 1, 1))
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
