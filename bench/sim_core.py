"""The four training modes on a simulated cluster: event queue, coordinator and learner.

- sync_*:  admit B prompts, generate until every one is done (the batch waits for its slowest),
           train, sync weights (generators pause), repeat.
- async_*: the coordinator keeps every engine at max_num_seqs outstanding sequences: queued
           extra rollouts first, then new prompts while admitted <= (version + max_staleness + 1)
           * B. Finished prompts stream to the learner, which trains on the B oldest ready ones
           as soon as B are ready; each engine loads new weights between two decode steps.
- *_grpo16: every prompt gets G rollouts; *_v05: k_init, then the REAL estimator
           (estimator.PromptState -> should_continue) asks for one more at a time up to k_max.
"""
from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import deque
from dataclasses import dataclass

import numpy as np

from bench.sim_engine import Engine, Rollout
from bench.sim_models import SimConfig
from estimator import PromptState, make_estimator

MODES = {"sync_grpo16": (False, "grpo"), "sync_v05": (False, "v05"),
         "async_grpo16": (True, "grpo"), "async_v05": (True, "v05")}
CHUNK = 512  # prompts drawn per block of random numbers
_LOAD = operator.attrgetter("outstanding")


class PromptSource:
    """Prompt i's success rate, prior, reward stream and length stream, identical across modes
    (common random numbers): block b of CHUNK prompts is drawn from seeds (seed, b, stream)."""

    def __init__(self, cfg: SimConfig):
        self.cfg, self.blocks = cfg, {}

    def _block(self, b: int):
        cfg, K = self.cfg, self.cfg.reward_slots
        rng = [np.random.default_rng([cfg.seed, b, s]) for s in range(4)]
        p, prior = cfg.prompts.draw(CHUNK, rng[0], rng[1])
        rewards = np.where(rng[2].random((CHUNK, K)) < p[:, None], 1.0, -1.0)
        lengths = cfg.length.draw(rng[3].normal(size=CHUNK), rng[3].normal(size=(CHUNK, K)))
        return p, prior, rewards, lengths

    def get(self, i: int):
        b, j = divmod(i, CHUNK)
        if b not in self.blocks:
            self.blocks[b] = self._block(b)
        p, prior, rewards, lengths = self.blocks[b]
        return float(p[j]), float(prior[j]), rewards[j], lengths[j]


class Prompt:
    __slots__ = ("pid", "state", "admit_version", "rewards", "lengths", "rollouts", "done")

    def __init__(self, pid, state, admit_version, rewards, lengths):
        self.pid, self.state, self.admit_version = pid, state, admit_version
        self.rewards, self.lengths = rewards, lengths
        self.rollouts: list = []
        self.done = False


@dataclass
class SimResult:
    mode: str
    cfg: SimConfig
    t_stop: float
    steps: list               # per learner step: dict(t_start, t_end, prompts, rollouts, tokens)
    engine_segments: np.ndarray   # (M, 5): engine, t0, t1, n running, kind (0 decode, 1 sync)
    learner_segments: np.ndarray  # (L, 3): t0, t1, kind (0 train, 1 sync)
    staleness: np.ndarray     # (R,) version lag of every trained rollout
    k_trained: np.ndarray     # (P,) rollouts of every trained prompt
    finish_times: np.ndarray  # (F,) time each rollout finished
    gen_tokens_done: int      # tokens of finished rollouts
    checks: dict              # conservation and staleness-bound bookkeeping


