"""Every role of a run loads the same model (common/model_files.py): the fingerprint tells a
different copy, an edited config or a weight file of another size apart, and the check names
the roles and nodes that differ."""
from __future__ import annotations

import shutil

import pytest

from common.model_files import check_same_model, fingerprint


def model(path, weights: bytes = b"w" * 64, config: str = '{"hidden_size": 64}'):
    path.mkdir()
    (path / "config.json").write_text(config)
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_the_fingerprint_follows_config_and_weight_sizes(tmp_path):
    a = model(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert fingerprint(a) == fingerprint(b)
    (b / "config.json").write_text('{"hidden_size": 128}')
    assert fingerprint(a) != fingerprint(b)
    c = model(tmp_path / "c", weights=b"w" * 65)  # a half-synced weight file
    assert fingerprint(a) != fingerprint(c)


def test_roles_that_see_different_models_are_named():
    check_same_model([("generator 0", "10.0.0.1", "ab"), ("learner rank 0", "10.0.0.2", "ab")],
                     "/m")
    with pytest.raises(RuntimeError, match=r"model\.path /m is not the same model on every "
                                           r"node: generator 0 on 10\.0\.0\.1 \(ab\); learner "
                                           r"rank 0 on 10\.0\.0\.2 \(cd\)"):
        check_same_model([("generator 0", "10.0.0.1", "ab"),
                          ("learner rank 0", "10.0.0.2", "cd")], "/m")
