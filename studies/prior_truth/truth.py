"""Near-true success rates: many sampled responses of one snapshot's weights per prompt, on an
in-process vLLM engine (the generators' engine, without Ray), scored by the task's verifier."""
from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np


def sample_truth(path: str, task, problems: Sequence, n: int, max_tokens: int,
                 temperature: float = 1.0, seed: int = 0, engine=None) -> tuple[np.ndarray, dict]:
    """Correct answers among ``n`` samples of each problem, (len(problems),) ints, and how
    long it took. One engine per call, dropped at the end. ``engine``: the run's generator
    settings (``GeneratorConfig``), whose ``prompt_format`` and ``system_prompt`` say how a
    prompt reaches the model (its chat template or the raw text), as the generators send it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from actors.engine_config import GeneratorConfig
    from actors.generator import render_prompt
    from common.seeds import eval_seed_base

    engine = engine or GeneratorConfig(prompt_format="raw")
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(path))
    inputs = []
    for p in problems:
        out = render_prompt(tok, p.prompt, engine.prompt_format, engine.system_prompt, p.messages)
        inputs.append({"prompt_token_ids": out} if isinstance(out, list) else out)
    longest = max(len(x["prompt_token_ids"]) if isinstance(x, dict)
                  else len(tok(x)["input_ids"]) + 1 for x in inputs)
    # No chunked prefill: vLLM-CPU fails a seeded request whose prefill is split
    # (actors/engine.py says more).
    llm = LLM(model=str(path), dtype="float32", max_model_len=longest + max_tokens + 8,
              enforce_eager=True, seed=seed, max_num_seqs=256, enable_chunked_prefill=False)
    t1 = time.time()
    params = [SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens,
                             seed=eval_seed_base(seed, p.id)) for p in problems]
    outs = llm.generate(inputs, params, use_tqdm=False)
    hi = task.rewards[1]
    correct = np.array([sum(task.score(p, c.text).reward == hi for c in o.outputs)
                        for p, o in zip(problems, outs)], dtype=int)
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    del llm
    return correct, {"engine_start_s": round(t1 - t0, 1), "sampling_s": round(time.time() - t1, 1),
                     "tokens": tokens}
