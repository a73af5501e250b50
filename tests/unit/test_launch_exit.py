"""The launcher's exit statuses for a run that stopped by itself, resumable (cluster/launch.py's
docstring): 4 preempted (the checkpoint of the last step is whole), 5 a checkpoint that could not
be written (the previous one is whole), each with its line. The run itself is replaced by one
that raises what the trainer raises; everything before it (config, preflight) is the real one."""
from __future__ import annotations

from pathlib import Path

import pytest

import cluster.launch as launch
from cluster.records.checkpoints import CheckpointWriteError
from cluster.run.preempt import Preempted

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raised,code,said", [
    (Preempted("preempted: checkpoint step 3 written in 1.0 s; resume with run.resume=true", 3,
               1.0), 4, "run directory: "),
    (CheckpointWriteError("checkpoint step4 not written (learner stage, /r/checkpoints/.staging)"
                          ": OSError: [Errno 28] No space left on device"), 5,
     "error: checkpoint step4 not written (learner stage, "),
])
def test_a_run_that_stopped_resumable_says_so_in_its_exit_status(monkeypatch, capsys, tmp_path,
                                                                 raised, code, said):
    import common.rayproc

    def run(cfg, checked=None):
        raise raised
    monkeypatch.setattr(launch, "run", run)
    monkeypatch.setattr(common.rayproc, "prefer_loopback", lambda *a: None)
    monkeypatch.chdir(ROOT)
    rc = launch.main(["v05.yaml", f"run.output_dir={tmp_path}"])
    out = capsys.readouterr()
    assert rc == code and said in out.out + out.err
