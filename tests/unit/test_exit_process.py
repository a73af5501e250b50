"""common.rayproc.run_main / exit_process: the exit path of our Ray entry points.

They end with os._exit (see exit_process for the Ray crash this avoids), so what Python
would have done at exit must still happen: the status, a traceback for an exception,
atexit handlers, flushed buffered output.
"""
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, sys
    from common.rayproc import run_main
    atexit.register(lambda: print("atexit ran"))
    def main():
        sys.stdout.write("buffered, no newline")  # lost without a flush before os._exit
        {body}
    run_main(main)
""")


def _run(body: str) -> subprocess.CompletedProcess:
    # stdout is a pipe: fully buffered, so a missing flush would drop the output.
    return subprocess.run([sys.executable, "-c", SCRIPT.format(body=body)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("body, code", [("return 3", 3), ("return None", 0),
                                        ("raise SystemExit(4)", 4)])
def test_status_atexit_and_output_survive(body, code):
    p = _run(body)
    assert p.returncode == code, p.stderr
    assert "buffered, no newline" in p.stdout and "atexit ran" in p.stdout


def test_exception_prints_traceback_and_exits_1():
    p = _run("raise RuntimeError('boom')")
    assert p.returncode == 1
    assert "Traceback" in p.stderr and "RuntimeError: boom" in p.stderr
    assert "atexit ran" in p.stdout


def test_message_exit_goes_to_stderr_with_status_1():
    p = _run("raise SystemExit('bad config')")
    assert p.returncode == 1 and "bad config" in p.stderr
