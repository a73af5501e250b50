"""Suite-wide hooks: Ray on loopback, the fast tier without Ray, and the exit path of a Ray
driver.

The pytest process is a Ray driver (integration tests start and stop local clusters in it),
so it ends the way our Ray entry points do, through ``actors.rayproc.exit_process``: pytest
finishes its report, Python's cleanup runs, and the process exits with pytest's status
without running C++ static destructors, where Ray 2.60's metrics exporter can crash
(SIGSEGV, exit 139, after every test passed; see ``exit_process``).
"""
from __future__ import annotations

import sys
from pathlib import Path

from actors.rayproc import prefer_loopback

# Every test cluster (and `ray start` in test_job_submit) listens on 127.0.0.1 only; set
# before any test imports ray (see prefer_loopback).
prefer_loopback()

_status: list[int] = []
_INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_ignore_collect(collection_path, config):
    # The fast tier (-m "not integration") does not even import tests/integration/, whose
    # modules import Ray and the cluster stack at collection: every test there is marked
    # integration (module-level pytestmark), so nothing it would select is lost.
    if " ".join(config.getoption("markexpr").split()) == "not integration":
        path = Path(collection_path).resolve()
        if path == _INTEGRATION or _INTEGRATION in path.parents:
            return True
    return None


def pytest_sessionfinish(session, exitstatus):
    _status.append(int(exitstatus))


def pytest_unconfigure(config):
    # Only a whole run of this process, and only once Ray was imported: a pytest embedded in
    # another program (or a run without Ray) ends normally.
    if _status and "ray" in sys.modules and not hasattr(config, "workerinput"):
        from actors.rayproc import exit_process

        exit_process(_status[-1])
