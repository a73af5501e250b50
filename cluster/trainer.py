"""The driver of a run: the step loop over the role handles, evaluation, checkpoints, outputs.

    for step in steps:
        batch   = coordinator.next_batch(B)      # the scheduler's hand-over (sync: a barrier)
        metrics = learner.train_step(batch.samples)
        learner.publish_weights(generators, v+1); coordinator.set_version(v+1)
        evaluate every N (admission paused, timed apart); metrics.jsonl; checkpoint every M

Sync and async runs differ only in the coordinator's scheduler (``max_staleness = 0`` is
the synchronous barrier); this loop is the same for both.
"""
from __future__ import annotations

import functools
import json
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from cluster.checkpoints import Checkpoints
from cluster.config import Config, dump_config
from cluster.evaluation import AnswerScorer, evaluate
from cluster.paths import REPLACED, fresh_run_dir
from cluster.metrics import (PRIOR_WINDOW_STEPS, RunWriter, StepTimes, TrainClock,
                             generator_delta, per_generator, pool_prior_error,
                             prior_error_summary, rates, run_summary, step_metrics)


STATS_WAIT_S = 5.0  # telemetry: a generator that does not answer in this long is skipped


def outcomes(refs: list, ready: list, get) -> list[tuple[object, object]]:
    """(result, None) for each ref of ``refs`` in ``ready`` whose ``get`` succeeded, else
    (None, why): "timeout" for one not ready when the wait ended, the exception for one that
    raised. The one reading of a bounded ``ray.wait`` over several actors' calls."""
    done, out = set(ready), []
    for ref in refs:
        if ref not in done:
            out.append((None, "timeout"))
            continue
        try:
            out.append((get(ref), None))
        except Exception as err:  # noqa: BLE001 - the caller decides which are its
            out.append((None, err))
    return out


def gather_stats(refs: list, wait, get, timeout_s: float, dead: tuple = ()) -> list:
    """The answers to ``refs`` (one stats call per generator), waited for together for at
    most ``timeout_s``; None for one that has not answered by then (hung, or busy in a long
    call) or whose actor died (``dead`` errors; any other error is raised). Per-step
    telemetry never holds the step loop up for long (it used to wait for each generator in
    turn, up to 60 s each, twice a step). ``wait``/``get``: ``ray.wait``/``ray.get``."""
    if not refs:
        return []
    ready, _ = wait(refs, num_returns=len(refs), timeout=timeout_s)
    out = []
    for value, why in outcomes(refs, ready, get):
        if isinstance(why, Exception) and not isinstance(why, dead):
            raise why
        out.append(value)
    return out


def last_and_eval_due(run, step: int, train_s: float, last_eval_at: float) -> tuple[bool, bool]:
    """After step ``step``'s update, ``train_s`` seconds of training into the run, resumes
    included (the last evaluation at ``last_eval_at``, on the same clock): is it the last
    step (``run.max_steps``, or the ``run.max_train_s`` budget spent), and is an evaluation
    due (every ``eval_every`` steps, every ``eval_every_s`` seconds of training, and after
    the last step when evaluating)?"""
    last = step >= run.max_steps or (run.max_train_s is not None and train_s >= run.max_train_s)
    due = bool(run.eval_every or run.eval_every_s) and (
        last or (bool(run.eval_every) and step % run.eval_every == 0)
        or (bool(run.eval_every_s) and train_s - last_eval_at >= run.eval_every_s))
    return last, due


def checkpoint_due(run, step: int, last: bool) -> bool:
    """A checkpoint after step ``step``, in the loop: every ``run.checkpoint_every`` steps,
    but not after the last one, which ``Trainer.run`` saves once, after the coordinator has
    stopped (so it holds the prompts still in flight at the end)."""
    return bool(run.checkpoint_every) and step % run.checkpoint_every == 0 and not last


def failed_updates(refs: list, ready: list, get) -> dict[int, str]:
    """The generators (by index in ``refs``, one update ref each) that did not load a
    publish's weights, and why: a ref not in ``ready`` when the wait ended ("timeout": hung,
    or never got them), or one whose result raised (the error's type: ``RayActorError`` for a
    dead one, ``RayTaskError`` when its ``update_weights`` raised). ``get`` fetches a ready
    ref's result."""
    return {i: why if why == "timeout" else type(why).__name__
            for i, (_, why) in enumerate(outcomes(refs, ready, get)) if why is not None}


