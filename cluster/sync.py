"""The synchronous loop: generate a full batch, wait for its slowest prompt, train, sync, repeat.

The baseline that bench/ compares the async pipeline against, on the same actors. Reads like
pseudocode on purpose: the Ray handles and ``.remote()`` calls are the whole story.
"""
from __future__ import annotations

import time

import numpy as np

from actors.types import RolloutRequest, SamplingConfig
from cluster.rollouts import GeneratorPool, Group, PromptSampler
from estimator.state import PromptState


def generate_batch(pool: GeneratorPool, task, est, sampler: PromptSampler, n_prompts: int,
                   sampling: SamplingConfig, priors=None, max_refills: int = 4):
    """Roll out ``n_prompts`` prompts to completion (dropped groups are refilled, as DAPO does).
    Returns (kept groups, dropped groups, served-by-generator counts)."""
    import ray

    kept, dropped, served = [], [], [0] * len(pool.handles)
    for _ in range(max_refills + 1):
        need = n_prompts - len(kept)
        if need <= 0:
            break
        problems = sampler.next(need)
        ps = priors(problems) if priors else [None] * len(problems)
        groups = [Group(p, PromptState(est, prior)) for p, prior in zip(problems, ps)]
        pending = {}
        for g in groups:
            for req, base in g.requests(pool, sampling):
                pending[pool.submit(req)] = (g, base)
        while pending:  # extra requests go out as soon as a prompt's test asks for them
            [ref], _ = ray.wait(list(pending), num_returns=1)
            g, base = pending.pop(ref)
            served[pool.finished(ref)] += 1
            g.add(task, ray.get(ref), base)
            for req, b in g.requests(pool, sampling):
                pending[pool.submit(req)] = (g, b)
            if g.state.done:
                g.t_done = time.time()
        for g in groups:
            (kept if g.state.keep else dropped).append(g)
    return kept, dropped, served


def evaluate(pool: GeneratorPool, task, problems: list, max_tokens: int) -> dict:
    """Greedy accuracy on held-out problems, spread over the generators."""
    import ray

    greedy = SamplingConfig(temperature=0.0, max_tokens=max_tokens)
    refs = [pool.submit(RolloutRequest(pool.request_id(), p.id, p.prompt, 1, greedy))
            for p in problems]
    results = ray.get(refs)
    for r in refs:
        pool.finished(r)
    correct = [task.score(p, rs[0].text).reward == task.rewards[1] for p, rs in zip(problems, results)]
    by_level: dict[int, list[bool]] = {}
    for p, c in zip(problems, correct):
        by_level.setdefault(p.difficulty, []).append(c)
    return {"eval_accuracy": float(np.mean(correct)),
            "eval_accuracy_by_difficulty": {str(k): float(np.mean(v)) for k, v in sorted(by_level.items())}}
