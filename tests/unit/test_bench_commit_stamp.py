"""bench.harness.checkout_commit, the commit a result file is stamped with (issue 44, item 5):
a checkout's HEAD, ``+dirty`` when a tracked file differs from it, None outside a git
checkout, without git or when git hangs. On real git repositories made under tmp_path, git's
global and system configs and every directory above tmp_path kept out."""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from bench import harness
from bench.harness import checkout_commit, stamp

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


@pytest.fixture(autouse=True)
def hermetic_git(monkeypatch, tmp_path):
    """No user config, no repository above tmp_path, no GIT_DIR from the caller."""
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "commit.gpgsign=false", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / "a.txt").write_text("one\n")
    git(root, "add", "a.txt")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_a_clean_checkout_gives_its_head(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    assert checkout_commit(repo) == head
    (repo / "a.txt").write_text("two\n")
    git(repo, "commit", "-q", "-am", "second")  # a new commit: the new head, still clean
    assert checkout_commit(repo) == git(repo, "rev-parse", "HEAD") != head


def test_a_changed_tracked_file_gives_dirty_an_untracked_one_does_not(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "new.txt").write_text("untracked\n")
    assert checkout_commit(repo) == head
    (repo / "a.txt").write_text("edited\n")
    assert checkout_commit(repo) == head + "+dirty"
    git(repo, "add", "a.txt")  # staged, not committed: still not the commit's tree
    assert checkout_commit(repo) == head + "+dirty"
    git(repo, "checkout", "-q", "HEAD", "--", "a.txt")
    assert checkout_commit(repo) == head


def test_a_subdirectory_gives_its_checkouts_commit(repo):
    (repo / "sub").mkdir()
    assert checkout_commit(repo / "sub") == git(repo, "rev-parse", "HEAD")


def test_no_checkout_gives_none(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert checkout_commit(plain) is None
    empty = tmp_path / "empty"  # a repository without a commit: no HEAD to name
    empty.mkdir()
    git(empty, "init", "-q")
    assert checkout_commit(empty) is None
    assert checkout_commit(tmp_path / "missing") is None


def test_no_git_or_a_hanging_git_gives_none(repo, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # no git on the path
    assert checkout_commit(repo) is None
    hang = bin_dir / "git"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(hang.stat().st_mode | stat.S_IXUSR)
    assert checkout_commit(repo, timeout_s=0.5) is None


def test_stamp_names_this_checkouts_commit(monkeypatch, tmp_path):
    """The checkout the code is in, whatever the working directory."""
    assert (harness.REPO / "bench" / "harness.py").is_file()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(harness, "checkout_commit", lambda root: f"commit of {root}")
    s = stamp("tests.acceptance.chaos", ["--quick"])
    assert s["commit"] == f"commit of {harness.REPO}"
    assert set(s) == {"command", "date", "machine", "commit"}
