"""A launch with no cluster to join starts a local Ray cluster of its own: a second launch on
the same machine meanwhile starts another instead of joining the first (whose resources the
first run's roles hold, so the second would wait for them); a cluster started with
``ray start --head`` is still the one launches join (``RAY_ADDRESS``/``auto``, test_job_submit).
Each launch here is ``cluster.nodes.connect.connect`` in a process of its own, as the launcher
calls it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CONNECT = """
import sys, time
from common.rayproc import prefer_loopback
prefer_loopback()
import ray
from cluster.config.schema import load_config
from cluster.nodes.placement import plan
from cluster.nodes.connect import connect
cfg = load_config("v05.yaml")
started = connect(cfg, plan(cfg))
print(started, ray.get_runtime_context().gcs_address, ray.cluster_resources()["CPU"], flush=True)
sys.stdin.readline()  # hold the cluster until told
ray.shutdown()
"""


def start(env: dict) -> tuple[subprocess.Popen, list[str]]:
    """A process connected as a launch would be; (it, what it said: started, address, CPUs)."""
    p = subprocess.Popen([sys.executable, "-c", CONNECT], cwd=REPO, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return p, p.stdout.readline().split()


def test_two_local_launches_start_clusters_of_their_own():
    tmp_path = Path(tempfile.mkdtemp(prefix="v05t-", dir="/tmp"))  # short: socket paths < 108
    env = dict(os.environ, RAY_TMPDIR=str(tmp_path))  # Ray's shared folder, for this test
    env.pop("RAY_ADDRESS", None)
    procs = []
    try:
        first, said_first = start(env)
        procs.append(first)
        second, said_second = start(env)  # while the first holds its cluster
        procs.append(second)
        for p in procs:
            p.communicate("\n", timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        own = sorted(d.name[:4] for d in (tmp_path / "ray").iterdir() if d.is_dir())
        shared = (tmp_path / "ray" / "ray_current_cluster").exists()
        shutil.rmtree(tmp_path, ignore_errors=True)
    assert said_first[0] == "True" and said_second[0] == "True", (said_first, said_second)
    assert said_first[1] != said_second[1]  # two clusters, two addresses
    # each in a folder of its own under Ray's, none in Ray's shared place
    assert own == ["v05-", "v05-"] and not shared
