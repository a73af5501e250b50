"""Which dtype computes fastest on this CPU: measured, never assumed.

Processors sold since 2023 (Intel since Sapphire Rapids with AMX, AMD since Zen 4 with
AVX512-BF16, Apple M2 and later) multiply bfloat16 several times faster than float32; older
ones emulate it and are slower. ``dtype: auto`` on a CPU (the learner's ``optim.dtype``, the
engine's ``generators.engine.dtype``) takes this module's choice: a short probe times a
square matmul and a model-shaped forward and backward (a SmolLM2-sized MLP block on 16 x 96
tokens, float32 against bf16 autocast) on one thread, and bf16 is chosen where both are at
least ``MARGIN`` times faster, else float32.

The answer is cached per machine and torch version (``$V05_CACHE``, else ``~/.cache/v05rl``,
``cpu_dtype.json``), so every role of a run on this machine reads the same choice and only
the first run pays the probe (about 2 s). ``V05_CPU_DTYPE=bf16|fp32`` forces it (tests; a
machine whose probe misjudges): the record then says so.

Only torch is imported, and only by ``probe``.
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

PROBE_VERSION = 1
MARGIN = 1.3          # bf16 must be this many times faster on both probes to be chosen
FORCE_ENV = "V05_CPU_DTYPE"
CHOICES = ("fp32", "bf16")


def cache_file() -> Path:
    root = os.environ.get("V05_CACHE") or str(Path.home() / ".cache" / "v05rl")
    return Path(root) / "cpu_dtype.json"


def machine_key() -> str:
    """What the answer depends on: the processor's model and bf16-relevant flags, the torch
    version, the probe's version."""
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


def probe(n: int = 1024, tokens: int = 16 * 96, hidden: int = 576, inner: int = 1536,
          reps: int = 3) -> dict:
    """float32 against bf16 on one thread: matmul GFLOP/s of two n x n matrices, and the
    tokens/s of a forward and backward of an MLP block (hidden -> inner -> hidden, SiLU) on
    ``tokens`` tokens under bf16 autocast (the learner's way) against float32."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        out = {}
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a = torch.randn(n, n, generator=g).to(dt)
            b = torch.randn(n, n, generator=g).to(dt)
            out[f"{name}_gflops"] = 2 * n ** 3 / _time(lambda: a @ b, reps) / 1e9
        w1 = torch.randn(hidden, inner, generator=g, requires_grad=True)
        w2 = torch.randn(inner, hidden, generator=g, requires_grad=True)
        x = torch.randn(tokens, hidden, generator=g)

        def step(autocast: bool):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = torch.nn.functional.silu(x @ w1) @ w2
            y.float().square().mean().backward()

        for name, ac in (("fp32", False), ("bf16", True)):
            out[f"{name}_fwd_bwd_tokens_per_s"] = tokens / _time(lambda: step(ac), reps)
    finally:
        torch.set_num_threads(threads)
    out["matmul_ratio"] = out["bf16_gflops"] / out["fp32_gflops"]
    out["fwd_bwd_ratio"] = out["bf16_fwd_bwd_tokens_per_s"] / out["fp32_fwd_bwd_tokens_per_s"]
    out["chosen"] = "bf16" if min(out["matmul_ratio"], out["fwd_bwd_ratio"]) >= MARGIN \
        else "fp32"
    return out


def cpu_dtype() -> dict:
    """This machine's choice and the probe's figures: ``{"chosen": "fp32"|"bf16",
    "fp32_gflops", "bf16_gflops", "fwd_bwd_ratio", ..., "source": "probe"|"cache"|"forced",
    "key"}``. Cached (module docstring); ``$V05_CPU_DTYPE`` wins."""
    forced = os.environ.get(FORCE_ENV)
    if forced:
        if forced not in CHOICES:
            raise ValueError(f"{FORCE_ENV}={forced!r}: must be one of {CHOICES}")
        return {"chosen": forced, "source": "forced", "key": None}
    key, path = machine_key(), cache_file()
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key and cached.get("chosen") in CHOICES:
            return {**cached, "source": "cache"}
    except (OSError, ValueError):
        pass
    found = {**probe(), "key": key}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(found, indent=1))
        tmp.replace(path)  # whole or not at all: roles starting together may race here
    except OSError:
        pass  # a read-only home: the next role probes again, and finds the same
    return {**found, "source": "probe"}


def run_dtypes(learner_dtype: str, engine_dtype: str, on_gpu: bool) -> dict:
    """What a run's learner and engines compute in (``optim.dtype``, ``generators.engine.dtype``
    resolved as their roles resolve them), with this CPU's probe when either was ``auto`` on
    a CPU: summary.json's ``dtypes`` and the line said at the start."""
    if on_gpu:
        return {"learner": "bf16" if learner_dtype == "auto" else learner_dtype,
                "engine": "bfloat16" if engine_dtype == "auto" else engine_dtype}
    probe = cpu_dtype() if "auto" in (learner_dtype, engine_dtype) else None
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
        line += (f" (this CPU: bf16 matmul {p['matmul_ratio']:.1f}x float32, a model-shaped "
                 f"forward and backward {p['fwd_bwd_ratio']:.1f}x; bf16 where both are at least "
                 f"{MARGIN}x; optim.dtype / generators.engine.dtype set one explicitly)")
    return line
