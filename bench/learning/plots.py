"""Plots of bench.learning: held-out accuracy against wall-clock, rollouts and trained tokens
(the seeds' mean, their range shaded, each seed thin), and the per-mode statistics."""
from __future__ import annotations

from pathlib import Path

COLORS = {"async_v05": "tab:red", "sync_grpo16": "tab:blue", "async_grpo16": "tab:cyan",
          "async_grpo4": "tab:green", "sync_dapo16": "tab:purple", "async_grpo2": "tab:olive",
          "async_grpo8": "tab:brown", "async_v05_cost2x": "salmon", "async_v05_cost4x": "pink",
          "async_v05_kmax8": "darkred", "async_v05_plugin": "orange",
          "async_v05_zu": "magenta", "async_drgrpo4": "black", "async_oracle4": "gold",
          "async_v05_k4": "tab:pink", "sync_drgrpo4": "black", "sync_oracle4": "gold",
          "sync_v05": "tab:red", "sync_v05_k4": "tab:pink"}
AXES = (("train_s", "training wall-clock (s, evaluations excluded)"),
        ("rollouts", "rollouts generated"), ("trained_tokens", "tokens trained on"))
STEPS_AXIS = ("step", "updates (each on the same number of samples)")


def plots(out: dict, stem: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, curves, s = out["runs"], out["curves"], out["summary"]
    cfg = out["config"]
    panels = (STEPS_AXIS, *AXES) if cfg.get("budget_steps") else AXES
    fig, axes = plt.subplots(1, len(panels), figsize=(5.3 * len(panels), 4.6), sharey=True)
    for ax, (axis, label) in zip(axes, panels):
        for mode, c in curves.items():
            color = COLORS.get(mode, "grey")
            if axis not in c:  # a file written before the axis was added
                continue
            cv = c[axis]
            ax.plot(cv["x"], cv["mean"], color=color, lw=2,
                    label=f"{mode} (final {s['final_accuracy'][mode]['mean']:.3f})")
            ax.fill_between(cv["x"], cv["min"], cv["max"], color=color, alpha=0.15, lw=0)
            for r in runs[mode]:
                ax.plot([q[axis] for q in r["points"]], [q["accuracy"] for q in r["points"]],
                        color=color, lw=0.6, alpha=0.5, marker=".", ms=3)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    target = s.get("grpo16_final_target")
    if target is not None:
        for ax in axes:
            ax.axhline(target, color="grey", ls=":", lw=1)
    axes[0].set_ylabel(f"held-out accuracy ({cfg['eval_metric']}, {cfg['eval_prompts']} prompts)")
    axes[0].legend(fontsize=8, loc="lower right")
    dotted = "; dotted: the GRPO-16 reference's final accuracy" if target is not None else ""
    budget = (f"{cfg['budget_steps']} updates" if cfg.get("budget_steps")
              else f"{cfg['budget_train_s']:.0f} s of training")
    fig.suptitle(f"{cfg['task']} task, {cfg['seeds']} seed(s) per mode, {budget} each; line: "
                 "mean over seeds, band: their range, thin: each seed" + dotted, fontsize=9)
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    plt.close(fig)

    modes = list(curves)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    noise = {m: (v or {}).get("median_mean") for m, v in
             ((s.get("baselines") or {}).get(cfg["start"], {}).get("grad_noise_to_signal")
              or {}).items()}
    first = (("noise", "gradient noise-to-signal, median over updates") if noise else
             ("grad_norm_var_over_steps", "variance over steps of the pre-clip gradient norm"))
    for ax, key, title in ((axes[0], *first),
                           (axes[1], "zero_advantage_share", "share of zero-advantage prompts")):
        values = noise if key == "noise" else s.get(key, s.get("grad_norm_variance", {}))
        ax.bar(range(len(modes)), [values.get(m) or 0.0 for m in modes],
               color=[COLORS.get(m, "grey") for m in modes])
        ax.set_xticks(range(len(modes)), modes, rotation=25, ha="right", fontsize=8)
        ax.set_title(f"{title} (mean over seeds)", fontsize=9)
    prior = [r["prior"] for r in runs.get("async_v05", []) if r.get("prior")]
    ax = axes[2]
    if prior:
        for i, q in enumerate(prior):
            rows = [b for b in q["reliability"] if b["count"]]
            ax.plot([b["p_mean"] for b in rows], [b["observed_mean"] for b in rows], marker="o",
                    label=f"seed {i}: MAE {q['abs_error']:.2f}, AUC "
                          + (f"{q['auc_within_step']:.2f}" if q["auc_within_step"] else "-"))
        ax.plot([0, 1], [0, 1], color="grey", ls=":", lw=1)
        ax.set_xlabel("prior p (bin mean)")
        ax.set_ylabel("observed success rate (bin mean)")
        ax.legend(fontsize=7)
    ax.set_title("the embedded prior during async V0.5 runs: reliability", fontsize=9)
    fig.tight_layout()
    fig.savefig(f"{stem}_stats.png", dpi=110)
    plt.close(fig)


def selection_plots(out: dict, stem: Path) -> None:
    """The per-rollout study's plot of one setting: accuracy against generated rollouts (each
    mode's mean over seeds), every mode minus the best baseline at equal generated rollouts
    (paired, +- 2 SE), and where each mode's generated rollouts went (the share in groups
    that gave the learner nothing; the selection's skip rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, curves = out["config"], out["curves"]
    setting = cfg["setting"]
    s = out["summary"]["settings"][setting]
    modes = list(curves)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    for i, mode in enumerate(modes):
        cv = curves[mode]["generated"]
        color = COLORS.get(mode, f"C{i % 10}")
        ax.plot(cv["x"], cv["mean"], color=color, lw=2, label=mode)
        ax.fill_between(cv["x"], [m - e for m, e in zip(cv["mean"], cv["se"])],
                        [m + e for m, e in zip(cv["mean"], cv["se"])], color=color, alpha=0.15,
                        lw=0)
    ax.axvline(s["at_generated_rollouts"], color="grey", ls=":", lw=1)
    ax.set_xlabel("rollouts generated (every one sent to a generator)")
    ax.set_ylabel(f"held-out accuracy ({cfg['eval_metric']}, {cfg['eval_prompts']} prompts)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    ax = axes[1]
    best = s.get("best_baseline")
    diffs = s.get("minus_best", {})
    names = [m for m in modes if m in diffs]
    ax.bar(range(len(names)), [diffs[m]["mean"] for m in names],
           yerr=[2 * (diffs[m]["se"] or 0) for m in names], capsize=3,
           color=[COLORS.get(m, "grey") for m in names])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
    ax.set_title(f"minus the best baseline ({best}) at {s['at_generated_rollouts']:.0f} generated "
                 "rollouts, paired, +- 2 SE", fontsize=9)
    ax = axes[2]
    x = range(len(modes))
    for j, (key, label, color) in enumerate((
            ("zero_advantage_share", "generated rollouts in groups with no advantage",
             "tab:grey"),
            ("uniform_share", "generated rollouts in groups whose rewards were all equal",
             "tab:blue"),
            ("skip_rate", "prompts drawn and deferred", "tab:orange"))):
        ax.bar([i + (j - 1) * 0.27 for i in x], [s["modes"][m].get(key) or 0.0 for m in modes],
               width=0.27, label=label, color=color)
    ax.set_xticks(list(x), modes, rotation=25, ha="right", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title("where the rollouts went (mean over seeds)", fontsize=9)
    fig.suptitle(f"per generated rollout, setting '{setting}' ({cfg['task']} task, "
                 f"{cfg['seeds']} seeds paired, {cfg['budget_rollouts']} generated rollouts a "
                 "run)", fontsize=10)
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    plt.close(fig)
