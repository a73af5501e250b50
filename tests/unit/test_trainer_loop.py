"""The trainer's step loop (cluster.trainer.Trainer.one_step) over fake roles, on a fake clock:
the watchdog's clock after an evaluation and a checkpoint, and the in-loop checkpoints.

No Ray: the coordinator and telemetry are plain objects whose ``.remote`` answers at once,
and the loop's Ray plumbing (``ray_get``, ``publish``, ``_gen_stats``) is replaced by calls
that answer those answers; evaluation and checkpoints only take (fake) time."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

import cluster.trainer as trainer_mod
from actors.types import TrainBatch
from cluster.config import build_config
from cluster.metrics import RunWriter, TrainClock
from cluster.trainer import Trainer

EVAL_S, SAVE_S, STEP_S = 30.0, 20.0, 5.0  # what each takes on the fake clock


class Clock:
    def __init__(self):
        self.now = 1000.0

    def time(self) -> float:
        return self.now


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class FakeCoordinator:
    def __init__(self, log: list, on_next_batch):
        batch = TrainBatch(records=[], samples=[], version=0, inflight_prompts=0, counters={})
        self.next_batch = _Remote(lambda n: on_next_batch() or log.append("next_batch") or batch)
        for name in ("pause", "resume", "set_version", "start"):
            setattr(self, name, _Remote(lambda *a, name=name: log.append(name)))


class Loop(Trainer):
    """The real ``one_step`` over fake roles."""

    def __init__(self, cfg, clock: Clock, totals: dict):
        self.cfg, self.clock_ = cfg, clock
        self.task = SimpleNamespace(rewards=(-1.0, 1.0))
        self.log: list = []
        self.saves: list[int] = []
        self.left_at_next_batch: list[float] = []  # the watchdog's time left, each step
        self.coord = FakeCoordinator(self.log,
                                     lambda: self.left_at_next_batch.append(self.time_left()))
        self.telemetry = SimpleNamespace(report=_Remote(lambda *a: None))
        learner = SimpleNamespace(train_step=lambda samples: clock_advance(clock, STEP_S) or {})
        self.roles = SimpleNamespace(learner=learner, generators=[])
        self.version = self.step = 0
        self.totals = {"prompts_trained": 0, "prompts_skipped_nan": 0, "rollouts": 0,
                       "tokens_generated": 0, "nan_skipped_steps": 0,
                       "generator_update_failures": 0, "learner_wait_s": 0.0,
                       "eval_time_s": 0.0, "train_s": 0.0, "last_eval_train_s": 0.0, **totals}
        self._calls = ThreadPoolExecutor(max_workers=1)
        self.recorder, self.after_step = None, None
        self.writer = RunWriter(cfg.run_dir, "", progress=False)
        self.prompts_log = self.writer.prompts_path.open("a")
        self.t_start = self.last_progress = clock.time()
        self.clock = TrainClock(self.totals, self.t_start)

    def ray_get(self, role, ref):
        return self.call(role, lambda r: r, ref)

    def publish(self):
        self.ray_get("coordinator", self.coord.set_version.remote(self.version, None))

    def evaluate(self):
        clock_advance(self.clock_, EVAL_S)
        self.log.append("evaluate")
        return {"eval_time_s": EVAL_S, "eval_accuracy": 0.5, "eval_accuracy_se": 0.1}

    def save(self):
        clock_advance(self.clock_, SAVE_S)
        self.saves.append(self.step)

    def _gen_stats(self):
        return []


def clock_advance(clock: Clock, s: float) -> None:
    clock.now += s


@pytest.fixture
def loop(tmp_path, monkeypatch):
    def make(totals=None, **run):
        clock = Clock()
        monkeypatch.setattr(trainer_mod, "time", clock)
        cfg = build_config({"run": {"name": "r", "output_dir": str(tmp_path), "progress": False,
                                    "stall_timeout_s": 100.0, **run}})
        return Loop(cfg, clock, totals or {})
    return make


def test_the_next_step_gets_the_whole_watchdog_limit_after_an_evaluation_and_a_checkpoint(loop):
    t = loop(max_steps=10, eval_every=1, checkpoint_every=1)
    t.one_step()
    t.one_step()
    assert t.log.count("evaluate") == 2 and t.saves == [1, 2]
    # Step 2 started 30 s of evaluation and 20 s of checkpoint after step 1's end: the
    # watchdog still gives it its 100 s.
    assert t.left_at_next_batch == [100.0, 100.0]


def test_a_resumed_run_continues_its_training_clock_and_budget(loop):
    """Resumed with 100 s of training behind it (its checkpoint's totals): the 120 s budget
    ends it after 4 more 5 s steps, evaluations (30 s each) not counted."""
    t = loop(totals={"train_s": 100.0, "last_eval_train_s": 100.0, "prompts_trained": 60},
             max_steps=1000, max_train_s=120.0, eval_every=0, eval_every_s=10.0)
    t.step = 20
    last = [t.one_step() for _ in range(4)]
    assert last == [False, False, False, True]
    assert t.totals["train_s"] == pytest.approx(120.0)
    assert t.log.count("evaluate") == 2  # 10 s after the last one (110), and at the end
    assert t.totals["eval_time_s"] == 2 * EVAL_S
    assert t.totals["last_eval_train_s"] == pytest.approx(120.0)


def test_the_last_step_leaves_its_checkpoint_to_the_end_of_the_run(loop):
    t = loop(max_steps=2, eval_every=0, checkpoint_every=1)
    assert [t.one_step(), t.one_step()] == [False, True]
    assert t.saves == [1]  # Trainer.run saves step 2 once, after the coordinator stops
