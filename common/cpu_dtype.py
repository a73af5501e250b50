"""Which dtype computes fastest on this CPU for this model: measured, never assumed.

Processors sold since 2023 (Intel since Sapphire Rapids with AMX, AMD since Zen 4 with
AVX512-BF16, Apple M2 and later) multiply bfloat16 several times faster than float32; older
ones emulate it and are slower. Whether that pays depends on the model too: a small model's
step is per-operation overhead, and bf16 autocast adds casts to every operation (the embedded
tiny policy trains 0.94x as fast under bf16 on a CPU where SmolLM2-135M trains 1.48x as fast).
``dtype: auto`` on a CPU (the learner's ``optim.dtype``, the engine's
``generators.engine.dtype``) therefore takes this module's choice for the run's model: a
short probe times a square matmul, and a forward and backward of the model's own
architecture (its config.json, cut to ``PROBE_LAYERS`` layers, random weights, 8 x 64
tokens) in float32 against bf16 autocast, on one thread; bf16 is chosen where both are at
least ``MARGIN`` times faster, else float32.

The answer is cached per machine, torch version and model shape (``$V05_CACHE``, else
``~/.cache/v05rl``, ``cpu_dtype.json``): the launcher probes before any role starts
(``run_dtypes``), so every role of a run on this machine reads the same choice and only the
first run of a model pays the probe (SmolLM2-135M: about 10 s). ``V05_CPU_DTYPE=bf16|fp32``
forces it (tests; a machine whose probe misjudges): the record then says so.

torch and transformers are imported only by ``probe`` and ``machine_key``.
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

PROBE_VERSION = 2
MARGIN = 1.25         # bf16 must be this many times faster on both probes to be chosen
PROBE_LAYERS = 2      # the model's layers the probe keeps (each layer costs the same)
FORCE_ENV = "V05_CPU_DTYPE"
CHOICES = ("fp32", "bf16")
SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "vocab_size")


def cache_file() -> Path:
    root = os.environ.get("V05_CACHE") or str(Path.home() / ".cache" / "v05rl")
    return Path(root) / "cpu_dtype.json"


def model_shape(model_path: str) -> str:
    """What of the model the answer depends on (its config.json's sizes), as text."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"model {model_path}: no readable config.json for the dtype probe "
                         f"({e}); set optim.dtype and generators.engine.dtype explicitly")
    return ",".join(f"{k}={cfg.get(k)}" for k in SHAPE_KEYS)


def machine_key() -> str:
    """What the answer depends on besides the model: the processor's model and bf16-relevant
    flags, the torch version, the probe's version."""
    import torch

    model, flags = platform.processor() or platform.machine(), []
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                      if ln.startswith("model name")), model)
        found = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
        flags = sorted(f for f in found.split() if "bf16" in f or f.startswith("amx"))
    except OSError:
        pass
    return f"{model}|{','.join(flags)}|torch {torch.__version__}|probe {PROBE_VERSION}"


def _time(fn, reps: int) -> float:
    fn()  # warm-up (kernels chosen, memory allocated)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def probe(model_path: str, n: int = 1024, batch: int = 8, length: int = 64,
          reps: int = 3) -> dict:
    """float32 against bf16 on one thread: matmul GFLOP/s of two n x n matrices, and the
    tokens/s of a forward and backward (mean log-softmax of the logits) of ``model_path``'s
    architecture cut to ``PROBE_LAYERS`` layers, random weights, on ``batch`` x ``length``
    tokens under bf16 autocast (the learner's way) against float32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        out = {}
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a = torch.randn(n, n, generator=g).to(dt)
            b = torch.randn(n, n, generator=g).to(dt)
            out[f"{name}_gflops"] = 2 * n ** 3 / _time(lambda: a @ b, reps) / 1e9
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
        config.num_hidden_layers = min(PROBE_LAYERS, config.num_hidden_layers)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()
        x = torch.randint(0, config.vocab_size, (batch, length), generator=g)

        def step(autocast: bool):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=x).logits
            torch.log_softmax(logits.float(), -1).mean().backward()

        for name, ac in (("fp32", False), ("bf16", True)):
            out[f"{name}_fwd_bwd_tokens_per_s"] = x.numel() / _time(lambda: step(ac), reps)
    finally:
        torch.set_num_threads(threads)
    out["matmul_ratio"] = out["bf16_gflops"] / out["fp32_gflops"]
    out["fwd_bwd_ratio"] = out["bf16_fwd_bwd_tokens_per_s"] / out["fp32_fwd_bwd_tokens_per_s"]
    out["chosen"] = "bf16" if min(out["matmul_ratio"], out["fwd_bwd_ratio"]) >= MARGIN \
        else "fp32"
    return out


def cpu_dtype(model_path: str) -> dict:
    """This machine's choice for ``model_path`` and the probe's figures: ``{"chosen":
    "fp32"|"bf16", "fp32_gflops", "bf16_gflops", "fwd_bwd_ratio", ..., "source":
    "probe"|"cache"|"forced", "key"}``. Cached (module docstring); ``$V05_CPU_DTYPE`` wins."""
    forced = os.environ.get(FORCE_ENV)
    if forced:
        if forced not in CHOICES:
            raise ValueError(f"{FORCE_ENV}={forced!r}: must be one of {CHOICES}")
        return {"chosen": forced, "source": "forced", "key": None}
    key, path = f"{machine_key()}|{model_shape(model_path)}", cache_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict) or "key" in cached:  # probe version 1 kept one answer
        cached = {}
    hit = cached.get(key)
    if isinstance(hit, dict) and hit.get("chosen") in CHOICES:
        return {**hit, "key": key, "source": "cache"}
    found = probe(model_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({**cached, key: found}, indent=1))
        tmp.replace(path)  # whole or not at all: roles probing together may race here
    except OSError:
        pass  # a read-only home: the next role probes again, and finds the same
    return {**found, "key": key, "source": "probe"}


def run_dtypes(learner_dtype: str, engine_dtype: str, on_gpu: bool, model_path: str) -> dict:
    """What a run's learner and engines compute in (``optim.dtype``, ``generators.engine.dtype``
    resolved as their roles resolve them), with this CPU's probe for ``model_path`` when
    either was ``auto`` on a CPU: summary.json's ``dtypes`` and the line said at the start."""
    if on_gpu:
        return {"learner": "bf16" if learner_dtype == "auto" else learner_dtype,
                "engine": "bfloat16" if engine_dtype == "auto" else engine_dtype}
    probe = cpu_dtype(model_path) if "auto" in (learner_dtype, engine_dtype) else None
    chosen = probe["chosen"] if probe else None
    return {"learner": chosen if learner_dtype == "auto" else learner_dtype,
            "engine": ({"bf16": "bfloat16", "fp32": "float32"}[chosen]
                       if engine_dtype == "auto" else engine_dtype),
            **({"cpu_probe": probe} if probe else {})}


def dtype_line(d: dict) -> str:
    """The start's line: what computes in which dtype, and why (the probe's figures)."""
    line = f"dtype: learner {d['learner']}, engine {d['engine']}"
    p = d.get("cpu_probe")
    if p and p.get("source") == "forced":
        return line + f" (forced by ${FORCE_ENV})"
    if p:
        line += (f" (this CPU: bf16 matmul {p['matmul_ratio']:.1f}x float32, this model's "
                 f"forward and backward {p['fwd_bwd_ratio']:.1f}x; bf16 where both are at least "
                 f"{MARGIN}x; optim.dtype / generators.engine.dtype set one explicitly)")
    return line