class Sim:
    def __init__(self, cfg: SimConfig, mode: str):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {list(MODES)}")
        self.cfg, self.mode = cfg, mode
        self.is_async, algo = MODES[mode]
        if algo == "v05":
            self.est = make_estimator("v05", k_init=cfg.k_init, k_max=cfg.k_max, cost=cfg.cost)
        else:
            self.est = make_estimator("grpo", k_init=cfg.group_size, k_max=cfg.group_size)
        slow = cfg.overlap_slowdown if self.is_async else 1.0
        times = cfg.decode.step_times() * slow
        self.train_s_per_token = cfg.learner.s_per_token_gpu * slow / cfg.learner_gpus
        self.engines = [Engine(i, times, cfg.decode.max_num_seqs, cfg.learner.sync_s, self)
                        for i in range(cfg.n_generators)]
        self.source = PromptSource(cfg)
        self.latency = cfg.dispatch_latency_s
        self.events: list = []
        self._seq = itertools.count()
        self.now, self.version, self.stopped = 0.0, 0, False
        self.prompts: list[Prompt] = []
        self.ready: list = []            # heap of (pid, Prompt): oldest admitted first
        self.pending: deque = deque()    # async: rollouts not yet on an engine
        self.batch: list[Prompt] = []    # sync: the current batch
        self.learner_busy = False
        self.learner_segments: list = []
        self.steps: list = []
        self.staleness: list = []
        self.k_trained: list = []
        self.finish_times: list = []
        self.n_rollouts = self.gen_tokens = 0
        self.admission_excess = -math.inf  # max over admissions of admitted - bound (must be <= 0)

    # -- event queue -------------------------------------------------------------------------
    def schedule(self, t: float, fn, *args) -> None:
        heapq.heappush(self.events, (t, next(self._seq), fn, args))

    def run(self) -> SimResult:
        t_max = math.inf if self.cfg.max_hours is None else self.cfg.max_hours * 3600.0
        self.schedule(0.0, self.fill if self.is_async else self.start_batch)
        while self.events and not self.stopped:
            t, _, fn, args = heapq.heappop(self.events)
            if t > t_max:
                self.now = t_max
                break
            self.now = t
            fn(*args)
        for e in self.engines:
            e.close(self.now)
        return self._result()

    # -- prompts and rollouts ----------------------------------------------------------------
    def admit(self) -> Prompt:
        pid = len(self.prompts)
        if self.is_async:
            bound = (self.version + self.cfg.max_staleness + 1) * self.cfg.batch_prompts
            self.admission_excess = max(self.admission_excess, pid + 1 - bound)
        _, prior, rewards, lengths = self.source.get(pid)
        state = PromptState(self.est, prior if self.est.needs_prior else None)
        pr = Prompt(pid, state, self.version, rewards, lengths)
        self.prompts.append(pr)
        return pr

    def new_rollouts(self, pr: Prompt) -> list[Rollout]:
        """Ask the prompt's estimator state how many rollouts to dispatch now."""
        n = pr.state.to_request()
        out = []
        for _ in range(n):
            i = len(pr.rollouts)
            r = Rollout(pr, i, int(pr.lengths[i]), float(pr.rewards[i]))
            pr.rollouts.append(r)
            out.append(r)
        self.n_rollouts += n
        return out

    def least_loaded(self) -> Engine:
        return min(self.engines, key=_LOAD)

    def on_finished(self, engine: Engine, finished: list) -> None:
        """Rewards arrive: feed the estimator state; more rollouts, or the prompt is done."""
        for r in finished:
            r.t_end = self.now
            self.finish_times.append(self.now)
            self.gen_tokens += r.length
            pr = r.prompt
            pr.state.add(r.reward, index=r.index)
            if pr.state.outstanding:
                continue
            extra = self.new_rollouts(pr)
            if extra and self.is_async:
                self.pending.extendleft(reversed(extra))  # extra rollouts go before new prompts
            elif extra:
                for x in extra:
                    self.least_loaded().submit(x, self.now, self.latency)
            else:
                pr.done = True
                heapq.heappush(self.ready, (pr.pid, pr))
        if self.is_async:
            self.fill()
            self.try_train()
        elif len(self.ready) == len(self.batch) and not self.learner_busy:
            self.try_train()

    # -- generation policy -------------------------------------------------------------------
    def can_admit(self) -> bool:
        cfg = self.cfg
        if len(self.prompts) >= (self.version + cfg.max_staleness + 1) * cfg.batch_prompts:
            return False
        if cfg.max_inflight_prompts is None:
            return True
        return len(self.prompts) - len(self.k_trained) - len(self.ready) < cfg.max_inflight_prompts

    def fill(self) -> None:
        """Async: top every engine up to max_num_seqs outstanding sequences."""
        cap = self.cfg.decode.max_num_seqs
        while not self.stopped:
            e = self.least_loaded()
            if e.outstanding >= cap:
                return
            if not self.pending:
                if not self.can_admit():
                    return
                self.pending.extend(self.new_rollouts(self.admit()))
                continue
            e.submit(self.pending.popleft(), self.now, self.latency)

    def start_batch(self) -> None:
        """Sync: admit B prompts and hand all their first rollouts to the engines at once."""
        self.batch = [self.admit() for _ in range(self.cfg.batch_prompts)]
        for pr in self.batch:
            for r in self.new_rollouts(pr):
                self.least_loaded().submit(r, self.now, self.latency)

    # -- learner -----------------------------------------------------------------------------
    def try_train(self) -> None:
        B = self.cfg.batch_prompts
        if self.learner_busy or len(self.ready) < B or self.stopped:
            return
        batch = [heapq.heappop(self.ready)[1] for _ in range(B)]
        rolls = [r for pr in batch for r in pr.rollouts]
        tokens = sum(r.length for r in rolls) + len(rolls) * self.cfg.length.prompt_tokens
        dur = self.cfg.learner.step_overhead_s + tokens * self.train_s_per_token
        self.staleness.extend(self.version - r.version for r in rolls)
        self.k_trained.extend(len(pr.rollouts) for pr in batch)
        self.learner_busy = True
        self.learner_segments.append((self.now, self.now + dur, 0))
        self.steps.append(dict(t_start=self.now, t_end=self.now + dur, prompts=B,
                               rollouts=len(rolls), tokens=tokens))
        self.schedule(self.now + dur, self.end_train)

    def end_train(self) -> None:
        self.version += 1
        if len(self.steps) >= self.cfg.steps:
            self.stopped = True
            return
        sync = self.cfg.learner.sync_s
        self.learner_segments.append((self.now, self.now + sync, 1))
        for e in self.engines:  # idle engines (sync mode) pause at once, busy ones between steps
            e.request_sync(self.version, self.now)
        self.schedule(self.now + sync, self.end_sync)
        if self.is_async:
            self.fill()  # the admission bound just moved up by B

    def end_sync(self) -> None:
        self.learner_busy = False
        if self.is_async:
            self.try_train()
        else:
            self.start_batch()

    # -- result ------------------------------------------------------------------------------
    def _result(self) -> SimResult:
        segs = [(e.idx, *s) for e in self.engines for s in e.segments]
        in_engines = sum(e.outstanding for e in self.engines)
        inflight = sum(1 for pr in self.prompts if not pr.done)
        checks = dict(
            admitted=len(self.prompts), trained=len(self.k_trained), ready=len(self.ready),
            inflight=inflight, rollouts_created=self.n_rollouts,
            rollouts_finished=len(self.finish_times), rollouts_in_engines=in_engines,
            rollouts_pending=len(self.pending),
            admission_excess=(None if not self.is_async else int(self.admission_excess)),
            max_staleness_bound=self.cfg.max_staleness if self.is_async else 0)
        return SimResult(self.mode, self.cfg, self.now, self.steps,
                         np.array(segs, dtype=float).reshape(-1, 5),
                         np.array(self.learner_segments, dtype=float).reshape(-1, 3),
                         np.array(self.staleness, dtype=int), np.array(self.k_trained, dtype=int),
                         np.array(self.finish_times), self.gen_tokens, checks)


def simulate(cfg: SimConfig, mode: str) -> SimResult:
    return Sim(cfg, mode).run()
