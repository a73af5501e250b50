"""A resume reads no checkpoint file that changed since its save (issue 31): every file's
SHA-256 is recorded in the checkpoint's ``digests.json`` when it is committed, and checked
before anything of it is read (``cluster.records.checkpoints.check_digests``); and no file
can run code when read (issue 43): the learner loads weights-only, so a file rewritten along
with its record is refused naming it, unrun, and the record needs no per-account key (a run
directory moves). Here the learner is a stand-in that writes ``torch.save`` pickles as
DeepSpeed does and loads them as ours does (``learner.state_io.weights_only_load``); the same
with real DeepSpeed ranks: tests/integration/test_deepspeed_digests.py."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from cluster.records.checkpoints import (DIGESTS, RUN_STATE, CheckpointAltered, Checkpoints,
                                         check_digests, main)

ROOT = Path(__file__).resolve().parents[2]
MODEL = "mp_rank_00_model_states.pt"
OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


class PickleLearner:
    """Writes ``<dir>/step<N>/`` as DeepSpeed does (a model-states pickle, an optimizer one)
    and loads it back as the learner does (``weights_only_load``), or ``unsafe``: with
    ``torch.load(weights_only=False)``, as DeepSpeed's own load would."""

    def __init__(self, unsafe: bool = False):
        self.step, self.unsafe = 0, unsafe

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> str:
        import torch

        tag = Path(ckpt_dir) / f"step{self.step}"
        tag.mkdir(parents=True)
        torch.save({"module": {"w": torch.arange(4096.0)}, "client": dict(client_state)},
                   tag / MODEL)
        torch.save({"exp_avg": torch.zeros(4096)}, tag / OPTIM)
        return str(tag)

    def load_checkpoint(self, ckpt_dir: str, tag: str) -> dict:
        import torch

        from learner.state_io import weights_only_load

        path = Path(ckpt_dir) / tag / MODEL
        if self.unsafe:
            return torch.load(path, weights_only=False)["client"]
        weights_only_load(Path(ckpt_dir) / tag / OPTIM)
        return weights_only_load(path)["client"]


