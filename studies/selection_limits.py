"""What limits admission by selection: how far can a rule on the prior's p cut the share of
rollouts in uniform groups, on prompts the prior scored and that all got their rollouts?

``python -m studies.selection_limits RUN_DIR...`` reads runs that admitted every prompt drawn
and asked the prior for each (V0.5 without selection: ``prompts.jsonl``'s ``prior_p`` at
admission, and the rewards of its first ``algo.k_init`` rollouts). Each prompt's chance of a
uniform group is what the selector would have computed (``actors.scheduler.selection``:
``uniform_chance`` with the prior's error variance ``PriorError`` measured over the prompts
finished before it was admitted); each admission rule is then read off these prompts by
weighting each with the probability that rule would have admitted it: the share of rollouts
in uniform groups among what it admits, and the share of candidates it admits (the rest
deferred: no rollouts spent). Rules: the shipped ``max(floor, 1 - U)``, sharper powers
``max(floor, (1 - U)^g)``, and thresholds (``algo.select_threshold``: ``U < t`` admitted, the
rest at the floor). And the
prior's ranking of uniform groups (AUC of U against whether the group was uniform). For the
prompts each rule defers, what they cost: the share of them whose group was not uniform
(``deferred_informative_share``: what they would have taught), the share of all informative
groups deferred (``informative_deferred``), and the prior's error on the deferred and on the
admitted prompts (``prior_abs_error``: |p - the success rate of all their rollouts|).

An offline reading: the runs' policy is V0.5's, not the selecting run's; a rule that defers
more also changes which prompts the policy learns on. Writes
bench/results/selection_limits.json (with its command, date and commit) and
selection_limits.png (uniform share against admitted share, one curve per rule family).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from studies.provenance import provenance

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "selection_limits.json"
FLOOR = 0.1
POWERS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
THRESHOLDS = (0.7, 0.6, 0.5, 0.4, 0.3, 0.2)


@dataclass(frozen=True)
class Scored:
    """A prompt as the selector would have seen it: its chance of a uniform group (``u``,
    with the prior's measured error; ``u_exact``: were the prior's p its true rate), and
    whether its first k rollouts were uniform."""

    u: float
    uniform: bool
    u_exact: float
    error: float = 0.0  # |prior p - the success rate of all the prompt's rollouts|


def scored_prompts(rows: list[dict], k: int, rewards: tuple[float, float],
                   error_window: int = 256) -> list[Scored]:
    """``rows`` (a run's prompts.jsonl) in admission order, each with the uniform chance from
    its ``prior_p`` and the prior's error variance over the prompts done before its
    admission (their p against the success rate of all their rollouts, ``rewards`` the task's
    (low, high): what the scheduler tells the selector as each prompt finishes)."""
    from actors.scheduler.selection import PriorError, uniform_chance
    from estimator.core import reward_to_prob

    rows = [r for r in rows if r.get("prior_p") is not None and len(r["rewards"]) >= k]

    def rate(r: dict) -> float:
        return float(reward_to_prob(sum(r["rewards"]) / len(r["rewards"]), rewards))

    done = sorted(rows, key=lambda r: r["t_done"])
    error, j, out = PriorError(error_window), 0, []
    for r in sorted(rows, key=lambda r: r["t_admit"]):
        while j < len(done) and done[j]["t_done"] <= r["t_admit"]:
            error.add(done[j]["prior_p"], rate(done[j]), len(done[j]["rewards"]))
            j += 1
        out.append(Scored(uniform_chance(r["prior_p"], error.var, k),
                          len(set(r["rewards"][:k])) == 1, uniform_chance(r["prior_p"], 0.0, k),
                          abs(r["prior_p"] - rate(r))))
    return out


def rule_reading(prompts: list[Scored], admit) -> dict:
    """What rule ``admit(u) -> probability`` would have done on ``prompts``: the share of
    candidates it admits and the share of its admitted prompts (each k rollouts) that are
    uniform, each prompt weighted by its admission probability; ``if_prior_exact``: the
    uniform share it would reach were each prompt's p its true success rate (its groups
    uniform with chance ``u_exact``, the rule reading that): the limit of 4 rollouts'
    own chance, whatever the prior's error."""
    weights = [admit(s.u) for s in prompts]
    total = sum(weights)
    deferred = [1.0 - w for w in weights]
    informative = sum(not s.uniform for s in prompts)
    exact = [admit(s.u_exact) for s in prompts]

    def mean(ws, xs):
        return sum(w * x for w, x in zip(ws, xs)) / sum(ws) if sum(ws) > 0 else None

    return {"admitted_share": total / len(prompts),
            "uniform_share": sum(w for w, s in zip(weights, prompts) if s.uniform) / total,
            "deferred_informative_share": mean(deferred, [not s.uniform for s in prompts]),
            "informative_deferred": (sum(d for d, s in zip(deferred, prompts) if not s.uniform)
                                     / informative if informative else None),
            "prior_abs_error": {"admitted": mean(weights, [s.error for s in prompts]),
                                "deferred": mean(deferred, [s.error for s in prompts])},
            "if_prior_exact": {
                "admitted_share": sum(exact) / len(prompts),
                "uniform_share": sum(w * s.u_exact for w, s in zip(exact, prompts)) / sum(exact)}}


