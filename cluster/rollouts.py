"""Rollout plumbing shared by the sync loop and the async coordinator.

- ``PromptSampler``: the training-prompt stream, deterministic by seed, with a resumable position.
- ``GeneratorPool``: least-loaded dispatch of rollout requests to generator actors.
- ``Group``: one prompt's estimator state plus its scored rollouts, turned into TrainSamples.
"""
from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field

from actors.types import Rollout, RolloutRequest, SamplingConfig, TrainSample
from estimator.core import reward_to_prob
from estimator.state import PromptState


class PromptSampler:
    """Epoch-wise shuffled pass over the train split; ``position`` counts prompts drawn."""

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


class GeneratorPool:
    """Sends each request to the generator with the fewest outstanding rollouts."""

    def __init__(self, handles: list):
        self.handles = list(handles)
        self.load = [0] * len(self.handles)
        self._where: dict = {}  # ref -> (generator index, n)
        self._ids = itertools.count()

    def submit(self, req: RolloutRequest):
        g = min(range(len(self.handles)), key=lambda i: self.load[i])
        ref = self.handles[g].generate.remote(req)
        self.load[g] += req.n
        self._where[ref] = (g, req.n)
        return ref

    def finished(self, ref) -> int:
        """Forget a completed request; returns the index of the generator that served it."""
        g, n = self._where.pop(ref)
        self.load[g] -= n
        return g

    def request_id(self) -> str:
        return f"r{next(self._ids)}"


def checked_priors(ps, n: int) -> list[float]:
    """The prior server's answer for n prompts, or ValueError if it is garbage."""
    if len(ps) != n or not all(0.0 <= float(p) <= 1.0 for p in ps):  # NaN fails too
        raise ValueError(f"prior returned garbage for {n} prompts: {ps!r:.200}")
    return [float(p) for p in ps]


@dataclass
class Group:
    """A prompt in flight: its estimator state, its rollouts by slot, its timings."""

    problem: object
    state: PromptState
    rollouts: dict[int, Rollout] = field(default_factory=dict)
    t_admit: float = field(default_factory=time.time)
    t_done: float = 0.0
    unparsed: int = 0
    wave: int = 0       # admission batch this prompt came in with
    uid: str = ""       # unique per admission (a prompt can come back in a later epoch)
    admitted_version: int = 0

    def requests(self, pool: GeneratorPool, sampling: SamplingConfig) -> list[tuple[RolloutRequest, int]]:
        """The rollout requests the estimator wants now, each with its first slot index."""
        n = self.state.to_request()
        if not n:
            return []
        base = self.state.requested - n
        req = RolloutRequest(pool.request_id(), self.problem.id, self.problem.prompt, n, sampling)
        return [(req, base)]

    def add(self, task, rollouts: list[Rollout], base: int) -> None:
        for j, r in enumerate(rollouts):
            verdict = task.score(self.problem, r.text)
            r.reward, r.parsed = verdict.reward, verdict.parsed
            self.unparsed += not verdict.parsed
            self.rollouts[base + j] = r
            self.state.add(verdict.reward, index=base + j)

    def samples(self) -> list[TrainSample]:
        adv = self.state.advantages()
        return [TrainSample(r.prompt_token_ids, r.token_ids, r.logprobs, float(a), r.version)
                for (_, r), a in zip(sorted(self.rollouts.items()), adv)]

    def success_rate(self, rewards: tuple[float, float]) -> float:
        """Mean reward on the [0, 1] scale: the observed success rate the prior learns from."""
        return float(reward_to_prob(self.state.vbar, rewards))

    @property
    def rewards(self) -> list[float]:
        return [r.reward for _, r in sorted(self.rollouts.items())]

    def export(self) -> dict:
        """What the driver needs of a finished prompt for metrics and ``prompts.jsonl``."""
        st = self.state
        res = st.result()  # baseline and keep from one estimator call
        baseline = float(res.baseline[0])
        fused = st.est.needs_prior and not st.fallback
        rs = self.rollouts.values()
        return {"prompt_id": self.problem.id, "prompt": self.problem.prompt, "uid": self.uid,
                "wave": self.wave, "k": st.k,
                "rewards": self.rewards, "baseline": baseline, "prior_p": st.prior_p,
                # The test kept the prior iff w == 0, and then the baseline IS the prior.
                "prior_accepted": (baseline == st.prior) if fused else None,
                "fallback": st.fallback, "keep": bool(res.keep[0]), "unparsed": self.unparsed,
                "t_admit": self.t_admit, "t_done": self.t_done,
                "versions": sorted({r.version for r in rs}),
                "generators": sorted({r.generator for r in rs}),
                "tokens": sum(len(r.token_ids) for r in rs),
                "lengths": [len(r.token_ids) for r in rs],
                "prompt_tokens": len(next(iter(rs)).prompt_token_ids) if rs else 0,
                # (generator, start, end) of each rollout: the utilisation timeline's bars
                "spans": [(r.generator, r.t_start, r.t_end) for r in rs]}
