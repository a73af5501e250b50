"""`ray job submit -- python -m cluster.launch v05.yaml` against a `ray start --head` cluster."""
import json
import os
import signal
import socket
import shutil
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
def head(tmp_path):
    """A head node we started ourselves (--block keeps its CLI alive; we stop it by pgid)."""
    gcs, dash = free_port(), free_port()
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # AF_UNIX socket paths must stay short
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"  # a loopback-only test cluster; no token to hand around
    proc = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs}",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--num-cpus=4",
         f"--temp-dir={ray_tmp}"],
        env=env, stdout=open(tmp_path / "head.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 120
    while time.time() < deadline:
        ok = subprocess.run(["ray", "job", "list", "--address", url], capture_output=True,
                            env=env).returncode == 0
        if ok:
            break
        time.sleep(2)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail("ray head did not come up: " + (tmp_path / "head.log").read_text()[-2000:])
    yield url, env
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_job_submit_runs_a_short_training(head, tmp_path):
    url, env = head
    out = tmp_path / "runs"
    cmd = ["ray", "job", "submit", "--address", url, "--working-dir", str(ROOT), "--",
           sys.executable, "-m", "cluster.launch", "v05.yaml", "run.max_steps=1",
           "run.name=job", f"run.output_dir={out}", "run.eval_every=0",
           "generators.count=1", "rollout.batch_prompts=2", "algo.k_init=2", "algo.k_max=2"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "succeeded" in (res.stdout + res.stderr).lower()
    summary = json.loads((out / "job" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["policy_version"] == 1
