"""The budget rule's sweep: each V0.5 variant minus the default, paired by seed, from a
bench.learning result's runs (bench/results/budget_learning.json's ``sweep`` block):

    python -m bench.learning.sweep [FILE]     (default bench/results/budget_learning.json)

rewrites the file's ``sweep`` block from its own ``runs``, so the block is what this code
computes from them (issue 29: it was written by no code in the repository).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bench.learning.analysis import final_stats, paired_difference, totals

REF = "async_v05"
DEFAULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "budget_learning.json"


def sweep(runs: dict[str, list[dict]], mean_k: dict[str, float], ref: str = REF) -> dict:
    """Each mode minus ``ref``, paired by seed: at equal rollouts (the fewest any run
    reached: ``minus_v05_equal_rollouts``, its SE ``se_r``, each seed's difference ``seeds``)
    and at the end of training (``minus_v05_equal_time``, ``se_t``: every run trained the
    same seconds); the final accuracy, rollouts and updates of each; and which setting is
    kept: the default unless a variant beats it by more than its SE at equal rollouts."""
    eq = min(r["points"][-1]["rollouts"] for rs in runs.values() for r in rs)
    modes = {}
    for m, rs in runs.items():
        at_r = paired_difference(rs, runs[ref], "rollouts", eq)
        ends = {r["seed"]: r["points"][-1]["accuracy"] for r in runs[ref]}
        d_t = np.array([r["points"][-1]["accuracy"] - ends[r["seed"]] for r in rs
                        if r["seed"] in ends])
        fs = final_stats(rs)
        modes[m] = {"final": fs["mean"], "final_se": fs["se"], "rollouts": totals(rs, "rollouts"),
                    "updates": float(np.mean([r["steps"] for r in rs])),
                    "minus_v05_equal_rollouts": at_r["mean"], "se_r": at_r["se"],
                    "minus_v05_equal_time": float(d_t.mean()),
                    "se_t": float(d_t.std(ddof=1) / np.sqrt(len(d_t))) if len(d_t) > 1 else None,
                    "seeds": [round(x, 3) for x in at_r["seeds"]]}
    better = [m for m, v in modes.items() if m != ref and v["se_r"] is not None
              and v["minus_v05_equal_rollouts"] > v["se_r"]]
    kept = (f"{better[0]}: it beats the default by more than its standard error at equal "
            "rollouts" if len(better) == 1 else
            f"{ref} (the default): no variant differs from it by more than its standard "
            "error at equal rollouts" if not better else
            f"undecided: {', '.join(better)} each beat the default by more than its SE")
    return {"what": "the budget rule's settings in the controlled study (warm start, every "
                    "update on 64 samples): each variant minus the default (async_v05: cost "
                    "0.0039, k_max 16, batched look-ahead), paired by seed, at equal rollouts "
                    "(the fewest any run reached) and at the end of 120 s of training; mean "
                    f"and SE over {len(runs[ref])} seeds",
            "equal_rollouts_at": eq, "modes": modes, "mean_k": dict(mean_k), "kept": kept}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0]) if argv else DEFAULT
    res = json.loads(path.read_text())
    res["sweep"] = {**sweep(res["runs"], res["summary"]["mean_k"]),
                    "command": "python -m bench.learning.sweep " + " ".join(argv)}
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({m: v["minus_v05_equal_rollouts"] for m, v in res["sweep"]["modes"].items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
