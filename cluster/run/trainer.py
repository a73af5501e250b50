"""The driver of a run: the step loop over a started run's roles (``cluster.run.start``).

    for step in steps:
        batch  = coordinator.next_batch(B)       # the scheduler's hand-over (sync: a barrier),
                                                 # its samples by reference
        result = learner.train_batch(batch)      # each rank fetches its own shard
        publish(v + 1): learner -> generators, then coordinator.set_version(v + 1)
        evaluate when due (admission paused, timed apart); record; checkpoint when due

Sync and async runs differ only in the coordinator's scheduler (``max_staleness = 0`` is
the synchronous barrier); this loop is the same for both. Every blocking call runs under
the watchdog's deadline (``cluster.run.watchdog``); every file is ``RunFiles``'s.
"""
from __future__ import annotations

import signal
import time

from cluster.records.checkpoints import CheckpointWriteError, run_state_writer
from cluster.records.metrics import StepTimes, generator_delta, run_summary, step_metrics
from cluster.records.step import HeldOut
from cluster.records.summary import RunSummary
from cluster.records.unparsed import UnparsedWatch
from cluster.run.preempt import Interrupted, Preempted, installed, wait_batch
from cluster.run.start import (Run, generator_stats, in_service, measure_peaks, publish,
                               run_extras, start_run)
from cluster.run.watchdog import Stalled
from common.cpu_dtype import dtype_line


def last_and_eval_due(run, step: int, train_s: float, last_eval_at: float,
                      generated: int = 0, last_eval_generated: int = 0) -> tuple[bool, bool]:
    """After step ``step``'s update, ``train_s`` seconds of training into the run, resumes
    included (the last evaluation at ``last_eval_at``, on the same clock), ``generated``
    rollouts generated for training (``last_eval_generated`` at the last evaluation): is it
    the last step (``run.max_steps``, or the ``run.max_train_s`` or ``run.max_rollouts``
    budget spent), and is an evaluation due (every ``eval_every`` steps, every
    ``eval_every_s`` seconds of training, every ``eval_every_rollouts`` rollouts, and after
    the last step when evaluating)?"""
    last = (step >= run.max_steps or (run.max_train_s is not None and train_s >= run.max_train_s)
            or (run.max_rollouts is not None and generated >= run.max_rollouts))
    every_r = run.eval_every_rollouts
    due = run.evaluates and (
        last or (bool(run.eval_every) and step % run.eval_every == 0)
        or (bool(run.eval_every_s) and train_s - last_eval_at >= run.eval_every_s)
        or (bool(every_r) and generated - last_eval_generated >= every_r))
    return last, due


def checkpoint_due(run, step: int, last: bool) -> bool:
    """A checkpoint after step ``step``, in the loop: every ``run.checkpoint_every`` steps,
    but not after the last one, which ``Trainer.run`` saves once, after the coordinator has
    stopped (so it holds the prompts still in flight at the end)."""
    return bool(run.checkpoint_every) and step % run.checkpoint_every == 0 and not last




