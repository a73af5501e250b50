"""common.atomic.write_atomic: the new content whole, or the old one when the write fails."""
import os

import pytest

from common.atomic import write_atomic


def test_writes_whole_files_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "latest"
    write_atomic(path, "step2")
    write_atomic(path, b"\x00step4")
    assert path.read_bytes() == b"\x00step4"
    assert os.listdir(tmp_path) == ["latest"]


def test_a_failed_rename_keeps_the_old_content(tmp_path, monkeypatch):
    path = tmp_path / "run_state.msgpack"
    write_atomic(path, b"old")

    def crash(src, dst):
        raise OSError("disk gone")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["run_state.msgpack"]  # its temporary removed
