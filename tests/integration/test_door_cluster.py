"""Joining a real `ray start --head` cluster on 127.0.0.1 that cannot hold the config's roles:
the launch (a real ``python -m cluster.launch`` process) is refused with what the plan asks
and what the cluster has, exit 2, within seconds of joining (no placement group left
waiting), and a previous run in the run directory is kept although run.overwrite=true asked
to delete it (the check comes before the delete). The unit tests cover a local cluster this
machine cannot hold (tests/unit/test_bad_input.py) and an address where nothing answers
(tests/unit/test_door.py)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def small_head(tmp_path):
    """A one-CPU head node of our own on 127.0.0.1 (stopped by its process group)."""
    port, ray_tmp = free_port(), tempfile.mkdtemp(prefix="r", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    proc = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--num-cpus=1", "--num-gpus=0", "--include-dashboard=false",
         f"--ray-client-server-port={free_port()}", f"--temp-dir={ray_tmp}"],
        env=env, stdout=open(tmp_path / "head.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.time() + 120
        while subprocess.run(["ray", "status", f"--address=127.0.0.1:{port}"], env=env,
                             capture_output=True).returncode != 0:
            if time.time() > deadline or proc.poll() is not None:
                pytest.fail("ray head did not come up: "
                            + (tmp_path / "head.log").read_text()[-2000:])
            time.sleep(2)
        yield f"127.0.0.1:{port}", env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def test_a_cluster_too_small_for_the_roles_is_refused_with_the_numbers(small_head, tmp_path):
    address, env = small_head
    run = tmp_path / "runs" / "prev"
    (run / "final").mkdir(parents=True)
    (run / "final" / "model.safetensors").write_bytes(b"trained")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    kept = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "cluster.launch", "v05.yaml",
                        f"cluster.address={address}", f"run.output_dir={tmp_path / 'runs'}",
                        "run.name=prev", "run.overwrite=true"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-3000:])
    last = r.stderr.strip().splitlines()[-1]
    assert last == ("error: placement asks for 1.8 CPU (generator 2x{'CPU': 0.5}, learner "
                    "1x{'CPU': 0.5}, prior 1x{'CPU': 0.2}, coordinator 1x{'CPU': 0.1}) but "
                    "the cluster has 1; lower the per-role cpus/gpus or the counts"), r.stderr
    assert "deleted the previous run" not in r.stderr and "Traceback" not in r.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == kept
    assert not (run / "logs").exists()  # no role started
    assert took < 120, took
