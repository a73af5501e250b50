"""One mode of one bench.learning file against the modes of another, paired by seed:

    python -m bench.learning.versus NEW.json MODE --against OLD.json [--start weak] [--write]

For a variant run on its own (``--out NEW.json``) after a study that already holds the
baselines: the variant stands in for ``async_v05`` in the study's pinned comparison
(``analysis.controlled``: the best async GRPO-G at equal rollouts and at equal training time,
paired by seed; GRPO-16's final accuracy). Pairing by seed is sound when both files ran the
same start, budget, evaluation prompts and seeds (checked): a seed's runs share their starting
weights and evaluation seed. ``--write`` stores the result in NEW.json under ``versus`` and redraws NEW's plots with the
study's modes beside the variant (NEW.png, NEW_stats.png).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.learning.analysis import controlled, mean_curves, paired_difference, summarise

SAME = ("budget_train_s", "seeds", "evals", "eval_prompts", "batch_samples", "start", "task")


def study(path: Path, start: str) -> dict:
    data = json.loads(Path(path).read_text())
    return data.get("studies", {}).get(start, data)


def versus(new: dict, mode: str, old: dict) -> dict:
    differ = {k: (new["config"].get(k), old["config"].get(k)) for k in SAME
              if new["config"].get(k) != old["config"].get(k)}
    if differ:
        raise SystemExit(f"the two studies differ in {differ}: not comparable by seed")
    if not new["runs"].get(mode):
        raise SystemExit(f"no runs of {mode!r} in the new file; it has {sorted(new['runs'])}")
    runs = {m: r for m, r in old["runs"].items() if m.startswith(("async_grpo", "sync_grpo"))}
    runs["async_v05"] = new["runs"][mode]
    out = controlled(runs)
    out["stands_for_async_v05"] = mode
    if old["runs"].get("async_v05"):  # the variant against plain V0.5 too
        a, b = new["runs"][mode], old["runs"]["async_v05"]
        out["minus_plain_v05"] = {
            axis: paired_difference(a, b, axis, min(r["points"][-1][axis] for r in a + b))
            for axis in ("rollouts", "train_s")}
    return out


def side_by_side(new: dict, mode: str, old: dict) -> dict:
    """A bench.learning result holding the study's runs and the variant's, for ``plots``."""
    runs = {**old["runs"], mode: new["runs"][mode]}
    return {"config": new["config"], "runs": runs, "summary": summarise(runs),
            "curves": mean_curves(runs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.learning.versus", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new")
    ap.add_argument("mode")
    ap.add_argument("--against", required=True)
    ap.add_argument("--start", default="weak")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    new_data = json.loads(Path(args.new).read_text())
    out = versus(study(Path(args.new), args.start), args.mode,
                 study(Path(args.against), args.start))
    out["command"] = "python -m bench.learning.versus " + " ".join(sys.argv[1:] if argv is None
                                                                    else argv)
    print(json.dumps(out, indent=1))
    if args.write:
        from bench.learning.plots import plots

        new_data["versus"] = out
        Path(args.new).write_text(json.dumps(new_data, indent=1) + "\n")
        plots(side_by_side(study(Path(args.new), args.start), args.mode,
                           study(Path(args.against), args.start)), Path(args.new).with_suffix(""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
