"""The scenarios that run on one set of long-lived actors, in this process's Ray cluster.

Every scenario starts from the same state (``bench.harness.Shared.reset``: initial learner
weights served by every generator, a new prior), runs the real ``Trainer`` on the real actors,
injects its fault, and is judged on the run's own files (``outcome.judge``).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from tests.acceptance.chaos.faults import FaultyLearner, GeneratorKill, Watch, pid_of, restarted
from tests.acceptance.chaos.outcome import Outcome, drawn_identity, first_step_after, judge, read_jsonl
from bench.harness import config_for


@dataclass
class Bench:
    """The shared actors and the settings every in-process scenario uses."""

    base: dict            # the resolved v05.yaml with the bench's overrides, as data
    shared: object        # bench.harness.Shared: the long-lived roles, task and initial state
    workdir: Path
    steps: int            # learner steps of a plain scenario run
    budget_s: float       # per-scenario wall-clock budget (past it: hung)
    hold_s: float         # longest wait for a killed role to come back inside a run
    baseline_step_s: float | None = None  # median step time of the clean control run

    @property
    def roles(self):      # cluster.nodes.roles.Roles (a scenario may swap its learner)
        return self.shared.roles

    def cfg(self, name: str, **sections):
        return config_for(self.base, name, self.workdir, **sections)

    def reset(self, cfg) -> None:
        self.shared.reset(cfg)

    def trainer(self, cfg, after_step=None):
        return self.shared.trainer(cfg, after_step=after_step)


@dataclass
class Ran:
    summary: dict | None
    error: str | None
    stalled: bool

    def completed(self, cfg) -> bool:
        return self.summary is not None and self.summary.get("steps") == cfg.run.max_steps


def run(trainer_or_factory) -> Ran:
    """Run a trainer (or build one, then run it: a resume loads in the constructor) to the end;
    the watchdog's ``Stalled`` and any other error become the result, not an exception."""
    from cluster.run.watchdog import Stalled

    try:
        trainer = trainer_or_factory() if callable(trainer_or_factory) else trainer_or_factory
        return Ran(trainer.run().to_json(), None, False)
    except Stalled as s:
        return Ran(None, f"Stalled: waiting on {s.role}", True)
    except Exception as err:  # noqa: BLE001 - the scenario's verdict, with its cause
        return Ran(None, f"{type(err).__name__}: {str(err)[:300]}", False)


def _steps(run_dir: Path) -> list[dict]:
    return read_jsonl(Path(run_dir) / "metrics.jsonl")


def _counters(s: dict | None, *keys) -> dict:
    s = s or {}
    return {k: s.get(k) for k in keys}


def _outcome(b: Bench, name: str, injected: str, cfg, ran: Ran, t0: float,
             completed: bool | None = None, **kw) -> Outcome:
    if ran.error:
        kw["error"] = ran.error
        kw["what_happened"] = f"{kw.get('what_happened', '')} Run failed: {ran.error}".strip()
    done = ran.completed(cfg) if completed is None else completed
    return judge(name, injected, cfg.run_dir, completed=done, hung=ran.stalled,
                 wall_s=time.time() - t0, budget_s=b.budget_s, **kw)


# -- 0. the control ------------------------------------------------------------------------
def baseline(b: Bench) -> Outcome:
    t0 = time.time()
    cfg = b.cfg("baseline")
    b.reset(cfg)
    ran = run(b.trainer(cfg))
    times = [r["step_time_s"] for r in _steps(cfg.run_dir)]
    b.baseline_step_s = statistics.median(times) if times else None
    return _outcome(
        b, "baseline", "nothing (the control run)", cfg, ran, t0, recovery_time_s=None,
        recovery="n/a (no fault)",
        what_happened=f"{len(times)} steps, median step {b.baseline_step_s or 0:.2f}s",
        median_step_s=b.baseline_step_s)


