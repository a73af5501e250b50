"""Prompt-side plumbing of the coordinator: the training-prompt stream, a prompt's rollout
request (seeded per rollout when the run asks), the prior's answer checked, a finished
prompt turned into what the prior learns from, its record and its training samples, and
finished prompts into a batch.

Pure Python (no Ray, no asyncio): the coordinator, the tests and the simulator share it
(``hand_over`` imports Ray only to put a batch's shards in the object store).
"""
from __future__ import annotations

import hashlib
import random

import numpy as np

from actors.scheduler import PromptInFlight
from actors.scheduler.messages import Dispatch
from common.records import mean_extras
from common.sharding import make_shards
from common.types import (PriorObservation, PromptRecord, Rollout, RolloutRequest,
                          SamplingConfig, TrainBatch, TrainSample)
from estimator.core import reward_to_prob
from estimator.registry import batch_group


class PromptSampler:
    """Epoch-wise shuffled pass over the train split; ``position`` counts prompts drawn, so a
    checkpoint that stores it resumes the stream exactly."""

    def __init__(self, problems: list, seed: int, position: int = 0):
        if not problems:
            raise ValueError("the task's train split is empty")
        self.problems, self.seed, self.position = problems, seed, position
        self._epoch, self._perm = -1, []

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self, n: int) -> list:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.problems))
            if epoch != self._epoch:
                self._epoch, self._perm = epoch, self._order(epoch)
            out.append(self.problems[self._perm[i]])
            self.position += 1
        return out


