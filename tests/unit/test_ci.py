""".ci/run is the README's "Two commands", both, in the README's order: CI trains the
embedded default first and runs the suite on the checkout that leaves behind (a finished run
in runs/v05-cpu), as a user who follows the README does. And a failure of any part of either
line fails CI at once."""
from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / ".ci" / "run"


def readme_commands() -> list[str]:
    """The command lines of the README's "Two commands" block, without their comments."""
    section = ROOT.joinpath("README.md").read_text().split("\n## Two commands\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section.split("\n## ", 1)[0], re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_commands_in_the_readme_order():
    commands = readme_commands()
    assert commands == ["python -m cluster.install && python -m cluster.launch v05.yaml",
                        "python -m cluster.install && python -m pytest -q"]
    lines = [line.strip() for line in CI.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    # Nothing else runs: each README line as it is, stopped at its first failure (`|| exit`:
    # set -e does not stop at a command before the last `&&` of a line).
    assert lines == ["set -euo pipefail", 'cd "$(dirname "$0")/.."',
                     *[f"{c} || exit" for c in commands]]
    assert CI.stat().st_mode & stat.S_IXUSR


def run_ci_with(tmp_path, fail_on: str | None) -> tuple[int, list[str]]:
    """.ci/run with a stand-in ``python`` first on PATH that records its arguments (and
    exits 1 when they are ``fail_on``): (exit status, the commands it was given, in order)."""
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "$*" >> "$CALLS"\n'
                    f'[ "$*" = "{fail_on}" ] && exit 1\nexit 0\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
           "CALLS": str(log)}
    rc = subprocess.run(["bash", str(CI)], env=env, capture_output=True, timeout=60).returncode
    return rc, log.read_text().splitlines() if log.exists() else []


def test_ci_runs_both_commands_and_stops_at_the_first_failure(tmp_path):
    install, launch, tests = "-m cluster.install", "-m cluster.launch v05.yaml", "-m pytest -q"
    assert run_ci_with(tmp_path / "ok", None) == (0, [install, launch, install, tests])
    # A failed install stops CI before the launch (under set -e alone the script went on).
    assert run_ci_with(tmp_path / "install", install) == (1, [install])
    assert run_ci_with(tmp_path / "launch", launch) == (1, [install, launch])
    assert run_ci_with(tmp_path / "tests", tests) == (1, [install, launch, install, tests])
