"""Figure of the estimator benchmark (reads the result dict of ``scenarios.run_benchmark``)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PRIOR_COLORS = {"exact": "#1b9e77", "sd0.05": "#66a61e", "sd0.1": "#e6ab02", "sd0.2": "#d95f02",
                "sd0.3": "#e7298a", "halluc20": "#7570b3", "const0.5": "#666666"}
VARIANT_MARKERS = {("v05_k4", None, "bound"): "s", ("v05_k4", None, "bernoulli"): "D",
                   ("v05_osla", "predictive", "bound"): "o", ("v05_osla", "plugin", "bound"): "^",
                   ("v05_osla", "predictive", "bernoulli"): "P",
                   ("v05_osla", "plugin", "bernoulli"): "X"}


def _variant(r):
    return r["estimator"], r["lookahead"], r["noise"]


def _label(key):
    est, look, noise = key
    return f"V0.5 fixed k=4 ({noise})" if look is None else f"V0.5 OSLA {look}/{noise}"


def panel_mse(ax, res):
    """MSE against mean rollouts: GRPO's curve and one V0.5 point per (variant, prior)."""
    g = res["grpo"]
    ks = np.linspace(1.8, 17, 100)
    ax.plot(ks, res["population_var_reward"] / ks, ":", color="k", lw=1,
            label="GRPO, E[Var r]/k (any k)")
    ax.plot([r["mean_k"] for r in g], [r["mse"] for r in g], "k-", marker="*", ms=11,
            lw=2, label="GRPO, G = " + ", ".join(str(r["group"]) for r in g))
    for r in g:
        ax.annotate(f"G={r['group']}", (r["mean_k"], r["mse"]), textcoords="offset points",
                    xytext=(4, 6), fontsize=8)
    for r in res["v05"]:
        ax.scatter(r["mean_k"], r["mse"], marker=VARIANT_MARKERS[_variant(r)],
                   color=PRIOR_COLORS.get(r["prior"], "C0"), s=55, edgecolor="k", lw=0.4,
                   zorder=3)
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xticks([2, 3, 4, 5, 6, 8, 11, 16], ["2", "3", "4", "5", "6", "8", "11", "16"])
    ax.set_xlabel("mean rollouts per prompt (log scale)")
    ax.set_ylabel("baseline MSE vs true mean reward")
    ax.set_title("(a) baseline MSE against rollout cost")
    ax.grid(True, which="both", alpha=0.3)
    # two legends: colour = prior quality, marker = V0.5 variant
    from matplotlib.lines import Line2D
    priors = [Line2D([], [], ls="", marker="o", color=PRIOR_COLORS.get(q, "C0"), mec="k", ms=8,
                     label=f"prior {q}") for q in dict.fromkeys(r["prior"] for r in res["v05"])]
    marks = [Line2D([], [], ls="", marker=m, color="w", mec="k", ms=8, label=_label(key))
             for key, m in VARIANT_MARKERS.items()]
    leg = ax.legend(handles=priors, loc="lower right", fontsize=8, title="colour", ncol=1)
    ax.add_artist(leg)
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + marks, loc="upper right", fontsize=8, title="marker / line")


def panel_hist(ax, res, lookahead="predictive", noise="bound"):
    """Distribution of rollouts per prompt under OSLA, one line per prior quality."""
    for r in res["v05"]:
        if _variant(r) != ("v05_osla", lookahead, noise):
            continue
        h = np.asarray(r["k_hist"])
        k = np.arange(h.size)
        sel = h > 0
        ax.plot(k[sel], h[sel], "-o", ms=4, color=PRIOR_COLORS.get(r["prior"], "C0"),
                label=f"{r['prior']} (mean {r['mean_k']:.2f})")
    ax.set_yscale("log")
    ax.set_xlabel("rollouts for the prompt (k at stop)")
    ax.set_ylabel("fraction of prompts")
    ax.set_title(f"(b) OSLA rollouts per prompt ({lookahead}/{noise})")
    ax.set_xticks(range(res["config"]["k_init"], res["config"]["k_max"] + 1))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, title="prior")


