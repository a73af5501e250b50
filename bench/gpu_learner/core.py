"""The learner benchmark's parts: the Qwen3 shapes, synthetic batches, the check (part 1)
and the measurement (part 2), each run in a fresh process by ``cli.main``."""
from __future__ import annotations

import time
from pathlib import Path

from common.types import TrainSample
from learner.config import LearnerConfig
from learner.ranks import free_port


def _qwen3(hidden_size: int, intermediate_size: int, num_hidden_layers: int,
           num_attention_heads: int) -> dict:
    """A released Qwen3 shape: 8 KV heads of 128 dims, the 151936-token vocabulary, the
    embeddings tied."""
    return dict(hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)


# Public Qwen3 shapes (config.json of the released checkpoints); random weights here.
SHAPES = {
    "qwen3-4b": _qwen3(2560, 9728, 36, 32),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                 vocab_size=512, tie_word_embeddings=False),
}


def log(msg: str) -> None:
    print(f"[gpu_learner {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def synthetic_samples(n: int, prompt_len: int, resp_len: int, vocab: int, seed: int,
             behaviour=None) -> list[TrainSample]:
    """n synthetic responses; behaviour log-probs from ``behaviour(prompt, resp)`` or -1.0."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = rng.integers(3, vocab, prompt_len).tolist()
        r = rng.integers(3, vocab, resp_len).tolist()
        lp = behaviour(p, r) if behaviour else [-1.0] * resp_len
        out.append(TrainSample(p, r, lp, float(rng.choice([-1.0, 1.0])) * (1 + i % 3) / 3, 0))
    return out


def fp32_logprobs(model_path: str):
    """behaviour(prompt, resp) -> fp32 transformers log-probs of resp's tokens on the GPU."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.logprobs import token_logprobs

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(dev).eval()

    def behaviour(p, r):
        ids = torch.tensor([p + r], device=dev)
        with torch.no_grad():
            logp, _ = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:], 1.0, False)
        return logp[0, len(p) - 1:].tolist()
    return behaviour


def save_random_shape(shape: str, path: Path) -> tuple[Path, int]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**SHAPES[shape], max_position_embeddings=40960, rope_theta=1e6,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(dev):  # init on the GPU: seconds instead of minutes for 4B weights
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16 if dev == "cuda" else torch.float32)
    model.save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    return path, n


def check(tmp: Path) -> dict:
    """Part 1. Returns what it measured; raises AssertionError on a failed check."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from learner.worker import LearnerWorker

    path, _ = save_random_shape("tiny", tmp / "tiny")
    behaviour = fp32_logprobs(str(path))
    samples = synthetic_samples(16, 12, 20, SHAPES["tiny"]["vocab_size"], 0, behaviour)
    w = LearnerWorker(str(path), LearnerConfig(lr=1e-3, micro_batch_size=4), 0, 1, free_port())
    cuda = torch.cuda.is_available()
    res = {"device": str(w.device), "dtype": w.dtype_name, "backend": dist.get_backend()}
    if cuda:
        assert (w.dtype_name, res["backend"]) == ("bf16", "nccl"), res
    before = w.get_weights()
    steps = [w.train_step(samples) for _ in range(3)]
    first = steps[0]
    res.update(first_step={k: getattr(first, k) for k in ("loss", "approx_kl", "clip_fraction",
                                                   "grad_norm", "entropy")},
               steps_applied=w.step)
    assert all(not s.skipped and np.isfinite(s.loss) for s in steps), steps
    # bf16 vs fp32 log-probs of the same weights: a wrong dtype/device path shows up here.
    assert first.approx_kl < 5e-3 and first.clip_fraction < 0.05, first
    # Direction: each step is taken on the same batch, so the surrogate loss measured at the
    # start of the next step must be lower (probability moved toward positive advantages).
    res["losses"] = [s.loss for s in steps]
    assert steps[2].loss < steps[1].loss < steps[0].loss, res["losses"]
    after = w.get_weights()
    assert set(after) == set(before)
    moved = max(float(np.abs(after[k] - before[k]).max()) for k in after)
    assert moved > 1e-4 and all(np.isfinite(v).all() for v in after.values()), moved
    tag = w.save_checkpoint(str(tmp / "ckpt"), {"step": w.step})
    w.train_step(samples)  # move away, then restore
    assert w.load_checkpoint(str(tmp / "ckpt"))["step"] == 3, tag
    restored = w.get_weights()
    assert all(np.array_equal(restored[k], after[k]) for k in after), "checkpoint restore differs"
    res["max_weight_change"] = moved
    w.close()
    return res


def measure(shape: str, tmp: Path, batch: int, prompt_len: int, resp_len: int,
            micro: int, steps: int) -> dict:
    """Part 2: trained tokens/s of ``LearnerWorker`` on one device for one model shape."""
    import torch

    from learner.worker import LearnerWorker

    t0 = time.perf_counter()
    path, n_params = save_random_shape(shape, tmp / shape)
    t_build = time.perf_counter() - t0
    cfg = LearnerConfig(lr=1e-6, micro_batch_size=micro, gradient_checkpointing=True)
    t0 = time.perf_counter()
    w = LearnerWorker(str(path), cfg, 0, 1, free_port())
    t_init = time.perf_counter() - t0
    samples = synthetic_samples(batch, prompt_len, resp_len, SHAPES[shape]["vocab_size"], 1)
    w.train_step(samples)  # warm-up: allocator, kernels
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, _ = timed_steps(w, samples, steps)
    tokens = batch * (prompt_len + resp_len)  # every position goes through forward+backward
    mean = sum(times) / len(times)
    res = {"shape": shape, "params": n_params, "batch": batch, "prompt_len": prompt_len,
           "resp_len": resp_len, "micro_batch_size": micro, "gradient_checkpointing": True,
           "dtype": w.dtype_name, "build_s": round(t_build, 1), "init_s": round(t_init, 1),
           "step_s": [round(t, 3) for t in times], "trained_tokens_per_step": tokens,
           "tokens_per_s": tokens / mean, "s_per_token_gpu": mean / tokens,
           "model_tflops_per_s": 6 * n_params * tokens / mean / 1e12}
    if torch.cuda.is_available():
        res["peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    w.close()
    del w
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return res


def timed_steps(worker, samples, steps: int) -> tuple[list[float], dict]:
    """``steps`` train steps of ``worker`` on ``samples``, each timed to its end on the device
    (CUDA synchronised); (the seconds of each, the last step's metrics). A skipped step fails
    the measurement (AssertionError)."""
    import torch

    times, m = [], {}
    for _ in range(steps):
        t0 = time.perf_counter()
        m = worker.train_step(samples)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        assert not m.skipped, m
    return times, m


def isolated(fn, *args):
    """Run fn(*args) in a fresh process: DeepSpeed caches its process groups per process, so a
    second engine after ``destroy_process_group`` in the same process fails."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()
