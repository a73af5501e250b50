"""common.rayproc.run_main / exit_process: the exit path of our Ray entry points.

They end with os._exit (see exit_process for the Ray crash this avoids), so what Python
would have done at exit must still happen: the status, a traceback for an exception,
atexit handlers, flushed buffered output.
"""
import os
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


NO_CLUSTER = textwrap.dedent("""
    import sys
    from common.rayproc import no_auto_init, run_main
    {before}
    def main():
        {after}
        import ray
        try:
            ray.get([])  # Ray's own rule would start a local cluster here
        except Exception as e:  # noqa: BLE001
            print(type(e).__name__, ray.is_initialized())
            return 5
        return 0
    run_main(main)
""")


@pytest.mark.parametrize("before, after", [
    ("", ""),                                   # run_main switches it off before main
    ("import ray", "no_auto_init()"),           # after ray is imported
], ids=["run_main", "after_import"])
def test_a_ray_call_without_a_cluster_raises_instead_of_starting_one(before, after):
    """A late call (a thread left running after its driver shut Ray down) must not start a
    cluster of its own: ray.get raises and nothing is connected."""
    env = {k: v for k, v in os.environ.items()
           if k != "RAY_ENABLE_AUTO_CONNECT"}  # the suite's conftest sets it for pytest
    p = subprocess.run([sys.executable, "-c", NO_CLUSTER.format(before=before, after=after)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 5, p.stdout + p.stderr[-2000:]
    assert p.stdout.split() == ["RaySystemError", "False"]
