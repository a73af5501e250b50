"""Held-out evaluation on the generators: greedy accuracy and the mean over sampled answers,
each with its standard error, overall and by difficulty.

The trainer pauses the coordinator's admission while this runs and reports its time apart
from training time: evaluation never counts in throughput.

    requests = eval_requests(problems, ...)                    # pure
    results  = spread(len(requests), n_generators, send, ...)  # a lost generator's go elsewhere
    correct  = scorer.correct(answers)                         # the task's verifier, bounded

Sampling seeds: sample i of held-out problem x is drawn with seed ``eval_seed_base(run seed,
x.id) + i`` (the generator adds i to a request's seed), so no two prompts share a seed and
their outcomes are independent (one seed for every prompt made sample i of each draw the same
random numbers: measured, the accuracy's spread over evaluation seeds was about 3x its
reported SE; the check that measured it, ``seed_spread_check``, left with its study at commit
6196e7a).

Faults: a generator whose call raises (dead, restarting, an engine error) or does not answer
within ``timeout_s`` is not used again in this evaluation, and its requests go to the
others; with none left they are skipped, counted in ``eval_failed_requests``. Answers are
scored through ``actors.scoring.Scorer``, in worker processes with a per-answer deadline for a
task that needs them (``reward.workers``): the evaluation runs in the trainer's watchdog
thread, where math_verify's own timeouts are off (they need the main thread), so one
pathological answer would otherwise hang it.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import math
import time
from dataclasses import replace

import numpy as np

from actors.scoring import Scorer
from cluster.records.step import HeldOut
from common.records import ScoringCounts
from common.seeds import SEEDS_PER_PROMPT, eval_seed_base
from common.types import RolloutRequest, SamplingConfig

def accuracy_stats(correct: np.ndarray) -> tuple[float, float]:
    """(mean, standard error) of per-prompt scores in [0, 1], shape (n,): the SE of a mean over
    prompts (prompts are the independent units; a prompt's samples are not)."""
    n = correct.size
    if n == 0:
        return math.nan, math.nan
    se = float(correct.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return float(correct.mean()), se


class AnswerScorer:
    """The task's verifier for held-out answers: ``actors.scoring.Scorer`` (inline with
    ``workers=0``, else worker processes with a ``timeout_s`` deadline per answer; a timed-out
    or raising answer counts as wrong), driven from any thread on a private event loop. One
    per run: worker processes start once."""

    def __init__(self, task, factory=None, workers: int = 0, timeout_s: float = 10.0):
        self.high = task.rewards[1]
        self.scorer = Scorer(task, factory, workers, timeout_s)
        self.loop = asyncio.new_event_loop()

    def correct(self, answers: list[tuple]) -> list[bool]:
        """For each (problem, text): did it get the task's high reward?"""
        async def score_all():
            return await asyncio.gather(*(self.scorer.score(p, text, 0) for p, text in answers))

        return [v.reward == self.high for v in self.loop.run_until_complete(score_all())]

    @property
    def counts(self) -> ScoringCounts:
        return self.scorer.counts

    def close(self) -> None:
        """Stop the worker processes; the loop too unless an evaluation still runs on it (a
        run stopped by its watchdog mid-evaluation: its thread is abandoned)."""
        self.scorer.close()
        if not self.loop.is_running():
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()


def eval_requests(problems: list, max_tokens: int, samples: int, temperature: float,
                  seed: int, prefix: str = "eval") -> list[tuple]:
    """(problem, "greedy" | "sampled", RolloutRequest) for every held-out problem: one greedy
    answer each, and ``samples`` sampled ones (none with ``samples=0``), seeded per problem
    from the run's ``seed`` (``eval_seed_base``; the generator seeds completion i with
    the request's seed + i)."""
    if samples > SEEDS_PER_PROMPT:
        raise ValueError(f"{samples} samples per prompt: at most {SEEDS_PER_PROMPT}")
    ids = itertools.count()
    greedy = SamplingConfig(temperature=0.0, max_tokens=max_tokens)
    out = [(p, "greedy", RolloutRequest(f"{prefix}-{next(ids)}", p.id, p.prompt, 1, greedy,
                                        messages=p.messages)) for p in problems]
    if samples:
        out += [(p, "sampled", RolloutRequest(
            f"{prefix}-{next(ids)}", p.id, p.prompt, samples,
            SamplingConfig(temperature=temperature, max_tokens=max_tokens,
                           seed=eval_seed_base(seed, p.id)), messages=p.messages))
            for p in problems]
    return out


def spread(n_requests: int, n_generators: int, send, wait, get, timeout_s: float,
           clock=time.monotonic) -> tuple[dict, list[int], list[int]]:
    """Run requests 0..n_requests-1 on the generators, round robin. ``send(g, i)`` starts
    request i on generator g and returns a handle; ``wait(handles, timeout)`` returns those
    done (at least one unless the timeout passed); ``get(handle)`` its result or raises. A
    generator whose call raises, or that holds requests and has finished none for
    ``timeout_s`` (hung; a busy one finishes some), is not used again; its outstanding
    requests go to the others. Returns ({request: result}, requests skipped because no
    generator was left, generators lost)."""
    live, lost, skipped = list(range(n_generators)), [], []
    results: dict[int, object] = {}
    pending: dict = {}  # handle -> (request, generator)
    heard = [clock()] * n_generators  # when each generator last finished a request
    turn = itertools.count()

    def dispatch(i: int) -> None:
        if not live:
            skipped.append(i)
            return
        g = live[next(turn) % len(live)]
        pending[send(g, i)] = (i, g)

    for i in range(n_requests):
        dispatch(i)
    while pending:
        busy = {g for _, g in pending.values()}
        done = wait(list(pending), max(0.0, min(heard[g] for g in busy) + timeout_s - clock()))
        failed, redo = set(), []
        for h in done:
            i, g = pending.pop(h)
            try:
                results[i] = get(h)
                heard[g] = clock()
            except Exception:  # noqa: BLE001 - the generator's fault, not the evaluation's
                failed.add(g)
                redo.append(i)
        now = clock()
        failed |= {g for _, g in pending.values() if now - heard[g] >= timeout_s}
        for h, (i, g) in list(pending.items()):
            if g in failed:  # a dead or hung generator's other requests go elsewhere too
                del pending[h]
                redo.append(i)
        for g in failed:
            live.remove(g)
            lost.append(g)
        for i in sorted(redo):
            dispatch(i)
    return results, sorted(skipped), sorted(lost)


def evaluate(generators: list, task, problems: list, max_tokens: int, samples: int = 4,
             temperature: float = 1.0, seed: int = 0, prefix: str = "eval",
             scorer: AnswerScorer | None = None, timeout_s: float = 600.0) -> HeldOut:
    """Greedy and ``samples`` sampled answers per held-out problem, spread over the generators
    (``spread``; ``timeout_s``: how long a generator holding requests may finish none), scored
    by ``scorer`` (inline by default).

    Returns the ``HeldOut`` record, its ``accuracy`` not set (the run's metric chooses:
    ``Evaluator``); the sampled figures are None with ``samples=0``."""
    import ray

    def wait(refs, timeout):
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        return ray.wait(refs, num_returns=len(refs), timeout=0)[0] if ready else []

    t0 = time.time()
    requests = eval_requests(problems, max_tokens, samples, temperature, seed, prefix)
    results, skipped, lost = spread(
        len(requests), len(generators),
        lambda g, i: generators[g].generate.remote(requests[i][2]), wait, ray.get, timeout_s)
    own = scorer is None
    scorer = AnswerScorer(task) if own else scorer
    try:
        out = score_answers(problems, requests, results, scorer)
    finally:
        if own:
            scorer.close()
    return HeldOut(**out, prompts=len(problems), samples=samples, failed_requests=len(skipped),
                   generators_lost=lost, duration_s=time.time() - t0)


def score_answers(problems: list, requests: list[tuple], results: dict,
                  scorer: AnswerScorer) -> dict:
    """Accuracy per kind (greedy, sampled), overall with its SE and by difficulty, from the
    answers in ``results`` (request index -> rollouts); a problem whose request was skipped
    is left out of its kind. Plus this scoring's verifier timeouts and errors. The keys are
    ``HeldOut``'s fields."""
    before = replace(scorer.counts)
    answers = [(i, r) for i in sorted(results) for r in results[i]]
    correct = scorer.correct([(requests[i][0], r.text) for i, r in answers])
    per_request: dict[int, list[bool]] = {}
    for (i, _), ok in zip(answers, correct):
        per_request.setdefault(i, []).append(ok)
    scores: dict[str, dict[str, float]] = {"greedy": {}, "sampled": {}}
    for i, oks in per_request.items():
        p, kind, _ = requests[i]
        scores[kind][p.id] = float(np.mean(oks))
    out = {}
    for kind in HeldOut.KINDS:
        answered = [p for p in problems if p.id in scores[kind]]
        if not answered:
            continue
        vals = np.array([scores[kind][p.id] for p in answered])
        out[kind], out[f"{kind}_se"] = accuracy_stats(vals)
        by: dict[int, list[float]] = {}
        for p, v in zip(answered, vals):
            by.setdefault(p.difficulty, []).append(v)
        out[f"{kind}_by_difficulty"] = {str(d): float(np.mean(v)) for d, v in sorted(by.items())}
    after = scorer.counts
    out["score_timeouts"] = after.score_timeout - before.score_timeout
    out["score_errors"] = after.score_error - before.score_error
    return out


class Evaluator:
    """A run's held-out evaluation (``run.eval_*``): the first ``run.eval_prompts`` held-out
    problems, answers scored as the coordinator scores rollouts (``reward.workers``,
    ``reward.timeout_s``; worker processes start with the first evaluation), a generator
    that fails or hangs (``run.call_timeout_s``) replaced by the others. An evaluation's
    ``eval_accuracy`` and ``eval_accuracy_se`` are its ``run.eval_metric``'s."""

    def __init__(self, cfg, task):
        self.cfg, self.task = cfg, task
        self.heldout = task.heldout()[: cfg.run.eval_prompts]
        self.scorer: AnswerScorer | None = None

    @property
    def enabled(self) -> bool:
        return self.cfg.run.evaluates

    def __call__(self, generators: list) -> HeldOut:
        cfg, run = self.cfg, self.cfg.run
        if self.scorer is None:
            from tasks import make_task_from_config

            self.scorer = AnswerScorer(self.task, functools.partial(make_task_from_config, cfg.task),
                                       cfg.score_workers(), cfg.reward.timeout_s)
        ev = evaluate(generators, self.task, self.heldout, cfg.rollout.max_tokens,
                      samples=run.eval_samples, temperature=cfg.rollout.temperature,
                      seed=run.seed, scorer=self.scorer, timeout_s=run.call_timeout_s)
        accuracy, se = ev.of(run.eval_metric)
        return replace(ev, accuracy=accuracy, accuracy_se=se)

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
