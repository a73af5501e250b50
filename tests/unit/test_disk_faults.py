"""Disk faults (a full disk, an unwritable directory, an I/O error) during a checkpoint or a
run-file write: the previous checkpoint stays whole and ``latest``, nothing of the failed one
is left, the error names the checkpoint, the stage, the path and the errno; a run file that
cannot be written is warned about, counted, and never left with a line cut short.

The faults are injected at every stage of a save through ``cluster.records.checkpoints.fault_hook``
(and its ``$V05_CHECKPOINT_FAULT``) and ``cluster.records.files.fault``; and, where this process
may mount one (root), for real: a 1 MiB tmpfs that fills up (ENOSPC from the kernel). The
learner's DeepSpeed save is stood in for by a writer of the same layout (staging/step<N>/);
the real one fails the same way in ``python -m tests.acceptance.chaos --scenarios disk_full_at_checkpoint``
(a real run on a tmpfs that fills up)."""
from __future__ import annotations

import errno
import hashlib
import json
import re
import subprocess

import pytest

import cluster.records.checkpoints as ckmod
import cluster.records.files as rfmod
from cluster.records.checkpoints import (RUN_STATE, STAGES, Checkpoints, CheckpointWriteError,
                                 resumable)
from cluster.records.files import RunFiles, read_lines
from cluster.records.step import StepMetrics
from cluster.records.summary import RunSummary, Totals


class Learner:
    """Writes ``nbytes`` of shard per checkpoint as DeepSpeed does: <dir>/step<N>/..."""

    def __init__(self, nbytes: int = 1000):
        self.nbytes, self.step = nbytes, 0

    def save_checkpoint(self, ckpt_dir, client_state):
        d = ckmod.Path(ckpt_dir) / f"step{client_state['step']}"
        d.mkdir(parents=True)
        (d / "mp_rank_00_model_states.pt").write_bytes(
            bytes([client_state["step"] % 256]) * self.nbytes)
        (ckmod.Path(ckpt_dir) / "latest").write_text(d.name)  # DeepSpeed's own, in staging
        return str(d)


def write_state(path):
    with open(path, "wb") as f:
        f.write(b"\x81\xa1k\x01")


def save(ck, step, learner=None):
    return ck.save(step, learner or Learner(), write_state, {"step": step})


def digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def injected(at_stage: str, code=errno.ENOSPC):
    def hook(stage, path, step):
        if stage == at_stage:
            raise OSError(code, __import__("os").strerror(code), str(path))
    return hook


@pytest.mark.parametrize("stage", STAGES)
def test_a_write_fault_at_any_stage_leaves_the_previous_checkpoint_whole(tmp_path, stage,
                                                                          monkeypatch):
    ck = Checkpoints(tmp_path / "checkpoints", keep=2)
    save(ck, 2)
    before = digest(ck.root / "step2")
    monkeypatch.setattr(ckmod, "fault_hook", injected(stage))
    with pytest.raises(CheckpointWriteError) as err:
        save(ck, 4)
    msg = str(err.value)
    assert f"checkpoint step4 not written ({stage} stage, " in msg
    assert "OSError: [Errno 28] No space left on device" in msg and "MB free on" in msg
    assert "the previous checkpoint step2 is whole and stays latest" in msg
    assert ck.latest() == "step2" and ck.tags() == ["step2"]
    assert digest(ck.root / "step2") == before
    assert not (ck.root / ".staging").exists() and not (ck.root / "step4").exists()
    assert resumable(tmp_path).tags() == ["step2"]
    assert ck.saved_step == 2  # a preemption at step 4 must write its own checkpoint
    monkeypatch.setattr(ckmod, "fault_hook", lambda *a: None)  # space freed: the next one saves
    save(ck, 6)
    assert ck.latest() == "step6" and ck.tags() == ["step6", "step2"]


@pytest.mark.parametrize("name,code", [("EACCES", errno.EACCES), ("EIO", errno.EIO)])
def test_the_env_var_injects_the_fault_a_subprocess_run_cannot_be_handed(tmp_path, monkeypatch,
                                                                          name, code):
    ck = Checkpoints(tmp_path / "checkpoints")
    save(ck, 1)
    monkeypatch.setenv(ckmod.FAULT_ENV, f"run_state@3:{name}")
    save(ck, 2)  # another step: not this one
    with pytest.raises(CheckpointWriteError) as err:
        save(ck, 3)
    assert f"[Errno {code}]" in str(err.value) and RUN_STATE in str(err.value)
    assert ck.latest() == "step2"


