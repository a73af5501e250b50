"""The report's figures: pure functions from arrays to an inlined PNG (base64), or None when
there is nothing to draw. matplotlib's object API only (no pyplot: no global state, no GUI
backend), so that ``cluster.report.page`` renders in seconds at the end of a run.

Every function takes already-extracted NumPy arrays (NaN where a step lacks the value) and
returns ``str | None``; the page (``cluster/report/page.py``) says "no data" for None.
"""
from __future__ import annotations

import base64
import io

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

DPI = 80
C = {"reward": "#1f77b4", "acc": "#d62728", "acc2": "#ff9896", "k": "#222222",
     "accept": "#2ca02c", "error": "#9467bd", "busy": "#1f77b4", "occ": "#ff7f0e",
     "idle": "#7f7f7f", "decode": "#17becf", "mean": "#1f77b4", "max": "#d62728",
     "wait": "#7f7f7f", "train": "#1f77b4", "sync": "#ff7f0e", "eval": "#2ca02c"}


def png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _finite(*arrays: np.ndarray) -> bool:
    return any(np.isfinite(a).any() for a in arrays if a is not None and len(a))


def _mark(ax, x: float, y: float, se: float | None, label: str, color: str, ha: str) -> None:
    ax.plot([x], [y], marker="D", ms=7, color=color, mec="black", zorder=5)
    text = f"{label} {y:.3f}" + (f" ± {se:.3f}" if se is not None and np.isfinite(se) else "")
    ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, 9), ha=ha, fontsize=8)


