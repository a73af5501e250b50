"""The three device checks of ``python -m bench.gpu_check``; each runs in its own process.

- ``learner_memory``: the learner (``LearnerWorker``, one rank, bf16 on CUDA, gradient
  checkpointing, token-budget micro-batches, chunked log-probs) on a Qwen3 shape at long
  responses: peak device memory, memory at rest between steps (the model states), trained
  tokens/s.
- ``logprob_memory``: the log-prob step alone (hidden states -> LM head -> log-probs +
  entropy -> backward), chunked against the old full-logits one; an out-of-memory error of
  either is caught and recorded.
- ``decoupled_steps``: a few steps of the decoupled objective (truncated importance weights,
  dual clip) on a fixed batch: finite, and the loss falls.

Without CUDA they run the same code on the CPU (fp32), with memory from the process's
resident set instead of the CUDA allocator.
"""
from __future__ import annotations

import time
from pathlib import Path

GIB = 2 ** 30
# The device check needs PyTorch, transformers and DeepSpeed only: it must run on a lent GPU
# machine where no Ray cluster or vLLM build is set up.
NOT_NEEDED = ("ray", "vllm")


def noting_imports(fn, *args) -> dict:
    """fn(*args), and which modules of ``NOT_NEEDED`` its process had loaded by the end
    (``loaded_not_needed``; ``python -m bench.gpu_check`` counts any as a failed check)."""
    import sys

    out = fn(*args)
    return {**out, "loaded_not_needed": sorted(m for m in NOT_NEEDED if m in sys.modules)}


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _reset_peak() -> int:
    """Start a peak-memory window; returns the bytes in use at its start."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    from bench.gpu_check.memory_cpu import reset_peak_rss

    return reset_peak_rss()


def _peak(start: int) -> int:
    """Peak bytes in use since ``_reset_peak`` returned ``start`` (CUDA allocator, or the
    resident set). On the CPU the kernel counts resident pages per thread in batches, so its
    high-water mark can read a few hundred KiB under the resident set read at the reset (seen
    in CI: 0.84931 against 0.84948 GiB); the window's peak is at least its start."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    from bench.gpu_check.memory_cpu import proc_status_bytes

    return max(proc_status_bytes("VmHWM"), start)


