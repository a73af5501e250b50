"""The machine's limits that a run is compared with, each measured in a process of its own
(``python -m bench.real_model.measure KIND ...``, JSON on stdout) so that the bench's own
process holds no engine or torch threads while the run goes on.

    matmul   float32 GEMM GFLOP/s at 1..N threads (the learner's peak on this machine)
    engine   one generator's engine alone, at fixed batches: decode tokens/s
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
    else:
        raise SystemExit(f"unknown measurement {kind!r}: matmul or engine")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