# -- 1, 2. generators killed ---------------------------------------------------------------
def _generator_outcome(b, name, injected, cfg, ran, t0, kill: GeneratorKill, **extra):
    import ray

    if kill.watch is not None:
        kill.watch.stop()
    s = ran.summary or {}
    victim = b.roles.generators[kill.index]
    try:
        served = ray.get(victim.version.remote(), timeout=30)
    except Exception:  # noqa: BLE001 - not back yet
        served = None
    w = kill.watch
    nxt = first_step_after(cfg.run_dir, kill.t_kill) if kill.t_kill else None
    detail = {"victim": kill.index, "in_flight_at_kill": kill.in_flight_at_kill,
              "taken_out_of_service_after_s": w and w.down_after_s and round(w.down_after_s, 2),
              "back_in_service_after_s": w and w.back_after_s and round(w.back_after_s, 2),
              "next_step_after_s": nxt and round(nxt["t_step_end"] - kill.t_kill, 2),
              "victim_version_at_end": served, "policy_version": s.get("policy_version"),
              **_counters(s, "reissued_requests", "generator_losses",
                          "generator_update_failures", "requests_per_generator",
                          "generator_events", "stale_regenerated"), **extra}
    back = detail["back_in_service_after_s"]
    what = (f"Ray restarted generator {kill.index} ({kill.in_flight_at_kill} requests in flight "
            f"at the kill); the coordinator took it out of service after "
            f"{detail['taken_out_of_service_after_s']}s, re-issued "
            f"{s.get('reissued_requests')} requests to the other generator, and "
            + (f"re-synced it with the newest weights and used it again {back}s after the kill"
               if back is not None else "had not got it back when the run ended")
            + f"; at the end it served version {served} of {s.get('policy_version')}.")
    return _outcome(b, name, injected, cfg, ran, t0, recovery_time_s=back,
                    t_fault=kill.t_kill, t_recovered=w and w.t_back,
                    recovery="from the kill to the generator back in the coordinator's service "
                             "with the newest weights (polled every 0.2 s)",
                    what_happened=what, **detail)


def generator_killed_mid_generation(b: Bench) -> Outcome:
    """Generator 1 killed (Ray restarts it) while it holds rollouts, after step 2."""
    t0 = time.time()
    cfg = b.cfg("generator_killed_mid_generation", run={"max_steps": b.steps + 2})
    b.reset(cfg)
    trainer = b.trainer(cfg)
    kill = GeneratorKill(trainer, index=1, at=2, hold_at=4, hold_s=b.hold_s)
    trainer.after_step = kill
    ran = run(trainer)
    return _generator_outcome(b, "generator_killed_mid_generation",
                              "ray.kill (crash, Ray restarts it) of generator 1 after step 2, "
                              "while it held rollouts", cfg, ran, t0, kill)


def generator_killed_during_weight_update(b: Bench) -> Outcome:
    """Generator 0 killed right after the learner asked it to load the step-2 weights."""
    import ray

    t0 = time.time()
    cfg = b.cfg("generator_killed_during_weight_update", run={"max_steps": b.steps + 2})
    b.reset(cfg)
    trainer = b.trainer(cfg)
    kill = GeneratorKill(trainer, index=0, at=None, hold_at=4, hold_s=b.hold_s)
    target, info = trainer.version + 2, {}

    def on_publish(version, refs):
        if version == target and kill.t_kill is None:
            info["update_done_before_kill"] = bool(ray.wait([refs[0]], timeout=0)[0])
            info["killed_during_update_to_version"] = version
            kill.kill_now()

    real = b.roles.learner
    b.roles.learner = FaultyLearner(real, on_publish=on_publish)
    trainer.after_step = kill
    try:
        ran = run(trainer)
    finally:
        b.roles.learner = real
    return _generator_outcome(b, "generator_killed_during_weight_update",
                              "ray.kill (crash) of generator 0 right after the learner asked it "
                              "to load the step-2 weights", cfg, ran, t0, kill, **info)


# -- 3. the prior --------------------------------------------------------------------------
def prior_killed(b: Bench) -> Outcome:
    """The prior server killed after step 2 (Ray restarts it: max_restarts=1)."""
    return _prior_killed(b, "prior_killed")


def prior_killed_under_selection(b: Bench) -> Outcome:
    """The same kill while the prior decides which prompts get rollouts (algo.select):
    admission falls back to the data order until it answers again, every drawn prompt is
    admitted, deferred or waiting, once."""
    out = _prior_killed(b, "prior_killed_under_selection", algo={"select": "prior"})
    return drawn_identity(out, b.workdir / "prior_killed_under_selection")


