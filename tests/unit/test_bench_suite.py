"""bench.suite reads pytest's own summary: counts with thousands separators, errors under
either spelling, the slowest phases in pytest's order."""
from bench.suite import parse

OUTPUT = """....s....
============================= slowest 25 durations =============================
158.00s setup    tests/integration/test_real_model.py::test_a_run
145.10s call     tests/integration/test_job_submit.py::test_submit
0.50s teardown tests/unit/test_x.py::test_y
1,328 passed, 4 skipped, 1 deselected, 2 errors in 990.12s (0:16:30)
"""


def test_counts_and_slowest_phases_come_from_pytests_summary():
    got = parse(OUTPUT)
    assert got["counts"] == {"passed": 1328, "failed": 0, "skipped": 4, "errors": 2,
                             "deselected": 1, "xfailed": 0, "xpassed": 0}
    assert [(r["seconds"], r["phase"]) for r in got["slowest"]] == [
        (158.0, "setup"), (145.1, "call"), (0.5, "teardown")]
    assert got["slowest"][1]["test"] == "tests/integration/test_job_submit.py::test_submit"
    assert parse("3 failed, 1 error in 2.0s")["counts"]["errors"] == 1
