"""The trainer's step loop (cluster.run.trainer.Trainer.one_step) over a run of fake roles, on a
fake clock: the watchdog's clock after an evaluation and a checkpoint, the in-loop
checkpoints, and the order of the remote calls.

No Ray: the coordinator and telemetry are plain objects whose ``.remote`` answers at once,
the watchdog's ``get`` takes those answers as they are, and publishing, generator stats,
evaluation and checkpoints are stand-ins that only take (fake) time. The run files, the
counters and the watchdog's deadline are the real ones."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import cluster.run.trainer as trainer_mod
import cluster.run.watchdog as watchdog_mod
from common.types import TrainBatch
from cluster.config.schema import build_config
from cluster.records.metrics import Tally
from cluster.records.files import RunFiles
from cluster.records.step import HeldOut
from cluster.run.start import Run, RunState
from cluster.run.trainer import Trainer
from cluster.run.watchdog import Watchdog
from common.records import StepResult

EVAL_S, SAVE_S, STEP_S = 30.0, 20.0, 5.0  # what each takes on the fake clock


class Clock:
    def __init__(self):
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def advance(self, s: float) -> None:
        self.now += s


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class FakeCoordinator:
    def __init__(self, log: list, on_next_batch):
        batch = TrainBatch(records=[], samples=[], version=0, inflight_prompts=0)
        self.next_batch = _Remote(lambda n: on_next_batch() or log.append("next_batch") or batch)
        for name in ("pause", "resume", "set_version", "start"):
            setattr(self, name, _Remote(lambda *a, name=name: log.append(name)))
        self.serving = _Remote(lambda: [])  # no generators


class Dog(Watchdog):
    def get(self, role, ref):  # the fake roles answer at once: the answer is the "ref"
        return self.call(role, lambda r: r, ref)

    def ready(self, role, ref, halt, poll_s=0.2):  # answered at once
        return True


def fake_run(cfg, clock: Clock, totals: dict, step: int) -> tuple[Run, list, list, list]:
    """A ``Run`` of fake roles; (run, call log, steps checkpointed, watchdog time left at
    each next_batch)."""
    log, saves, left = [], [], []
    dog = Dog(cfg.run.stall_timeout_s, lambda role, waited, step: (role, {}))
    learner = SimpleNamespace(train_batch=lambda batch: clock.advance(STEP_S) or StepResult())

    def evaluate(generators):
        clock.advance(EVAL_S)
        log.append("evaluate")
        return HeldOut(accuracy=0.5, accuracy_se=0.1, duration_s=EVAL_S)

    def save(step, learner, coord, state):
        clock.advance(SAVE_S)
        saves.append(step)
        run.ckpts.saved_step = step

    from cluster.nodes.roles import Startup

    run = Run(cfg, SimpleNamespace(learner=learner, generators=[], startup=Startup(), published=0,
                                  dtypes={"learner": "fp32", "engine": "float32"}),
              SimpleNamespace(rewards=(-1.0, 1.0)), RunState(version=0, step=step),
              FakeCoordinator(log, lambda: left.append(dog.time_left())),
              SimpleNamespace(report=_Remote(lambda *a: None)), dog,
              RunFiles(cfg.run_dir, "", progress=False), Tally(totals),
              SimpleNamespace(save=save, tags=lambda: [f"step{x}" for x in saves[::-1]]),
              Evaluating(evaluate))
    return run, log, saves, left


class Evaluating:
    """The evaluator stand-in: a callable with the real one's ``enabled`` and ``heldout``."""

    enabled, heldout = True, []

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, generators):
        return self.fn(generators)

    def close(self):
        pass


@pytest.fixture
def loop(tmp_path, monkeypatch):
    def make(totals=None, step=0, **run):
        clock = Clock()
        for mod in (trainer_mod, watchdog_mod):
            monkeypatch.setattr(mod, "time", clock)
        monkeypatch.setattr(trainer_mod, "generator_stats", lambda generators, serving=None: [])
        def publish(r, version):  # as run_start.publish: the owner advances, the coordinator told
            r.roles.published = version
            r.coord.set_version.remote(version)

        monkeypatch.setattr(trainer_mod, "publish", publish)
        cfg = build_config({"run": {"name": "r", "output_dir": str(tmp_path), "progress": False,
                                    "stall_timeout_s": 100.0, **run}})
        r, log, saves, left = fake_run(cfg, clock, totals or {}, step)
        t = Trainer(r)
        t.log, t.saves, t.left_at_next_batch = log, saves, left
        t.dog.progress(step)
        return t
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
             step=20, max_steps=1000, max_train_s=120.0, eval_every=0, eval_every_s=10.0)
    last = [t.one_step() for _ in range(4)]
    assert last == [False, False, False, True]
    assert t.tally.totals.train_s == pytest.approx(120.0)
    assert t.log.count("evaluate") == 2  # 10 s after the last one (110), and at the end
    assert t.tally.totals.eval_time_s == 2 * EVAL_S
    assert t.tally.totals.last_eval_train_s == pytest.approx(120.0)


