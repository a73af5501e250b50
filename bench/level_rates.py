"""How often the model gets each difficulty level right, and so how many groups of k rollouts
each level would spend on all-equal rewards: what to measure before choosing a run's level
mix (``task.difficulties``).

    python -m bench.level_rates [--config configs/smollm2-135m.yaml] [--levels 1,2,...]
                                [--prompts 12] [--samples 12] [--out FILE] [overrides ...]

For each level of the config's task (all of the task's levels unless ``--levels``),
``--prompts`` train prompts (the config's task seed) get ``--samples`` sampled responses
each from the config's model as it starts (its rollout temperature, max_tokens and prompt
format, one sampling seed per prompt: ``studies.prior_truth.truth``), scored by the task's
verifier. Per level: the mean success rate with its SE over prompts, each prompt's rate, and
the expected share of groups of ``algo.k_init`` rollouts whose rewards are all equal
(all wrong, all right): per prompt C(c, k) / C(n, k) for c right of n, the unbiased estimate of
p^k, and the same for the wrong ones. Writes bench/results/level_rates.json (or ``--out``).
"""
from __future__ import annotations

import argparse
import sys
from math import comb
from pathlib import Path

import numpy as np

from bench.harness import stamp, write_json

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def all_equal_shares(correct: np.ndarray, n: int, k: int) -> tuple[float, float]:
    """(all right, all wrong): the expected share of groups of ``k`` of a prompt's rollouts
    whose rewards are all right / all wrong, averaged over prompts, from ``correct`` right
    answers of ``n`` samples each (unbiased: drawing ``k`` of the ``n`` without replacement)."""
    right = np.mean([comb(int(c), k) / comb(n, k) for c in correct])
    wrong = np.mean([comb(n - int(c), k) / comb(n, k) for c in correct])
    return float(right), float(wrong)


def level_figures(correct: np.ndarray, n: int, k: int) -> dict:
    """One level's figures from its prompts' right answers of ``n`` samples each."""
    rates = correct / n
    right, wrong = all_equal_shares(correct, n, k)
    return {"prompts": len(rates), "success_rate": round(float(rates.mean()), 4),
            "success_rate_se": round(float(rates.std(ddof=1) / np.sqrt(len(rates))), 4)
            if len(rates) > 1 else None,
            "all_right_share": round(right, 4), "all_wrong_share": round(wrong, 4),
            "all_equal_share": round(right + wrong, 4),
            "rates": [round(float(r), 4) for r in rates]}


def mix_share(levels: dict, mix: list[int]) -> float:
    """The all-equal share of a mix drawing ``mix``'s levels evenly (as the tasks draw)."""
    return round(float(np.mean([levels[str(lv)]["all_equal_share"] for lv in mix])), 4)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.level_rates", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/smollm2-135m.yaml")
    ap.add_argument("--levels", help="comma-separated levels (default: all of the task's)")
    ap.add_argument("--prompts", type=int, default=12, help="train prompts per level")
    ap.add_argument("--samples", type=int, default=12, help="sampled responses per prompt")
    ap.add_argument("--out", type=Path, default=RESULTS / "level_rates.json")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    a = ap.parse_args(argv)
    from cluster.config.schema import load_config
    from studies.prior_truth.truth import sample_truth
    from tasks import make_task, make_task_from_config

    cfg = load_config(a.config, a.overrides)
    table = make_task(cfg.task.name).levels
    levels = [int(x) for x in a.levels.split(",")] if a.levels else sorted(table)
    k = cfg.algo.k_init
    if a.samples < k:
        ap.error(f"--samples {a.samples} is below algo.k_init = {k}: no group of k to count")
    problems = {lv: make_task(cfg.task.name, seed=cfg.task.seed, difficulties=(lv,),
                              n_train=a.prompts, n_heldout=1).train() for lv in levels}
    flat = [p for lv in levels for p in problems[lv]]
    print(f"[level_rates] {len(flat)} prompts x {a.samples} samples of {cfg.model_path()}",
          file=sys.stderr, flush=True)
    correct, timing = sample_truth(cfg.model_path(), make_task_from_config(cfg.task), flat,
                                   a.samples,
                                   cfg.rollout.max_tokens, cfg.rollout.temperature,
                                   seed=cfg.task.seed, engine=cfg.generators.engine)
    by_level, i = {}, 0
    for lv in levels:
        n = len(problems[lv])
        by_level[str(lv)] = level_figures(correct[i:i + n], a.samples, k)
        i += n
    out = {**stamp("bench.level_rates", argv), "config": a.config, "overrides": a.overrides,
           "model_path": cfg.model_path(), "task": cfg.task.name, "k": k,
           "samples_per_prompt": a.samples, "temperature": cfg.rollout.temperature,
           "max_tokens": cfg.rollout.max_tokens, "timing": timing, "levels": by_level,
           "config_mix": {"levels": list(cfg.task.difficulties),
                          "all_equal_share": mix_share(by_level, list(cfg.task.difficulties))}
           if set(cfg.task.difficulties) <= set(levels) else None}
    write_json(a.out, out)
    print(f"{'level':>5} {'rate':>6} {'+-':>6} {'all wrong':>9} {'all right':>9}")
    for lv, f in by_level.items():
        print(f"{lv:>5} {f['success_rate']:6.3f} {f['success_rate_se'] or 0:6.3f} "
              f"{f['all_wrong_share']:9.3f} {f['all_right_share']:9.3f}")
    if out["config_mix"]:
        print(f"the config's mix {out['config_mix']['levels']}: groups of {k} all equal "
              f"{out['config_mix']['all_equal_share']:.1%}; written {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