def learning(x: np.ndarray, reward: np.ndarray, acc_x: np.ndarray, acc: np.ndarray,
             acc_se: np.ndarray, other: tuple[str, np.ndarray] | None, metric: str,
             start: tuple[float, float, float | None] | None,
             end: tuple[float, float, float | None] | None, xlabel: str) -> str | None:
    """Reward per step (with a running mean) over held-out accuracy with its SE band.
    ``start``/``end``: (x, accuracy, se) of the first and last evaluation, marked."""
    if not _finite(reward, acc) and start is None:
        return None
    fig = Figure(figsize=(7.5, 5.0))
    top, bot = fig.subplots(2, 1, sharex=True)
    ok = np.isfinite(reward)
    if ok.any():
        top.plot(x[ok], reward[ok], color=C["reward"], lw=1, alpha=0.45, marker=".", label="per step")
        w = max(1, int(ok.sum()) // 10)
        if w > 1:
            run = np.convolve(reward[ok], np.ones(w) / w, mode="valid")
            top.plot(x[ok][w - 1:], run, color=C["reward"], lw=2, label=f"mean of {w} steps")
        top.legend(fontsize=8, loc="best")
    else:
        top.text(0.5, 0.5, "no reward data", transform=top.transAxes, ha="center")
    top.set_ylabel("reward_mean")
    top.grid(alpha=0.3)
    ok = np.isfinite(acc)
    px, py, pse = list(acc_x[ok]), list(acc[ok]), list(np.nan_to_num(acc_se[ok], nan=0.0))
    if start is not None and (not px or start[0] < px[0]):
        px.insert(0, start[0]), py.insert(0, start[1]), pse.insert(0, start[2] or 0.0)
    has_acc = bool(px)
    if has_acc:
        px, py, pse = np.array(px), np.array(py), np.array(pse)
        bot.fill_between(px, py - pse, py + pse, color=C["acc"], alpha=0.2, label="± 1 SE")
        bot.plot(px, py, color=C["acc"], marker="o", lw=2, label=f"held-out {metric}")
    if other is not None and np.isfinite(other[1]).any():
        o = np.isfinite(other[1])
        bot.plot(acc_x[o], other[1][o], color=C["acc2"], ls="--", marker=".",
                 label=f"held-out {other[0]}")
    for mark, label, ha in ((start, "start", "left"), (end, "end", "right")):
        if mark is not None:
            _mark(bot, mark[0], mark[1], mark[2], label, C["acc"], ha)
    if has_acc or (other is not None and np.isfinite(other[1]).any()):
        bot.legend(fontsize=8, loc="best")
    else:
        bot.text(0.5, 0.5, "no evaluation in this run", transform=bot.transAxes, ha="center")
    bot.set_ylabel("held-out accuracy")
    bot.set_xlabel(xlabel)
    bot.grid(alpha=0.3)
    return png(fig)


def k_heatmap(steps: np.ndarray, hist: np.ndarray, k_mean: np.ndarray) -> str | None:
    """``hist``: (steps, k_max + 1) prompt counts; coloured by the share of each step's prompts."""
    if hist.size == 0 or hist.sum() == 0:
        return None
    ks = np.nonzero(hist.sum(axis=0))[0]
    lo, hi = int(ks.min()), int(ks.max())
    share = hist[:, lo:hi + 1] / np.maximum(1, hist.sum(axis=1, keepdims=True))
    fig = Figure(figsize=(7.5, 3.8))
    ax = fig.subplots()
    x0, x1 = float(steps.min()) - 0.5, float(steps.max()) + 0.5
    im = ax.imshow(share.T, origin="lower", aspect="auto", cmap="viridis", interpolation="nearest",
                   extent=(x0, x1, lo - 0.5, hi + 0.5), vmin=0, vmax=max(1e-9, share.max()))
    fig.colorbar(im, ax=ax, label="share of the step's prompts")
    ok = np.isfinite(k_mean)
    if ok.any():
        ax.plot(steps[ok], k_mean[ok], color="white", lw=1.5, label="k_mean")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xlabel("step")
    ax.set_ylabel("k (rollouts per prompt)")
    return png(fig)


def prior_steps(steps: np.ndarray, accept: np.ndarray, error: np.ndarray,
                sd: np.ndarray | None = None, bias: np.ndarray | None = None,
                window: int = 0) -> str | None:
    """Per step: acceptance rate and |p - observed|; ``sd``/``bias``: the noise-corrected
    error sd and the bias pooled over the last ``window`` steps (each step's own is noisy)."""
    if not _finite(accept, error, sd, bias):
        return None
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.subplots()
    lines = [(accept, "prior_accept_rate", C["accept"], "-"),
             (error, "prior_abs_error: mean |p - observed success|", C["error"], "-")]
    if sd is not None:
        lines.append((sd, f"prior_error_sd_corrected ({window} steps)", C["sync"], "-"))
    if bias is not None:
        lines.append((bias, f"prior_bias ({window} steps)", C["k"], "--"))
    low = -0.02
    for y, label, c, ls in lines:
        ok = np.isfinite(y)
        if ok.any():
            ax.plot(steps[ok], y[ok], marker=".", color=c, ls=ls, label=label)
            low = min(low, float(y[ok].min()) - 0.05)
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.set_ylim(max(-1.02, low), 1.02)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return png(fig)


def reliability(bins: list[dict]) -> str | None:
    """``bins``: dicts of edges (lo, hi), n, p (mean predicted), obs (mean observed), se."""
    full = [b for b in bins if b["n"]]
    if not full:
        return None
    fig = Figure(figsize=(5.5, 6.0))
    ax, cnt = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="perfect calibration")
    p = np.array([b["p"] for b in full])
    obs = np.array([b["obs"] for b in full])
    ax.errorbar(p, obs, yerr=[b["se"] for b in full], fmt="o-", color=C["error"], capsize=3,
                label="observed success (± 1 SE)")
    for b in full:
        ax.annotate(f"n={b['n']}", (b["p"], b["obs"]), textcoords="offset points", xytext=(5, -11),
                    fontsize=7)
    ax.set_xlim(0, 1), ax.set_ylim(-0.08, 1.04)
    ax.set_ylabel("observed success rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    mids = [(b["lo"] + b["hi"]) / 2 for b in bins]
    cnt.bar(mids, [b["n"] for b in bins], width=[b["hi"] - b["lo"] for b in bins],
            color=C["error"], alpha=0.5, edgecolor="black", lw=0.5)
    cnt.set_xlabel("predicted p (prior)")
    cnt.set_ylabel("prompts")
    return png(fig)


def generators_steps(steps: np.ndarray, busy: np.ndarray, occ: np.ndarray, idle: np.ndarray,
                     decode: np.ndarray) -> str | None:
    if not _finite(busy, occ, idle, decode):
        return None
    fig = Figure(figsize=(7.5, 3.4))
    ax = fig.subplots()
    for y, label, c in ((busy, "generator_busy_fraction", C["busy"]),
                        (occ, "generator_slot_occupancy", C["occ"]),
                        (idle, "learner_idle_fraction", C["idle"])):
        ok = np.isfinite(y)
        if ok.any():
            ax.plot(steps[ok], y[ok], marker=".", color=c, label=label)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction")
    ax.grid(alpha=0.3)
    ok = np.isfinite(decode)
    if ok.any():
        tw = ax.twinx()
        tw.plot(steps[ok], decode[ok], color=C["decode"], ls=":", marker=".", label="decode tokens/s")
        tw.set_ylabel("decode tokens/s")
        tw.set_ylim(bottom=0)
        tw.legend(fontsize=8, loc="lower right")
    ax.legend(fontsize=8, loc="lower left")
    return png(fig)


def generators_bars(rows: list[dict]) -> str | None:
    """Per-generator busy fraction, slot occupancy and fraction of peak decode rate."""
    alive = [r for r in rows if r.get("alive", True)]
    if not alive:
        return None
    keys = [("busy_fraction", C["busy"]), ("slot_occupancy", C["occ"]),
            ("fraction_of_peak", C["decode"])]
    keys = [(k, c) for k, c in keys if any(isinstance(r.get(k), (int, float)) for r in alive)]
    if not keys:
        return None
    fig = Figure(figsize=(max(4.0, 1.2 * len(rows) + 2), 3.0))
    ax = fig.subplots()
    w = 0.8 / len(keys)
    for j, (k, c) in enumerate(keys):
        xs = [i + (j - (len(keys) - 1) / 2) * w for i in range(len(rows))]
        ax.bar(xs, [r.get(k) or 0.0 for r in rows], width=w, color=c, label=k)
    ax.set_xticks(range(len(rows)),
                  [f"gen {r.get('index', i)}" + ("" if r.get("alive", True) else " (dead)")
                   for i, r in enumerate(rows)])
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper right")
    return png(fig)


def gantt(lanes: dict[int, list[tuple[float, float]]], step_ends: np.ndarray) -> str | None:
    """Rollout spans per generator (seconds since the run's start). Within a generator's lane
    each span takes the lowest free row (interval partitioning), so rows read as slots."""
    if not any(lanes.values()):
        return None
    import heapq

    segs, colors, yticks, ylabels, base = [], [], [], [], 0
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for li, (g, spans) in enumerate(sorted(lanes.items())):
        free: list[tuple[float, int]] = []   # (end, row) of rows in use
        spare: list[int] = []
        rows = 0
        for s, e in sorted(spans):
            while free and free[0][0] <= s:
                heapq.heappush(spare, heapq.heappop(free)[1])
            row = heapq.heappop(spare) if spare else rows
            rows = max(rows, row + 1)
            heapq.heappush(free, (e, row))
            segs.append([(s, base + row), (e, base + row)])
            colors.append(palette[li % len(palette)])
        yticks.append(base + rows / 2)
        ylabels.append(f"gen {g}" if g >= 0 else "gen ?")
        base += rows + max(1, rows // 10)
    fig = Figure(figsize=(7.5, min(8.0, 1.5 + 0.02 * base + 0.6 * len(lanes))))
    ax = fig.subplots()
    ax.add_collection(LineCollection(segs, colors=colors, linewidths=max(0.5, min(3.0, 200 / base))))
    for t in step_ends:
        ax.axvline(t, color="grey", lw=0.5, alpha=0.5)
    ax.autoscale()
    ax.set_yticks(yticks, ylabels)
    ax.set_xlabel("seconds since the run's start (grey lines: learner step ends)")
    ax.set_ylabel("concurrent rollouts")
    return png(fig)


def staleness(steps: np.ndarray, mean: np.ndarray, mx: np.ndarray, bound: float | None) -> str | None:
    if not _finite(mean, mx):
        return None
    fig = Figure(figsize=(7.5, 3.0))
    ax = fig.subplots()
    for y, label, c in ((mean, "staleness_mean", C["mean"]), (mx, "staleness_max", C["max"])):
        ok = np.isfinite(y)
        if ok.any():
            ax.step(steps[ok], y[ok], where="mid", marker=".", color=c, label=label)
    if bound is not None:
        ax.axhline(bound, color="black", ls="--", lw=1, label=f"max_staleness = {bound:g}")
    ax.set_xlabel("step")
    ax.set_ylabel("versions")
    ax.set_ylim(bottom=-0.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return png(fig)


def step_time(steps: np.ndarray, parts: dict[str, np.ndarray]) -> str | None:
    """Stacked seconds per step: learner wait, train, weight sync, evaluation."""
    if not _finite(*parts.values()):
        return None
    fig = Figure(figsize=(7.5, 3.4))
    ax = fig.subplots()
    bottom = np.zeros(len(steps))
    many = len(steps) > 200
    for (name, y), c in zip(parts.items(), (C["wait"], C["train"], C["sync"], C["eval"])):
        y = np.nan_to_num(y, nan=0.0)
        if many:
            ax.fill_between(steps, bottom, bottom + y, step="mid", color=c, label=name, lw=0)
        else:
            ax.bar(steps, y, bottom=bottom, width=0.8, color=c, label=name)
        bottom = bottom + y
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return png(fig)
