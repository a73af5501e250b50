"""The loaders that need no digest because their format runs nothing (issue 31): the V0
prior's checkpoint, a user-given file, is read with ``torch.load(weights_only=True)``
(tensors, containers, plain values: a pickle that would run code is refused, naming the
file), and the run's msgpack files (``rollouts.msgpack``; the coordinator's run state is
msgpack too, and under the checkpoint's signed digests) hold data only: a tampered one is a
clear error naming the file and the record, and nothing in it is ever unpickled."""
from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import msgpack
import pytest
import torch

from actors.priors.v0_model import load_v0_checkpoint
from actors.priors.v0_tiny import write_checkpoint
from learner.replay import RolloutRecorder, keep_records, read_records


class Marker:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_v0_checkpoint_loads_as_weights_and_settings_only(tmp_path):
    write_checkpoint(tmp_path / "v0.pt")
    ckpt = load_v0_checkpoint(tmp_path / "v0.pt")
    assert ckpt["args"] == {"pooling_strategy": "dynamic_query", "num_heads": 3, "target_dim": 24}
    assert all(isinstance(v, torch.Tensor) for v in ckpt["model_state_dict"].values())
    # A training script's argparse.Namespace of settings is allowed, and read as a dict.
    torch.save({"model_state_dict": ckpt["model_state_dict"],
                "args": argparse.Namespace(num_heads=3, target_dim=24)}, tmp_path / "ns.pt")
    assert load_v0_checkpoint(tmp_path / "ns.pt")["args"] == {"num_heads": 3, "target_dim": 24}


def test_a_v0_checkpoint_that_holds_code_is_refused_naming_the_file(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model_state_dict": {}, "args": Marker(marker)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=rf"V0 checkpoint {tmp_path / 'bad.pt'} holds more than "
                                         r"weights and settings, so it is not loaded"):
        load_v0_checkpoint(tmp_path / "bad.pt")
    assert not marker.exists()
    (tmp_path / "plain.pt").write_bytes(pickle.dumps(Marker(marker)))  # a bare pickle
    with pytest.raises(ValueError, match=r"plain\.pt holds more than weights"):
        load_v0_checkpoint(tmp_path / "plain.pt")
    assert not marker.exists()
    torch.load(tmp_path / "bad.pt", weights_only=False)  # the control: the old load ran it
    assert marker.exists()


def record(path: Path, n: int = 2) -> None:
    with RolloutRecorder(path) as rec:
        for i in range(n):
            rec.append(f"p{i}", "1+1=", [1.0], 0.0, 0,
                       [{"prompt_token_ids": [1], "token_ids": [2], "logprobs": [-0.5],
                         "advantage": 1.0, "version": 0}], step=i + 1)


@pytest.mark.parametrize("tamper, message", [
    (lambda good: good + b"\xc1\xc1", r"not a rollout file written by RolloutRecorder "
                                      r"\(FormatError"),
    (lambda good: good + msgpack.packb(7), r"record 2 is a int, not a map"),
    (lambda good: good + msgpack.packb({"prompt_id": "x", "prompt": "", "rewards": [],
                                        "baseline": 0, "policy_version": 0,
                                        "samples": [pickle.dumps(Marker("/nonexistent"))]}),
     r"record 2: a sample that is not a TrainSample"),
    (lambda good: good + msgpack.packb({"samples": msgpack.ExtType(1, b"x")}),
     r"record 2 lacks \['prompt_id'"),
], ids=["not-msgpack", "not-a-map", "pickle-bytes", "ext-type"])
def test_a_tampered_rollout_file_is_named_and_runs_nothing(tmp_path, tamper, message):
    path = tmp_path / "rollouts.msgpack"
    record(path)
    path.write_bytes(tamper(path.read_bytes()))
    with pytest.raises(ValueError, match=rf"{path}: {message}"):
        list(read_records(path))
    if "lacks" not in message and "sample" not in message:  # the resume's trim reads it too
        with pytest.raises(ValueError, match=rf"{path}: {message}"):
            keep_records(path, 1)


def test_a_rollout_file_cut_short_keeps_its_whole_records(tmp_path):
    path = tmp_path / "rollouts.msgpack"
    record(path, 3)
    path.write_bytes(path.read_bytes()[:-5])  # a crash mid-append
    assert [r["prompt_id"] for r in read_records(path)] == ["p0", "p1"]
    assert keep_records(path, 1) == 1 and [r["prompt_id"] for r in read_records(path)] == ["p0"]