def panel_bias(ax, res):
    """Conditional bias of the fused baseline at fixed k against the paper's O(1/sqrt k)."""
    b = res["bias_vs_k"]
    k = np.asarray(b["k"], float)
    sigma = (res["config"]["rewards"][1] - res["config"]["rewards"][0]) / 2  # sqrt(noise bound)
    ax.plot(k, sigma / np.sqrt(k), "k--", lw=1.5, label="sigma / sqrt(k)")
    for noise, ls in (("bound", "-"), ("bernoulli", "-.")):
        ax.plot(k, b["worst_case_grid"][noise]["max_abs"], ls, color="k", marker="v",
                label=f"worst case over (p, prior) grid, {noise}")
    for key, v in b["per_prior"].items():
        q, noise = key.split("/")
        if noise != "bound":
            continue
        ax.plot(k, np.maximum(v["mean_abs"], 1e-6), "-o", ms=3,
                color=PRIOR_COLORS.get(q, "C0"), label=f"mean |bias|, prior {q}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("k (fixed number of rollouts)")
    ax.set_ylabel("|E[baseline | p, prior] - mu|")
    ax.set_title("(c) conditional bias of the fused baseline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")


PLAN_COLORS = {"sequential": "#7f7f7f", "batched": "#1f78b4"}


def panel_plan_rounds(ax, res):
    """Generation rounds per prompt by prior: mean (bars) and 99th percentile (markers)."""
    rows = res.get("batched_vs_sequential") or []
    x = np.arange(len(rows))
    for j, plan in enumerate(("sequential", "batched")):
        pos = x + (j - 0.5) * 0.38
        ax.bar(pos, [r[f"rounds_mean_{plan}"] for r in rows], 0.38, color=PLAN_COLORS[plan],
               label=f"{plan}: mean")
        ax.plot(pos, [r[f"rounds_p99_{plan}"] for r in rows], "v", color="k", ms=7,
                mfc=PLAN_COLORS[plan], label=f"{plan}: 99th percentile")
    ax.axhline(2.0, color="C3", ls="--", lw=1, label="aim: mean <= 2")
    ax.axhline(3.0, color="C3", ls=":", lw=1, label="aim: p99 <= 3")
    ax.set_xticks(x, [r["prior"] for r in rows])
    ax.set_yscale("log", base=2)
    ax.set_yticks([1, 2, 3, 4, 8, 16], ["1", "2", "3", "4", "8", "16"])
    ax.set_ylim(0.9, 48)  # room for the legend above the sequential p99 markers
    ax.set_ylabel("generation rounds per prompt")
    cap = rows[0]["plan_batched"]["max_rounds"] if rows else None
    ax.set_title(f"(e) rounds: sequential OSLA vs batched plan (max_rounds={cap})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncol=3)


def panel_plan_k(ax, res):
    """Rollouts per prompt by prior, both plans; batched split into observed and cancelled
    (run fraction of cancelled rollouts); MSE ratio batched / sequential written above."""
    rows = res.get("batched_vs_sequential") or []
    x = np.arange(len(rows))
    ax.bar(x - 0.19, [r["k_mean_sequential"] for r in rows], 0.38,
           color=PLAN_COLORS["sequential"], label="sequential")
    obs = [r["observed_k_mean_batched"] for r in rows]
    ax.bar(x + 0.19, obs, 0.38, color=PLAN_COLORS["batched"], label="batched: observed")
    ax.bar(x + 0.19, [r["cancelled_spent_mean"] for r in rows], 0.38, bottom=obs,
           color="#a6cee3", label="batched: cancelled (run fraction)")
    for xi, r in zip(x, rows):
        ax.annotate(f"k {r['k_ratio']:.2f}x\nMSE {r['mse_ratio']:.2f}x",
                    (xi, max(r["k_mean_sequential"], r["k_mean_batched"])),
                    textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
    ax.set_xticks(x, [r["prior"] for r in rows])
    ax.set_ylabel("rollouts per prompt (rollout equivalents)")
    ax.set_title("(f) rollouts: batched / sequential ratios of k and MSE above the bars")
    ax.set_ylim(0, 1.2 * max([r["k_mean_batched"] for r in rows], default=1))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def plot_results(res: dict, path: str | Path) -> None:
    fig, axes = plt.subplots(3, 2, figsize=(17, 20))
    panel_mse(axes[0, 0], res)
    panel_hist(axes[0, 1], res)
    panel_bias(axes[1, 0], res)
    axes[1, 1].axis("off")  # was (d), the experimental variants (retired, issue 44)
    panel_plan_rounds(axes[2, 0], res)
    panel_plan_k(axes[2, 1], res)
    cfg = res["config"]
    fig.suptitle(f"Baseline estimators on p ~ Beta{tuple(cfg['beta_ab'])}, rewards "
                 f"{tuple(cfg['rewards'])}, {cfg['n_prompts']:,} prompts, OSLA k {cfg['k_init']}"
                 f"..{cfg['k_max']}, c = {cfg['cost']:.5g}", fontsize=14)
    fig.tight_layout(rect=(0, 0, 1, 0.985))  # leave the top strip to the title
    fig.savefig(path, dpi=100)
    plt.close(fig)