def learner_memory(shape: str, tmp: str, prompt_len: int, resp_lens: list[int],
                   responses: int, steps: int) -> dict:
    """Per response length: one warm-up step, then ``steps`` measured ones on ``responses``
    responses of ``prompt_len + resp_len`` tokens, one response per micro-batch."""
    import torch

    from bench.gpu_learner import SHAPES, save_random_shape, synthetic_samples, timed_steps
    from learner.config import LearnerConfig
    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    t0 = time.perf_counter()
    path, n_params = save_random_shape(shape, Path(tmp) / shape)
    build_s = time.perf_counter() - t0
    budget = prompt_len + max(resp_lens)
    cfg = LearnerConfig(lr=1e-6, micro_batch_size=1, micro_batch_tokens=budget,
                        gradient_checkpointing=True, logprob_chunk_tokens=1024)
    w = LearnerWorker(str(path), cfg, 0, 1, free_port())
    res = {"shape": shape, "params": n_params, "dtype": w.dtype_name, "zero_stage": 0,
           "build_s": round(build_s, 1), "logprob_chunk_tokens": cfg.logprob_chunk_tokens,
           "runs": []}
    try:
        for resp_len in resp_lens:
            samples = synthetic_samples(responses, prompt_len, resp_len,
                                        SHAPES[shape]["vocab_size"], 1)
            run = {"prompt_len": prompt_len, "resp_len": resp_len, "responses": responses}
            try:
                w.train_step(samples)  # warm-up: allocator, kernels, Adam's moments
                rest = _reset_peak()
                times, m = timed_steps(w, samples, steps)
                peak = _peak(rest)
                tokens = responses * (prompt_len + resp_len)
                run.update(rest_gib=rest / GIB, peak_gib=peak / GIB,
                           step_working_gib=(peak - rest) / GIB,
                           step_s=[round(x, 3) for x in times],
                           trained_tokens_per_step=tokens,
                           tokens_per_s=tokens / (sum(times) / len(times)),
                           micro_batches=m.micro_batches)
                if torch.cuda.is_available():
                    run["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
            except torch.cuda.OutOfMemoryError as err:
                run.update(oom=True, error=str(err).splitlines()[0])
                torch.cuda.empty_cache()
            res["runs"].append(run)
    finally:
        w.close()
    return res


def logprob_memory(tokens: int, hidden: int, vocab: int, chunk: int) -> dict:
    """Peak memory and time of the log-prob step, chunked vs full logits, on one device."""
    import torch

    from learner.logprobs import chunked_logprobs, token_logprobs

    dev = _device()
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    g = torch.Generator(device=dev).manual_seed(0)
    h = (torch.randn(tokens, hidden, generator=g, device=dev) * 0.5).to(dt).requires_grad_(True)
    head = torch.nn.Linear(hidden, vocab, bias=False, device=dev, dtype=dt)
    targets = torch.randint(0, vocab, (tokens,), generator=g, device=dev)
    head.weight.grad, h.grad = torch.zeros_like(head.weight), torch.zeros_like(h)
    out = {"tokens": tokens, "hidden": hidden, "vocab": vocab, "chunk": chunk,
           "dtype": str(dt).removeprefix("torch."), "device": dev.type}
    for kind in ("chunked", "full_logits"):
        def step():
            if kind == "chunked":
                logp, _ = chunked_logprobs(h, head, targets, 1.0, chunk)
            else:
                logp, _ = token_logprobs(head(h), targets, 1.0)
            logp.float().sum().backward()
        try:
            step()  # warm-up
            base = _reset_peak()
            t = time.perf_counter()
            step()
            peak = _peak(base)
            out[kind] = {"peak_above_inputs_gib": (peak - base) / GIB,
                         "seconds": round(time.perf_counter() - t, 4)}
        except torch.cuda.OutOfMemoryError as err:
            out[kind] = {"oom": True, "error": str(err).splitlines()[0]}
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return out


def decoupled_steps(tmp: str, steps: int = 4) -> dict:
    """The decoupled objective on the device: ``steps`` updates on one fixed batch whose
    behaviour log-probs come from an fp32 forward of the initial weights."""
    import math

    import torch

    from bench.gpu_learner import SHAPES, fp32_logprobs, save_random_shape, synthetic_samples
    from learner.config import LearnerConfig
    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    path, _ = save_random_shape("tiny", Path(tmp) / "tiny_decoupled")
    samples = synthetic_samples(16, 12, 20, SHAPES["tiny"]["vocab_size"], 0,
                                fp32_logprobs(str(path)))
    cfg = LearnerConfig(lr=1e-3, micro_batch_size=4, micro_batch_tokens=96,
                        objective="decoupled", tis_cap=5.0, dual_clip=3.0)
    w = LearnerWorker(str(path), cfg, 0, 1, free_port())
    try:
        history = [w.train_step(samples) for _ in range(steps)]
    finally:
        w.close()
    losses = [m.loss for m in history]
    res = {"device": str(_device()), "dtype": w.dtype_name, "losses": losses,
           "is_weight": [m.is_weight for m in history],
           "truncated_fraction": [m.truncated_fraction for m in history],
           "applied": sum(not m.skipped for m in history)}
    assert res["applied"] == steps and all(math.isfinite(x) for x in losses), res
    # pi_prox is the current policy, so the loss is -mean(w A) at the current weights: it
    # falls as probability moves toward positive advantages.
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    if torch.cuda.is_available():
        assert w.dtype_name == "bf16", res
    return res
