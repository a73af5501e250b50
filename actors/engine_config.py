"""The engine settings of one generator (one vLLM engine), ``GeneratorConfig``. Pure pydantic:
no vLLM, Ray or torch import, so the run's config (``cluster/config/schema.py``) validates them on a
machine without vLLM; ``actors/engine.py`` turns them into an engine.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class GeneratorConfig(BaseModel):
    """Engine settings of one generator (one vLLM engine)."""

    model_config = ConfigDict(extra="forbid")

    max_num_seqs: int = Field(64, gt=0, description="Most sequences in one running batch.")
    max_model_len: int = Field(256, gt=0, description="Prompt + completion length limit "
                               "in tokens.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description=(
            "Engine dtype; 'auto' is bfloat16 on CUDA and, on a CPU, bfloat16 where this "
            "machine's probe measures it clearly faster than float32, else float32 "
            "(common/cpu_dtype.py; the learner's optim.dtype auto follows the same choice)."))
    enforce_eager: bool = Field(True, description="Skip torch.compile / CUDA graphs (fast "
                                "start; set False on GPUs for decode speed).")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="CUDA: fraction of "
                                          "GPU memory vLLM may take (weights + KV cache).")
    cpu_kvcache_gib: float = Field(1.0, gt=0, description="CPU: KV-cache size in GiB.")
    seed: int = Field(0, description="Engine seed (requests without their own seed).")
    enable_prefix_caching: bool = Field(True, description="Reuse prompt KV across the n "
                                        "completions of one prompt.")
    max_num_batched_tokens: int | None = Field(None, gt=0, description="Token budget per "
                                               "engine step; None lets vLLM choose.")
    tensor_parallel_size: int = Field(1, gt=0, description="GPUs per engine.")
    cpu_worker_process: bool = Field(False, description="CPU: run the model in a separate "
                                     "worker process (vLLM's multiprocess executor, which binds "
                                     "its threads itself) rather than inside the engine-core "
                                     "process: one process more per generator, slower start.")
    engine_core: Literal["auto", "in_process", "own_process"] = Field(
        "auto", description="Where vLLM's engine core runs. 'in_process': in the generator's "
        "own process, stepped by a thread of it (actors/inproc_engine.py): no second import of "
        "torch and vLLM at start-up. 'own_process': vLLM's AsyncLLM with its engine core in a "
        "process of its own (overlaps the core's loop with output handling; the usual choice "
        "on GPUs). 'auto': in_process on CPU (unless cpu_worker_process), own_process on "
        "CUDA. Weight updates take the same call into the same worker either way.")
    cpu_onednn_cache: int = Field(64, ge=0, description="CPU: oneDNN primitive-cache "
                                  "capacity of the engine's processes "
                                  "(ONEDNN_PRIMITIVE_CACHE_CAPACITY; oneDNN's default is 1024). "
                                  "Every distinct batch shape adds an entry, and a long run "
                                  "sees thousands: at 1024 each engine core grew by MiBs per "
                                  "step for hours (docs/benchmarks.md, tests.acceptance.soak). 0 turns the "
                                  "cache off. An ONEDNN_PRIMITIVE_CACHE_CAPACITY already set in "
                                  "the environment wins.")
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = Field(
        "raw_logprobs", description="'raw': log-softmax of the model's logits (what the "
        "learner recomputes); 'processed': after temperature/top-p.")
    prompt_format: Literal["auto", "chat", "raw"] = Field(
        "auto", description="How a task prompt reaches the model: 'chat' renders it as a "
        "user turn with the tokenizer's chat template (instruct models), 'raw' sends the text "
        "as is (base models, the embedded policy), 'auto' is chat when the tokenizer carries a "
        "chat template.")
    system_prompt: str | None = Field(None, description="chat: a system turn before the "
                                      "user's (None: none).")
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority", description="'priority': requests with a lower priority value run first "
        "(the coordinator sends extra rollouts of prompts in flight ahead of new prompts); "
        "'fcfs': arrival order, priorities ignored.")


def resolve_engine_core(engine_core: str, on_cpu: bool, cpu_worker_process: bool) -> str:
    """'in_process' or 'own_process' for ``GeneratorConfig.engine_core`` on this platform."""
    if engine_core == "auto":
        return "in_process" if on_cpu and not cpu_worker_process else "own_process"
    if engine_core == "in_process" and on_cpu and cpu_worker_process:
        raise ValueError("generators.engine.engine_core 'in_process' cannot be combined with "
                         "cpu_worker_process (vLLM's multiprocess executor needs AsyncLLM's "
                         "engine-core process): set one of them")
    return engine_core


def resolve_dtype(dtype: str, on_cpu: bool, model_path: str) -> str:
    """The engine's dtype: auto is bfloat16 on CUDA and, on a CPU, what this machine's probe
    measured faster for ``model_path`` (common/cpu_dtype.py: the learner follows the same
    choice)."""
    if dtype != "auto":
        return dtype
    if not on_cpu:
        return "bfloat16"
    from common.cpu_dtype import cpu_dtype
    return "bfloat16" if cpu_dtype(model_path)["chosen"] == "bf16" else "float32"
