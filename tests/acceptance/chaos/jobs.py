"""The scenario of two users' jobs on one cluster: ``second_job_killed``.

A head node of the bench's own (``ray start --head --block`` on 127.0.0.1, its own ports and
temporary folder; stopped by its process group), two ``ray job submit -- python -m
cluster.launch v05.yaml`` jobs with different run names, the second stopped with ``ray job
stop`` once both train. The first must train to its end, judged by uid on its own files;
the second must stop; neither may write outside its own run directory, and each must have
run its own actors (coordinator, generators, learner rank, prior) at the same time.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.acceptance.chaos.faults import wait_for
from tests.acceptance.chaos.outcome import Outcome, judge, read_jsonl, summary_of

REPO = Path(__file__).resolve().parents[3]
ROLES = ("Coordinator", "Generator", "LearnerWorker", "PriorServer")


@dataclass
class Head:
    """A ``ray start --head`` cluster this bench started: its dashboard URL and environment."""

    proc: subprocess.Popen
    url: str
    env: dict
    temp: str

    @classmethod
    def start(cls, log: Path, num_cpus: int = 4, timeout_s: float = 120) -> "Head":
        from learner.ranks import free_port

        gcs, dash = free_port(), free_port()
        temp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # AF_UNIX socket paths stay short
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_AUTH_MODE"] = "disabled"  # loopback only; no token to hand around
        proc = subprocess.Popen(
            ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
             f"--num-cpus={num_cpus}", f"--temp-dir={temp}"],
            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        head = cls(proc, f"http://127.0.0.1:{dash}", env, temp)
        deadline = time.time() + timeout_s
        while time.time() < deadline:  # ready when a trivial job runs (the job agent lags)
            if head.ray("job", "submit", "--", "true").returncode == 0:
                return head
            time.sleep(2)
        head.stop()
        raise RuntimeError(f"ray head did not come up: {log.read_text()[-1000:]}")

    def ray(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``ray <args> --address <dashboard>``."""
        return subprocess.run(["ray", *args[:2], "--address", self.url, *args[2:]],
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def submit(self, job: str, overrides: list[str]) -> None:
        res = self.ray("job", "submit", "--no-wait", "--submission-id", job, "--working-dir",
                       str(REPO), "--", sys.executable, "-m", "cluster.launch", "v05.yaml",
                       *overrides)
        if res.returncode:
            raise RuntimeError(f"ray job submit {job}: {res.stdout}{res.stderr}"[-1000:])

    def status(self, job: str) -> str:
        """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED (the CLI words these differently)."""
        from ray.job_submission import JobSubmissionClient

        return str(JobSubmissionClient(self.url).get_job_status(job).value)

    def wait(self, pred, timeout_s: float) -> bool:
        return wait_for(pred, timeout_s, every_s=1.0, not_yet=())

    def actors(self) -> list[dict]:
        from ray.util.state import list_actors

        return [{"class": a.class_name, "job": a.job_id, "pid": a.pid}
                for a in list_actors(address=self.url, filters=[("state", "=", "ALIVE")],
                                     limit=1000)]

    def stop(self) -> None:
        """The head's process group: SIGTERM, then SIGKILL what is left after 60 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)


def _steps(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


def _median_step_s(rows: list[dict]) -> float | None:
    xs = sorted(r["step_time_s"] for r in rows)
    return round(xs[len(xs) // 2], 2) if xs else None


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x}s"


def second_job_killed(pb) -> Outcome:
    """Two jobs on one ``ray start --head`` cluster; ``ray job stop`` of the second once both
    train; the first must end with every admitted prompt accounted for."""
    name, t0 = "second_job_killed", time.time()
    out = pb.workdir / name
    first, second = f"{name}-first", f"{name}-second"
    # Each job joins the head (no cluster.address) with one generator: two jobs' engines and
    # learners share the machine.
    over = [*(o for o in pb.overrides if not o.startswith("cluster.address=")),
            "generators.count=1"]
    run = {first: out / first, second: out / second}
    head = Head.start(pb.workdir / f"{name}.head.log")
    try:
        # The second (to be stopped, and never ending on its own) is submitted first: it is
        # surely training when the first starts to.
        head.submit(second, [*over, f"run.name={second}", f"run.output_dir={out}",
                             f"run.max_steps={100 * pb.steps}", "run.checkpoint_every=2"])
        head.submit(first, [*over, f"run.name={first}", f"run.output_dir={out}",
                            f"run.max_steps={pb.steps}", "run.checkpoint_every=2"])
        both = head.wait(lambda: all(_steps(d) for d in run.values()), pb.budget_s)
        actors = head.actors()
        jobs = {c: sorted({a["job"] for a in actors if a["class"] == c}) for c in ROLES}
        at_kill = {j: len(_steps(d)) for j, d in run.items()}
        t_kill = time.time()
        head.ray("job", "stop", second)
        stopped = head.wait(lambda: head.status(second) in ("STOPPED", "FAILED"), 120)
        t_stopped = time.time()
        head.wait(lambda: head.status(first) not in ("RUNNING", "PENDING"), pb.budget_s)
        status = {j: head.status(j) for j in run}
        time.sleep(3)
        left = [a for a in head.actors() if a["class"] in ROLES]
        logs = {j: head.ray("job", "logs", j, timeout=60).stdout[-2000:] for j in run}
    finally:
        head.stop()
    s = summary_of(run[first]) or {}
    rows = _steps(run[first])
    before = [r for r in rows if r["t_step_end"] <= t_kill]
    after = [r for r in rows if r["t_start"] >= t_kill]
    steps_after = len(_steps(run[second])) - at_kill[second]
    outside = sorted(p.name for p in out.iterdir() if p.name not in run) if out.exists() else []
    leaked = [j for j, d in run.items() for other in run if other != j
              and (d / "config.yaml").exists() and str(run[other]) in (d / "config.yaml").read_text()]
    completed = (status[first] == "SUCCEEDED" and s.get("steps") == pb.steps and stopped
                 and both and not outside and not leaked and not left and steps_after <= 1
                 and all(len(v) == 2 for v in jobs.values()))
    for j in run:
        (pb.workdir / f"{j}.log").write_text(logs[j])
    what = (f"Both jobs trained at once, each with its own {', '.join(ROLES)} "
            f"({'two jobs each' if all(len(v) == 2 for v in jobs.values()) else jobs}). "
            f"`ray job stop` stopped the second at its step {at_kill[second]} "
            f"({status[second]} after {t_stopped - t_kill:.0f}s, {steps_after} step(s) after "
            f"the stop); the first was at step {at_kill[first]} and trained to step "
            f"{s.get('steps')} ({status[first]}), its median step time "
            f"{_s(_median_step_s(before))} before the stop and {_s(_median_step_s(after))} after. "
            + ("Each wrote only its own run directory." if not (outside or leaked) else
               f"Files outside the run directories: {outside}; runs naming the other: {leaked}."))
    return judge(name, "ray job stop of the second of two jobs (one generator each) on one "
                       "cluster once both train",
                 run[first], completed=completed, hung=not both or status[first] == "RUNNING",
                 wall_s=time.time() - t0, budget_s=2 * pb.budget_s, recovery_time_s=None,
                 recovery="none needed: the first job is not interrupted (its step times "
                          "before and after the stop are in what_happened)",
                 what_happened=what, t_fault=t_kill, jobs_per_role=jobs, steps_at_stop=at_kill,
                 second_job_steps_after_stop=steps_after, job_status=status,
                 stop_took_s=round(t_stopped - t_kill, 1), role_actors_left=left,
                 files_outside_run_dirs=outside, run_dirs_naming_the_other=leaked,
                 first_median_step_s={"before_stop": _median_step_s(before),
                                      "after_stop": _median_step_s(after)},
                 logs=[str(pb.workdir / f"{j}.log") for j in run],
                 first_summary_status=s.get("status"))