class Marker:
    """A pickle that, when loaded, creates ``path``: what a swapped checkpoint file could
    run instead (any code)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def write_state(path: str) -> int:
    import msgpack

    Path(path).write_bytes(msgpack.packb({"scheduler": {"inflight": []}, "data_pos": 7}))
    return 0


@pytest.fixture
def saved(tmp_path):
    """Checkpoints step2 and step4 of a run, saved through ``Checkpoints.save``."""
    learner, ck = PickleLearner(), Checkpoints(tmp_path / "run" / "checkpoints", keep=3)
    for step in (2, 4):
        learner.step = step
        ck.save(step, learner, write_state, {"step": step})
    return ck, learner


def malicious(path: Path, marker: Path, pad_to: int | None = None) -> None:
    data = pickle.dumps(Marker(marker))
    path.write_bytes(data + b"\0" * max(0, (pad_to or 0) - len(data)))


def test_the_save_records_every_file_and_a_resume_checks_them(saved, tmp_path):
    ck, learner = saved
    record = json.loads((ck.root / "step4" / DIGESTS).read_text())
    assert sorted(record["sha256"]) == sorted([MODEL, OPTIM, RUN_STATE])
    assert set(record) == {"sha256"}  # no signature: nothing of it is tied to an account
    assert check_digests(ck.root / "step4") is None
    assert ck.verified() == ("step4", [])
    tag, client, state, skipped = ck.load(learner)
    assert (tag, client["step"], skipped) == ("step4", 4, [])


def test_a_swapped_pickle_is_refused_naming_the_file_and_never_run(saved, tmp_path):
    """The model file replaced by a pickle whose loading would create a marker file, at the
    recorded length (so not "cut short"): the resume refuses it naming the file, nothing is
    unpickled, and the older whole checkpoint is not silently used instead."""
    ck, learner = saved
    victim, marker = ck.root / "step4" / MODEL, tmp_path / "pwned"
    malicious(victim, marker, pad_to=victim.stat().st_size)
    for attempt in (ck.verified, lambda: ck.load(learner)):
        with pytest.raises(CheckpointAltered, match=rf"{victim}: its SHA-256 .* is not the .* "
                                                    r"recorded when the checkpoint was saved"):
            attempt()
    assert not marker.exists()
    # The control: loading it unchecked, the way DeepSpeed's own load would, runs it.
    with pytest.raises(Exception):
        PickleLearner(unsafe=True).load_checkpoint(str(ck.root), "step4")
    assert marker.exists()


def test_a_file_cut_short_is_skipped_for_the_older_checkpoint_unread(saved, tmp_path):
    """A file shorter than recorded (a torn write, a full disk; here a short malicious
    pickle): the checkpoint is damaged, skipped for step2, and nothing of it read."""
    ck, learner = saved
    marker = tmp_path / "pwned"
    malicious(ck.root / "step4" / MODEL, marker)
    recorded = json.loads((ck.root / "step4" / DIGESTS).read_text())["sha256"][MODEL][1]
    tag, client, _, skipped = ck.load(learner)
    assert tag == "step2" and client["step"] == 2
    assert skipped == [f"step4: damaged: {ck.root / 'step4' / MODEL} is cut short "
                       f"({(ck.root / 'step4' / MODEL).stat().st_size} of {recorded} bytes)"]
    assert not marker.exists()


def test_a_tampered_run_state_an_extra_file_and_a_forged_record_are_refused(saved, tmp_path):
    ck, learner = saved
    step = ck.root / "step4"
    state = step / RUN_STATE
    good = state.read_bytes()
    state.write_bytes(good.replace(b"\x07", b"\x08"))  # msgpack, same length: data_pos 7 -> 8
    with pytest.raises(CheckpointAltered, match=rf"{state}: its SHA-256"):
        check_digests(step)
    state.write_bytes(good)
    (step / "extra.pt").write_bytes(b"x")
    with pytest.raises(CheckpointAltered, match=r"extra\.pt: a file its save did not write"):
        check_digests(step)
    (step / "extra.pt").unlink()
    # Whoever can write the folder can rewrite the record too: the digests then agree, and
    # the weights-only load refuses the file, naming it, with nothing of it run; the older
    # checkpoint is not silently used instead.
    malicious(step / MODEL, tmp_path / "pwned")
    record = json.loads((step / DIGESTS).read_text())
    import hashlib
    record["sha256"][MODEL] = [hashlib.sha256((step / MODEL).read_bytes()).hexdigest(),
                               (step / MODEL).stat().st_size]
    (step / DIGESTS).write_text(json.dumps(record))
    assert check_digests(step) is None
    with pytest.raises(CheckpointAltered, match=rf"{step / MODEL}: refused by a weights-only "
                                                r"load \(Unsupported .*\); nothing of "
                                                r"it ran; nothing of step4 was used"):
        ck.load(learner)
    (step / DIGESTS).write_text("{not json")
    with pytest.raises(CheckpointAltered, match=r"not a readable record"):
        check_digests(step)
    (step / DIGESTS).unlink()
    with pytest.raises(CheckpointAltered, match=r"digests\.json is missing: .* trust"):
        check_digests(step)
    assert not (tmp_path / "pwned").exists()


def test_trust_records_an_unrecorded_checkpoint(saved, tmp_path, capsys):
    ck, _ = saved
    step = ck.root / "step2"
    (step / DIGESTS).unlink()
    assert main(["trust", str(step)]) == 0
    assert "3 files recorded" in capsys.readouterr().out
    assert check_digests(step) is None
    assert main(["trust", str(tmp_path)]) == 2


def test_a_run_directory_moves_to_another_home_and_resumes(saved, tmp_path, monkeypatch):
    """The run copied elsewhere and resumed under another home and cache (another account or
    node of the cluster): nothing to trust by hand, the newest checkpoint loads."""
    import shutil

    ck, learner = saved
    moved = tmp_path / "elsewhere" / "checkpoints"
    shutil.copytree(ck.root, moved)
    monkeypatch.setenv("HOME", str(tmp_path / "other-home"))
    monkeypatch.setenv("V05_CACHE", str(tmp_path / "other-cache"))
    tag, client, _, skipped = Checkpoints(moved, keep=3).load(learner)
    assert (tag, client["step"], skipped) == ("step4", 4, [])


def test_the_launcher_refuses_a_tampered_checkpoint_with_exit_2(saved, tmp_path, monkeypatch,
                                                                  capsys):
    """Through ``python -m cluster.launch``'s main: preflight verifies the checkpoint it
    would resume before any actor starts; one line naming the file, exit 2, nothing run."""
    from cluster import launch

    def tripwire(*a, **k):
        raise AssertionError("a refused request reached the cluster")
    monkeypatch.setattr(launch, "run", tripwire)
    monkeypatch.chdir(ROOT)
    ck, _ = saved
    victim, marker = ck.root / "step4" / MODEL, tmp_path / "pwned"
    malicious(victim, marker, pad_to=victim.stat().st_size + 10)
    rc = launch.main(["v05.yaml", f"run.output_dir={tmp_path}", "run.name=run",
                      "run.max_steps=10"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {victim}: its SHA-256") and "nothing of step4 was read" in err
    assert not marker.exists() and victim.exists()