def test_the_first_checkpoint_failing_says_there_is_nothing_to_resume(tmp_path, monkeypatch):
    ck = Checkpoints(tmp_path / "checkpoints")
    monkeypatch.setattr(ckmod, "fault_hook", injected("learner", errno.EACCES))
    with pytest.raises(CheckpointWriteError, match="no earlier checkpoint to resume from"):
        save(ck, 1)
    assert ck.tags() == [] and ck.latest() is None


def test_a_role_dying_during_the_save_is_not_a_disk_fault(tmp_path):
    class ActorDiedError(RuntimeError):
        pass

    class Dies(Learner):
        def save_checkpoint(self, ckpt_dir, client_state):
            raise ActorDiedError("The actor died unexpectedly")

    with pytest.raises(ActorDiedError):
        save(Checkpoints(tmp_path / "checkpoints"), 1, Dies())


def test_an_error_from_a_ray_task_is_described_by_its_cause():
    class RayTaskError(RuntimeError):
        def __init__(self, cause):
            super().__init__("ray::LearnerWorker.save_checkpoint() (pid=1)\n  File ...")
            self.cause = cause

    err = RayTaskError(OSError(errno.ENOSPC, "No space left on device", "/x/y.pt"))
    assert ckmod.describe_error(err) == \
        "OSError: [Errno 28] No space left on device: '/x/y.pt'"


def test_a_run_file_that_cannot_be_written_is_warned_about_counted_and_training_goes_on(
        tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    w = RunFiles(run, "a: 1\n", progress=False)
    w.step(StepMetrics(step=1, policy_version=1))
    metrics = run / "metrics.jsonl"
    monkeypatch.setattr(rfmod, "fault", lambda path: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device", str(path))) if path == metrics else None)
    w.step(StepMetrics(step=2, policy_version=2))  # does not raise
    err = capsys.readouterr().err
    assert f"warning: could not write {metrics}: OSError: No space left on device" in err
    assert "training goes on" in err
    monkeypatch.setattr(rfmod, "fault", lambda path: None)
    w.step(StepMetrics(step=3, policy_version=3))
    written = w.summary(RunSummary(3, 3, Totals()))
    assert [r["step"] for r in read_lines(metrics)] == [1, 3]
    assert json.loads((run / "summary.json").read_text())["run_file_failures"] == 1
    # the record returned (Trainer.run's, the launcher's) is the one written, failures included
    assert isinstance(written, RunSummary) and written.run_file_failures == 1
    assert written.to_json() == json.loads((run / "summary.json").read_text())


def test_a_line_cut_short_by_a_crash_is_skipped_on_read_and_dropped_on_resume(tmp_path):
    run = tmp_path / "run"
    w = RunFiles(run, "a: 1\n", progress=False)
    w.step(StepMetrics(step=1, policy_version=1))
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "lo')  # SIGKILL mid-line
    assert [r["step"] for r in read_lines(run / "metrics.jsonl")] == [1]
    RunFiles(run, "a: 1\n", resume_step=1, progress=False)
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "policy_version": 1}\n'


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MiB tmpfs (root only; skipped where mounting is not permitted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_real_full_disk_during_a_checkpoint(tiny_disk):
    """600 KB per checkpoint on 1 MiB: the second one fails with the kernel's ENOSPC."""
    ck = Checkpoints(tiny_disk / "checkpoints", keep=2)
    learner = Learner(600_000)
    save(ck, 1, learner)
    before = digest(ck.root / "step1")
    with pytest.raises(CheckpointWriteError) as err:
        save(ck, 2, learner)
    assert "(learner stage, " in str(err.value) and "[Errno 28] No space left on device" in \
        str(err.value)
    free = float(re.search(r"; ([\d.]+) MB free on .* when it failed;", str(err.value)).group(1))
    assert free < 0.2  # the disk as it was when the save failed, not after the clean-up
    assert ck.latest() == "step1" and ck.tags() == ["step1"]
    assert digest(ck.root / "step1") == before and not (ck.root / ".staging").exists()


def test_a_real_full_disk_cuts_no_run_file_line_short(tiny_disk, capsys):
    run = tiny_disk / "run"
    w = RunFiles(run, "a: 1\n", progress=False)
    w.step(StepMetrics(step=1, policy_version=1))
    (tiny_disk / "ballast").write_bytes(b"\0" * 900_000)
    # part of it fits: cut off again
    w.step(StepMetrics(step=2, policy_version=2, skip_reason="x" * 300_000))
    assert "No space left on device" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "policy_version": 1}\n'
    (tiny_disk / "ballast").unlink()
    w.step(StepMetrics(step=3, policy_version=3))
    assert [r["step"] for r in read_lines(run / "metrics.jsonl")] == [1, 3]
    assert w.write_failures == 1
