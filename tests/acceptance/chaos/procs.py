"""The scenarios that need their own processes: the run is ``python -m cluster.launch`` in a
subprocess (which starts its own local Ray cluster on 127.0.0.1), a process of it is killed
with SIGKILL, and the run is resumed with ``run.resume=true`` in a new subprocess.

Only what a subprocess of this bench started is ever killed: its descendants, remembered by
(pid, start time) from snapshots taken while it runs (a killed driver's children are
re-parented and can no longer be found from it), each killed by pid.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.acceptance.chaos.jobs import second_job_killed  # noqa: F401 - a scenario of this kind
from tests.acceptance.chaos.outcome import Outcome, first_step_after, judge, read_jsonl, summary_of

REPO = Path(__file__).resolve().parents[3]


class Tree:
    """The descendants of one process, by (pid, start time)."""

    def __init__(self, root_pid: int):
        import psutil

        self.root = psutil.Process(root_pid)
        self.known: dict[int, tuple[float, str]] = {}

    def snapshot(self) -> None:
        import psutil

        try:
            procs = self.root.children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                self.known.setdefault(p.pid, (p.create_time(), _title(p)))
            except psutil.Error:
                pass

    def alive(self) -> list:
        import psutil

        out = []
        for pid, (created, _) in self.known.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def find(self, title_prefix: str):
        """The newest live descendant whose process title starts with ``title_prefix`` (Ray
        names an actor's worker ``ray::Class`` or ``ray::Class.method``)."""
        self.snapshot()
        found = []
        for p in self.alive():
            try:
                if _title(p).startswith(title_prefix):
                    found.append((p.create_time(), p))
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
        return max(found, key=lambda cp: cp[0])[1] if found else None

    def kill_leftovers(self, grace_s: float = 0.0) -> list[str]:
        """After the root is gone: wait up to ``grace_s`` for its descendants to exit on their
        own, then SIGKILL those left, by pid; returns their titles."""
        deadline = time.time() + grace_s
        while self.alive() and time.time() < deadline:
            time.sleep(0.5)
        left = []
        for p in self.alive():
            try:
                left.append(_title(p))
                p.kill()
            except Exception:  # noqa: BLE001 - exited meanwhile
                pass
        return left


def _title(p) -> str:
    cmd = p.cmdline()
    return (" ".join(cmd) if cmd else p.name()).strip()[:80]


@dataclass
class Launch:
    proc: subprocess.Popen
    tree: Tree
    log: Path
    t_start: float

    def wait_until(self, pred, timeout_s: float) -> bool:
        """Poll ``pred()`` while the run goes on (snapshotting its processes); False if it
        exited or the time ran out first."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            self.tree.snapshot()
            if pred():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.2)
        return False

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status, or None if it did not exit in time (then it is killed)."""
        deadline = time.time() + timeout_s
        while self.proc.poll() is None and time.time() < deadline:
            self.tree.snapshot()
            time.sleep(0.5)
        if self.proc.poll() is None:
            self.tree.snapshot()
            self.proc.kill()
            self.proc.wait()
            return None
        return self.proc.returncode


def launch(args: list[str], log: Path) -> Launch:
    """``python -m cluster.launch v05.yaml ARGS`` with its output to ``log``. RAY_ADDRESS is
    dropped: with ``cluster.address=local`` the run starts its own cluster, never joins one."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with open(log, "w") as f:
        t = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "cluster.launch", "v05.yaml", *args],
                                cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    return Launch(proc, Tree(proc.pid), log, t)


def latest_step(run_dir: Path) -> int:
    f = run_dir / "checkpoints" / "latest"
    try:
        return int(f.read_text().strip()[4:])
    except (OSError, ValueError):
        return 0


def error_line(log: Path) -> str | None:
    """The driver's last exception line (not an actor's log line, which Ray prefixes with
    ``(Class pid=...)``)."""
    pat = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Stalled|Interrupt)\b:?")
    lines = log.read_text(errors="replace").splitlines()
    hits = [i for i, ln in enumerate(lines) if pat.match(ln)]
    if not hits:
        return None
    i = hits[-1]
    # Ray's actor errors name the actor's class on a following line.
    cls = [ln.strip() for ln in lines[i + 1:i + 3] if ln.strip().startswith("class_name:")]
    return " ".join([lines[i], *cls])[:300]


def actors_up_s(log: Path) -> float | None:
    m = re.search(r"actors up in (\d+)s", log.read_text(errors="replace"))
    return float(m.group(1)) if m else None


@dataclass
class ProcBench:
    overrides: list[str]   # the bench's overrides of v05.yaml (steps, batch, speed)
    workdir: Path
    steps: int
    budget_s: float        # per subprocess


def _args(pb: ProcBench, name: str, *extra: str) -> list[str]:
    """A scenario's launch; its first replaces an earlier one of that name in the workdir."""
    again = [] if "run.resume=true" in extra else ["run.overwrite=true"]
    return [*pb.overrides, f"run.name={name}", f"run.output_dir={pb.workdir}",
            f"run.max_steps={pb.steps}", "run.checkpoint_every=2", *again, *extra]


