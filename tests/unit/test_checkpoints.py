"""What ``run.resume=true`` continues from (cluster.checkpoints.resumable): whole checkpoints
under an absolute run directory (shared storage on a cluster), newest first; a clear error
naming the directory when there is none. The save/load round trip itself runs with real
DeepSpeed ranks in tests/integration/test_pipeline.py (resume tests, absolute output_dir)."""
from __future__ import annotations

import pytest

from cluster.checkpoints import RUN_STATE, resumable
from cluster.config import build_config


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
