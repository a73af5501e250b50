"""Plots of the cluster simulator (python -m bench.sim): per-mode Gantt timelines, utilisation over time, sensitivity sweeps."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import colors as mcolors  # noqa: E402

from bench.sim.metrics import summarise, window  # noqa: E402

TITLES = {"sync_grpo16": "sync GRPO G=16", "sync_v05": "sync V0.5 (k_init 4 .. k_max 16)",
          "sync_grpo16_colocated": "sync GRPO G=16, colocated (all GPUs generate, then all train)",
          "sync_grpo16_colocated_oversample": "sync GRPO G=16, colocated, 10% over-sampled, "
                                              "stragglers aborted",
          "async_grpo_equal_mse": "async GRPO at V0.5's baseline MSE",
          "async_grpo_best_g": "async GRPO at the best G",
          "async_grpo16": "async GRPO G=16", "async_v05": "async V0.5 (the product)"}
SYNC_COLOR, TRAIN_COLOR, IDLE_COLOR = "#d62728", "#1f77b4", "#ececec"


def _bars(ax, y, seg, t0, t1, facecolors, h=0.8):
    keep = (seg[:, 1] < t1) & (seg[:, 2] > t0)
    s = seg[keep]
    if len(s):
        xs = [(max(a, t0) - t0, min(b, t1) - max(a, t0)) for a, b in s[:, 1:3]]
        ax.broken_barh(xs, (y - h / 2, h), facecolors=facecolors(s), linewidth=0)


def gantt(results: dict, path: str, span_s: float | None = None) -> None:
    """One panel per mode: engines' decode bars coloured by running sequences (log scale), red
    weight-sync pauses, white idle; the learner on top (blue train, red sync)."""
    modes = list(results)
    cfg = results[modes[0]].cfg
    if span_s is None:
        r0 = results[modes[0]]
        w0, w1 = window(r0)  # 2.5 steps of the first mode (sync GRPO: generate, train, sync)
        span_s = 2.5 * (w1 - w0) / max(1, len(r0.steps) - cfg.warmup)
    norm = mcolors.LogNorm(1, cfg.decode.max_num_seqs)
    cmap = plt.get_cmap("viridis")
    E = max(r.n_engines for r in results.values())
    fig = plt.figure(figsize=(13, 1.2 + 2.6 * len(modes)))
    axes = fig.subplots(len(modes), 1)
    fig.subplots_adjust(left=0.08, right=0.88, top=1 - 0.75 / fig.get_figheight(),
                        bottom=0.55 / fig.get_figheight(), hspace=0.42)
    for ax, m in zip(np.atleast_1d(axes), modes):
        res = results[m]
        t0 = window(res)[0]
        t1 = t0 + span_s
        seg = res.engine_segments
        ax.set_facecolor(IDLE_COLOR)
        for e in range(res.n_engines):
            es = seg[seg[:, 0] == e]
            _bars(ax, e, es, t0, t1, lambda s: _decode_colors(s, cmap, norm))
        ls = res.learner_segments
        ls5 = np.column_stack([np.zeros(len(ls)), ls[:, :2], np.zeros(len(ls)), ls[:, 2]])
        _bars(ax, E + 1.5, ls5, t0, t1, lambda s: [SYNC_COLOR if k else TRAIN_COLOR for k in s[:, 4]],
              h=1.8)
        ax.axhline(E + 0.25, color="white", lw=2)
        ax.set_ylim(-0.7, E + 2.6)
        ax.set_xlim(0, span_s)
        ax.set_yticks([0, E - 1, E + 1.5], ["engine 0", f"engine {E - 1}", "learner"])
        s = summarise_line(res)
        ax.set_title(f"{TITLES.get(m, m)}   [{s}]", fontsize=10, loc="left")
    np.atleast_1d(axes)[-1].set_xlabel(f"seconds into a {span_s:.0f} s window that starts after "
                                       f"{cfg.warmup} warm-up learner steps")
    cax = fig.add_axes([0.9, 0.2, 0.015, 0.6])
    cb = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), cax=cax)
    cb.set_label(f"running sequences per engine (max_num_seqs {cfg.decode.max_num_seqs})")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="grey")
               for c in (TRAIN_COLOR, SYNC_COLOR, IDLE_COLOR)]
    fig.legend(handles, ["learner training", "weight sync (engines paused)", "idle"],
               loc="upper center", ncol=3, frameon=False, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _decode_colors(s, cmap, norm) -> list:
    """One colour per segment: running sequences on a log scale, red for a weight sync."""
    rgba = cmap(norm(np.maximum(s[:, 3], 1)))  # vectorised: one colormap call per engine
    return [SYNC_COLOR if k else tuple(c) for c, k in zip(rgba, s[:, 4])]


def summarise_line(res) -> str:
    s = summarise(res)
    return (f"{s['prompts_per_hour']:.0f} prompts/h, {s['fraction_of_limit']:.0%} of limit, "
            f"slots {s['generator_slot_occupancy']:.0%}, learner busy {s['learner_busy_fraction']:.0%}")


def utilisation_series(res):
    """Per learner step (between consecutive step ends): (edges (S+1,), engine busy, slot
    occupancy, learner busy), each (S,). A step-wise average reads better than fixed bins, which
    alias against the generate/train rhythm."""
    cfg = res.cfg
    edges = np.array([0.0] + [s["t_end"] for s in res.steps])
    S = len(edges) - 1
    busy, occ, lrn = (np.zeros(S) for _ in range(3))
    seg = res.engine_segments
    dec = seg[seg[:, 4] == 0]
    ls = res.learner_segments
    ls = ls[ls[:, 2] == 0]
    for i in range(S):
        a, b = edges[i], edges[i + 1]
        ov = np.clip(np.minimum(dec[:, 2], b) - np.maximum(dec[:, 1], a), 0, None)
        busy[i] = ov.sum() / (res.n_engines * (b - a))
        occ[i] = (ov * dec[:, 3]).sum() / (res.n_engines * (b - a) * cfg.decode.max_num_seqs)
        lrn[i] = np.clip(np.minimum(ls[:, 1], b) - np.maximum(ls[:, 0], a), 0, None).sum() / (b - a)
    return edges, busy, occ, lrn


def utilisation(results: dict, path: str) -> None:
    modes = list(results)
    nrow = -(-len(modes) // 2)
    fig, axes = plt.subplots(nrow, 2, figsize=(13, 3.7 * nrow), sharey=True, squeeze=False)
    for ax, m in zip(axes.ravel(), modes):
        edges, busy, occ, lrn = utilisation_series(results[m])
        x = edges / 60
        for ys, col, lab in ((busy, "#2ca02c", "generators busy (>= 1 sequence running)"),
                             (occ, "#9467bd", "generator slot occupancy (n / max_num_seqs)"),
                             (lrn, TRAIN_COLOR, "learner training")):
            ax.stairs(ys, x, color=col, lw=1.8, label=lab)
        w0 = window(results[m])[0] / 60
        ax.axvline(w0, color="grey", ls=":", lw=1)
        ax.set_title(TITLES.get(m, m), fontsize=10, loc="left")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.set_xlabel("simulated minutes; each stair is one learner step (dotted: end of warm-up)",
                      fontsize=9)
    for ax in axes[:, 0]:
        ax.set_ylabel("fraction")
    for ax in axes.ravel()[len(modes):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PRIOR_LINES = (  # (ratio stem, colour, marker, label)
    ("async_v05_vs_async_grpo_equal_mse", "black", "o", "/ async GRPO, equal MSE"),
    ("async_v05_vs_async_grpo_best_g", "#ff7f0e", "s", "/ async GRPO, best G"),
    ("async_v05_vs_sync_grpo16_colocated_oversample", "#1f77b4", "^",
     "/ coloc. sync GRPO-16 +10% abort"),
    ("async_v05_vs_sync_grpo16_colocated", "#9467bd", "v", "/ coloc. sync GRPO-16"),
)


def prior_panel(ax, sw: dict, measured: float | None) -> None:
    """Async V0.5's ratios against the prior's error sd: prompts/hour (solid) and rollouts/hour
    (dotted); the aims (1.5x equal MSE, 2.5x over-sampled colocated) and the measured sd."""
    pts = sw["points"]
    x = [p["prior_error_sd"] for p in pts]
    for stem, col, mk, label in PRIOR_LINES:
        ax.plot(x, [p["ratios"].get(f"{stem}_prompts_per_hour", np.nan) for p in pts], "-",
                marker=mk, color=col, label="V0.5 " + label + ", prompts/h")
        ax.plot(x, [p["ratios"].get(f"{stem}_rollouts_per_hour", np.nan) for p in pts], ":",
                marker=mk, mfc="none", color=col, alpha=0.8, label="(same), rollouts/h")
    ax.axhline(1.0, color="grey", lw=0.6)
    ax.axhline(1.5, color="black", lw=0.8, ls="--", alpha=0.5)
    ax.axhline(2.5, color="#1f77b4", lw=0.8, ls="--", alpha=0.5)
    ax.set_yscale("log")
    ys = [y for ln in ax.get_lines() for y in ln.get_ydata() if np.isfinite(y) and y > 0]
    lo, hi = min(ys + [1.0]) / 1.15, max(ys + [2.5]) * 1.15
    ticks = [t for t in (0.3, 0.5, 0.7, 1, 1.5, 2, 2.5, 3, 4, 6, 8, 12, 20) if lo <= t <= hi]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(lo, hi)
    if measured is not None:
        ax.axvline(measured, color="#2ca02c", lw=2, alpha=0.5)
        ax.text(measured, 0.02, f" this run's prior: sd {measured:.3g}", color="#2ca02c",
                fontsize=9, transform=ax.get_xaxis_transform())
    ax.set_xlabel("prior error sd (sd of p_prior - true success rate, probability scale)")
    ax.set_ylabel("ratio (log scale)")
    ax.set_title("prior_error_sd: where V0.5 pays (dashed: aims 1.5x, 2.5x)", fontsize=11,
                 loc="left")
    ax.grid(alpha=0.3, which="both")
    ax.set_xticks(x, [f"{v:g}" for v in x], fontsize=9)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    ax2 = ax.twinx()
    ax2.plot(x, [p["modes"].get("async_v05", {}).get("mean_k", np.nan) for p in pts],
             color="#8c564b", alpha=0.4, lw=4)
    ax2.set_ylabel("async V0.5 mean k (brown, right axis)", color="#8c564b")


def sweeps(sweep_data: dict, path: str, measured: float | None = None) -> None:
    """The prior sweep (its own panel, two units); each other sweep: prompts/hour ratios
    (left axis) and async V0.5 utilisation (right axis)."""
    names = [n for n in sweep_data if n != "prior_error_sd"]
    prior = sweep_data.get("prior_error_sd")
    ncol = 3
    nrow = -(-len(names) // ncol) + (prior is not None)
    fig = plt.figure(figsize=(14, 3.9 * nrow + 1.0 + (1.5 if prior is not None else 0)))
    grid = fig.add_gridspec(nrow, ncol, height_ratios=([1.4] if prior is not None else [])
                            + [1] * (nrow - (prior is not None)))
    if prior is not None:
        prior_panel(fig.add_subplot(grid[0, :]), prior, measured)
    axes = [fig.add_subplot(grid[(prior is not None) + i // ncol, i % ncol])
            for i in range(len(names))]
    lines = []
    for ax, name in zip(axes, names):
        sw = sweep_data[name]
        x = np.arange(len(sw["points"]))
        lines = []
        for key, style, col in (("async_v05_vs_sync_grpo16_colocated_prompts_per_hour", "o-", "black"),
                                ("async_v05_vs_sync_grpo16_colocated_oversample_prompts_per_hour",
                                 "v-", "#1f77b4"),
                                ("async_v05_vs_sync_grpo16_prompts_per_hour", "o--", "grey"),
                                ("async_v05_vs_async_grpo16_prompts_per_hour", "s--", "#ff7f0e"),
                                ("sync_v05_vs_sync_grpo16_prompts_per_hour", "^:", "#e377c2")):
            ys = [p["ratios"].get(key, np.nan) for p in sw["points"]]
            lines += ax.plot(x, ys, style, color=col,
                             label=key.replace("_prompts_per_hour", "").replace("_vs_", " / ")
                             + "  (prompts/h, left axis)")
        ax.axhline(3.0, color="grey", lw=0.8, ls="--")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xticks(x, [str(p["value"]) for p in sw["points"]], fontsize=9)
        ax.set_xlabel(f"{sw['param']} (default {sw['default']})")
        ax.set_ylabel("prompts/hour ratio")
        ax.set_title(name, fontsize=11, loc="left")
        ax.grid(alpha=0.3)
        ax2 = ax.twinx()
        for key, col in (("generator_slot_occupancy", "#2ca02c"), ("fraction_of_limit", TRAIN_COLOR)):
            ys = [p["modes"].get("async_v05", {}).get(key, np.nan) for p in sw["points"]]
            lines += ax2.plot(x, ys, color=col, alpha=0.45, lw=4,
                              label="async V0.5 " + key.replace("_", " ") + " (right axis)")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("fraction of time (async V0.5)")
    if lines:
        fig.legend(lines, [ln.get_label() for ln in lines], loc="lower center", ncol=3,
                   fontsize=9, frameon=False,
                   title="dashed grey line: the 3x aim against colocated sync GRPO-16")
    fig.tight_layout(rect=(0, 0.1 if lines else 0, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
