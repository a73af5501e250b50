"""The machine's limits that a run is compared with, each measured in a process of its own
(``python -m bench.real_model.measure KIND ...``, JSON on stdout) so that the bench's own
process holds no engine or torch threads while the run goes on.

    matmul   float32 GEMM GFLOP/s at 1..N threads (the learner's peak on this machine)
    engine   one generator's engine alone, at fixed batches: decode tokens/s
    plain    a plain transformers forward and backward of the model on a batch, float32 or
             under bf16 autocast: the rate the learner is measured against
    learner  the learner's own step (``LearnerWorker.train_step``, DeepSpeed, one rank) on
             the same batch, in a dtype, packed in rows (auto, one, or a token cap):
             trained tokens/s
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def matmul_gflops(threads: int, n: int = 2048, repeats: int = 8) -> float:
    """Best-of-three float32 ``n x n`` matrix-multiply rate on ``threads`` torch threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b  # warm-up: the first calls pick kernels and touch memory
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * n ** 3 * repeats / (time.perf_counter() - t) / 1e9)
    return best


def engine_curve(config: str, batches: list[int], overrides: list[str]) -> list[dict]:
    """Decode tokens/s of one generator's engine (``actors.generator.Generator``, in this
    process, bound to core 0 with the config's thread count) at each batch: ``b`` real train
    prompts at once, ``rollout.max_tokens`` tokens each (EOS ignored, so the batch holds
    ``b`` sequences from start to end; prompt processing included, as in a run)."""
    from actors.generator import Generator
    from cluster.config.schema import load_config
    from tasks import make_task_from_config

    cfg = load_config(config, overrides)
    task = make_task_from_config(cfg.task)
    gen = Generator(cfg.model_path(), 0, cfg.generators.engine,
                    cpu_threads=cfg.generators.threads, cpu_bind="0")
    prompts = [p.prompt for p in task.train()]

    async def measure() -> list[dict]:
        await gen.ready()
        rows = []
        for b in batches:
            rate = await gen.measure_peak(prompts[:b], cfg.rollout.max_tokens)
            rows.append({"batch": b, "tokens_per_s": round(rate, 2)})
            print(f"[engine_curve] batch {b}: {rate:.1f} tokens/s", file=sys.stderr, flush=True)
        return rows

    try:
        return asyncio.run(measure())
    finally:
        gen.shutdown()


def batch_of(n: int, length: int, vocab: int) -> list:
    """``n`` responses of ``length`` random tokens after 16-token prompts (random ids, seed 0):
    what a learner step trains, with the shape the benchmark names."""
    from bench.gpu_learner.core import synthetic_samples

    return synthetic_samples(n, 16, length, vocab, 0)


def plain_tokens_per_s(model_path: str, dtype: str, n: int = 16, length: int = 96,
                       steps: int = 4, threads: int = 1) -> float:
    """A plain transformers forward and backward (mean log-prob of the batch) in float32
    (``fp32``) or under bf16 autocast over float32 weights (``bf16``), one thread: tokens/s
    over ``steps`` after a warm-up."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    vocab = model.config.vocab_size
    x = torch.tensor([s.prompt_token_ids + s.token_ids for s in batch_of(n, length, vocab)])

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(x).logits
        torch.log_softmax(logits.float(), -1).mean().backward()
    step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return x.numel() * steps / (time.perf_counter() - t)


def learner_tokens_per_s(model_path: str, dtype: str, rows: str = "auto", n: int = 16,
                         length: int = 96, steps: int = 4, threads: int = 1) -> float:
    """The learner's step (one DeepSpeed rank over gloo, this process) on the same batch,
    ``optim.dtype`` ``dtype``, ``optim.pack_row_tokens`` ``rows`` (``one``: the whole batch in
    one row, the learner before rows): prompt + response tokens trained per second over
    ``steps`` after a warm-up."""
    from learner.config import LearnerConfig
    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    cap = {"auto": "auto", "one": None}[rows] if rows in ("auto", "one") else int(rows)
    cfg = LearnerConfig(dtype=dtype, micro_batch_size=n, lr=1e-6, pack_row_tokens=cap)
    w = LearnerWorker(model_path, cfg, 0, 1, free_port(), threads)
    batch = batch_of(n, length, w.model.config.vocab_size)
    w.train_step(batch)
    t = time.perf_counter()
    for _ in range(steps):
        w.train_step(batch)
    rate = n * (16 + length) * steps / (time.perf_counter() - t)
    w.close()
    return rate


def in_subprocess(kind: str, *args: str, timeout_s: float = 900) -> object:
    """``python -m bench.real_model.measure KIND ARGS`` and the JSON it prints."""
    cmd = [sys.executable, "-m", "bench.real_model.measure", kind, *args]
    done = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, timeout=timeout_s, check=True)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    if kind == "matmul":
        out = {str(t): round(matmul_gflops(t), 1) for t in (int(x) for x in rest)}
    elif kind == "engine":
        config, batches, overrides = rest[0], [int(b) for b in rest[1].split(",")], rest[2:]
        out = engine_curve(config, batches, overrides)
    elif kind in ("plain", "learner"):
        fn = plain_tokens_per_s if kind == "plain" else learner_tokens_per_s
        out = round(fn(*rest), 1)
    else:
        raise SystemExit(f"unknown measurement {kind!r}: matmul, engine, plain or learner")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
