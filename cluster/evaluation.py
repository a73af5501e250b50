"""Held-out evaluation on the generators: greedy accuracy and the mean over sampled answers,
each with its standard error, overall and by difficulty.

The trainer pauses the coordinator's admission while this runs and reports its time apart
from training time: evaluation never counts in throughput.
"""
from __future__ import annotations

import itertools
import math
import time

import numpy as np

from actors.types import RolloutRequest, SamplingConfig

EVAL_METRICS = ("sampled", "greedy")


def accuracy_stats(correct: np.ndarray) -> tuple[float, float]:
    """(mean, standard error) of per-prompt scores in [0, 1], shape (n,): the SE of a mean over
    prompts (prompts are the independent units; a prompt's samples are not)."""
    n = correct.size
    if n == 0:
        return math.nan, math.nan
    se = float(correct.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return float(correct.mean()), se


def evaluate(generators: list, task, problems: list, max_tokens: int, samples: int = 4,
             temperature: float = 1.0, seed: int = 0, prefix: str = "eval") -> dict:
    """Greedy and ``samples`` sampled answers per held-out problem, spread over the generators.

    Returns ``{eval_greedy, eval_greedy_se, eval_sampled, eval_sampled_se, eval_time_s,
    eval_prompts, eval_samples, eval_greedy_by_difficulty, eval_sampled_by_difficulty}``
    (the sampled keys are absent with ``samples=0``)."""
    import ray

    t0 = time.time()
    ids = itertools.count()
    greedy = SamplingConfig(temperature=0.0, max_tokens=max_tokens)
    sampled = SamplingConfig(temperature=temperature, max_tokens=max_tokens, seed=seed)
    gens = itertools.cycle(generators)
    refs = [(p, "greedy", next(gens).generate.remote(
        RolloutRequest(f"{prefix}-{next(ids)}", p.id, p.prompt, 1, greedy))) for p in problems]
    if samples:
        refs += [(p, "sampled", next(gens).generate.remote(
            RolloutRequest(f"{prefix}-{next(ids)}", p.id, p.prompt, samples, sampled)))
            for p in problems]
    hi = task.rewards[1]
    scores: dict[str, dict[str, float]] = {"greedy": {}, "sampled": {}}
    for (p, kind, ref), rollouts in zip(refs, ray.get([r for _, _, r in refs])):
        scores[kind][p.id] = float(np.mean([task.score(p, r.text).reward == hi for r in rollouts]))
    out = {"eval_prompts": len(problems), "eval_samples": samples}
    for kind in EVAL_METRICS:
        if not scores[kind]:
            continue
        vals = np.array([scores[kind][p.id] for p in problems])
        out[f"eval_{kind}"], out[f"eval_{kind}_se"] = accuracy_stats(vals)
        by: dict[int, list[float]] = {}
        for p, v in zip(problems, vals):
            by.setdefault(p.difficulty, []).append(v)
        out[f"eval_{kind}_by_difficulty"] = {str(d): float(np.mean(v)) for d, v in sorted(by.items())}
    out["eval_time_s"] = time.time() - t0
    return out
