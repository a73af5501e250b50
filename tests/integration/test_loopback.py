"""A Ray cluster our entry points start listens on 127.0.0.1 only (common.rayproc.prefer_loopback).

Ray on Linux turns a requested 127.0.0.1 into the machine's primary address; each case runs
in a fresh interpreter because the switch only works before ray is imported.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import json, sys
    from common.rayproc import prefer_loopback
    on = prefer_loopback(sys.argv[1] if len(sys.argv) > 1 else None)
    if not on:
        print(json.dumps({"on": on})); raise SystemExit
    import ray
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    @ray.remote(num_cpus=0.1)
    def where():
        return ray.util.get_node_ip_address()
    out = {"on": on, "gcs": ray.get_runtime_context().gcs_address, "worker": ray.get(where.remote())}
    ray.shutdown()
    print(json.dumps(out))
""")


def _run(*args, **env):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    p = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True,
                       env={**clean, **env}, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_local_cluster_listens_on_loopback():
    out = _run()
    assert out["on"] and out["gcs"].startswith("127.0.0.1:") and out["worker"] == "127.0.0.1"


@pytest.mark.parametrize("args, env", [((), {"RAY_ADDRESS": "10.1.2.3:6379"}),
                                       (("10.1.2.3:6379",), {})])
def test_left_alone_when_joining_a_given_cluster(args, env):
    assert _run(*args, **env) == {"on": False}
