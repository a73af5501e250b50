"""Peak memory of the learner's pieces, measured on the CPU (no GPU needed).

Each measurement runs in a fresh process: it builds its tensors, resets the kernel's
peak-RSS mark (``/proc/self/clear_refs``), records the resident set, runs one forward and
backward, and reports the peak resident set above that baseline (``VmHWM - VmRSS``): every
byte the step allocated and touched at its worst moment, whoever allocated it.

- ``logprob_step``: the log-prob step of the old learner (``token_logprobs`` on full logits,
  entropy included) against ``chunked_logprobs``, for N positions, a vocabulary V and hidden
  size H; the inputs (hidden states, head weight, its gradient buffer) are allocated before the
  baseline, so the figure is what the step itself adds (the second of two identical steps:
  the first one's one-off workspaces are not counted).
- ``layer_step``: forward + backward of a Qwen3-shaped decoder with HF gradient
  checkpointing, parameters and their gradient buffers allocated before the baseline (again
  the second of two steps), at depth 1 with N and 2N tokens and at depth 2 with N tokens:
  the slope in tokens is one layer's working memory per token (its recomputation and
  backward, plus embeddings and final hidden states), the step in depth what one more layer
  keeps (its checkpointed input).
"""
from __future__ import annotations

import re
from pathlib import Path

MIB = 2 ** 20
_MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"


def proc_status_bytes(key: str) -> int:
    """Bytes of a ``/proc/self/status`` entry (VmRSS: resident now, VmHWM: peak)."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def reset_peak_rss() -> int:
    """Reset the peak-RSS mark to the current resident set; returns that baseline."""
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return proc_status_bytes("VmRSS")


def logprob_step(kind: str, n: int, hidden: int, vocab: int, chunk: int, dtype: str,
                 threads: int = 1) -> dict:
    """One forward + backward of the log-prob step; returns peak MiB above the baseline."""
    import time

    import torch

    from learner.logprobs import chunked_logprobs, token_logprobs

    torch.set_num_threads(threads)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(n, hidden, generator=g) * 0.5).to(dt).requires_grad_(True)
    head = torch.nn.Linear(hidden, vocab, bias=False).to(dt)
    targets = torch.randint(0, vocab, (n,), generator=g)
    # gradient buffers exist before the baseline, as they do in a training step
    head.weight.grad = torch.zeros_like(head.weight)
    h.grad = torch.zeros_like(h)

    def step():
        if kind == "reference":
            logp, ent = token_logprobs(head(h), targets, 1.0)
        elif kind == "chunked":
            logp, ent = chunked_logprobs(h, head, targets, 1.0, chunk)
        else:
            raise ValueError(f"kind must be 'reference' or 'chunked', got {kind!r}")
        logp.sum().backward()
        return ent

    step()  # first calls allocate workspaces (thread pools, GEMM packing): not measured
    base = reset_peak_rss()
    t0 = time.perf_counter()
    ent = step()
    seconds = time.perf_counter() - t0
    peak = proc_status_bytes("VmHWM") - base
    return {"kind": kind, "tokens": n, "hidden": hidden, "vocab": vocab,
            "chunk": chunk if kind == "chunked" else None, "dtype": dtype,
            "peak_mib": peak / MIB, "bytes_per_position_vocab": peak / (n * vocab),
            "seconds": round(seconds, 2), "mean_entropy": float(ent.mean())}


def layer_step(layers: int, n: int, shape: dict, threads: int = 1) -> dict:
    """Peak MiB above baseline of one fwd+bwd of a ``layers``-deep model of ``shape`` (fp32,
    gradient checkpointing, train mode, small vocabulary), via the learner's LogprobModel."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from learner.logprobs import LogprobModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = Qwen3Config(**{**shape, "num_hidden_layers": layers}, max_position_embeddings=40960)
    model = Qwen3ForCausalLM(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    lm = LogprobModel(model, 1.0, 1024)
    ids = torch.randint(3, cfg.vocab_size, (1, n))
    pos = torch.arange(n)[None]
    positions = torch.arange(n - 1)

    def step():
        logp, _ = lm(ids, pos, positions, ids[0, 1:])
        logp.sum().backward()

    step()  # allocates every gradient buffer and workspace; the measured step reuses them
    base = reset_peak_rss()
    step()
    peak = proc_status_bytes("VmHWM") - base
    return {"layers": layers, "tokens": n, "hidden": cfg.hidden_size,
            "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size, "dtype": "fp32",
            "peak_mib": peak / MIB}


def isolated(fn, *args) -> dict:
    """fn(*args) in a fresh spawned process (a clean heap and peak mark for each figure).

    The child's glibc serves every allocation above 64 KiB by mmap, so freed tensors leave
    the resident set at once: without it, tensors under glibc's 32 MiB mmap threshold are
    carved from the heap, whose fragments stay resident and inflate the peak."""
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor

    old = os.environ.get(_MMAP_ENV)
    os.environ[_MMAP_ENV] = "65536"  # read by the child's malloc at start-up
    try:
        with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
            return ex.submit(fn, *args).result()
    finally:
        if old is None:
            os.environ.pop(_MMAP_ENV, None)
        else:
            os.environ[_MMAP_ENV] = old


def run(tokens: int, hidden: int, vocab: int, chunk: int, dtype: str, layer_tokens: int,
        layer_shape: dict | None, log=print) -> dict:
    """Every CPU measurement; ``layer_shape`` None skips the decoder-layer figures."""
    out: dict = {"logprob_step": [], "layer_step": []}
    for kind in ("chunked", "reference"):
        r = isolated(logprob_step, kind, tokens, hidden, vocab, chunk, dtype)
        log(f"logprob step {kind}: {r['peak_mib']:.0f} MiB above baseline ({r['seconds']} s)")
        out["logprob_step"].append(r)
    if layer_shape is not None:
        n = layer_tokens
        runs = {(d, t): isolated(layer_step, d, t, layer_shape) for d, t in ((1, n), (1, 2 * n),
                                                                             (2, n))}
        for r in runs.values():
            log(f"decoder depth {r['layers']}, {r['tokens']} tokens: {r['peak_mib']:.0f} MiB "
                "above baseline")
        out["layer_step"] = list(runs.values())
        mib = {k: v["peak_mib"] * MIB for k, v in runs.items()}
        working = (mib[1, 2 * n] - mib[1, n]) / n
        out["layer_derived_fp32"] = {
            # what one more layer keeps (its checkpointed input), per token
            "kept_per_layer_bytes_per_token": (mib[2, n] - mib[1, n]) / n,
            # the step's memory that grows with tokens at depth 1 (one layer's recomputation
            # and backward, embeddings, final hidden states), per token
            "working_bytes_per_token": working,
            # what does not grow with tokens (weight-gradient temporaries)
            "fixed_mib": (mib[1, n] - working * n) / MIB,
        }
        log(f"derived (fp32): {out['layer_derived_fp32']}")
    return out
