"""A resume never unpickles a checkpoint file that changed since its save (issue 31): every
file's SHA-256 is recorded in the checkpoint's signed ``digests.json`` when it is committed,
and checked before anything of it is read (``cluster.records.checkpoints.check_digests``).
Here the learner is a stand-in that writes and reads ``torch.save`` pickles the way
DeepSpeed's checkpoint does (``torch.load(weights_only=False)``); the same with real
DeepSpeed ranks: tests/integration/test_deepspeed_digests.py."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from cluster.records.checkpoints import (DIGESTS, KEY_ENV, RUN_STATE, CheckpointAltered,
                                         Checkpoints, check_digests, main, write_digests)

ROOT = Path(__file__).resolve().parents[2]
MODEL = "mp_rank_00_model_states.pt"
OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


class PickleLearner:
    """Writes ``<dir>/step<N>/`` as DeepSpeed does (a model-states pickle, an optimizer one)
    and loads it back with ``torch.load(weights_only=False)``, as DeepSpeed's load does."""

    def __init__(self):
        self.step = 0

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

        return torch.load(Path(ckpt_dir) / tag / MODEL, weights_only=False)["client"]


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
def saved(tmp_path, monkeypatch):
    """Checkpoints step2 and step4 of a run, saved through ``Checkpoints.save``; the signing
    key in the test's folder."""
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "key" / "checkpoint.key"))
    learner, ck = PickleLearner(), Checkpoints(tmp_path / "run" / "checkpoints", keep=3)
    for step in (2, 4):
        learner.step = step
        ck.save(step, learner, write_state, {"step": step})
    return ck, learner


def malicious(path: Path, marker: Path, pad_to: int | None = None) -> None:
    data = pickle.dumps(Marker(marker))
    path.write_bytes(data + b"\0" * max(0, (pad_to or 0) - len(data)))


def test_the_save_records_and_signs_every_file_and_a_resume_checks_them(saved, tmp_path):
    ck, learner = saved
    record = json.loads((ck.root / "step4" / DIGESTS).read_text())
    assert sorted(record["sha256"]) == sorted([MODEL, OPTIM, RUN_STATE])
    assert len(record["hmac_sha256"]) == 64
    assert oct((tmp_path / "key" / "checkpoint.key").stat().st_mode & 0o777) == "0o600"
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
    # The control: loading it unchecked, the way the learner does, runs it.
    with pytest.raises(Exception):
        learner.load_checkpoint(str(ck.root), "step4")
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
    ck, _ = saved
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
    # Whoever can write the folder can rewrite the record too, but cannot sign it.
    malicious(step / MODEL, tmp_path / "pwned")
    record = json.loads((step / DIGESTS).read_text())
    import hashlib
    record["sha256"][MODEL] = [hashlib.sha256((step / MODEL).read_bytes()).hexdigest(),
                               (step / MODEL).stat().st_size]
    (step / DIGESTS).write_text(json.dumps(record))
    with pytest.raises(CheckpointAltered, match=r"digests\.json: not signed with this user's "
                                                r"checkpoint key .* trust"):
        check_digests(step)
    (step / DIGESTS).write_text("{not json")
    with pytest.raises(CheckpointAltered, match=r"not a readable record"):
        check_digests(step)
    (step / DIGESTS).unlink()
    with pytest.raises(CheckpointAltered, match=r"digests\.json is missing: .* trust"):
        check_digests(step)
    assert not (tmp_path / "pwned").exists()


def test_trust_records_an_unrecorded_checkpoint_and_a_shared_key_is_refused(saved, tmp_path,
                                                                            capsys):
    ck, _ = saved
    step = ck.root / "step2"
    (step / DIGESTS).unlink()
    assert main(["trust", str(step)]) == 0
    assert "3 files recorded and signed" in capsys.readouterr().out
    assert check_digests(step) is None
    assert main(["trust", str(tmp_path)]) == 2
    os.chmod(tmp_path / "key" / "checkpoint.key", 0o644)
    with pytest.raises(CheckpointAltered, match=r"checkpoint\.key is not yours alone "
                                                r"\(mode 644\)"):
        check_digests(step)


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
