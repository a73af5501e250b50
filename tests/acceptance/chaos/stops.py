"""The scenarios in which the run must stop by itself, cleanly and resumable, then resume:
a preemption (SIGTERM to the driver) and a disk that fills up during a checkpoint. Like
``tests.acceptance.chaos.procs``, the run is ``python -m cluster.launch`` in a subprocess with its own
local Ray cluster, and only what it started is ever killed (by pid).

- ``sigterm_then_resume``: SIGTERM to the driver at a random moment after a random step
  (seeded), with no periodic checkpoint: the run must write its preemption checkpoint within
  ``run.preempt_grace_s`` and exit 4; the resume then trains every prompt exactly once.
- ``disk_full_at_checkpoint``: the run directory on a real tmpfs; after the step-2
  checkpoint the tmpfs is shrunk (``mount -o remount,size=``) to what is used plus half a
  checkpoint, so the step-4 checkpoint fails with the kernel's ENOSPC: the run must say what
  failed, keep step2 whole as ``latest`` and exit 5; space is freed (remount larger) and the
  resume trains to the end. Where mounting is not permitted (not root), the fault is injected
  by ``$V05_CHECKPOINT_FAULT`` instead (said in the row).
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from tests.acceptance.chaos.outcome import Outcome, drawn_identity, read_jsonl, summary_of
from tests.acceptance.chaos.procs import ProcBench, _args, _resume, error_line, latest_step, launch

GRACE_S = 60.0  # run.preempt_grace_s of the preempted run


def _steps_done(run_dir: Path) -> int:
    return max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")), default=0)


def _last_line(log: Path, pattern: str) -> str | None:
    hits = [ln for ln in log.read_text(errors="replace").splitlines() if re.search(pattern, ln)]
    return hits[-1].strip()[:300] if hits else None


def sigterm_then_resume(pb: ProcBench, seed: int = 0,
                        name: str = "sigterm_then_resume") -> Outcome:
    """SIGTERM to the driver after a random step in [2, steps - 2], a random fraction of a
    step into the next one (the run's own step time so far: a fixed 0-3 s once landed after
    the last step of a run whose steps took 1.3 s); then ``run.resume=true``."""
    t0 = time.time()
    run_dir = pb.workdir / name
    rng = random.Random(seed)
    at, fraction = rng.randint(2, max(2, pb.steps - 2)), rng.uniform(0.0, 1.0)
    first = launch(_args(pb, name, "run.checkpoint_every=0",
                         f"run.preempt_grace_s={GRACE_S:g}"), pb.workdir / f"{name}.log")
    reached = first.wait_until(lambda: _steps_done(run_dir) >= at, pb.budget_s)
    times = [r["step_time_s"] for r in read_jsonl(run_dir / "metrics.jsonl")
             if r.get("step_time_s")]
    delay = round(fraction * (sorted(times)[len(times) // 2] if times else 1.0), 2)
    time.sleep(delay)
    first.tree.snapshot()
    landed = first.proc.poll() is None
    t_sig = time.time()
    if landed:
        os.kill(first.proc.pid, signal.SIGTERM)
    rc = first.wait_exit(GRACE_S + 60)
    t_exit = time.time()
    left = first.tree.kill_leftovers(grace_s=20)
    said = _last_line(first.log, r"^preempted: ")
    m = re.search(r"checkpoint step (\d+) written in ([\d.]+) s", said or "")
    info = {"log": first.log, "fault_landed": landed, "step_reached": reached,
            "signal_after_step": at, "signal_delay_s": delay, "driver_exit_code": rc,
            "preempted_line": said, "checkpoint_step": m and int(m.group(1)),
            "checkpoint_write_s": m and float(m.group(2)),
            "signal_to_exit_s": round(t_exit - t_sig, 2), "grace_s": GRACE_S,
            "latest_at_exit": latest_step(run_dir), "left_behind_after_20s": left,
            "batch_wait_cancelled": (summary_of(run_dir) or {}).get("batch_wait_cancelled"),
            "hung": rc is None}
    clean_stop = rc == 4 and m is not None and info["latest_at_exit"] == int(m.group(1))
    what = (f"SIGTERM {delay}s after step {at}: the driver "
            + (f"stopped admitting, wrote checkpoint step{m.group(1)} in {m.group(2)} s with "
               f"its prompts in flight and exited 4 (preempted) {info['signal_to_exit_s']} s "
               f"after the signal (grace {GRACE_S:g} s)" if clean_stop else
               f"did NOT stop as preempted (exit {rc}; {said or error_line(first.log)})") + ".")
    out = _resume(pb, name, run_dir, t_sig, t0, f"SIGTERM to the driver {delay} s after step "
                  f"{at} (no periodic checkpoint; run.preempt_grace_s={GRACE_S:g})", what, info)
    out.survived = out.survived and landed and clean_stop
    return out


def sigterm_then_resume_under_selection(pb: ProcBench) -> Outcome:
    """The same preemption and resume with admission by selection (algo.select=prior): the
    candidates waiting at the checkpoint are in it, and after the resume every prompt drawn
    was admitted, deferred or is waiting, once."""
    name = "sigterm_then_resume_under_selection"
    out = sigterm_then_resume(replace(pb, overrides=[*pb.overrides, "algo.select=prior"]),
                              name=name)
    return drawn_identity(out, pb.workdir / name)


def _mount(where: Path, size: str) -> str | None:
    """Mount (or with ``remount``, resize) a tmpfs; the error, or None."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(where)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")


