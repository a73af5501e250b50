"""Starting one generator's vLLM engine: the environment its processes inherit (CPU pinning,
the repo on ``PYTHONPATH``) and the ``AsyncLLM`` built from ``GeneratorConfig``. vLLM is
imported inside the functions, when an engine is started.
"""
from __future__ import annotations

import os
from pathlib import Path

from actors.engine_config import GeneratorConfig, resolve_dtype


def prepare_env(index: int, cpu_threads: int, cpu_bind: str | None,
                worker_process: bool) -> dict[str, str]:
    """Pin this generator's vLLM-CPU worker to its own cores; the engine's processes are
    spawned from this one and inherit ``os.environ``. Also make the worker extension
    importable from them (Ray workers may not have the repo on their path)."""
    from vllm.platforms import current_platform

    from common.threads import cpu_engine_env

    env: dict[str, str] = {}
    if current_platform.is_cpu():
        env.update(cpu_engine_env(index, cpu_threads, cpu_bind, sorted(os.sched_getaffinity(0)),
                                  worker_process))
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p != root])
    os.environ.update(env)
    return env


def build_engine(model_path: str, cfg: GeneratorConfig):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    from common.weight_sync import WORKER_EXTENSION

    on_cpu = current_platform.is_cpu()
    args = AsyncEngineArgs(
        model=model_path, dtype=resolve_dtype(cfg.dtype, on_cpu), seed=cfg.seed,
        max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        enforce_eager=cfg.enforce_eager, enable_prefix_caching=cfg.enable_prefix_caching,
        tensor_parallel_size=cfg.tensor_parallel_size, logprobs_mode=cfg.logprobs_mode,
        scheduling_policy=cfg.scheduling_policy,
        worker_extension_cls=WORKER_EXTENSION, disable_log_stats=True,
        **({"kv_cache_memory_bytes": int(cfg.cpu_kvcache_gib * 2**30)} if on_cpu
           else {"gpu_memory_utilization": cfg.gpu_memory_utilization}))
    try:
        return AsyncLLM.from_engine_args(args)
    except Exception as e:
        raise RuntimeError(f"vLLM engine failed to start for {model_path}: "
                           f"{type(e).__name__}: {e}") from e
