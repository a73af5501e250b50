"""`ray job submit -- python -m cluster.launch v05.yaml` against a `ray start --head` cluster."""
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from learner.ranks import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


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
        # Ready when a trivial job runs: the job agent can lag the dashboard by seconds
        # ("No available agent to submit job"), and Ray answers at once rather than waiting.
        ok = subprocess.run(["ray", "job", "submit", "--address", url, "--", "true"],
                            capture_output=True, env=env).returncode == 0
        if ok:
            break
        time.sleep(2)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail("ray head did not come up: " + (tmp_path / "head.log").read_text()[-2000:])

    def stop():
        """Stop the cluster we started (its process group), once."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        shutil.rmtree(ray_tmp, ignore_errors=True)  # Ray's session files go with it

    yield url, env, stop
    stop()


PROMISED = ("config.yaml", "metrics.jsonl", "prompts.jsonl", "dropped.jsonl", "summary.json",
            "inflight_at_end.json", "report.html", "checkpoints/latest", "final/config.json",
            "logs/coordinator.log", "logs/generator-0.log", "logs/learner-0.log")


def test_a_job_keeps_its_outputs_at_the_printed_path_after_the_cluster_stops(head, tmp_path):
    """The user's own path: a relative run.output_dir under `ray job submit --working-dir`
    must not land in Ray's temporary copy of the working directory but under the durable
    output root (here V05_OUTPUT_ROOT, a test directory; without it ~/v05rl-runs, unit-tested
    in test_paths). The cluster is then stopped and every promised output is found where the
    job said it would be."""
    url, env, stop = head
    root = tmp_path / "outputs"
    runtime_env = json.dumps({"env_vars": {"V05_OUTPUT_ROOT": str(root)}})
    cmd = ["ray", "job", "submit", "--address", url, "--working-dir", str(ROOT),
           "--runtime-env-json", runtime_env, "--",
           sys.executable, "-m", "cluster.launch", "v05.yaml", "run.max_steps=1",
           "run.name=job", "run.eval_every=0", "generators.count=1",
           "rollout.batch_prompts=2", "algo.k_init=2", "algo.k_max=2"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    logs = res.stdout + res.stderr
    assert res.returncode == 0, logs[-3000:]
    assert "succeeded" in logs.lower()
    printed = {line.split("run directory: ", 1)[1].strip() for line in logs.splitlines()
               if "run directory: " in line}
    assert len(printed) == 1, printed  # printed at the start and at the end, the same path
    run_dir = Path(printed.pop())
    assert run_dir == root / "runs" / "job"
    assert "working_dir_files" not in str(run_dir)
    # The console stayed quiet: engine start-up went to the log files.
    assert "Loading safetensors checkpoint shards" not in logs
    # No warning the user can do nothing about: the job's own console (the launcher's output
    # and every role's forwarded lines, which the CLI tails to its stdout) has no line that
    # says "warning". Ray's CLI says its own things before that (e.g. that it leaves .git out
    # of the uploaded --working-dir): the user's command, not the run.
    job_console = res.stdout.split("Tailing logs until the job exits", 1)[1]
    warned = [line for line in job_console.splitlines() if "warning" in line.lower()]
    assert warned == [], "\n".join(warned)
    stop()  # the cluster and its session files are gone; the outputs must not be
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["policy_version"] == 1
    missing = [name for name in PROMISED if not (run_dir / name).exists()]
    assert missing == [], missing
