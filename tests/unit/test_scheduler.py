"""The scheduling policy (actors/scheduler.py) driven by fake generators and a fake clock:
admission under each bound, extra rollouts first and at home, the sample-age bound, the
synchronous barrier, DAPO refills, cancellation, lost generators, stale re-generation and the
accounting identity. No Ray, no asyncio: the scheduler is a pure object."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from actors.prompts import prior_observation, train_samples
from actors.scheduler.checkpoint import restore, snapshot
from actors.scheduler import core as sched_mod
from actors.scheduler import (Cancel, Dispatch, Finished, Scheduler, SchedulerConfig,
                              priority)
from actors.scheduler.state import cap_samples
from common.records import DropCounts, DropReason
from common.types import PriorObservation, Rollout
from estimator import make_estimator


def cfg(**kw) -> SchedulerConfig:
    base = dict(batch_prompts=4, max_staleness=1, slots_per_generator=64)
    base.update(kw)
    return SchedulerConfig(**base)


@dataclass
class Fake:
    """Fake generators: they hold each dispatched request until the test completes it, and
    report the version the scheduler was at when the request was sent as its start version
    (a real generator's is never older). Rewards come from ``reward(uid, index)``."""

    sched: Scheduler
    reward: callable = lambda uid, i: 1.0
    inflight: dict = field(default_factory=dict)     # request_id -> (Dispatch, start version)
    cancelled: dict = field(default_factory=dict)    # request_id -> set of positions
    log: list = field(default_factory=list)          # every action, in order

    def apply(self, actions) -> None:
        for a in actions:
            self.log.append(a)
            if isinstance(a, Dispatch):
                assert a.request_id not in self.inflight
                self.inflight[a.request_id] = (a, self.sched.version)
            elif isinstance(a, Cancel):
                self.cancelled.setdefault(a.request_id, set()).update(a.positions)
            else:
                raise AssertionError(f"unknown action {a!r}")

    def admit(self, n: int | None = None, prior: float | None = None) -> list:
        n = self.sched.room() if n is None else n
        acts = self.sched.admit([f"q{len(self.log)}-{i}" for i in range(n)], [prior] * n)
        self.apply(acts)
        return acts

    def complete(self, rid: str) -> list:
        d, v = self.inflight.pop(rid)
        gone = self.cancelled.pop(rid, set())
        fin = [Finished(p, self.reward(d.uid, i), tokens=10, start_version=v,
                        payload=(d.uid, i), cancelled=p in gone)
               for p, i in enumerate(d.indices)]
        acts = self.sched.on_rollouts(rid, fin)
        self.apply(acts)
        return acts

    def complete_all(self) -> None:
        while self.inflight:
            self.complete(next(iter(self.inflight)))


def grpo(k=4):
    return make_estimator("grpo", k_init=k, k_max=k)


# -- admission --------------------------------------------------------------------------------

def test_admission_is_bounded_by_free_sequence_slots():
    s = Scheduler(cfg(batch_prompts=8, max_staleness=4, slots_per_generator=8), grpo(4), 2)
    f = Fake(s)
    assert s.room() == 4  # 2 generators x 8 slots / 4 rollouts per prompt
    acts = f.admit()
    assert [len(a.indices) for a in acts] == [4] * 4
    assert sorted(a.generator for a in acts) == [0, 0, 1, 1]  # k_init of a prompt on one engine
    assert s.load == [8, 8] and s.room() == 0
    f.complete(acts[0].request_id)
    assert s.room() == 1


def test_admission_is_bounded_by_the_staleness_calendar():
    s = Scheduler(cfg(batch_prompts=2, max_staleness=1, slots_per_generator=1000), grpo(), 2)
    f = Fake(s)
    assert s.room() == 4  # deadlines v and v+1, B each
    f.admit()
    assert s.room() == 0
    assert sorted(g.deadline for g in s.inflight.values()) == [0, 0, 1, 1]
    f.complete_all()
    batch, _ = s.take_batch(2)
    assert sorted(g.deadline for g in batch) == [0, 0]
    s.set_version(1)
    assert s.room() == 2  # deadline 2 opened; deadline 1 is still full


def test_admission_is_bounded_by_the_inflight_cap():
    s = Scheduler(cfg(batch_prompts=2, max_staleness=8, max_inflight_prompts=3), grpo(), 2)
    assert s.room() == 3


def test_config_rejects_a_cap_below_one_batch():
    with pytest.raises(ValueError, match="max_inflight_prompts"):
        cfg(batch_prompts=4, max_inflight_prompts=3)


def test_admitting_past_the_room_is_an_error():
    s = Scheduler(cfg(batch_prompts=1, max_staleness=0), grpo(), 1)
    with pytest.raises(ValueError, match="room"):
        s.admit(["a", "b"], [None, None])


# -- extras, homes, priorities --------------------------------------------------------------

def test_extra_rollouts_go_to_the_prompts_generator_ahead_of_new_prompts():
    # The prior says "always solved", every reward says "never": the test rejects the prior
    # and the plan asks for more rollouts of this prompt.
    est = make_estimator("v05", k_init=4, k_max=16)
    s = Scheduler(cfg(batch_prompts=4, max_staleness=2), est, 3)
    f = Fake(s, reward=lambda uid, i: -1.0)
    [first] = f.admit(1, prior=1.0)
    d = s.inflight[first.uid].deadline
    assert d == 0  # the first fill takes the earliest deadlines
    assert first.priority == priority(d, first=True) and first.round == 1
    extra = f.complete(first.request_id)
    assert extra and all(isinstance(a, Dispatch) for a in extra)
    assert all(a.priority == priority(d, first=False) < first.priority for a in extra)
    assert all(a.generator == first.generator for a in extra)
    # A prompt admitted now, due at the same version: its rollouts queue behind the extras.
    [later] = f.admit(1, prior=0.5)
    assert s.inflight[later.uid].deadline == d and later.priority > extra[0].priority
    assert min(a.indices[0] for a in extra) == 4 and all(a.round == 2 for a in extra)


def test_an_accepted_prior_finishes_the_prompt_at_k_init():
    est = make_estimator("v05", k_init=4, k_max=16)
    s = Scheduler(cfg(batch_prompts=1, max_staleness=0), est, 1)
    f = Fake(s, reward=lambda uid, i: 1.0)
    [d] = f.admit(1, prior=1.0)
    assert f.complete(d.request_id) == []
    batch, _ = s.take_batch(1)
    assert batch[0].state.k == 4


def test_a_finished_prompt_is_told_to_the_prior_as_a_checked_record():
    """What the coordinator sends the prior (``prior_observation``): the prompt, its success
    rate on the run's reward scale, the version given and the rollouts behind the rate; a
    record the server takes as is."""
    from actors.priors.server import PriorServer, check_observation

    s = Scheduler(cfg(batch_prompts=1, max_staleness=0), grpo(k=4), 1)
    f = Fake(s, reward=lambda uid, i: 1.0 if i < 3 else -1.0)     # 3 of 4 right
    f.apply(s.admit([SimpleNamespace(id="p1", prompt="What is 2 plus 2?")], [None]))
    f.complete_all()
    [pif] = s.drain_finished()
    o = prior_observation(pif, (-1.0, 1.0), 7)
    assert o == PriorObservation("What is 2 plus 2?", 0.75, 7, 4)
    assert check_observation(o, "here") == o
    server = PriorServer("constant", {}, window=4)
    assert server.observe([o]) == 1 and server.stats().latest_version == 7


# -- the hand-over and the age bound ------------------------------------------------------------

@pytest.mark.parametrize("staleness", [0, 1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_trained_sample_is_older_than_max_staleness(staleness, seed):
    """A random completion order, V0.5 with a noisy prior: every sample the learner takes is
    at most max_staleness versions old, and every admitted prompt is accounted for."""
    rng = random.Random(seed)
    est = make_estimator("v05", k_init=4, k_max=16)
    s = Scheduler(cfg(batch_prompts=3, max_staleness=staleness, slots_per_generator=24), est, 2)
    truth = {}

    def reward(uid, i):
        p = truth.setdefault(uid, rng.random())
        return 1.0 if rng.random() < p else -1.0

    f = Fake(s, reward=reward)
    trained = 0
    while trained < 30:
        if s.room():
            acts = s.admit([f"x{trained}-{j}" for j in range(s.room())],
                           [rng.random() for _ in range(s.room())])
            f.apply(acts)
        got = s.take_batch(3)
        if got is not None:
            batch, acts = got
            f.apply(acts)
            for g in batch:
                ages = [s.version - v for v in g.start_version.values()]
                assert max(ages) <= staleness, (g.uid, ages)
                assert g.deadline >= s.version
            if batch:
                trained += len(batch)
                s.set_version(s.version + 1)
            continue
        assert f.inflight, "no batch, nothing in flight and no room: the scheduler is stuck"
        f.complete(rng.choice(list(f.inflight)))
        a = s.accounting()
        assert a.scheduler.prompts_admitted == a.scheduler.prompts_handed + a.prompts_dropped + \
            s.in_flight()


def test_synchronous_barrier_admits_one_batch_per_version_and_waits_for_all_of_it():
    s = Scheduler(cfg(batch_prompts=3, max_staleness=0), grpo(), 2)
    f = Fake(s)
    acts = f.admit()
    assert len(acts) == 3 and s.room() == 0
    f.complete(acts[0].request_id)
    f.complete(acts[1].request_id)
    assert s.take_batch(3) is None  # the slowest prompt holds the batch
    f.complete(acts[2].request_id)
    batch, _ = s.take_batch(3)
    assert {g.uid for g in batch} == {a.uid for a in acts}
    assert s.room() == 0  # nothing new until the learner publishes the next version
    s.set_version(1)
    assert s.room() == 3


def test_the_learner_waits_for_a_prompt_due_now_even_with_others_ready():
    s = Scheduler(cfg(batch_prompts=2, max_staleness=1), grpo(), 2)
    f = Fake(s)
    acts = f.admit()                     # deadlines 0, 0, 1, 1
    due = [a for a in acts if s.inflight[a.uid].deadline == 0]
    later = [a for a in acts if s.inflight[a.uid].deadline == 1]
    f.complete(due[0].request_id)
    for a in later:
        f.complete(a.request_id)
    assert s.take_batch(2) is None       # a deadline-0 prompt is unfinished
    f.complete(due[1].request_id)
    batch, _ = s.take_batch(2)
    assert {g.uid for g in batch} == {a.uid for a in due}


def test_filtered_prompts_free_their_slot_and_are_refilled_then_the_batch_trains_short():
    s = Scheduler(cfg(batch_prompts=2, max_staleness=0, max_refill_factor=2),
                  make_estimator("dapo", k_init=4, k_max=4), 1)
    # "keep" has mixed rewards; every other prompt all-equal ones (DAPO drops those).
    f = Fake(s, reward=lambda uid, i: float(i % 2 * 2 - 1) if uid == "keep" else -1.0)
    f.apply(s.admit(["keep", "x"], [None, None], uids=["keep", "x"]))
    while True:
        f.complete_all()
        if s.room() == 0:
            break
        f.apply(s.admit([f"y{len(f.log)}"], [None]))
    assert s.drops.filtered_all_equal == 4  # refilled until the cap (2 x B)
    batch, _ = s.take_batch(2)
    assert [g.uid for g in batch] == ["keep"]  # a closed deadline trains short
    a = s.accounting()
    assert a.scheduler.prompts_admitted == a.scheduler.prompts_handed + a.prompts_dropped + s.in_flight()


def test_a_stale_finished_sample_is_regenerated_then_the_prompt_dropped():
    s = Scheduler(cfg(batch_prompts=1, max_staleness=1, max_regenerations=1), grpo(2), 1)
    f = Fake(s)
    [d] = f.admit(1)
    f.inflight[d.request_id] = (d, -5)   # as if started long ago (e.g. before a resume)
    f.complete(d.request_id)
    got = s.take_batch(1)
    assert got is not None and got[0] == []
    regen = got[1]
    assert [a.indices for a in regen] == [(2, 3)] and s.counts.stale_regenerated == 2
    f.apply(regen)
    f.inflight[regen[0].request_id] = (regen[0], -5)
    f.complete(regen[0].request_id)
    assert s.take_batch(1) is None       # too stale again: dropped, nothing to train

    assert s.drops.stale == 1 and s.in_flight() == 0


# -- cancellation -------------------------------------------------------------------------------

class ScriptedState:
    """A PromptState stand-in whose plan follows a script, one (request, cancel) pair per
    planning call (the real plan's arithmetic is tested in test_estimator; here only the
    scheduler's reaction matters)."""

    keep = True

    def __init__(self, est, prior):
        self.est = est
        self.script = [(4, 0), (6, 0), (0, 3)]
        self.now = (0, 0)
        self.requested = 0
        self.obs, self.gone = {}, set()
        self.prior_p = prior

    @property
    def k(self):
        return len(self.obs)

    @property
    def outstanding(self):
        return self.requested - self.k - len(self.gone)

    @property
    def done(self):
        return not self.script and self.outstanding == 0

    def round_of(self, i):
        return 1 if i < 4 else 2

    def outstanding_indices(self):
        return sorted(set(range(self.requested)) - set(self.obs) - self.gone)

    def to_request(self):
        self.now = self.script.pop(0) if self.script else (0, 0)
        self.requested += self.now[0]
        return self.now[0]

    def to_cancel(self):
        return self.now[1]

    def cancel(self, i):
        self.gone.add(i)

    def add(self, r, index):
        assert index not in self.gone
        self.obs[index] = r


def test_a_shrinking_plan_cancels_the_latest_dispatched_rollouts(monkeypatch):
    monkeypatch.setattr(sched_mod, "PromptState", ScriptedState)
    s = Scheduler(cfg(batch_prompts=1, max_staleness=0), grpo(), 1)
    f = Fake(s)
    [first] = f.admit(1)
    [extra] = f.complete(first.request_id)         # plan: 6 more
    assert extra.indices == (4, 5, 6, 7, 8, 9)
    [cancel] = s._plan(s.inflight[first.uid])         # plan shrinks by 3
    f.apply([cancel])
    assert cancel.request_id == extra.request_id and cancel.positions == (3, 4, 5)
    assert s.load == [3]                             # aborted slots free at once
    f.complete(extra.request_id)                     # 3 results + 3 cancelled reports
    assert s.counts.cancelled_tokens == 30 and s.counts.rollouts_cancelled == 3
    pif = s.ready[first.uid]
    assert sorted(pif.state.obs) == [0, 1, 2, 3, 4, 5, 6] and pif.cancelled_rollouts == 3


# -- faults ---------------------------------------------------------------------------------

def test_a_lost_generators_work_is_reissued_to_the_others():
    s = Scheduler(cfg(batch_prompts=64, max_staleness=1), grpo(), 2)
    f = Fake(s)
    acts = f.admit(2)
    on1 = next(a for a in acts if a.generator == 1)
    f.inflight.pop(on1.request_id)
    [again] = s.on_request_failed(on1.request_id, generator_lost=True)
    assert again.generator == 0 and again.indices == on1.indices and again.uid == on1.uid
    assert s.alive == [True, False] and s.load[1] == 0
    assert s.room() == (64 - s.load[0]) // 4   # only the live generator's slots count
    f.apply([again])
    assert s.mark_back(1) == [] and s.alive == [True, True]


def test_with_every_generator_lost_work_is_parked_until_one_returns():
    s = Scheduler(cfg(batch_prompts=4, max_staleness=1), grpo(), 1)
    f = Fake(s)
    [d] = f.admit(1)
    f.inflight.pop(d.request_id)
    assert s.on_request_failed(d.request_id, generator_lost=True) == []
    assert s.room() == 0 and len(s.parked) == 1
    [again] = s.mark_back(0)
    assert again.indices == d.indices and not s.parked


def test_repeated_engine_errors_drop_the_prompt_with_its_reason():
    s = Scheduler(cfg(batch_prompts=4, max_staleness=1), grpo(), 1)
    f = Fake(s)
    [d] = f.admit(1)
    f.inflight.pop(d.request_id)
    assert s.on_request_failed(d.request_id, drop_reason=DropReason.GENERATOR_ERROR,
                               detail="X") == []
    assert s.drops == DropCounts(generator_error=1) and s.in_flight() == 0
    assert s.dropped == [(d.uid, "generator_error: X")]  # dropped.jsonl's reason: kind: detail
    a = s.accounting()
    assert a.scheduler.prompts_admitted == 1 == a.prompts_dropped


def test_a_result_for_a_dropped_prompt_counts_as_spent_compute():
    s = Scheduler(cfg(batch_prompts=4, max_staleness=1), grpo(), 1)
    f = Fake(s)
    [d] = f.admit(1)
    [c] = s.drop(d.uid, DropReason.ABORTED)
    assert c.positions == (0, 1, 2, 3)
    f.cancelled[d.request_id] = set(c.positions)
    assert f.complete(d.request_id) == []
    assert s.counts.cancelled_tokens == 40 and s.load == [0]


# -- checkpoints ----------------------------------------------------------------------------

def test_snapshot_restore_continues_every_prompt_exactly_once():
    """Snapshot mid-run (some prompts finished and waiting, some with rollouts in flight),
    restore into a fresh scheduler: the in-flight rollouts are asked for again, finished ones
    kept, and every admitted prompt is then trained exactly once."""
    import json
    import random

    rng = random.Random(0)
    est = make_estimator("v05", k_init=4, k_max=16)

    def make(version=0):
        return Scheduler(cfg(batch_prompts=3, max_staleness=1, slots_per_generator=24), est, 2,
                         version=version)

    s = make()
    f = Fake(s, reward=lambda uid, i: rng.choice([1.0, -1.0]))
    f.apply(s.admit([f"q{i}" for i in range(s.room())], [0.5] * s.room()))
    for rid in list(f.inflight)[:3]:
        f.complete(rid)
    trained = []
    batch = s.take_batch(3)
    if batch and batch[0]:
        trained += [g.uid for g in batch[0]]
        s.set_version(1)
    snap = json.loads(json.dumps(snapshot(s, lambda p: p, lambda p: list(p))))
    admitted = s.accounting().scheduler.prompts_admitted
    every_uid = set(trained) | set(s.inflight)

    s2 = make(s.version)  # the resumed run starts at the checkpoint's version
    redo = restore(s2, snap, lambda p: p, lambda p: tuple(p))
    f2 = Fake(s2, reward=lambda uid, i: rng.choice([1.0, -1.0]))
    f2.apply(redo)
    assert s2.version == s.version and s2.in_flight() == s.in_flight()
    assert {a.uid for a in redo} == {u for u, g in s.inflight.items() if g.state.outstanding}
    while s2.in_flight():
        got = s2.take_batch(3)
        if got is not None:
            f2.apply(got[1])
            if got[0]:
                trained += [g.uid for g in got[0]]
                s2.set_version(s2.version + 1)
                continue
        if not f2.inflight:
            break
        f2.complete(next(iter(f2.inflight)))
    a = s2.accounting()
    assert a.scheduler.prompts_admitted == admitted  # nothing new was admitted (no one called admit)
    assert len(trained) == len(set(trained))  # no prompt twice
    assert set(trained) | set(s2.inflight) == every_uid and not set(trained) & set(s2.inflight)
    assert not s2.inflight  # and none left behind
    assert a.scheduler.prompts_admitted == a.scheduler.prompts_handed + a.prompts_dropped + s2.in_flight()


def test_a_resume_under_a_higher_version_number_keeps_every_age():
    """The resumed learner trains the checkpoint's weights under a higher number (generators
    that outlived the crash serve newer ones): the snapshot's versions move with it, so no
    sample restored is taken for stale, and every batch keeps the bound. Seen once in a
    shuffled suite before the shift: a prompt due at the old numbering was cut and trained
    two versions "old" on the checkpoint's own weights."""
    import json

    def make(version=0):
        return Scheduler(cfg(batch_prompts=2, max_staleness=1, slots_per_generator=16),
                         grpo(4), 1, version=version)

    s = make()
    f = Fake(s)
    f.admit()
    f.complete_all()                         # finished on version 0's weights
    batch, acts = s.take_batch(2)
    assert len(batch) == 2 and not acts
    s.set_version(1)                         # the other two wait, due at 1
    f.admit()                                # more admitted at 1 ...
    f.complete(next(iter(f.inflight)))       # ... some finished, some still generating
    assert s.ready and f.inflight
    snap = json.loads(json.dumps(snapshot(s, lambda p: p, lambda p: list(p))))
    with pytest.raises(ValueError, match="older than the snapshot's 1"):
        restore(make(0), snap, lambda p: p, tuple)

    s2 = make(3)                             # the same weights, numbered 3
    f2 = Fake(s2)
    f2.apply(restore(s2, snap, lambda p: p, tuple))
    for uid, g in s2.inflight.items():
        old = s.inflight[uid]
        assert g.deadline == old.deadline + 2 and g.admitted_version == old.admitted_version + 2
        assert g.start_version == {i: v + 2 for i, v in old.start_version.items()}
    trained = 0
    while s2.in_flight():
        got = s2.take_batch(2)
        if got is not None:
            f2.apply(got[1])
            if got[0]:
                assert all(s2.version - v <= 1 for g in got[0] for v in g.start_version.values())
                trained += len(got[0])
                s2.set_version(s2.version + 1)
                continue
        if not f2.inflight:
            break                            # a short last batch waits for admissions
        f2.complete(next(iter(f2.inflight)))
    assert trained >= 2 and trained + len(s2.ready) == len(snap["inflight"])
    assert s2.counts.stale_regenerated == 0


def test_a_checkpoint_written_before_the_rename_restores():
    """Snapshots once named the in-flight prompts "groups"; such a checkpoint still resumes."""
    s = Scheduler(cfg(batch_prompts=2, max_staleness=1), grpo(), 1)
    f = Fake(s)
    f.admit()
    f.complete(next(iter(f.inflight)))
    snap = snapshot(s, lambda p: p, lambda p: list(p))
    old = {("groups" if k == "inflight" else k): v for k, v in snap.items()}
    new, legacy = (Scheduler(cfg(batch_prompts=2, max_staleness=1), grpo(), 1) for _ in range(2))
    assert restore(new, snap, lambda p: p, tuple) == restore(legacy, old, lambda p: p, tuple)
    assert set(legacy.inflight) == set(new.inflight) == set(s.inflight) and set(legacy.ready) == set(s.ready)


def test_drops_not_yet_handed_over_survive_a_checkpoint():
    """A drop reaches dropped.jsonl only with the next batch: a checkpoint taken before it
    keeps the (uid, reason), else a resumed run has that uid nowhere. A checkpoint written
    before ``dropped`` was kept still restores (with none)."""
    import json

    s = Scheduler(cfg(batch_prompts=2, max_staleness=1), grpo(), 1)
    f = Fake(s)
    d = f.admit(2)[0]
    f.inflight.pop(d.request_id)
    s.on_request_failed(d.request_id, drop_reason=DropReason.GENERATOR_ERROR, detail="X")
    snap = json.loads(json.dumps(snapshot(s, lambda p: p, lambda p: list(p))))
    resumed = Scheduler(cfg(batch_prompts=2, max_staleness=1), grpo(), 1)
    restore(resumed, snap, lambda p: p, tuple)
    assert resumed.dropped == [(d.uid, "generator_error: X")] == s.dropped
    assert resumed.drops == s.drops == DropCounts(generator_error=1)
    # a checkpoint written before the drops were typed named them "kind: <exception type>"
    untyped = {**snap, "drops": {"generator_error: X": 1, "filtered_all_equal": 2}}
    typed = Scheduler(cfg(batch_prompts=2, max_staleness=1), grpo(), 1)
    restore(typed, untyped, lambda p: p, tuple)
    assert typed.drops == DropCounts(generator_error=1, filtered_all_equal=2)
    old = {k: v for k, v in snap.items() if k != "dropped"}
    legacy = Scheduler(cfg(batch_prompts=2, max_staleness=1), grpo(), 1)
    restore(legacy, old, lambda p: p, tuple)
    assert legacy.dropped == [] and set(legacy.inflight) == set(s.inflight)


def test_skipped_learner_steps_never_starve_admission():
    """A NaN-skipped step hands a batch over without a new version; more than
    max_staleness + 1 of them in a row must not leave the scheduler unable to admit."""
    s = Scheduler(cfg(batch_prompts=2, max_staleness=1), grpo(), 1)
    f = Fake(s)
    for _ in range(6):
        assert s.room() > 0
        f.admit()
        f.complete_all()
        batch, _ = s.take_batch(2)
        assert len(batch) == 2
        s.set_version(s.version)  # the learner skipped: same version
    assert s.version == 0


def test_in_the_steady_state_a_new_prompt_has_all_the_slack():
    """A prompt trained early does not give its deadline's quota back: prompts admitted
    later go to the newest deadline (max_staleness versions ahead), never into an early one."""
    s = Scheduler(cfg(batch_prompts=2, max_staleness=2), grpo(), 1)
    f = Fake(s)
    f.admit()                                   # the first fill: deadlines 0, 0, 1, 1, 2, 2
    assert sorted(g.deadline for g in s.inflight.values()) == [0, 0, 1, 1, 2, 2]
    f.complete_all()
    batch, _ = s.take_batch(2)
    assert [g.deadline for g in batch] == [0, 0]
    s.set_version(1)
    f.admit()
    new = [g for g in s.inflight.values() if g.admitted_version == 1]
    assert [g.deadline for g in new] == [3, 3]  # 1 + max_staleness, not the freed 0


def test_a_due_prompt_still_in_a_later_round_is_cut_not_waited_for():
    """The learner reaches a prompt's deadline while its extra rollouts still run: the prompt
    is finished with the k_init rewards in hand and the extras are cancelled in the engine."""
    est = make_estimator("v05", k_init=4, k_max=16)
    s = Scheduler(cfg(batch_prompts=1, max_staleness=1), est, 1)
    f = Fake(s, reward=lambda uid, i: -1.0)
    [first] = f.admit(1, prior=1.0)             # deadline 0; the prior will be rejected
    extra = f.complete(first.request_id)        # round 2 asked for, still running
    assert extra and s.inflight[first.uid].state.outstanding
    got = s.take_batch(1)
    assert got is not None
    batch, cancels = got
    assert [g.uid for g in batch] == [first.uid] and batch[0].state.k == 4
    assert cancels and all(isinstance(c, Cancel) for c in cancels)
    assert s.counts.deadline_cuts == 1 and s.load == [0]
    f.apply(cancels)
    f.complete(extra[0].request_id)             # the aborted rollouts report back, counted
    assert s.counts.cancelled_tokens > 0


def test_a_due_prompt_in_its_first_round_is_waited_for():
    s = Scheduler(cfg(batch_prompts=1, max_staleness=0), grpo(), 1)
    f = Fake(s)
    [d] = f.admit(1)
    assert s.take_batch(1) is None and s.counts.deadline_cuts == 0
    f.complete(d.request_id)
    assert [g.uid for g in s.take_batch(1)[0]] == [d.uid]


def test_behind_the_barrier_extra_rounds_are_waited_for_not_cut():
    est = make_estimator("v05", k_init=4, k_max=16)
    s = Scheduler(cfg(batch_prompts=1, max_staleness=0), est, 1)
    f = Fake(s, reward=lambda uid, i: -1.0)
    [first] = f.admit(1, prior=1.0)
    f.complete(first.request_id)                 # round 2 asked for
    assert s.take_batch(1) is None and s.counts.deadline_cuts == 0
    f.complete_all()
    batch, _ = s.take_batch(1)
    assert batch[0].state.k > 4                  # the sync batch waited for its extras


# -- batches counted in samples (rollout.batch_samples) ---------------------------------------

def v05(k_init=4, k_max=16):
    return make_estimator("v05", k_init=k_init, k_max=k_max)


@pytest.mark.parametrize("G", [2, 4, 8, 16])
def test_a_sample_counted_batch_holds_S_samples_whatever_the_group_size(G):
    S = 32
    s = Scheduler(cfg(batch_prompts=S // G, batch_samples=S, max_staleness=0), grpo(G), 2)
    f = Fake(s, reward=lambda uid, i: float(i % 2))
    f.admit()
    assert s.room() == 0 and s.in_flight() == S // G  # the barrier: one deadline of S / G
    f.complete_all()
    batch, _ = s.take_batch(10_000)
    assert sum(g.state.k for g in batch) == S


def test_the_quota_follows_the_mean_k_of_finished_prompts():
    # V0.5 with a prior that every group contradicts (p = 0.95, all rewards -1): the plan asks
    # for more than k_init, so the mean k rises above 4 and fewer prompts make S samples.
    S = 64
    s = Scheduler(cfg(batch_prompts=S // 4, batch_samples=S, max_staleness=1), v05(), 2)
    f = Fake(s, reward=lambda uid, i: -1.0)
    assert s.calendar.quota_size == 16  # nothing finished yet: S / k_init
    f.admit(prior=0.95)
    f.complete_all()
    ks = [g.state.k for g in s.ready.values()]
    assert min(ks) > 4
    assert s.calendar.quota_size == round(S / (sum(ks) / len(ks))) < 16
    batch, _ = s.take_batch(10_000)
    # Every prompt due now is taken even past S in rollouts, and the batch trains exactly S
    # of them: one cap on the samples trained per prompt (cap_samples).
    assert sum(g.state.k for g in batch) > S and all(g.deadline == 0 for g in batch)
    assert sum(g.trained for g in batch) == S
    assert sum(len(train_samples(as_rollouts(g))) for g in batch) == S
    trained = sorted(g.trained for g in batch)
    assert trained[-1] - trained[0] <= 1 and all(g.trained <= g.state.k for g in batch)


def as_rollouts(pif):
    """The Fake's payloads (uid, index) as the Rollouts a generator returns."""
    pif.payloads = {i: Rollout(f"{u}/{j}", u, [1], [j], [0.0], "", "stop", 0)
                    for i, (u, j) in pif.payloads.items()}
    return pif


def test_cap_samples_trims_the_largest_groups_first_and_keeps_the_rest_whole():
    class G:  # a prompt in flight, as cap_samples sees one
        def __init__(self, n):
            self.trainable, self.train_n = n, None

    batch = [G(n) for n in (4, 16, 4, 9, 5)]  # 38 samples
    cap_samples(batch, 30)
    got = [g.train_n if g.train_n is not None else g.trainable for g in batch]
    assert sum(got) == 30 and got[0] == got[2] == 4 and got[4] == 5  # under the cap: whole
    assert sorted(got[1::2]) == [8, 9] and got[1] == 9  # the remainder goes to the first
    short = [G(4), G(4)]
    cap_samples(short, 10)
    assert [g.train_n for g in short] == [None, None]  # fewer than S: nothing trimmed


def test_the_oracle_trains_train_k_of_each_group_and_its_quota_counts_those():
    S = 16
    oracle = make_estimator("oracle", k_init=16, k_max=16, train_k=4)
    s = Scheduler(cfg(batch_prompts=S // 4, batch_samples=S, max_staleness=0,
                      slots_per_generator=1000), oracle, 2)
    f = Fake(s, reward=lambda uid, i: float(i % 3 == 0) * 2 - 1)
    f.admit()
    assert s.in_flight() == S // 4
    f.complete_all()
    batch, _ = s.take_batch(10_000)
    assert [g.state.k for g in batch] == [16] * 4 and s.calendar.quota_size == S // 4
    samples = [x for g in batch for x in train_samples(as_rollouts(g))]
    assert len(samples) == S
    # rewards by index: +1 at 0, 3, 6, 9, 12, 15 (6 of 16); the baseline is the mean of the
    # 12 held out (indices 4-15: 4 of 12 succeed), the advantage of sample i is r_i minus it
    held_out_mean = (4 * 1 + 8 * -1) / 12
    assert [x.advantage for x in samples[:4]] == pytest.approx(
        [1 - held_out_mean, -1 - held_out_mean, -1 - held_out_mean, 1 - held_out_mean])


def test_a_sample_counted_batch_stops_at_S_and_keeps_the_rest_for_later():
    S = 16
    s = Scheduler(cfg(batch_prompts=4, batch_samples=S, max_staleness=2,
                      slots_per_generator=1000), grpo(4), 2)
    f = Fake(s, reward=lambda uid, i: float(i % 2))
    f.admit()  # 3 deadlines x 4 prompts
    f.complete_all()
    n_ready = len(s.ready)
    batch, _ = s.take_batch(10_000)
    assert sum(g.state.k for g in batch) == S and len(s.ready) == n_ready - 4


def test_a_sample_counted_batch_that_nothing_can_join_takes_more_prompts_then_trains_S():
    # S / k does not divide: B = round(10 / 4) = 2 prompts of 4 = 8 samples < 10. With every
    # prompt finished and no quota left the batch takes one more prompt at this version (the
    # 2 missing samples at the 4 a finished prompt gave) and trains exactly S (issue 29: the
    # synchronous V0.5 run trained 59 samples per update against GRPO's 64).
    s = Scheduler(cfg(batch_prompts=2, batch_samples=10, max_staleness=0), grpo(4), 2)
    f = Fake(s)
    f.admit()
    assert s.take_batch(10_000) is None  # still generating
    f.complete_all()
    assert s.take_batch(10_000) is None and s.room() == 1  # short: one more prompt admitted
    assert s.counts.batch_top_ups == 1
    f.admit()
    assert s.take_batch(10_000) is None  # the top-up's rollouts are still generating
    f.complete_all()
    batch, _ = s.take_batch(10_000)
    assert len(batch) == 3 and sum(g.state.k for g in batch) == 12
    assert sum(g.trained for g in batch) == 10  # trimmed to S (cap_samples)
    assert s.room() == 0 and s.counts.batch_top_ups == 1
    s.set_version(1)  # the next version's quota is B again: the top-up was for version 0
    assert s.room() == 2


def test_a_top_up_leaves_room_even_when_the_quota_fell_below_the_admissions_held():
    # B follows the mean k of the newest finished prompts: here it falls from 2 to 1 while
    # version 0 holds 2 admissions (8 samples of 10). The top-up must leave room for the one
    # prompt missing whatever B is now: counted from B it left none, and the batch waited for
    # ever (a synchronous V0.5 run stalled at step 46 of 48).
    s = Scheduler(cfg(batch_prompts=2, batch_samples=10, max_staleness=0), grpo(4), 2)
    f = Fake(s)
    f.admit()
    s.calendar.recent_k.extend([8] * 64)      # as after prompts of k = 8
    f.complete_all()
    assert s.calendar.quota_size == 1 < s.calendar.quota[0] == 2
    assert s.take_batch(10_000) is None and s.room() == 1
    f.admit()
    f.complete_all()
    batch, _ = s.take_batch(10_000)
    assert sum(g.trained for g in batch) == 10


def test_a_short_sample_counted_batch_trains_short_when_admission_is_paused():
    # Paused (an evaluation, the run's end) nothing more is admitted: waiting would be for ever.
    s = Scheduler(cfg(batch_prompts=2, batch_samples=10, max_staleness=0), grpo(4), 2)
    f = Fake(s)
    f.admit()
    f.complete_all()
    s.paused = True
    batch, _ = s.take_batch(10_000)
    assert sum(g.state.k for g in batch) == 8 and s.counts.batch_top_ups == 0


def test_synchronous_v05_trains_S_samples_every_step_whatever_k_its_prompts_reach():
    # V0.5 against a prior every group contradicts: k varies by prompt, so S / mean k prompts
    # make more or fewer than S samples; every step trains exactly S, at one version.
    S = 64
    s = Scheduler(cfg(batch_prompts=S // 4, batch_samples=S, max_staleness=0,
                      slots_per_generator=1000), v05(), 2)
    f = Fake(s, reward=lambda uid, i: -1.0 if (int(uid[1:]) + i) % 3 else 1.0)
    for v in range(6):
        while (got := s.take_batch(10_000)) is None or not got[0]:
            f.admit(prior=0.9) if s.room() else f.complete_all()
        batch = got[0]
        assert sum(g.trained for g in batch) == S, v
        assert all(g.deadline == v for g in batch)
        s.set_version(v + 1)
    assert s.counts.batch_top_ups >= 1


def test_a_long_run_with_drops_keeps_the_schedulers_containers_flat():
    """tests.acceptance.soak's concern, in miniature: 200 versions of DAPO refills (a drop at almost
    every deadline) leave no container larger than after the first few versions."""
    s = Scheduler(cfg(batch_prompts=2, max_staleness=1, max_refill_factor=2),
                  make_estimator("dapo", k_init=4, k_max=4), 1)
    f = Fake(s, reward=lambda uid, i: float(i % 2 * 2 - 1) if int(uid[1:]) % 3 else -1.0)
    n, sizes = 0, []
    for v in range(200):
        while True:
            f.complete_all()
            if s.room() == 0:
                break
            k = s.room()
            f.apply(s.admit([f"u{n + i}" for i in range(k)], [None] * k,
                            uids=[f"u{n + i}" for i in range(k)]))
            n += k
        got = s.take_batch(2)
        assert got is not None
        s.dropped = []  # the coordinator hands these over with each batch
        s.drain_finished()  # and feeds these to the prior
        s.set_version(v + 1)
        sizes.append(s.sizes())
    assert s.drops.filtered_all_equal > 100
    for key in sizes[0]:
        assert max(z[key] for z in sizes[100:]) <= max(max(z[key] for z in sizes[:10]), 4), key


def test_a_batch_level_estimator_takes_the_batchs_baselines_together_at_hand_over():
    """James-Stein's baselines depend on every group of the learner batch: the hand-over
    computes them over the batch, in the samples and in the records (the mean of a prompt's
    responses' baselines); a prompt handed alone keeps its own (leave-one-out) ones."""
    from actors.prompts import hand_over
    from estimator.registry import batch_group

    js = make_estimator("james_stein", k_init=4, k_max=4)
    s = Scheduler(cfg(batch_prompts=3, max_staleness=0), js, 1)
    pattern = {0: [1.0] * 4, 1: [1.0, -1.0, -1.0, -1.0], 2: [-1.0, -1.0, 1.0, 1.0]}
    f = Fake(s, reward=lambda uid, i: pattern[int(uid[1:]) % 3][i])
    from tasks.base import Problem

    f.apply(s.admit([Problem(x, f"what is {x}?", "1") for x in "abc"], [None] * 3,
                    uids=["p0", "p1", "p2"]))
    f.complete_all()
    prompts, _ = s.take_batch(3)
    for p in prompts:
        p.payloads = {i: Rollout(p.uid, p.problem.id, [1], [2], [-0.5], "t", "stop", 0,
                                 reward=float(r))
                      for i, r in enumerate(pattern[int(p.uid[1:]) % 3])}
    batch = hand_over(prompts, 0, 0, [])
    expected = batch_group(js, [p.state.rewards() for p in prompts]).advantages
    got = [x.advantage for x in batch.samples]
    assert got == pytest.approx(expected.ravel().tolist())
    assert got[:4] != pytest.approx([0.0] * 4)  # the uniform group has a signal in the batch
    alone = hand_over(prompts[:1], 0, 0, [])
    assert [x.advantage for x in alone.samples] == pytest.approx([0.0] * 4)  # RLOO's
    assert batch.records[0].baseline == pytest.approx(1.0 - sum(expected[0]) / 4)