def rollout_seed(seed: int, uid: str, index: int) -> int:
    """The sampling seed of rollout ``index`` of the prompt admitted as ``uid`` in a run
    seeded ``seed``: the same in every run and algorithm with that seed (the n-th admission
    is the same prompt: ``PromptSampler``), distinct across prompts and rollouts."""
    digest = hashlib.blake2b(f"{seed}/{uid}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 2**31  # vLLM takes any int; torch wants < 2**63


def rollout_request(d: Dispatch, problem, sampling: SamplingConfig) -> RolloutRequest:
    """The engine request of dispatch ``d`` for ``problem``: its completions seeded one by
    one (``rollout_seed``) when ``sampling.seed`` is set (``rollout.seeded``), else unseeded."""
    seeds = (() if sampling.seed is None else
             tuple(rollout_seed(sampling.seed, d.uid, i) for i in d.indices))
    return RolloutRequest(d.request_id, problem.id, problem.prompt, len(d.indices), sampling,
                          priority=d.priority, messages=problem.messages, seeds=seeds)


def checked_priors(ps, n: int) -> list[float]:
    """The prior server's answer for n prompts, or ValueError if it is garbage."""
    if len(ps) != n or not all(0.0 <= float(p) <= 1.0 for p in ps):  # NaN fails too
        raise ValueError(f"prior returned garbage for {n} prompts: {ps!r:.200}")
    return [float(p) for p in ps]


def success_rate(pif: PromptInFlight, rewards: tuple[float, float]) -> float:
    """Mean reward on the [0, 1] scale: the observed success rate the prior learns from."""
    return float(reward_to_prob(pif.state.vbar, rewards))


def prior_observation(pif: PromptInFlight, rewards: tuple[float, float],
                      version: int) -> PriorObservation:
    """What the prior is told of a finished prompt: its success rate over all its rollouts
    (the oracle's held-out ones included) at policy ``version``, and how many there were."""
    return PriorObservation(pif.problem.prompt, success_rate(pif, rewards), int(version),
                            int(pif.state.k))


def train_samples(pif: PromptInFlight, adv=None) -> list[TrainSample]:
    """One TrainSample per trained rollout (``pif.trained``: all observed ones, but those the
    oracle holds out and those a full batch trimmed), the first by index; advantages from
    the estimator state, which saw every rollout (``adv``: given, by a batch-level
    estimator, in the same order)."""
    if adv is None:
        adv = pif.state.advantages()  # (k,) in pif.state.indices() order
    out = []
    for i, a in list(zip(pif.state.indices(), adv))[:pif.trained]:
        r: Rollout = pif.payloads[i]
        out.append(TrainSample(r.prompt_token_ids, r.token_ids, r.logprobs, float(a),
                               pif.start_version[i]))
    return out


def make_record(pif: PromptInFlight, baseline: float | None = None) -> PromptRecord:
    """The run's record of a finished prompt (estimator evaluated once; ``baseline``: given
    by a batch-level estimator, the mean of its responses' baselines)."""
    st = pif.state
    if baseline is None:
        baseline = float(st.result().baseline[0])
    fused = st.est.needs_prior and not st.fallback
    rs: list[Rollout] = [pif.payloads[i] for i in st.indices()]
    return PromptRecord(
        prompt_id=pif.problem.id, uid=pif.uid, prompt=pif.problem.prompt, k=st.k,
        rewards=[float(r) for r in st.rewards()], baseline=baseline, prior_p=st.prior_p,
        # The test kept the prior iff w == 0, and then the baseline IS the prior.
        prior_accepted=(baseline == st.prior) if fused else None, fallback=st.fallback,
        unparsed=sum(not r.parsed for r in rs), admitted_version=pif.admitted_version,
        deadline=pif.deadline, versions=sorted(set(pif.start_version.values())),
        generators=sorted({r.generator for r in rs}), rounds=st.rounds,
        cancelled_rollouts=pif.cancelled_rollouts, trained_samples=pif.trained,
        cancelled_tokens=pif.cancelled_tokens, regenerations=pif.regenerations,
        reward_extras=mean_extras([dict(r.reward_extras) for r in rs]),
        tokens=sum(len(r.token_ids) for r in rs), lengths=[len(r.token_ids) for r in rs],
        prompt_tokens=len(rs[0].prompt_token_ids) if rs else 0,
        t_admit=pif.t_admit, t_done=pif.t_done,
        spans=[(r.generator, r.t_start, r.t_end) for r in rs])


def batch_advantages(prompts: list[PromptInFlight]) -> tuple[list, list]:
    """Each prompt's advantages and baseline when its estimator takes a batch's baselines
    together (``Estimator.batch_level``: James-Stein), else (None, None) each: the prompt's
    own state decides."""
    est = prompts[0].state.est if prompts else None
    if est is None or not est.batch_level or len(prompts) < 2:
        return [None] * len(prompts), [None] * len(prompts)
    res = batch_group(est, [p.state.rewards() for p in prompts])
    rewards = [p.state.rewards() for p in prompts]
    advs = [res.advantages[i, :len(r)] for i, r in enumerate(rewards)]
    # the record's baseline: the mean of its responses' (reward minus advantage)
    return advs, [float(np.mean(r - a)) for r, a in zip(rewards, advs)]


def hand_over(prompts: list[PromptInFlight], version: int, inflight: int, dropped: list,
              learner_ranks: int = 0, put=None, generated: int = 0,
              notes: list[str] | None = None, deferred: list | None = None) -> TrainBatch:
    """The batch of finished ``prompts``: their records, and their samples split over
    ``learner_ranks`` ranks and ``put`` (default ``ray.put``: the calling actor's object
    store) one shard each (``common.sharding``), or inline with no ranks given; ``generated``:
    the rollouts generated for training so far (``TrainBatch.rollouts_generated``); ``notes``:
    what the coordinator has to say on the run's console; ``deferred``: the prompts the
    selection deferred since the last batch."""
    advs, bases = batch_advantages(prompts)
    samples = [s for p, a in zip(prompts, advs) for s in train_samples(p, a)]
    shards = None
    if learner_ranks:  # by reference: the driver passes the shards on unread
        if put is None:
            import ray

            put = ray.put
        shards, samples = make_shards(samples, learner_ranks, put), []
    return TrainBatch(records=[make_record(p, b) for p, b in zip(prompts, bases)],
                      samples=samples,
                      version=version, inflight_prompts=inflight, dropped=dropped,
                      shards=shards, rollouts_generated=generated, notes=list(notes or []),
                      deferred=list(deferred or []))
