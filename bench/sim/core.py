"""The training modes on a simulated cluster: the SHIPPED scheduler, simulated engines, a learner.

Every decision that the real coordinator makes (admission, which engine, extra rollouts,
cancellation, the staleness deadline, the hand-over) is made here by the same object,
``actors.scheduler.Scheduler``, fed by simulated engines (``bench/sim/engine.py``) instead of
vLLM; the per-prompt estimator state is the real ``estimator.PromptState``. What is modelled
is only time: decode steps, learner steps, weight syncs and call latency.

Modes (``MODES``: how each is simulated; a name that ``bench.modes``, the table of the modes the
benches run, also holds is the same mode, tests/unit/test_sim.py):
- ``sync_*``: the scheduler's barrier (max_staleness 0): B prompts admitted at a version,
  trained when all are finished, then the weights are synced (engines pause) and repeat.
- ``sync_grpo16_colocated``: the same barrier, but every GPU generates and then every GPU
  trains (as verl runs it): no GPU is dedicated to one role.
- ``sync_grpo16_colocated_oversample``: that barrier with the usual fix for its tail:
  ceil((1 + ``SimConfig.oversample``) x B) prompts admitted per step, the batch trained as
  soon as B of them finished; the stragglers are aborted in the engines (their tokens, and
  those of any surplus finished prompt, counted as spent and never trained).
- ``async_*``: generators and learner on their own GPUs run at once; samples are at most
  ``max_staleness`` versions old when trained.
- ``*_equal_mse``: GRPO with the group size whose baseline MSE equals V0.5's at this prior
  quality (``SimConfig.equal_mse_group``, set by the caller from a V0.5 run).
- ``async_grpo_best_g``: async GRPO at ``SimConfig.best_grpo_group`` (the G that learned best
  per unit of compute in ``bench.learning``; 4 when none is measured); ``async_grpo4``: G = 4.
- ``*_select``: admission by selection (``actors.scheduler.selection``, the shipped rule): a
  prompt gets rollouts with the chance that its group would not be uniform, predicted by the
  prior, never below ``SimConfig.select_floor``. ``async_v05_k4_select`` holds V0.5 at k = 4.

Each trained prompt's rollouts are also counted by what they give the learner: ``nonzero``
(some advantage is not 0) and ``mixed`` (its rewards are not all equal: a group-mean method's
only signal; V0.5's baseline also gives a uniform group an advantage where the prior
disagrees with it).
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from actors.scheduler import Cancel, Dispatch, Finished, Scheduler, SchedulerConfig
from actors.scheduler.selection import SelectionConfig
from bench.sim.engine import Engine, Rollout
from bench.sim.models import SimConfig
from common.records import DropReason
from estimator import ESTIMATORS, make_estimator


@dataclass(frozen=True)
class ModeSpec:
    barrier: bool          # synchronous: max_staleness 0
    colocated: bool        # every GPU generates, then every GPU trains
    algo: str              # "grpo", "v05" or "v05_k4" (V0.5 held at k = 4)
    group: int | str = 16  # GRPO's G, or the SimConfig field that holds it
    oversample: bool = False  # barrier only: admit SimConfig.oversampled_prompts, train the
                              # first B to finish, abort the rest
    select: bool = False   # admission by selection (the prior decides which prompts)


MODES = {
    "sync_grpo16": ModeSpec(True, False, "grpo"),
    "sync_grpo16_colocated": ModeSpec(True, True, "grpo"),
    "sync_grpo16_colocated_oversample": ModeSpec(True, True, "grpo", oversample=True),
    "sync_v05": ModeSpec(True, False, "v05"),
    "async_grpo16": ModeSpec(False, False, "grpo"),
    "async_grpo_best_g": ModeSpec(False, False, "grpo", "best_grpo_group"),
    "async_v05": ModeSpec(False, False, "v05"),
    "async_grpo_equal_mse": ModeSpec(False, False, "grpo", "equal_mse_group"),
    "async_grpo4": ModeSpec(False, False, "grpo", 4),
    "async_v05_select": ModeSpec(False, False, "v05", select=True),
    "async_v05_k4_select": ModeSpec(False, False, "v05_k4", select=True),
}
CHUNK = 512  # prompts drawn per block of random numbers


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


@dataclass
class SimResult:
    mode: str
    cfg: SimConfig
    n_engines: int
    learner_gpus: int         # colocated: every usable GPU, also the n_engines
    t_stop: float
    steps: list               # per learner step: dict(t_start, t_end, prompts, rollouts, tokens)
    engine_segments: np.ndarray   # (M, 5): engine, t0, t1, n running, kind (0 decode, 1 sync)
    learner_segments: np.ndarray  # (L, 3): t0, t1, kind (0 train, 1 sync)
    staleness: np.ndarray     # (R,) version lag of every trained rollout
    k_trained: np.ndarray     # (P,) rollouts of every trained prompt
    rounds_trained: np.ndarray    # (P,) generation rounds of every trained prompt
    baseline_sq_err: np.ndarray   # (P,) (baseline - true mean reward)^2 of every trained prompt
    finish_times: np.ndarray  # (F,) time each rollout finished
    token_events: np.ndarray  # (E, 2): time, tokens of every finished or aborted rollout
    gen_tokens_done: int      # tokens of finished rollouts
    cancelled_tokens: int     # tokens of aborted rollouts (spent, never trained)
    aborted_prompts: int      # oversample mode: prompts dropped at a hand-over, never trained
    checks: dict              # conservation and staleness-bound bookkeeping


class Sim:
    def __init__(self, cfg: SimConfig, mode: str):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {list(MODES)}")
        self.cfg, self.mode, self.spec = cfg, mode, MODES[mode]
        spec = self.spec
        if spec.algo == "v05":
            self.est = ESTIMATORS["v05"](cfg.estimator_config())
        elif spec.algo == "v05_k4":
            self.est = ESTIMATORS["v05"](replace(cfg.estimator_config(), k_max=cfg.k_init))
        else:
            g = getattr(cfg, spec.group) if isinstance(spec.group, str) else spec.group
            if g is None:
                raise ValueError(f"mode {mode}: set SimConfig.{spec.group} first")
            self.est = make_estimator("grpo", k_init=g, k_max=g)
        if spec.oversample and not spec.barrier:
            raise ValueError(f"mode {mode}: over-sampling is a barrier's tail fix")
        # Admissions per version: B, or ceil((1 + oversample) B) that race for B places.
        admit = cfg.oversampled_prompts if spec.oversample else cfg.batch_prompts
        self.is_async = not spec.barrier
        slow = cfg.overlap_slowdown if self.is_async else 1.0
        usable = cfg.usable_gpus(self.est.needs_prior)
        self.n_engines = usable if spec.colocated else cfg.n_generators
        self.learner_gpus = usable if spec.colocated else cfg.learner_gpus_for(self.est.needs_prior)
        times = cfg.decode.step_times() * slow
        self.train_s_per_token = cfg.learner.s_per_token_gpu * slow / self.learner_gpus
        self.engines = [Engine(i, times, cfg.decode.max_num_seqs, cfg.learner.sync_s, self)
                        for i in range(self.n_engines)]
        selection = (SelectionConfig(floor=cfg.select_floor, window=4 * admit,
                                     k=self.est.cfg.k_init, seed=cfg.seed)
                     if spec.select else None)
        self.sched = Scheduler(
            SchedulerConfig(batch_prompts=admit,
                            max_staleness=0 if spec.barrier else cfg.max_staleness,
                            slots_per_generator=cfg.decode.max_num_seqs,
                            max_inflight_prompts=cfg.max_inflight_prompts, selection=selection),
            self.est, self.n_engines, clock=lambda: self.now)
        self.candidates: dict = {}       # uid -> (stream, prior) of a drawn, undecided prompt
        self.source = PromptSource(cfg)
        self.latency = cfg.dispatch_latency_s
        self.events: list = []
        self._seq = itertools.count()
        self.now, self.version, self.stopped = 0.0, 0, False
        self.next_pid = 0
        self.streams: dict = {}          # uid -> (true mean reward, rewards, lengths)
        self.rollouts: dict = {}         # (request_id, position) -> Rollout
        self.learner_busy = False
        self.learner_segments: list = []
        self.steps: list = []
        self.staleness: list = []
        self.k_trained: list = []
        self.rounds_trained: list = []
        self.sq_err: list = []
        self.finish_times: list = []
        self.token_events: list = []
        self.gen_tokens = self.cancelled_tokens = self.aborted_prompts = 0

    # -- event queue -------------------------------------------------------------------------
    def schedule(self, t: float, fn, *args) -> None:
        heapq.heappush(self.events, (t, next(self._seq), fn, args))

    def run(self) -> SimResult:
        t_max = math.inf if self.cfg.max_hours is None else self.cfg.max_hours * 3600.0
        self.schedule(0.0, self.fill)
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

    # -- the scheduler's actions on simulated engines ----------------------------------------
    def apply(self, actions) -> None:
        for a in actions:
            if isinstance(a, Dispatch):
                _, rewards, lengths = self.streams[a.uid]
                for pos, idx in enumerate(a.indices):
                    j = idx % len(rewards)  # regenerated indices reuse the stream cyclically
                    r = Rollout(a.request_id, pos, int(lengths[j]), float(rewards[j]), a.priority)
                    self.rollouts[(a.request_id, pos)] = r
                    self.engines[a.generator].submit(r, self.now, self.latency)
            elif isinstance(a, Cancel):
                for pos in a.positions:
                    r = self.rollouts.get((a.request_id, pos))
                    if r is not None:
                        self.engines[a.generator].abort(r, self.now)

    def fill(self) -> None:
        """Admit as many new prompts as the scheduler has room for."""
        if self.spec.select:
            return self.fill_selected()
        while not self.stopped and (n := self.sched.room()) > 0:
            uids, priors = [], []
            for _ in range(n):
                pid = self.next_pid
                self.next_pid += 1
                p, prior, rewards, lengths = self.source.get(pid)
                uid = f"p{pid}"
                self.streams[uid] = (-1.0 + 2.0 * p, rewards, lengths)
                uids.append(uid)
                priors.append(prior if self.est.needs_prior else None)
            self.apply(self.sched.admit(uids, priors, uids=uids))

    def fill_selected(self) -> None:
        """Admission by selection, as the coordinator drives it: the window filled from the
        stream, every waiting candidate scored by its prior, the scheduler's choice admitted;
        a deferred prompt's streams are forgotten."""
        s = self.sched
        while not self.stopped and s.room() > 0:
            uids = []
            for _ in range(s.to_draw()):
                pid, self.next_pid = self.next_pid, self.next_pid + 1
                p, prior, rewards, lengths = self.source.get(pid)
                uids.append(f"p{pid}")
                self.candidates[uids[-1]] = ((-1.0 + 2.0 * p, rewards, lengths), prior)
            s.offer(uids, uids)
            s.score([self.candidates[u][1] for u in s.waiting()])
            chosen = s.admit_selected()
            waiting = set(s.waiting())
            for u in [u for u in self.candidates if u not in waiting]:
                stream, _ = self.candidates.pop(u)
                if u in s.inflight:
                    self.streams[u] = stream
            self.apply(chosen)

    def on_finished(self, engine: Engine, finished: list) -> None:
        for r in finished:
            self.finish_times.append(self.now)
            self.token_events.append((self.now, r.tokens))
            self.gen_tokens += r.tokens
            del self.rollouts[(r.request_id, r.position)]
            self.apply(self.sched.on_rollouts(
                r.request_id, [Finished(r.position, r.reward, r.tokens, r.version, payload=r)]))
        self.fill()
        self.try_train()

    def on_aborted(self, engine: Engine, aborted: list) -> None:
        for r in aborted:
            self.token_events.append((self.now, r.tokens))
            self.cancelled_tokens += r.tokens
            self.rollouts.pop((r.request_id, r.position), None)
            self.apply(self.sched.on_rollouts(
                r.request_id, [Finished(r.position, 0.0, r.tokens, r.version, r, cancelled=True)]))
        self.fill()
        self.try_train()

    # -- learner -----------------------------------------------------------------------------
    def abort_stragglers(self) -> list:
        """Over-sampling: once B prompts have finished, drop every other prompt of the step
        (the unfinished ones and any surplus finished ones, latest first) so that the barrier
        releases at once. Returns the engines' cancels, to apply once the learner is busy."""
        sched, B = self.sched, self.cfg.batch_prompts
        if len(sched.ready) < B:
            return []
        keep = sorted(sched.ready.values(), key=lambda g: (g.deadline, g.t_done, g.uid))[:B]
        keep = {g.uid for g in keep}
        cancels = []
        for uid in [u for u in sched.inflight if u not in keep]:
            cancels += sched.drop(uid, DropReason.ABORTED)
            self.streams.pop(uid, None)
            self.aborted_prompts += 1
        return cancels

    def try_train(self) -> None:
        if self.learner_busy or self.stopped:
            return
        aborts = self.abort_stragglers() if self.spec.oversample else []
        got = self.sched.take_batch(self.cfg.batch_prompts)
        batch, actions = got if got is not None else ([], [])
        if not batch:  # (after aborts the B kept prompts are all due and finished: not here)
            self.apply(actions + aborts)
            return
        self.apply(actions)
        rolls = [grp.payloads[i] for grp in batch for i in grp.state.indices()]
        tokens = sum(r.length for r in rolls) + len(rolls) * self.cfg.length.prompt_tokens
        dur = self.cfg.learner.step_overhead_s + tokens * self.train_s_per_token
        nonzero = mixed = 0
        for grp in batch:
            self.staleness.extend(self.sched.version - v for v in grp.start_version.values())
            r, k = grp.state.rewards(), grp.state.k
            nonzero += k * bool((abs(grp.state.advantages()) > 1e-12).any())
            mixed += k * bool(r.max() > r.min())
            self.k_trained.append(grp.state.k)
            self.rounds_trained.append(grp.state.rounds)
            mu = self.streams[grp.uid][0]
            self.sq_err.append((grp.state.baseline - mu) ** 2)
            del self.streams[grp.uid]
        self.learner_busy = True
        self.learner_segments.append((self.now, self.now + dur, 0))
        self.steps.append(dict(t_start=self.now, t_end=self.now + dur, prompts=len(batch),
                               rollouts=len(rolls), tokens=tokens, nonzero_rollouts=nonzero,
                               mixed_rollouts=mixed))
        self.schedule(self.now + dur, self.end_train)
        # The aborts' reports come back through on_aborted -> try_train: the learner is busy
        # and the step's admissions closed (the batch was taken), so nothing re-enters.
        self.apply(aborts)

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

    def end_sync(self) -> None:
        """Every engine has the new weights: the coordinator learns the new version."""
        self.learner_busy = False
        self.sched.set_version(self.version)
        self.fill()
        self.try_train()

    # -- result ------------------------------------------------------------------------------
    def _result(self) -> SimResult:
        segs = [(e.idx, *s) for e in self.engines for s in e.segments]
        acct = self.sched.accounting()
        counts = acct.scheduler
        checks = dict(
            admitted=counts.prompts_admitted, trained=len(self.k_trained),
            handed=counts.prompts_handed, dropped=acct.prompts_dropped,
            inflight=self.sched.in_flight(),
            drop_reasons={k: n for k, n in asdict(acct.drop_reasons).items() if n},
            rollouts_dispatched=counts.rollouts_dispatched,
            rollouts_finished=len(self.finish_times), rollouts_cancelled=counts.rollouts_cancelled,
            stale_regenerated=counts.stale_regenerated, aborted_prompts=self.aborted_prompts,
            drawn=acct.prompts_drawn, deferred=acct.prompts_deferred,
            waiting=acct.prompts_waiting_at_end,
            rollouts_in_engines=sum(e.outstanding for e in self.engines),
            max_staleness_bound=0 if self.spec.barrier else self.cfg.max_staleness)
        return SimResult(self.mode, self.cfg, self.n_engines, self.learner_gpus, self.now,
                         self.steps, np.array(segs, dtype=float).reshape(-1, 5),
                         np.array(self.learner_segments, dtype=float).reshape(-1, 3),
                         np.array(self.staleness, dtype=int), np.array(self.k_trained, dtype=int),
                         np.array(self.rounds_trained, dtype=int), np.array(self.sq_err),
                         np.array(self.finish_times),
                         np.array(self.token_events, dtype=float).reshape(-1, 2),
                         self.gen_tokens, self.cancelled_tokens, self.aborted_prompts, checks)


def simulate(cfg: SimConfig, mode: str) -> SimResult:
    return Sim(cfg, mode).run()