def _used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _size_of(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def disk_full_at_checkpoint(pb: ProcBench) -> Outcome:
    """The disk fills up under the step-4 checkpoint (checkpoint every 2 steps); the run
    must stop saying so (exit 5), step2 whole; then space is freed and the run resumed."""
    name, t0 = "disk_full_at_checkpoint", time.time()
    run_dir = pb.workdir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    why_not = _mount(run_dir, "size=4g")
    env = {} if why_not is None else {"V05_CHECKPOINT_FAULT": "learner@4"}
    os.environ.update(env)  # the launch copies this process's environment
    try:
        first = launch(_args(pb, name), pb.workdir / f"{name}.log")
    finally:
        for k in env:
            os.environ.pop(k, None)
    reached = first.wait_until(lambda: latest_step(run_dir) >= 2, pb.budget_s)
    ckpt = _size_of(run_dir / "checkpoints" / "step2") if reached else 0
    shrunk = None
    if why_not is None and reached:
        shrunk = _used_bytes(run_dir) + ckpt // 2
        shrink_error = _mount(run_dir, f"remount,size={shrunk}")
        if shrink_error:
            shrunk = None
    t_full = time.time()
    rc = first.wait_exit(pb.budget_s)
    left = first.tree.kill_leftovers(grace_s=20)
    said = _last_line(first.log, r"checkpoint step\d+ not written")
    warned = len(re.findall(r"^warning: could not write ",
                            first.log.read_text(errors="replace"), re.M))
    info = {"log": first.log, "real_tmpfs": why_not is None, "mount_error": why_not,
            "checkpoint_bytes": ckpt, "tmpfs_shrunk_to_bytes": shrunk,
            "driver_exit_code": rc, "error_line": said, "run_file_warnings": warned,
            "latest_at_exit": latest_step(run_dir), "staging_left": (run_dir / "checkpoints" /
                                                                     ".staging").exists(),
            "left_behind_after_20s": left, "hung": rc is None}
    stopped_clean = rc == 5 and said is not None and info["latest_at_exit"] == 2 \
        and not info["staging_left"]
    if why_not is None:
        info["remount_error"] = _mount(run_dir, "remount,size=4g")  # the operator frees space
    how = ("a real tmpfs shrunk to what was used plus half a checkpoint after step 2"
           if shrunk else f"$V05_CHECKPOINT_FAULT=learner@4 (no tmpfs: {why_not})")
    what = ("The step-4 checkpoint failed; the driver "
            + (f"said `{said}`, kept step2 whole as latest (no .staging left), stopped its "
               f"roles and exited 5" if stopped_clean else
               f"did NOT stop cleanly (exit {rc}; {said or error_line(first.log)})")
            + (f"; {warned} run-file writes failed meanwhile, each warned about" if warned
               else "") + ". Space freed, then:")
    try:
        out = _resume(pb, name, run_dir, t_full, t0, f"disk full during the step-4 checkpoint "
                      f"({how})", what, info)
    finally:
        if why_not is None:  # the run's files outlive the tmpfs (for --keep)
            subprocess.run(["cp", "-a", str(run_dir), f"{run_dir}.files"], check=False)
            subprocess.run(["umount", str(run_dir)], check=False)
    out.survived = out.survived and stopped_clean and reached
    return out
