"""Where a results file came from: the command that wrote it, the date (UTC, to the second) and
the commit of the checkout it ran in. Kept here, below bench/ (tests/unit/test_structure.py's
floors), so that a study stamps its file as a bench does; ``bench.harness`` imports
``checkout_commit`` from here (one owner) and adds the machine."""
from __future__ import annotations

import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def checkout_commit(root: str | Path, timeout_s: float = 5.0) -> str | None:
    """The commit checked out at ``root`` (``git rev-parse HEAD``), ``+dirty`` appended when a
    tracked file differs from it (``git status --porcelain --untracked-files=no``); None where
    git is missing, ``root`` is not a git checkout or git does not answer in ``timeout_s``."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=timeout_s)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "--verify", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if head else None
    if not head or status is None:
        return None
    return head.strip() + ("+dirty" if status.strip() else "")


def provenance(prog: str, argv: Sequence[str]) -> dict:
    """``command`` (``python -m prog argv...``), ``date`` and ``commit`` (this checkout's:
    ``checkout_commit``) of an invocation, as a results file records them."""
    return {"command": " ".join(["python", "-m", prog, *argv]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "commit": checkout_commit(REPO)}