def test_the_last_step_leaves_its_checkpoint_to_the_end_of_the_run(loop):
    t = loop(max_steps=2, eval_every=0, checkpoint_every=1)
    assert [t.one_step(), t.one_step()] == [False, True]
    assert t.saves == [1]  # Trainer.run saves step 2 once, after the coordinator stops


def test_one_step_calls_the_roles_in_the_order_of_the_pseudocode(loop):
    """Batch, (train), pause before an evaluation, publish, evaluate, resume after it; the
    last step pauses admission for good and does not resume it."""
    t = loop(max_steps=2, eval_every=1, checkpoint_every=0)
    assert [t.one_step(), t.one_step()] == [False, True]
    assert t.log == ["next_batch", "pause", "set_version", "evaluate", "resume",
                     "next_batch", "pause", "set_version", "evaluate"]
    assert t.version == 2 and t.tally.totals.eval_time_s == 2 * EVAL_S


def test_a_signal_checkpoints_the_last_step_whole_then_stops_the_run(loop, monkeypatch):
    """SIGTERM during step 3 (cluster/run/preempt.py): step 3 finishes and is recorded, the next
    wait for a batch asks for nothing; admission paused, a checkpoint of step 3 (the periodic
    one at step 2 is not the newest), summary.json says preempted, Preempted is raised."""
    import io
    import json
    import signal

    from cluster.run.preempt import Preempted, Preemption

    monkeypatch.setattr(Trainer, "close", lambda self: None)  # fake roles: no ray.kill
    t = loop(max_steps=10, eval_every=0, checkpoint_every=2)
    t.r.cfg.generators.measure_peak = False
    t.stop = Preemption(60.0, hard_exit=lambda code: pytest.fail(f"hard exit {code}"),
                        out=io.StringIO())
    t.after_step = lambda step, m: step == 3 and t.stop.handle(signal.SIGTERM)
    with pytest.raises(Preempted) as done:
        t.run()
    t.stop.uninstall()
    assert done.value.step == 3 and t.step == 3 and t.saves == [2, 3]
    assert t.log.count("next_batch") == 3 and t.log[-1] == "pause"
    summary = json.loads((t.cfg.run_dir / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["steps"] == 3
    assert summary["checkpoint"] == "step3" and summary["signal"] == "SIGTERM"
    assert [json.loads(x)["step"] for x in
            (t.cfg.run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_signal_right_after_a_periodic_checkpoint_does_not_write_it_twice(loop, monkeypatch):
    import io
    import signal

    from cluster.run.preempt import Preempted, Preemption

    monkeypatch.setattr(Trainer, "close", lambda self: None)
    t = loop(max_steps=10, eval_every=0, checkpoint_every=2)
    t.r.cfg.generators.measure_peak = False
    t.stop = Preemption(60.0, hard_exit=lambda code: pytest.fail(f"hard exit {code}"),
                        out=io.StringIO())
    t.after_step = lambda step, m: step == 4 and t.stop.handle(signal.SIGTERM)
    with pytest.raises(Preempted):
        t.run()
    t.stop.uninstall()
    assert t.saves == [2, 4]


def test_a_learner_that_dies_stops_the_run_naming_the_checkpoint_to_resume_from(loop,
                                                                                monkeypatch):
    """The learner's actor dies in step 3 (its node lost, say): Ray cannot restart it, so the
    run stops after step 2 with RoleLost naming the last whole checkpoint (step 2), and
    summary.json says role_lost; the launcher exits ROLE_LOST (6)."""
    import json

    from ray.exceptions import ActorDiedError

    from cluster.run.trainer import RoleLost

    monkeypatch.setattr(Trainer, "close", lambda self: None)
    t = loop(max_steps=10, eval_every=0, checkpoint_every=2)
    t.r.cfg.generators.measure_peak = False
    train = t.learner.train_batch

    def dies_at_step_3(batch):
        if t.step == 3:
            raise ActorDiedError()
        return train(batch)
    t.learner.train_batch = dies_at_step_3
    with pytest.raises(RoleLost) as lost:
        t.run()
    assert "ActorDiedError" in str(lost.value) and "after step 2" in str(lost.value)
    assert "its last whole checkpoint is step2: the same command resumes from it" in str(lost.value)
    summary = json.loads((t.cfg.run_dir / "summary.json").read_text())
    assert summary["status"] == "role_lost" and summary["steps"] == 2 and t.saves == [2]