def auc(prompts: list[Scored]) -> float:
    """P(U of a uniform group > U of a mixed one), ties counting one half (NaN without both)."""
    from cluster.records.metrics import pair_auc

    return pair_auc([s.u for s in prompts], [s.uniform for s in prompts])


def readings(prompts: list[Scored], floor: float = FLOOR) -> dict:
    """Each rule's reading on ``prompts``: the shipped one, powers of it, and thresholds
    (``algo.select_threshold``), with the prior's AUC."""
    from actors.scheduler.selection import admit_given_u

    every = sum(s.uniform for s in prompts) / len(prompts)

    every_exact = sum(s.u_exact for s in prompts) / len(prompts)

    def row(admit, **params) -> dict:
        got = rule_reading(prompts, admit)
        got["if_prior_exact"]["vs_admitting_all"] = \
            got["if_prior_exact"]["uniform_share"] / every_exact
        return {**params, **got, "vs_admitting_all": got["uniform_share"] / every}

    return {"prompts": len(prompts), "uniform_share_admitting_all": every,
            "uniform_chance_mean": sum(s.u for s in prompts) / len(prompts),
            "uniform_share_admitting_all_if_prior_exact": every_exact,
            "auc_uniform_chance": auc(prompts), "floor": floor,
            "shipped": row(lambda u: admit_given_u(u, floor)),
            "power": [row(lambda u, g=g: max(floor, (1.0 - u) ** g), g=g) for g in POWERS],
            "threshold": [row(lambda u, t=t: admit_given_u(u, floor, t), t=t)
                          for t in THRESHOLDS]}


def run_rows(run_dir: Path) -> tuple[list[dict], int, tuple[float, float]]:
    """A run's prompts, its k_init and its task's reward range."""
    from cluster.config.schema import load_config

    cfg = load_config(run_dir / "config.yaml", [])
    rows = [json.loads(line) for line in (run_dir / "prompts.jsonl").read_text().splitlines()
            if line.strip()]
    return rows, cfg.algo.k_init, (cfg.task.reward_low, cfg.task.reward_high)


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = res["pooled"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for family, key in (("power", "g"), ("threshold", "t")):
        pts = r[family]
        ax.plot([p["admitted_share"] for p in pts], [p["vs_admitting_all"] for p in pts],
                "o-", label=f"{family} ({key} = " + ", ".join(f"{p[key]:g}" for p in pts) + ")")
        ax.plot([p["if_prior_exact"]["admitted_share"] for p in pts],
                [p["if_prior_exact"]["vs_admitting_all"] for p in pts], "o--", alpha=0.5,
                label=f"{family}, were the prior's p each prompt's true rate")
    s = r["shipped"]
    ax.plot([s["admitted_share"]], [s["vs_admitting_all"]], "k*", ms=12,
            label="shipped: max(floor, 1 - U)")
    ax.axhline(0.5, color="grey", ls=":", label="issue 41's aim (half)")
    ax.set_xlabel("share of drawn prompts admitted")
    ax.set_ylabel("uniform-group share, relative to admitting all")
    ax.set_title(f"{r['prompts']} prompts, AUC of U {r['auc_uniform_chance']:.2f}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m studies.selection_limits",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", type=Path,
                    help="runs that asked the prior for every prompt and admitted all (V0.5)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    pooled, per_run = [], {}
    for d in args.run_dirs:
        rows, k, rewards = run_rows(d)
        got = scored_prompts(rows, k, rewards)
        if not got:
            raise SystemExit(f"{d}: no prompt with a prior_p and {k} rewards (a run of V0.5 "
                             "without selection is what this reads)")
        per_run[str(d)] = readings(got)
        pooled += got
    res = {**provenance("studies.selection_limits", argv),
           "units": "shares of prompts (each with k_init rollouts); vs_admitting_all: the "
                    "rule's uniform share over the share among all prompts",
           "pooled": readings(pooled), "runs": per_run}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    plot(res, args.out.with_suffix(".png"))
    p = res["pooled"]
    print(f"{p['prompts']} prompts: uniform {p['uniform_share_admitting_all']:.3f} admitting all; "
          f"AUC {p['auc_uniform_chance']:.3f}; shipped rule admits "
          f"{p['shipped']['admitted_share']:.2f}, uniform {p['shipped']['uniform_share']:.3f} "
          f"({p['shipped']['vs_admitting_all']:.2f} of all) -> {args.out}")
    return res


if __name__ == "__main__":
    main()
