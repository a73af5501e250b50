"""What ``run.resume=true`` continues from (cluster.records.checkpoints.resumable): whole checkpoints
under an absolute run directory (shared storage on a cluster), newest first; a clear error
naming the directory when there is none. The save/load round trip itself runs with real
DeepSpeed ranks in tests/integration/test_pipeline.py (resume tests, absolute output_dir)."""
from __future__ import annotations

import pytest

from cluster.records.checkpoints import RUN_STATE, Checkpoints, resumable, stale_tags
from cluster.config.schema import build_config


def _whole(root, tag):
    (root / tag).mkdir(parents=True)
    (root / tag / RUN_STATE).write_bytes(b"\x80")


def test_an_absolute_output_dir_is_where_resume_looks(tmp_path, monkeypatch):
    monkeypatch.delenv("V05_OUTPUT_ROOT", raising=False)
    shared = tmp_path / "shared" / "runs"  # an absolute run.output_dir, as on a cluster
    cfg = build_config({"run": {"name": "r1", "output_dir": str(shared), "resume": True}})
    assert cfg.run_dir == shared / "r1"
    root = cfg.run_dir / "checkpoints"
    for tag in ("step2", "step10"):
        _whole(root, tag)
    (root / "step11").mkdir()  # no run state: a checkpoint that never completed
    (root / ".staging" / "step12").mkdir(parents=True)
    assert resumable(cfg.run_dir).tags() == ["step10", "step2"]


def test_resume_without_a_checkpoint_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="run directory does not exist: .*/gone/"):
        resumable(tmp_path / "gone")
    run = tmp_path / "r1"
    (run / "checkpoints" / ".staging" / "step4").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no whole checkpoint in it \(only an interrupted"):
        resumable(run)
    empty = tmp_path / "r2"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"no whole checkpoint in it: {empty}/checkpoints"):
        resumable(empty)


def test_pruning_keeps_the_checkpoint_just_saved_and_drops_later_steps():
    assert stale_tags(["step40", "step35", "step5"], 5, 2) == ["step40", "step35"]
    assert stale_tags(["step15", "step10", "step5"], 15, 2) == ["step5"]
    assert stale_tags(["step15", "step10", "step5"], 15, 1) == ["step10", "step5"]
    # Resumed from step5 (step10 failed to load): step10 is no longer this run's past.
    assert stale_tags(["step10", "step6", "step5"], 6, 2) == ["step10"]


def test_a_new_run_in_an_old_run_directory_never_loses_its_checkpoint(tmp_path):
    """Old step40/step35 left in place: the new run's step5 must survive its own save, and
    ``latest`` must name it (a resume would otherwise load the old run's step40)."""
    root = tmp_path / "r1" / "checkpoints"
    for tag in ("step40", "step35"):
        _whole(root, tag)
    (root / "latest").write_text("step40")
    staged = root / ".staging" / "step5"
    _whole(root / ".staging", "step5")
    final = Checkpoints(root, keep=2).commit(staged, 5)
    assert final == root / "step5" and (final / RUN_STATE).is_file()
    assert not (root / ".staging").exists()
    ckpts = resumable(tmp_path / "r1")
    assert ckpts.latest() == "step5" and ckpts.tags() == ["step5"]