class Trainer:
    """The step loop over a started ``Run``; ``Trainer.start`` starts one on running roles.

    ``after_step(step, metrics)``: called after every step's ``StepMetrics`` are written
    (tests and ``tests.acceptance.chaos`` inject faults there). ``initial_eval``: the held-out evaluation
    of the starting weights when a run from the same weights with the same evaluation
    settings measured it before (bench.learning: once per seed); None: this run measures it
    (``self.initial_eval`` after ``run``). The run's counters and training clock are its
    ``Tally``'s (``self.tally``), the policy version ``Roles.published``."""

    def __init__(self, run: Run, after_step=None, initial_eval: HeldOut | None = None):
        self.r, self.cfg, self.roles = run, run.cfg, run.roles
        self.coord, self.dog, self.tally = run.coord, run.dog, run.tally
        self.learner = run.roles.learner
        self.batch_prompts = run.cfg.rollout.batch_prompts
        self.step = run.state.step
        self.recorded = run.state.step  # the last step whose metrics were written
        self.after_step = after_step or (lambda step, metrics: None)
        self.initial_eval = initial_eval
        self.reused = initial_eval is not None
        self.final: HeldOut | None = None
        self.stop = installed()
        # answers the grader cannot read: said once, within the first steps
        self.unparsed = UnparsedWatch(run.cfg.rollout.max_tokens,
                                      getattr(run.task, "answer_format", "a final answer"))
        self.tally.skip(time.time())  # training time counts from here (and ``run``'s start)

    @property
    def version(self) -> int:
        """The policy version the generators serve (``Roles.published`` owns it)."""
        return self.roles.published

    @classmethod
    def start(cls, cfg, roles, task, start, after_step=None, initial_eval: HeldOut | None = None):
        """On running roles; ``start``: how the run starts in its directory, decided once
        (``cluster.run.start.start_run``)."""
        return cls(start_run(cfg, roles, task, start), after_step, initial_eval)

    def run(self) -> RunSummary:
        """Every step, then the coordinator's accounting, the last checkpoint, the trained policy
        (``run.save_final``), summary.json (its record returned); ``Stalled``, or ``Preempted``
        (cluster.run.preempt)."""
        cfg, files = self.cfg, self.r.files
        try:  # a stall from here on still closes the run's own roles (``close``)
            initial, peaks, gen0 = self.warm_up()
            self.dog.get("coordinator", self.coord.start.remote())
            if self.r.replacer:
                self.r.replacer.start()
            budget = cfg.run.max_rollouts  # a resumed run that spent its budget is done
            last = self.step >= cfg.run.max_steps or (
                budget is not None and self.tally.totals.rollouts_generated >= budget)
            while not last:
                last = self.one_step()
            acct = self.dog.get("coordinator", self.coord.stop.remote())
            files.end(acct, self.step)
            self.save()
            if cfg.run.save_final:  # the trained policy, loadable by transformers and vLLM
                self.export(cfg.run_dir / "final")
        except Interrupted:  # a signal (cluster/run/preempt.py): checkpoint, then stop
            self.step = self.recorded  # the step whose batch never came did not happen
            raise self.preempted() from None
        except Stalled as stall:
            self.stopped("stalled", stalled_on=stall.role, stall_report=stall.report)
            raise
        except CheckpointWriteError as err:  # the previous checkpoint is whole: resumable
            self.stopped("checkpoint_failed", error=str(err))
            raise
        except actor_died() as err:  # the learner's or the coordinator's node lost, say
            raise self.role_lost(err) from err
        finally:
            self.close()
        summary = run_summary(cfg, acct, self.tally.totals, self.step, self.version,
                              time.time() - self.t_start, initial, self.final,
                              run_extras(self.r, self.t_start, gen0, peaks,
                                         initial is not None and self.reused))
        written = files.summary(summary)
        self.report()
        return written

    def warm_up(self) -> tuple[HeldOut | None, list | None, list]:
        """Before the clock starts, each with the watchdog's whole limit: the checkpoint's
        weights served (resuming), the initial evaluation, the engines' peak probe; then the
        generators' counters at the start. Returns (initial evaluation, peaks, counters)."""
        if self.r.state.resumed:  # the generators serve the checkpoint's weights first
            publish(self.r, self.r.state.version)
        self.r.files.note(dtype_line(self.roles.dtypes))
        self.dog.progress()
        initial = self.initial_evaluation()
        self.dog.progress()
        peaks = measure_peaks(self.r) if self.cfg.generators.measure_peak else None
        gen0, self.t_start = generator_stats(self.roles.generators), self.dog.progress(self.step)
        self.tally.skip(self.t_start)  # training time counts from here
        return initial, peaks, gen0

    def one_step(self) -> bool:
        """One learner step; True when it was the last."""
        self.step += 1
        t0, g0 = time.time(), self.generator_stats()
        batch, t1 = timed(wait_batch, self.dog, self.coord, self.batch_prompts, self.stop)
        result, t2 = timed(self.dog.call, "learner (train)", self.learner.train_batch, batch)
        last, eval_due = self.due(self.tally.tick(t2), batch.rollouts_generated)
        if eval_due or last:  # nothing new is admitted while evaluating, nor after the end
            self.dog.get("coordinator", self.coord.pause.remote())
        if result.skipped:  # the same version: the coordinator reopens its admission for it
            self.dog.get("coordinator", self.coord.set_version.remote(self.version))
        else:
            publish(self.r, self.version + 1)
        t3 = self.dog.progress(self.step)
        self.tally.tick(t3)
        ev = self.evaluate() if eval_due else None
        if ev is not None and not last:
            self.dog.get("coordinator", self.coord.resume.remote())
        m = self.record(batch, result, (t0, t1, t2, t3), g0, ev)
        self.r.telemetry.report.remote(m, [p.k for p in batch.records])
        self.snapshot_when_due()
        if checkpoint_due(self.cfg.run, self.step, last):
            self.save()
        self.after_step(self.step, m)
        return last

    def due(self, train_s: float, generated: int) -> tuple[bool, bool]:
        """(last step, evaluation due) after this step, ``train_s`` into the run and
        ``generated`` rollouts generated for training (counted from here on)."""
        t = self.tally.totals
        t.rollouts_generated = generated
        return last_and_eval_due(self.cfg.run, self.step, train_s, t.last_eval_train_s,
                                 t.rollouts_generated, t.last_eval_rollouts)

    def record(self, batch, result, marks: tuple, g0: list, ev: HeldOut | None):
        """The step's ``StepMetrics``, counted (``Tally``) and written (metrics.jsonl,
        prompts.jsonl, dropped.jsonl, rollouts.msgpack)."""
        r = self.r
        self.look_at_nodes()
        m = step_metrics(self.step, self.version, batch, result, StepTimes(*marks, time.time()),
                         generator_delta(g0, self.generator_stats()),
                         self.cfg.algo.k_init, r.task.rewards, self.tally, ev,
                         len(r.nodes.alive) if r.nodes else None)
        r.files.step(m)
        r.files.prompts(batch, self.step, self.version, marks[1], result.skipped)
        for line in [*batch.notes, self.unparsed.step(batch.records)]:
            if line:
                r.files.warn(line)
        self.recorded = self.step
        return m

    def generator_stats(self) -> list:
        """The in-service generators' stats (None for the others: a call to a restarting one
        would wait)."""
        return generator_stats(self.roles.generators, in_service(self.r))

    def look_at_nodes(self) -> None:
        """A node lost or joined since the last step (cluster.nodes.watch), and a generator
        replaced meanwhile (cluster.nodes.replace): said."""
        for line in self.r.nodes.look(self.step) if self.r.nodes else []:
            self.r.files.warn(line)
        for line in self.r.replacer.said() if self.r.replacer else []:
            self.r.files.warn(line)

    def evaluate(self) -> HeldOut:
        """Held-out accuracy (``Evaluator``); not training time, and the next step gets the
        whole watchdog limit."""
        ev = self.dog.call("generators (evaluation)", self.r.evaluator,
                           [self.roles.generators[i] for i in in_service(self.r)])
        self.tally.skip(self.dog.progress(self.step))
        self.tally.evaluation(ev)
        self.final = ev
        return ev

    def initial_evaluation(self) -> HeldOut | None:
        """The starting weights' held-out accuracy (None when resuming or not evaluating)."""
        if not self.r.evaluator.enabled or self.r.state.resumed:
            return None
        if self.initial_eval is None:
            self.initial_eval = self.dog.call("generators (evaluation)", self.r.evaluator,
                                              self.roles.generators)
        self.final = ev = self.initial_eval
        self.r.files.note(f"held-out {self.cfg.run.eval_metric} accuracy at the start: "
                          f"{ev.accuracy:.3f} +- {ev.accuracy_se:.3f}")
        return ev

    def save(self) -> None:
        """A whole checkpoint or none (cluster/records/checkpoints.py): learner state with the run's
        counters, and the coordinator's admitted, untrained prompts."""
        state = {"step": self.step, "policy_version": self.version,
                 "totals": self.tally.totals.to_json()}
        self.dog.call("learner (checkpoint)", self.r.ckpts.save, self.step, self.learner,
                      run_state_writer(self.coord), state)
        self.dog.progress(self.step)  # as after an evaluation

    def snapshot_when_due(self) -> None:
        """The policy in Hugging Face format under snapshots/ every ``run.snapshot_every``."""
        if self.cfg.run.snapshot_every and self.step % self.cfg.run.snapshot_every == 0:
            self.export(self.cfg.run_dir / "snapshots" / f"step{self.step}")

    def export(self, path) -> None:
        """The policy in Hugging Face format at ``path``."""
        self.dog.call("learner (export)", self.learner.save_hf, str(path))
        self.dog.progress(self.step)

    def preempted(self) -> Preempted:
        """After a signal: no more admission, a checkpoint now (with every admitted, untrained
        prompt) unless this step's is already whole, summary.json saying ``preempted``;
        returns the ``Preempted`` to raise."""
        stop, t0 = self.stop, time.time()
        self.dog.get("coordinator", self.coord.pause.remote())
        if self.r.ckpts.saved_step != self.step:
            self.save()
        save_s = time.time() - t0
        done = stop.saved(self.step, save_s)
        stop.say(done.line)
        since = round(time.time() - stop.t_signal, 2) if stop.t_signal else None
        self.r.files.summary(RunSummary(
            self.step, self.version, self.tally.totals, status="preempted",
            signal=signal.Signals(stop.signum).name if stop.signum else None,
            checkpoint=f"step{self.step}", checkpoint_s=round(save_s, 2),
            signal_to_checkpoint_s=since, batch_wait_cancelled=stop.cancelled_wait))
        return done

    def role_lost(self, err: Exception) -> RoleLost:
        """A role whose actor Ray cannot restart died (the learner's ranks, the coordinator;
        generators and the prior restart, and the coordinator carries on without them):
        summary.json says ``role_lost``; the ``RoleLost`` to raise names the last whole
        checkpoint, which the same command resumes from."""
        self.step = self.recorded  # a step the loss interrupted did not happen
        self.look_at_nodes()  # the node that went, if one did
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        tags = self.r.ckpts.tags()
        resume = (f"its last whole checkpoint is {tags[0]}: the same command resumes from it"
                  if tags else "it has no whole checkpoint: the same command starts it over")
        self.stopped("role_lost", error=why)
        return RoleLost(f"a role the run cannot go on without is gone, its actor dead or "
                        f"unreachable ({type(err).__name__}: {why}); the run stopped after "
                        f"step {self.step}; {resume}")

    def stopped(self, status: str, **why) -> None:
        """summary.json and report.html of a run that stopped before its end (``status``:
        stalled, checkpoint_failed), with why and its counters."""
        self.r.files.summary(RunSummary(self.step, self.version, self.tally.totals,
                                        status=status, **why))
        self.report()

    def report(self) -> None:
        """report.html, the run's last file (then the W&B run ends)."""
        from cluster.report.page import write_report  # lazy: matplotlib costs ~1 s of import

        self.r.files.report(write_report)

    def close(self) -> None:
        """Stop the run's own roles and release its files, threads and scorer workers."""
        import ray

        if self.r.replacer:
            self.r.replacer.stop()
        ray.kill(self.coord)
        ray.kill(self.r.telemetry)
        self.r.files.close()
        self.dog.close()
        self.r.evaluator.close()


class RoleLost(RuntimeError):
    """The run stopped because a role it cannot go on without died (exit ``ROLE_LOST``)."""


ROLE_LOST = 6  # exit status: a role lost (its node, say); resumable from the last checkpoint


def actor_died() -> type:
    """Ray's error for a call to an actor that died (imported when an error is matched)."""
    from ray.exceptions import RayActorError

    return RayActorError


def timed(fn, *args):
    """``fn(*args)`` and the time it returned."""
    return fn(*args), time.time()
