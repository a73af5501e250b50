"""Does a vLLM CPU engine's resident memory grow per weight reload, or per generation?

    python -m bench.soak.engine_probe [N]

One engine in this process (sync ``LLM``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the engine
core's memory is this process's), the embedded policy, then three phases of N rounds each:
generate only (16 prompts x 4 samples, up to 200 tokens), reload only (the object-store
receiver's path: safetensors under /dev/shm, ``collective_rpc("v05_load_dir")``), both.
Prints the RSS at the start and end of each phase and writes them to $OUT (default
/tmp/engine_probe.json). bench.soak found each engine core growing about 1.3 MiB per step in a
real run; this isolates the two things a step does to an engine.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time


def main(n: int) -> dict:
    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
                       "VLLM_CPU_OMP_THREADS_BIND": "nobind", "TOKENIZERS_PARALLELISM": "false"})
    import psutil
    from safetensors.numpy import load_file
    from vllm import LLM, SamplingParams

    from common.weight_sync import WORKER_EXTENSION
    from common.weight_sync.base import shm_tempdir, write_safetensors
    from tasks.policy import ensure_default_policy

    path = str(ensure_default_policy())
    llm = LLM(model=path, dtype="bfloat16", max_model_len=320, max_num_seqs=64, seed=0,
              worker_extension_cls=WORKER_EXTENSION, kv_cache_memory_bytes=2**30,
              enforce_eager=True, disable_log_stats=True)
    sd = load_file(os.path.join(path, "model.safetensors"))
    me = psutil.Process()
    sp = SamplingParams(max_tokens=200, temperature=1.0, n=4)
    prompts = [f"{a}+{b}=" for a in range(8) for b in range(2)]

    def reload():
        d = shm_tempdir("probe")
        write_safetensors(sd, d)
        llm.collective_rpc("v05_load_dir", args=(str(d),))
        shutil.rmtree(d)

    for _ in range(5):  # warm-up
        reload()
        llm.generate(prompts, sp, use_tqdm=False)
    out: dict = {}
    for phase in ("generate", "reload", "both"):
        t0, rss = time.time(), []
        for i in range(n):
            if phase != "generate":
                reload()
            if phase != "reload":
                llm.generate(prompts, sp, use_tqdm=False)
            if i % 5 == 0 or i == n - 1:
                rss.append((i, round(me.memory_info().rss / 2**20, 1)))
        out[phase] = rss
        print(f"{phase}: {time.time() - t0:.0f}s, RSS {rss[0][1]} -> {rss[-1][1]} MiB",
              flush=True)
    return out


if __name__ == "__main__":
    result = main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
    with open(os.environ.get("OUT", "/tmp/engine_probe.json"), "w") as f:
        json.dump(result, f)
    os._exit(0)  # no engine teardown: the numbers are out
