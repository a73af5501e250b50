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