def _kill_step(pb: ProcBench) -> int:
    """The checkpoint after which the fault lands: about halfway through the run."""
    return max(2, 2 * (pb.steps // 4))


def _resume(pb: ProcBench, name: str, run_dir: Path, t_kill: float, t0: float, injected: str,
            what: str, first: dict) -> Outcome:
    """The second half of a process scenario: resume, wait, judge on the run's files."""
    log2 = pb.workdir / f"{name}.resume.log"
    second = launch(_args(pb, name, "run.resume=true"), log2)
    rc2 = second.wait_exit(pb.budget_s)
    left2 = second.tree.kill_leftovers(grace_s=10)
    s = summary_of(run_dir) or {}
    resumed_step = int((s.get("resumed_from") or "step0")[4:])
    nxt = first_step_after(run_dir, second.t_start, after_step=resumed_step)
    completed = rc2 == 0 and s.get("steps") == pb.steps and bool(s.get("resumed_from"))
    hung = first.get("hung", False) or rc2 is None
    detail = {**first, "resume_exit_code": rc2, "resume_error": error_line(log2) if rc2 else None,
              "resumed_from": s.get("resumed_from"),
              "resume_actors_up_s": actors_up_s(log2),
              "downtime_s": nxt and round(nxt["t_step_end"] - t_kill, 2),
              "resume_left_behind": left2,
              "logs": [str(first["log"]), str(log2)]}
    detail.pop("hung", None)
    detail.pop("log", None)
    what += (f" The resume (run.resume=true) loaded {s.get('resumed_from')}, continued its "
             f"prompts in flight, and trained to step {s.get('steps')}.")
    return judge(name, injected, run_dir, completed=completed, hung=hung,
                 wall_s=time.time() - t0, budget_s=2 * pb.budget_s,
                 recovery_time_s=nxt and nxt["t_step_end"] - second.t_start,
                 t_fault=t_kill, t_recovered=nxt and nxt["t_step_end"],
                 recovery="from the resume command's start (a new Ray cluster, actors, "
                          "checkpoint load) to its first completed step",
                 what_happened=what, **detail)


def driver_sigkill(pb: ProcBench) -> Outcome:
    """SIGKILL the driver (``python -m cluster.launch``) half a second after its step-K
    checkpoint, then resume it."""
    name, t0 = "driver_sigkill", time.time()
    run_dir = pb.workdir / name
    k = _kill_step(pb)
    first = launch(_args(pb, name), pb.workdir / f"{name}.log")
    reached = first.wait_until(lambda: latest_step(run_dir) >= k, pb.budget_s)
    time.sleep(0.5)  # mid-run: past the checkpoint, inside a later step
    first.tree.snapshot()
    t_kill = time.time()
    landed = first.proc.poll() is None
    if landed:
        os.kill(first.proc.pid, signal.SIGKILL)
    rc = first.proc.wait()
    at = max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")), default=0)
    left = first.tree.kill_leftovers(grace_s=20)
    info = {"log": first.log, "fault_landed": landed, "checkpoint_reached": reached,
            "killed_at_step": at,
            "checkpoint_at_kill": latest_step(run_dir), "driver_exit_code": rc,
            "left_behind_after_20s": left}
    what = (f"The driver died at step {at} (checkpoint step{info['checkpoint_at_kill']}); its "
            f"Ray cluster went with it" + (f" except {len(left)} processes the bench killed"
                                           if left else "") + ".")
    out = _resume(pb, name, run_dir, t_kill, t0,
                  f"SIGKILL of the driver process 0.5 s after its step-{k} checkpoint", what, info)
    if not landed:  # the run ended before the kill: nothing was tested
        out.survived = False
    return out


def learner_rank_killed(pb: ProcBench) -> Outcome:
    """SIGKILL learner rank 0's process (``ray::LearnerWorker``) after the step-K checkpoint:
    the run must stop with a clear error, then resume."""
    name, t0 = "learner_rank_killed", time.time()
    run_dir = pb.workdir / name
    k = _kill_step(pb)
    first = launch(_args(pb, name), pb.workdir / f"{name}.log")
    reached = first.wait_until(lambda: latest_step(run_dir) >= k, pb.budget_s)
    rank = first.tree.find("ray::LearnerWorker")
    t_kill = time.time()
    if rank is not None:
        rank.send_signal(signal.SIGKILL)
    rc = first.wait_exit(120)
    at = max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")), default=0)
    left = first.tree.kill_leftovers(grace_s=10)
    err = error_line(first.log)
    stopped = rc is not None and rc != 0
    info = {"log": first.log, "checkpoint_reached": reached, "rank_pid": rank and rank.pid,
            "killed_at_step": at, "checkpoint_at_kill": latest_step(run_dir),
            "driver_exit_code": rc, "driver_stopped_after_s": round(time.time() - t_kill, 1)
            if rc is not None else None, "driver_error": err, "hung": rc is None,
            "left_behind": left}
    what = (f"Learner rank 0 died at step {at}; the driver "
            + (f"stopped with exit {rc}: {err}" if stopped else
               "did NOT stop with an error" if rc is not None else
               "did NOT exit within 120 s (killed by the bench)") + ".")
    out = _resume(pb, name, run_dir, t_kill, t0,
                  f"SIGKILL of learner rank 0's process after its step-{k} checkpoint", what,
                  info)
    out.detail["fault_landed"] = rank is not None and rc != 0
    if not out.detail["fault_landed"]:  # no rank found, or the run ended first: not tested
        out.survived = False
    return out