def _prior_killed(b: Bench, name: str, **sections) -> Outcome:
    import ray

    t0 = time.time()
    cfg = b.cfg(name, run={"max_steps": b.steps + 2}, **sections)
    b.reset(cfg)
    trainer = b.trainer(cfg)
    prior = b.roles.prior
    old_pid = pid_of(prior)
    st: dict = {}

    def hook(step, m):
        if step == 2:
            st["t"] = time.time()
            ray.kill(prior, no_restart=False)
            st["watch"] = Watch(restarted(prior, old_pid), st["t"], b.hold_s + 60,
                                every_s=0.1, down_is_known=True)
            st["watch"].start()
        if step == 4 and "watch" in st:
            st["watch"].join(timeout=b.hold_s)

    trainer.after_step = hook
    ran = run(trainer)
    w = st.get("watch")
    if w:
        w.stop()
    s = ran.summary or {}
    prompts = read_jsonl(cfg.run_dir / "prompts.jsonl")
    t_kill = st.get("t", float("inf"))
    after = sorted((p for p in prompts if p["t_admit"] > t_kill), key=lambda p: p["t_admit"])
    first_prior = next((p for p in after if not p["fallback"]), None)
    back = w.back_after_s if w else None
    detail = {"prior_pid_before": old_pid,
              "back_after_s": back and round(back, 2),
              "first_admission_with_the_prior_after_s":
                  first_prior and round(first_prior["t_admit"] - t_kill, 2),
              "prompts_trained_with_fallback": sum(p["fallback"] for p in prompts),
              **_counters(s, "prior_fallbacks")}
    what = (f"Ray restarted the prior ({back and round(back, 1)}s after the kill; its context "
            f"window starts empty); {s.get('prior_fallbacks')} prompts admitted meanwhile used "
            f"the empirical-mean fallback (counted in prior_fallbacks); prompts admitted after "
            f"it came back used its predictions again.")
    return _outcome(b, name, "ray.kill (crash, Ray restarts it) of the prior server "
                    "after step 2", cfg, ran, t0, recovery_time_s=back,
                    t_fault=st.get("t"), t_recovered=w and w.t_back,
                    recovery="from the kill to the prior answering again from its new process",
                    what_happened=what, **detail)


# -- 6, 7. the reward function -------------------------------------------------------------
def _reward(b: Bench, name: str, injected: str, reward: dict) -> Outcome:
    t0 = time.time()
    cfg = b.cfg(name, reward=reward)
    b.reset(cfg)
    ran = run(b.trainer(cfg))
    s = ran.summary or {}
    sc = s.get("scoring", {})
    times = [r["step_time_s"] for r in _steps(cfg.run_dir)]
    worst = max(times) - b.baseline_step_s if times and b.baseline_step_s else None
    failed = sc.get("score_timeout", 0) + sc.get("score_error", 0)
    detail = {"scoring": sc, "reward": reward,
              "faulty_answers_scored_low": failed,
              # Scored low beyond the injected faults: healthy answers caught by a deadline.
              "collateral": max(0, failed - sc.get("faults_injected", 0)),
              # Injected but not yet answered when the run stopped (their prompts in flight).
              "pending_at_stop": max(0, sc.get("faults_injected", 0) - failed),
              "median_step_s": times and round(statistics.median(times), 3),
              "baseline_median_step_s": b.baseline_step_s and round(b.baseline_step_s, 3)}
    kind = "timed out at the deadline, its worker killed and replaced" \
        if reward["inject_fault"] == "hang" else "raised"
    what = (f"{sc.get('faults_injected', 0)} of {sc.get('scored', 0)} answers {kind}: each got "
            f"the low reward, counted ({failed} in scoring.score_*); the run went on.")
    return _outcome(b, name, injected, cfg, ran, t0, recovery_time_s=worst,
                    recovery="the slowest step of the run minus the clean control run's "
                             "median step (the most time one step lost to the faults)",
                    what_happened=what, **detail)


def reward_raises(b: Bench) -> Outcome:
    return _reward(b, "reward_raises", "the verifier raises on every 7th answer "
                   "(reward.inject_fault=raise, inject_every=7, inline scoring)",
                   {"inject_fault": "raise", "inject_every": 7})


def reward_hangs(b: Bench) -> Outcome:
    return _reward(b, "reward_hangs", "the verifier never returns on every 20th answer "
                   "(reward.inject_fault=hang, inject_every=20, workers=1, timeout_s=1)",
                   {"inject_fault": "hang", "inject_every": 20, "workers": 1, "timeout_s": 1.0})


