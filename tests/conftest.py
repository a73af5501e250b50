"""Suite-wide hooks: Ray on loopback, the fast tier without Ray, and the exit path of a Ray
driver.

The pytest process is a Ray driver (integration tests start and stop local clusters in it),
so it ends the way our Ray entry points do, through ``common.rayproc.exit_process``: pytest
finishes its report, Python's cleanup runs, and the process exits with pytest's status
without running C++ static destructors, where Ray 2.60's metrics exporter can crash
(SIGSEGV, exit 139, after every test passed; see ``exit_process``).
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from common.rayproc import no_auto_init, prefer_loopback

# Every test cluster (and `ray start` in test_job_submit) listens on 127.0.0.1 only; set
# before any test imports ray (see prefer_loopback).
prefer_loopback()
# The suite's tolerances (vLLM against transformers, learner against references) are
# float32's: on a CPU whose probe would choose bf16, dtype auto is forced to float32 here;
# the tests of the bf16 path force it themselves (tests/unit/test_cpu_dtype.py). A value the
# caller set is kept (V05_CPU_DTYPE=bf16 python -m pytest runs the suite in bf16).
os.environ.setdefault("V05_CPU_DTYPE", "fp32")
# A Ray call made after a module's cluster is shut down (a thread it left running) raises
# instead of starting a cluster that the next module's ray.init would trip over.
no_auto_init()

_status: list[int] = []
_INTEGRATION = Path(__file__).resolve().parent / "integration"
_ACCEPTANCE = Path(__file__).resolve().parent / "acceptance"
_STANDIN = Path(__file__).resolve().parent / "standin"


def pytest_ignore_collect(collection_path, config):
    # The fast tier (-m "not integration") does not even import tests/integration/,
    # tests/acceptance/ or tests/standin/, whose modules import Ray and the cluster stack at
    # collection or start a Ray cluster: the fast tier is tests/unit/, no Ray.
    if " ".join(config.getoption("markexpr").split()) == "not integration":
        path = Path(collection_path).resolve()
        if any(path == d or d in path.parents for d in (_INTEGRATION, _ACCEPTANCE, _STANDIN)):
            return True
    return None


def pytest_addoption(parser):
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="run the modules, and the tests within each module, in an order "
                          "shuffled with SEED (each module's tests stay together, so a "
                          "module-scoped fixture is still set up once): shows that no test "
                          "depends on another having run before it")


def pytest_report_header(config):
    seed = config.getoption("shuffle")
    return None if seed is None else f"test order shuffled with seed {seed}"


# The longest modules first (seconds in a 2-worker run), so that the two workers (pyproject's
# addopts: -n 2, a module to each) do not end with one of them alone on a long module: the
# longest-first order of list scheduling. Every other module keeps its place after them. By the
# 2026-12-03 runs; the real model's and the benches' modules, the hungriest for CPU, do not
# start side by side (890 s and 922 s in this order, 1,041 s with the two first; runs of one
# order may differ by about that much too). The suite is CPU-bound on 2 cores: only less work
# shortens it (773 s and 867 s after the two-jobs test moved into test_job_submit).
LONGEST_FIRST = ("test_pipeline.py", "test_real_model.py", "test_job_submit.py", "test_benches.py",
                 "test_gpu_learner_bench.py", "test_placement_cluster.py",
                 "test_weight_sync_vllm.py", "test_learner.py", "test_generator.py")


def longest_first(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1],
                                         len(rank)))


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("shuffle")
    if seed is None:
        longest_first(items)  # a stable sort: within a module, the file's order
        return
    rng = random.Random(seed)
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = list(modules.values())
    rng.shuffle(order)
    for tests in order:
        rng.shuffle(tests)
    items[:] = [item for tests in order for item in tests]


# The user's run folders (cluster/config/paths.py): runs/ in the checkout, ~/v05rl-runs and
# $V05_OUTPUT_ROOT as the user set it. No test may write there: every launch in the tests
# goes to a temporary directory (test_bad_input.py's launcher), since a user's finished run
# there changes what a launch answers, and a test's run would land among the user's.
USER_RUN_ROOTS = tuple(dict.fromkeys(
    Path(p).expanduser().resolve() for p in (
        Path(__file__).resolve().parents[1] / "runs", "~/v05rl-runs",
        *([os.environ["V05_OUTPUT_ROOT"]] if os.environ.get("V05_OUTPUT_ROOT") else []))))


def run_roots_state() -> dict[str, tuple[int, int]]:
    """Each user run root and three levels under it (``<output_dir>/<run.name>/<file>``):
    path -> (mtime, size). Making, deleting or rewriting a run's files, checkpoints or logs
    changes an entry: a file's own, or its folder's."""
    state = {}
    for root in USER_RUN_ROOTS:
        for p in (root, *root.glob("*"), *root.glob("*/*"), *root.glob("*/*/*")):
            try:
                st = p.lstat()
            except OSError:  # gone in between
                continue
            state[str(p)] = (st.st_mtime_ns, st.st_size)
    return state


@pytest.fixture(scope="module")
def lent_roles(tmp_path_factory):
    """v05.yaml's roles on a local cluster, started once per module and lent to the runs a
    bench or an acceptance test starts in this process (``bench.harness.lend_roles``)."""
    from bench.harness import lend_roles, shared_roles
    from cluster.config.schema import load_config

    tmp = tmp_path_factory.mktemp("roles")
    cfg = load_config(Path(__file__).resolve().parents[1] / "v05.yaml",
                      ["cluster.address=local", f"run.output_dir={tmp}", "run.progress=false"])
    with shared_roles(cfg, tmp) as shared, lend_roles(shared, cfg):
        yield shared


@pytest.fixture(autouse=True)
def never_in_the_users_run_folders():
    """Fails the test (an error at teardown, naming what changed) that wrote into a user run
    root. Under pytest-xdist a test running beside the culprit on the other worker may be
    named too; the culprit always is."""
    before = run_roots_state()
    yield
    after = run_roots_state()
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        pytest.fail("a test wrote into the user's run folders (a launch not pointed at a "
                    "temporary run.output_dir; this test, or one beside it on another xdist "
                    "worker): " + ", ".join(changed[:10]), pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def ray_shut_down_after_each_module(request):
    """Fails the module (an error at its last test's teardown, naming it) that leaves this
    process connected to Ray, and disconnects it: under xdist's --dist loadfile every later
    module on the same worker would otherwise fail at its own ray.init. Set up before the
    module's own fixtures, so torn down after them."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.module.__name__} left this process connected to Ray (a "
                    "ray.init without its ray.shutdown)", pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    _status.append(int(exitstatus))


def pytest_unconfigure(config):
    # Only a whole run of this process, and only once Ray was imported: a pytest embedded in
    # another program (or a run without Ray) ends normally.
    if _status and "ray" in sys.modules and not hasattr(config, "workerinput"):
        from common.rayproc import exit_process

        exit_process(_status[-1])