class Stalled(RuntimeError):
    """No learner step completed for ``run.stall_timeout_s``: ``role`` is what the run was
    waiting on, ``report`` what that role last reported."""

    def __init__(self, role: str, report: dict):
        super().__init__(f"stalled: no learner step for the watchdog's limit, waiting on {role}")
        self.role, self.report = role, report


class Trainer:
    """``after_step(step, metrics)``: called after every step's metrics are written (tests and
    ``bench.chaos`` inject faults there).

    The watchdog: every blocking call of the loop runs with a deadline, the time left until
    ``run.stall_timeout_s`` has passed since the last completed step; past it the run stops
    with ``Stalled`` naming the role it waited on (``summary.json`` says ``"status":
    "stalled"``) instead of waiting forever."""

    def __init__(self, cfg: Config, roles, task, after_step=None,
                 initial_eval: dict | None = None):
        from cluster.runtime import resume_state, start_run_roles

        self.cfg, self.roles, self.task = cfg, roles, task
        self.after_step = after_step
        # The held-out evaluation of the starting weights when it was measured before, by a
        # run from the same weights with the same evaluation settings (bench.learning: once
        # per seed); None: this run measures it (``self.initial_eval`` after ``run``).
        self.initial_eval = initial_eval
        # A fresh run: nothing of an older run's in its directory (the launcher has cleared
        # logs/ before the roles started; roles that outlive a run keep writing theirs).
        if not cfg.run.resume and fresh_run_dir(cfg.run_dir, logs=False) and cfg.run.progress:
            print(REPLACED, file=sys.stderr, flush=True)
        self.ckpts = Checkpoints(cfg.run_dir / "checkpoints", cfg.run.keep_checkpoints)
        state = self.state = resume_state(cfg, roles)
        self.version, self.step = state.version, state.step
        # Counters over the run and its resumes (restored from the checkpoint): train_s is
        # the training wall-clock (TrainClock), last_eval_train_s where the last evaluation was.
        self.totals = {"prompts_trained": 0, "prompts_skipped_nan": 0, "rollouts": 0,
                       "tokens_generated": 0, "nan_skipped_steps": 0,
                       "generator_update_failures": 0, "learner_wait_s": 0.0, "eval_time_s": 0.0,
                       "train_s": 0.0, "last_eval_train_s": 0.0, **state.totals}
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="watchdog")
        self.update_failed: list[tuple[int, int, str]] = []  # (version, generator, why)
        self.prior_window: deque[dict] = deque(maxlen=PRIOR_WINDOW_STEPS)  # steps' metrics
        self.scorer: AnswerScorer | None = None  # evaluation's verifier, from the first one
        self.last_progress = time.time()
        # The run's own roles, beside the long-lived ones: the coordinator and telemetry.
        self.coord, self.telemetry = start_run_roles(cfg, roles, task, state)
        if state.resumed:
            self.publish()  # generators serve the checkpoint's weights before any rollout
        self.recorder = None
        rollouts = cfg.run_dir / "rollouts.msgpack"
        if state.resumed:  # what was recorded after the checkpoint is trained again
            from learner.replay import keep_records

            keep_records(rollouts, self.step)
        if cfg.run.record_rollouts:
            from learner.replay import RolloutRecorder

            self.recorder = RolloutRecorder(rollouts)

    # -- the watchdog --------------------------------------------------------------------
    def time_left(self) -> float:
        """Seconds until the watchdog's deadline (``run.stall_timeout_s`` after the last
        progress), at least 0."""
        return max(0.0, self.cfg.run.stall_timeout_s - (time.time() - self.last_progress))

    def call(self, role: str, fn, *args):
        """``fn(*args)`` within the watchdog's deadline; past it, ``Stalled(role, report)``."""
        fut = self._calls.submit(fn, *args)
        try:
            return fut.result(timeout=self.time_left())
        except FutureTimeout:
            raise Stalled(*self._blame(role)) from None

    def _blame(self, role: str) -> tuple[str, dict]:
        """Name what the run waits on: the coordinator says which of its roles it waits for."""
        import ray

        waited = round(time.time() - self.last_progress, 1)
        if role != "coordinator":
            return role, {"seconds_since_last_step": waited, "step": self.step}
        try:
            report = ray.get(self.coord.waiting_on.remote(), timeout=30)
        except Exception as err:  # noqa: BLE001 - the coordinator itself does not answer
            return "coordinator (not answering)", {"error": f"{type(err).__name__}: {err}",
                                                   "seconds_since_last_step": waited}
        return report.pop("role"), {**report, "seconds_since_last_step": waited}

    def ray_get(self, role: str, ref):
        import ray

        return self.call(role, ray.get, ref)

    # -- weights -------------------------------------------------------------------------
    def publish(self) -> None:
        """Learner rank 0's weights -> every generator, in place; then the coordinator.

        The generators' updates are waited for together, at most ``run.call_timeout_s`` and
        never past the watchdog's deadline. A generator that did not load them (dead, hung,
        or its ``update_weights`` raised) is counted in ``generator_update_failures`` and
        named in the summary's ``generator_update_failed``; the coordinator re-syncs one
        that Ray restarts (its incarnation changes)."""
        import ray

        payload, refs = self.call("learner (weight publish)", self.roles.learner.publish_weights,
                                  self.roles.generators, self.version)
        self.roles.published = self.version
        refs = list(refs)
        ready, _ = ray.wait(refs, num_returns=len(refs),
                            timeout=min(self.cfg.run.call_timeout_s, self.time_left())) \
            if refs else ([], [])
        failed = failed_updates(refs, ready, functools.partial(ray.get, timeout=10))
        self.totals["generator_update_failures"] += len(failed)
        self.update_failed += [(self.version, i, why) for i, why in failed.items()]
        self.ray_get("coordinator", self.coord.set_version.remote(self.version, payload))

    def save(self) -> None:
        """A whole checkpoint or none (cluster/checkpoints.py): learner state with the
        trainer's counters, and the coordinator's admitted, untrained prompts."""
        state = {"step": self.step, "policy_version": self.version, "totals": self.totals}
        self.call("learner (checkpoint)", self.ckpts.save, self.step, self.roles.learner,
                  self.coord, state)

    def evaluate(self) -> dict:
        """Held-out accuracy (cluster/evaluation.py): answers scored as the coordinator
        scores rollouts (``reward.workers``, ``reward.timeout_s``), a generator that fails or
        hangs (``run.call_timeout_s``) replaced by the others."""
        cfg = self.cfg.run
        if self.scorer is None:  # worker processes start once per run
            from tasks import make_task_from_config

            self.scorer = AnswerScorer(self.task,
                                       functools.partial(make_task_from_config, self.cfg.task),
                                       self.cfg.score_workers(), self.cfg.reward.timeout_s)
        ev = self.call("generators (evaluation)", functools.partial(
            evaluate, self.roles.generators, self.task, self.heldout, self.cfg.rollout.max_tokens,
            samples=cfg.eval_samples, temperature=self.cfg.rollout.temperature, seed=cfg.seed,
            scorer=self.scorer, timeout_s=cfg.call_timeout_s))
        ev["eval_accuracy"] = ev.get(f"eval_{cfg.eval_metric}")
        ev["eval_accuracy_se"] = ev.get(f"eval_{cfg.eval_metric}_se")
        return ev

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> dict:
        import ray

        cfg = self.cfg
        self.writer = RunWriter(cfg.run_dir, dump_config(cfg),
                                resume_step=self.step if self.state.resumed else None,
                                tensorboard=cfg.logging.tensorboard, progress=cfg.run.progress)
        self.heldout = self.task.heldout()[: cfg.run.eval_prompts]
        # The initial evaluation is before the clock starts (summary: eval_time_initial_s).
        initial, reused = {}, self.initial_eval is not None
        if self.evaluating and not self.state.resumed:
            if self.initial_eval is None:
                self.initial_eval = self.evaluate()
            initial = self.initial_eval
        self.final = initial  # the latest evaluation, replaced by each one after a step
        if initial:
            self.writer.note(f"held-out {cfg.run.eval_metric} accuracy at the start: "
                             f"{initial['eval_accuracy']:.3f} +- {initial['eval_accuracy_se']:.3f}")
        peaks = self._measure_peaks() if cfg.generators.measure_peak else None
        self.prompts_log = self.writer.prompts_path.open("a")
        self.t_start, gen0 = time.time(), self._gen_stats()
        self.last_progress = self.t_start  # the watchdog counts from here
        self.clock = TrainClock(self.totals, self.t_start)  # training time too
        try:
            self.ray_get("coordinator", self.coord.start.remote())
            self.finished = self.step >= cfg.run.max_steps
            while not self.finished:
                self.finished = self.one_step()
            acct = self.ray_get("coordinator", self.coord.stop.remote())
            self._log_end(acct)
            self.save()
            if cfg.run.save_final:  # the trained policy, loadable by transformers and vLLM
                self.call("learner (export)", self.roles.learner.save_hf,
                          str(cfg.run_dir / "final"))
        except Stalled as stall:
            self.writer.summary({"status": "stalled", "stalled_on": stall.role,
                                 "stall_report": stall.report, "steps": self.step,
                                 "policy_version": self.version, **self.totals})
            self._report()
            raise
        finally:
            ray.kill(self.coord)
            ray.kill(self.telemetry)
            self.prompts_log.close()
            self._calls.shutdown(wait=False, cancel_futures=True)
            if self.scorer is not None:
                self.scorer.close()
            if self.recorder:
                self.recorder.close()
        gen_end = self._gen_stats()
        summary = run_summary(cfg, acct, self.totals, self.step, self.version,
                              time.time() - self.t_start, initial, self.final,
                              {**generator_delta(gen0, gen_end), "t_start": self.t_start,
                               "eval_initial_reused": bool(initial) and reused,
                               "resumed_from": self.state.resumed_from,
                               "startup": dict(self.roles.startup),
                               "skipped_checkpoints": self.state.skipped_checkpoints,
                               "generator_update_failed": self.update_failed,
                               "generators": per_generator(gen0, gen_end, peaks),
                               "decode_peak_tokens_per_s": sum(peaks) if peaks else None})
        self.writer.summary(summary)
        self._report()
        return summary

    def _report(self) -> None:
        """report.html beside the run's outputs; a failed report never fails the run."""
        from cluster.report import write_report  # lazy: matplotlib costs ~1 s of import

        try:
            self.writer.note(f"report: {write_report(self.cfg.run_dir)}")
        except Exception as err:  # noqa: BLE001 - the run's outputs are already written
            self.writer.note(f"report: not written ({type(err).__name__}: {err})")

    @property
    def evaluating(self) -> bool:
        return bool(self.cfg.run.eval_every or self.cfg.run.eval_every_s)

    def one_step(self) -> bool:
        """One learner step (batch, train, publish, maybe evaluate, record); True when it was
        the last."""

        cfg, coord = self.cfg, self.coord
        self.step += 1
        t0, g0 = time.time(), self._gen_stats()
        batch = self.ray_get("coordinator", coord.next_batch.remote(cfg.rollout.batch_prompts))
        t1 = time.time()
        lm = self.call("learner (train step)", self.roles.learner.train_step, batch.samples)
        t2 = time.time()
        last, eval_due = last_and_eval_due(cfg.run, self.step, self.clock.tick(t2),
                                           self.totals["last_eval_train_s"])
        if eval_due or last:  # nothing new is admitted while evaluating, nor after the end
            self.ray_get("coordinator", coord.pause.remote())
        if not lm.get("skipped"):
            self.version += 1
            self.publish()
        else:  # the same version: the coordinator reopens its admission for it
            self.ray_get("coordinator", coord.set_version.remote(self.version))
        self.last_progress = t3 = time.time()
        self.clock.tick(t3)
        ev = self.evaluate() if eval_due else {}
        if ev:
            self.last_progress = time.time()  # the next step gets the whole watchdog limit
            self.clock.skip(self.last_progress)  # evaluation is not training time
            self.final = ev
            self.totals["eval_time_s"] += ev["eval_time_s"]
            self.totals["last_eval_train_s"] = self.totals["train_s"]
            if not last:
                self.ray_get("coordinator", coord.resume.remote())
        m = step_metrics(self.step, self.version, batch, lm,
                         StepTimes(t0, t1, t2, t3, time.time()),
                         generator_delta(g0, self._gen_stats()), self.k_init, self.task.rewards)
        self._account(batch, lm, m)
        m.update(ev, **rates(self.totals))
        self.writer.step(m)
        self._log_prompts(batch, t1, bool(lm.get("skipped")))
        self.telemetry.report.remote(m, [r.k for r in batch.records], m.get("extra_rollouts", 0))
        if cfg.run.snapshot_every and self.step % cfg.run.snapshot_every == 0:
            self.call("learner (export)", self.roles.learner.save_hf,
                      str(cfg.run_dir / "snapshots" / f"step{self.step}"))
            self.last_progress = time.time()
        if checkpoint_due(cfg.run, self.step, last):
            self.save()
            self.last_progress = time.time()  # as after an evaluation
        if self.after_step is not None:
            self.after_step(self.step, m)
        return last

    @property
    def k_init(self) -> int:
        return self.cfg.algo.k_init

    def _account(self, batch, lm: dict, m: dict) -> None:
        t = self.totals
        skipped = bool(lm.get("skipped"))
        t["nan_skipped_steps"] += skipped
        t["prompts_skipped_nan" if skipped else "prompts_trained"] += len(batch.records)
        t["rollouts"] += m["rollouts"]
        t["tokens_generated"] += m["tokens_generated"]
        t["learner_wait_s"] += m["learner_wait_s"]
        if m.get("prior_abs_error") is not None:  # the prior's running error over the run
            n = m["prior_prompts"]
            t["prior_error_sum"] = t.get("prior_error_sum", 0.0) + m["prior_abs_error"] * n
            t["prior_error_prompts"] = t.get("prior_error_prompts", 0) + n
            m["prior_abs_error_running"] = t["prior_error_sum"] / t["prior_error_prompts"]
        self._account_prior_error(m)
        if self.recorder is not None:
            it = iter(batch.samples)
            for r in batch.records:
                self.recorder.append(r.prompt_id, r.prompt, r.rewards, r.baseline, self.version,
                                     [next(it) for _ in range(r.k)], step=self.step)

    def _account_prior_error(self, m: dict) -> None:
        """The prior's noise-corrected error (``corrected_prior_error``) pooled over the run
        (sums in the totals, so resumes continue them) and over the last
        ``PRIOR_WINDOW_STEPS`` steps (this process's; a resume starts the window afresh), as
        ``prior_error_sd_corrected_{running,window}`` and ``prior_bias_{running,window}``."""
        t = self.totals
        if m.get("prior_error_n"):
            n = m["prior_error_n"]
            t["prior_error_sq_sum"] = t.get("prior_error_sq_sum", 0.0) + m["prior_error_var_corrected"] * n
            t["prior_bias_sum"] = t.get("prior_bias_sum", 0.0) + m["prior_bias"] * n
            t["prior_error_n"] = t.get("prior_error_n", 0) + n
            self.prior_window.append(m)
        if not t.get("prior_error_n"):
            return
        for when, pooled in (("running", prior_error_summary(
                t["prior_error_sq_sum"], t["prior_bias_sum"], t["prior_error_n"])),
                             ("window", pool_prior_error(self.prior_window))):
            for key in ("prior_error_sd_corrected", "prior_error_var_corrected", "prior_bias"):
                if key in pooled:
                    m[f"{key}_{when}"] = pooled[key]

    def _measure_peaks(self) -> list[float]:
        """Each engine's decode tokens/s with every slot busy, all engines at once (they share
        the machine as they do in a run)."""
        import ray

        prompt = self.heldout[0].prompt if self.heldout else "0"
        n = min(32, self.cfg.rollout.max_tokens)
        return self.call("generators (peak probe)", ray.get,
                         [g.measure_peak.remote(prompt, n) for g in self.roles.generators])

    def _gen_stats(self) -> list:
        """Each generator's ``stats()`` (None while it is dead or restarting)."""
        import ray

        return gather_stats([g.stats.remote() for g in self.roles.generators], ray.wait,
                            ray.get, STATS_WAIT_S, (ray.exceptions.RayActorError,))

    def _log_end(self, acct: dict) -> None:
        """Drops after the last hand-over to dropped.jsonl; the uids still in flight to
        inflight_at_end.json (with prompts.jsonl: every admitted prompt's fate, by uid)."""
        with self.writer.dropped_path.open("a") as drops:
            for uid, why in acct.pop("dropped_since_last_batch"):
                drops.write(json.dumps({"uid": uid, "reason": why, "step": self.step}) + "\n")
        (self.cfg.run_dir / "inflight_at_end.json").write_text(
            json.dumps({"step": self.step, "uids": acct.pop("inflight_uids")}) + "\n")

    def _log_prompts(self, batch, t_trained: float, skipped: bool) -> None:
        """prompts.jsonl: one line per trained prompt; dropped.jsonl: one per dropped prompt
        with its reason (the prompts of a NaN-skipped step among them)."""
        with self.writer.dropped_path.open("a") as drops:
            for uid, why in batch.dropped:
                drops.write(json.dumps({"uid": uid, "reason": why, "step": self.step}) + "\n")
            if skipped:
                for r in batch.records:
                    drops.write(json.dumps({"uid": r.uid, "reason": "learner_nan_skip",
                                            "step": self.step}) + "\n")
                return
        for r in batch.records:
            self.prompts_log.write(json.dumps({**r.to_dict(), "step": self.step,
                                               "t_trained": t_trained}) + "\n")
        self.prompts_log.flush()