# -- 8. a NaN loss -------------------------------------------------------------------------
def nan_loss(b: Bench) -> Outcome:
    """Step 2's batch reaches the learner with NaN advantages."""
    t0 = time.time()
    cfg = b.cfg("nan_loss", run={"max_steps": b.steps + 1})
    b.reset(cfg)
    real = b.roles.learner
    b.roles.learner = faulty = FaultyLearner(real, nan_at=2)
    try:
        ran = run(b.trainer(cfg))
    finally:
        b.roles.learner = real
    s = ran.summary or {}
    rows = _steps(cfg.run_dir)
    skipped = [r for r in rows if r.get("skipped")]
    nxt = next((r for r in rows if r["step"] > 2 and not r.get("skipped")), None)
    rec = nxt["t_step_end"] - faulty.nan_injected_at if nxt and faulty.nan_injected_at else None
    detail = {"skipped_steps": [(r["step"], r.get("skip_reason")) for r in skipped],
              **_counters(s, "nan_skipped_steps", "prompts_skipped_nan", "policy_version")}
    what = (f"the learner skipped step {[r['step'] for r in skipped]} "
            f"({skipped[0].get('skip_reason') if skipped else '-'}); its "
            f"{s.get('prompts_skipped_nan')} prompts were dropped as learner_nan_skip, the "
            f"version stayed, admission reopened and the next step trained.")
    return _outcome(b, "nan_loss", "NaN advantages for every sample of step 2's batch "
                    "(a wrapper around the learner group's train_batch)", cfg, ran, t0,
                    recovery_time_s=rec, t_fault=faulty.nan_injected_at,
                    t_recovered=nxt and nxt["t_step_end"],
                    recovery="from the NaN step's train call to the end of the next step "
                             "that trained", what_happened=what, **detail)


# -- 9. a corrupt checkpoint ---------------------------------------------------------------
def corrupt_checkpoint(b: Bench) -> Outcome:
    """4 steps with a checkpoint every 2; the newest checkpoint's largest file cut in half;
    the resume must fall back to the one before and train to step 6."""
    from cluster.records.checkpoints import Checkpoints

    t0 = time.time()
    name = "corrupt_checkpoint"
    cfg = b.cfg(name, run={"max_steps": 4, "checkpoint_every": 2, "keep_checkpoints": 3})
    b.reset(cfg)
    first = run(b.trainer(cfg))
    ck = Checkpoints(cfg.run_dir / "checkpoints")
    tag = ck.latest()
    victim, size = None, 0
    if tag:
        victim = max((f for f in (ck.root / tag).iterdir() if f.is_file()),
                     key=lambda f: f.stat().st_size)
        size = victim.stat().st_size
        with open(victim, "r+b") as f:
            f.truncate(size // 2)
    t_cut = time.time()
    cfg2 = b.cfg(name, run={"max_steps": 6, "resume": True, "keep_checkpoints": 3})
    t_resume = time.time()
    ran = run(lambda: b.trainer(cfg2))
    s = ran.summary or {}
    nxt = first_step_after(cfg2.run_dir, t_resume)
    ok = (first.completed(cfg) and ran.completed(cfg2) and s.get("resumed_from") != tag
          and bool(s.get("skipped_checkpoints")))
    detail = {"first_run_error": first.error, "truncated": victim and str(victim.relative_to(
        cfg.run_dir)), "bytes_before": size, "bytes_after": size // 2,
        **_counters(s, "resumed_from", "skipped_checkpoints")}
    what = (f"{tag}'s {victim and victim.name} cut to half; the resume skipped it "
            f"({len(s.get('skipped_checkpoints') or [])} skipped), loaded "
            f"{s.get('resumed_from')}, and re-trained from there to step {s.get('steps')}.")
    if ran.error is None and not ok:
        ran = Ran(ran.summary, f"resume did not fall back: resumed_from={s.get('resumed_from')}, "
                               f"skipped={s.get('skipped_checkpoints')}", False)
    return _outcome(b, name, f"{tag}'s largest file truncated to half its bytes, then "
                    "run.resume=true", cfg2, ran, t0, completed=ok,
                    recovery_time_s=nxt and nxt["t_step_end"] - t_resume, t_fault=t_cut,
                    t_recovered=nxt and nxt["t_step_end"],
                    recovery="from the resumed trainer's start (checkpoint load included) to "
                             "its first completed step", what_happened=what, **detail)
