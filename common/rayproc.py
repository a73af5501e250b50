"""How a Ray driver process of ours starts and ends (launcher, benchmarks, replay, pytest).

- ``prefer_loopback``: a cluster the process starts listens on 127.0.0.1 only.
- ``no_auto_init``: once Ray is shut down, a late Ray call raises instead of starting a cluster.
- ``exit_process`` / ``run_main``: end without C++ static destructors (Ray's metrics exporter
  crashes in them).

Standard library only; ray is imported only if already loaded.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, NoReturn

LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTO_INIT_SWITCH = "RAY_ENABLE_AUTO_CONNECT"


def prefer_loopback(address: str | None = None) -> bool:
    """Make a Ray cluster this process starts listen on 127.0.0.1 only. Call before ray is
    imported; returns whether the switch is now on.

    Why: on Linux Ray rewrites a loopback node address (``_node_ip_address="127.0.0.1"``,
    ``ray start --node-ip-address=127.0.0.1``) to the machine's primary address
    (``services.resolve_ip_for_localhost``). Ray's switch for single-machine clusters on
    macOS/Windows, read when ray is imported, keeps every process on loopback instead; such a
    driver still joins a cluster already running on this machine. Left off when a cluster
    address is given (``RAY_ADDRESS``, which ``ray job submit`` sets, or ``cluster.address``):
    the nodes of a real cluster must be able to reach the driver."""
    if os.environ.get("RAY_ADDRESS") or address not in (None, "local"):
        return False
    if "ray" in sys.modules:  # too late: Ray read the switch at import
        return os.environ.get(LOOPBACK_SWITCH) == "0"
    os.environ.setdefault(LOOPBACK_SWITCH, "0")
    return os.environ[LOOPBACK_SWITCH] == "0"


def no_auto_init() -> None:
    """Make ``ray.get``, ``ray.wait``, ``ray.kill`` and the like raise ("Ray has not been
    started yet") in this process when Ray is not initialized, instead of calling
    ``ray.init()``, which would start a new local cluster or join whatever cluster Ray's
    address file names. Call before or after ray is imported.

    Why: a thread still running when its driver shut Ray down (a call abandoned past its
    timeout, a watcher between two looks) would otherwise start a cluster of its own with its
    next call. That cluster outlives the run, and the process's next ``ray.init`` fails with
    "Maybe you called ray.init twice by accident?" (seen in CI: one such start in the pytest
    process made every later Ray module on that worker fail)."""
    os.environ[AUTO_INIT_SWITCH] = "0"  # read when ray is imported
    hook = sys.modules.get("ray._private.auto_init_hook")
    if hook is not None:  # already imported: its switch is a module global
        hook.enable_auto_connect = False


def exit_process(code: int) -> NoReturn:
    """End a Ray driver process: Python's cleanup, then ``os._exit`` (no C++ static destructors).

    Why: Ray 2.60's OpenTelemetry metric reader makes a last export while the process's C++
    static objects are being destroyed. When the metrics agent is already gone (the driver
    stopped its local cluster), that export logs an error through spdlog, whose registry
    has already been destroyed: SIGSEGV, exit 139, after a run that succeeded (seen in CI and
    reproduced here with gdb on the core: ``OpenTelemetryMetricExporter::Export`` ->
    ``RayLog::~RayLog`` -> ``spdlog::details::registry::initialize_logger``). Everything
    Python would do still happens: Ray is shut down, atexit handlers run, streams flushed.
    """
    import atexit
    import logging

    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing left to save
            pass
    os._exit(code)


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """``raise SystemExit(main())`` for entry points that use Ray, ending in ``exit_process``.
    An exception prints its traceback and exits 1, as Python itself would."""
    import traceback

    no_auto_init()
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:  # noqa: BLE001 - reported, then the same exit status as Python's
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    exit_process(code)
