"""Measure an embedded policy: accuracy greedy and sampled, pass@k, response lengths.

``python -m tasks.policy_eval [--task NAME]`` (also ``python -m tasks.policy``) builds or finds
the task's policy and prints, for its held-out problems: greedy accuracy, sampled accuracy
(T = 1, the mean of several samples per prompt, with its standard error over prompts), both
by difficulty; for train problems: pass@1 against pass@k; and the sampled response lengths.
Sampling runs on vLLM (CPU) in this process when it is installed, else on transformers'
``generate`` (``--backend``). Heavy imports are local.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks import DEFAULT_TASK, arithmetic, make_task
from tasks.base import Problem, Task


# ---- transformers' generate (tests of the arithmetic policy use these) ----------------------

def generate(model, tokenizer, prompts: Sequence[str], *, temperature: float = 0.0,
             max_new_tokens: int = 8, batch_size: int = 256) -> list[str]:
    """Completions (special tokens stripped) with transformers' ``generate``; greedy at T=0."""
    import torch

    tokenizer.padding_side = "left"  # decoder-only batch generation needs left padding
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(list(prompts[i:i + batch_size]), return_tensors="pt", padding=True,
                        add_special_tokens=False)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) \
            if temperature > 0 else dict(do_sample=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id, **sampling)
        new = gen[:, enc["input_ids"].shape[1]:]  # (B, <= max_new_tokens)
        out += tokenizer.batch_decode(new, skip_special_tokens=True)
    return out


def evaluate_accuracy(model_path: str | Path, problems: Sequence[Problem], *,
                      task: Task | None = None, temperature: float = 0.0, seed: int = 0,
                      max_new_tokens: int = 8) -> dict:
    """Fraction of ``problems`` solved (one completion each), overall and by difficulty.

    Returns ``{"overall": float, "by_difficulty": {level: float}, "unparsed": float}``.
    ``task`` scores the completions (default: arithmetic).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    task = task or arithmetic.ArithmeticTask()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    torch.manual_seed(seed)
    texts = generate(model, tokenizer, [p.prompt for p in problems],
                     temperature=temperature, max_new_tokens=max_new_tokens)
    scored = score(task, problems, [[t] for t in texts])
    return dict(overall=scored.accuracy, by_difficulty=scored.by_difficulty,
                unparsed=scored.unparsed)


# ---- samplers: n completions per prompt -> (texts, token counts) ----------------------------

def sample_hf(path: str | Path, prompts: Sequence[str], *, n: int, temperature: float,
              max_tokens: int, seed: int = 0, ids: Sequence[str] | None = None
              ) -> tuple[list[list[str]], list[list[int]]]:
    """One torch random stream (``seed``) over all the completions: independent across
    prompts, though not the evaluation's per-prompt seeds (``ids`` is unused)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(seed)
    flat = generate(model, tokenizer, [p for p in prompts for _ in range(n)],
                    temperature=temperature, max_new_tokens=max_tokens, batch_size=128)
    # One token per character, plus EOS when the completion ended by itself.
    lengths = [len(t) + (len(t) < max_tokens) for t in flat]
    return ([flat[i * n:(i + 1) * n] for i in range(len(prompts))],
            [lengths[i * n:(i + 1) * n] for i in range(len(prompts))])


class VllmSampler:
    """An in-process vLLM (CPU) engine, one thread: the generators' engine, without Ray."""

    def __init__(self, path: str | Path, max_model_len: int, seed: int = 0):
        # Before vLLM is imported: the engine in this process, on this process's one thread.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        self.llm = LLM(model=str(path), dtype="float32", max_model_len=max_model_len,
                       enforce_eager=True, seed=seed, max_num_seqs=256)

    def __call__(self, prompts: Sequence[str], *, n: int, temperature: float, max_tokens: int,
                 seed: int = 0, ids: Sequence[str] | None = None,
                 seeds: Sequence[Sequence[int]] | None = None
                 ) -> tuple[list[list[str]], list[list[int]]]:
        """``n`` completions of each prompt, one engine request each: completion i of prompt j
        is sampled with ``seeds[j][i]``, by default the evaluation's per-prompt seeds
        (``common.seeds.eval_seeds`` of the run ``seed`` and the problem ``ids``, the
        prompt texts when no ids are given), as the generators sample held-out answers."""
        from vllm import SamplingParams

        from common.seeds import eval_seeds

        prompts = list(prompts)
        if seeds is None:
            seeds = eval_seeds(seed, list(ids) if ids is not None else prompts, n)
        if len(seeds) != len(prompts) or any(len(row) != n for row in seeds):
            raise ValueError(f"seeds must be {len(prompts)} rows of {n}")
        params = [SamplingParams(n=1, temperature=temperature, max_tokens=max_tokens, seed=int(s))
                  for row in seeds for s in row]
        outs = self.llm.generate([p for p in prompts for _ in range(n)], params, use_tqdm=False)
        texts = [o.outputs[0].text for o in outs]
        lengths = [len(o.outputs[0].token_ids) for o in outs]
        return ([texts[j * n:(j + 1) * n] for j in range(len(prompts))],
                [lengths[j * n:(j + 1) * n] for j in range(len(prompts))])


# ---- scoring -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scored:
    """Completions of problems scored by a task. ``per_prompt``: each problem's success rate
    over its completions; ``accuracy``: their mean; ``se``: its standard error over prompts."""

    per_prompt: list[float]
    accuracy: float
    se: float
    by_difficulty: dict[int, float]
    unparsed: float


def score(task: Task, problems: Sequence[Problem], completions: Sequence[Sequence[str]]) -> Scored:
    r_hi = task.rewards[1]
    per, unparsed, total = [], 0, 0
    by: dict[int, list[float]] = {}
    for p, texts in zip(problems, completions, strict=True):
        verdicts = [task.score(p, t) for t in texts]
        rate = sum(v.reward == r_hi for v in verdicts) / len(verdicts)
        per.append(rate)
        by.setdefault(p.difficulty, []).append(rate)
        unparsed += sum(not v.parsed for v in verdicts)
        total += len(verdicts)
    acc = sum(per) / len(per)
    se = statistics.stdev(per) / math.sqrt(len(per)) if len(per) > 1 else float("nan")
    return Scored(per_prompt=per, accuracy=acc, se=se,
                  by_difficulty={d: sum(r) / len(r) for d, r in sorted(by.items())},
                  unparsed=unparsed / max(1, total))


def pass_at_k(per_prompt_correct: Sequence[int], n: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) from ``c`` correct of ``n`` samples per prompt."""
    def one(c: int) -> float:
        return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)
    return sum(one(c) for c in per_prompt_correct) / len(per_prompt_correct)


def length_stats(lengths: Sequence[int]) -> dict:
    s = sorted(lengths)
    med = statistics.median(s)
    p95 = s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]
    return dict(mean=statistics.fmean(s), median=med, p95=p95, max=s[-1],
                p95_over_median=p95 / med if med else float("inf"))


# ---- the report ----------------------------------------------------------------------------

def measure(path: str | Path, task: Task, *, max_tokens: int, n_heldout: int = 500,
            samples: int = 4, n_train: int = 200, k: int = 16, backend: str = "vllm",
            seed: int = 0) -> dict:
    """The numbers ``main`` prints, as a dict (see the module docstring)."""
    heldout = task.heldout()[:n_heldout]
    train = task.train()[:n_train]
    t0 = time.time()
    if backend == "vllm":
        longest = max(len(p.prompt) for p in heldout + train)
        sampler = VllmSampler(path, max_model_len=longest + max_tokens, seed=seed)
    else:
        def sampler(prompts, **kw):
            return sample_hf(path, prompts, **kw)
    kw = dict(max_tokens=max_tokens, seed=seed)
    held_ids, train_ids = [p.id for p in heldout], [p.id for p in train]
    greedy_txt, _ = sampler([p.prompt for p in heldout], n=1, temperature=0.0, ids=held_ids, **kw)
    sampled_txt, sampled_len = sampler([p.prompt for p in heldout], n=samples,
                                       temperature=1.0, ids=held_ids, **kw)
    train_txt, _ = sampler([p.prompt for p in train], n=k, temperature=1.0, ids=train_ids, **kw)
    greedy = score(task, heldout, greedy_txt)
    sampled = score(task, heldout, sampled_txt)
    on_train = score(task, train, train_txt)
    correct = [round(r * k) for r in on_train.per_prompt]
    spread = on_train.per_prompt
    return dict(
        backend=backend, sampling_seconds=round(time.time() - t0, 1),
        heldout=dict(prompts=len(heldout), greedy=greedy.accuracy, greedy_se=greedy.se,
                     greedy_by_difficulty=greedy.by_difficulty, greedy_unparsed=greedy.unparsed,
                     samples_per_prompt=samples, sampled=sampled.accuracy, sampled_se=sampled.se,
                     sampled_by_difficulty=sampled.by_difficulty,
                     sampled_unparsed=sampled.unparsed),
        train=dict(prompts=len(train), samples_per_prompt=k, pass_at_1=pass_at_k(correct, k, 1),
                   **{f"pass_at_{k}": pass_at_k(correct, k, k)},
                   by_difficulty=on_train.by_difficulty,
                   prompts_all_wrong=sum(r == 0 for r in spread) / len(spread),
                   prompts_all_right=sum(r == 1 for r in spread) / len(spread)),
        lengths=length_stats([n for per in sampled_len for n in per]))


def main(argv: Sequence[str] | None = None) -> None:
    from tasks.policy import ensure_default_policy, policy_recipe

    ap = argparse.ArgumentParser(prog="python -m tasks.policy", description=__doc__.split("\n")[0])
    ap.add_argument("--task", default=DEFAULT_TASK, help="task whose embedded policy to measure")
    ap.add_argument("--heldout", type=int, default=500, help="held-out prompts")
    ap.add_argument("--samples", type=int, default=4, help="samples per held-out prompt at T=1")
    ap.add_argument("--train-prompts", type=int, default=200, help="train prompts for pass@k")
    ap.add_argument("--k", type=int, default=16, help="samples per train prompt (pass@k)")
    ap.add_argument("--backend", choices=("vllm", "hf"), default=None,
                    help="sampler (default: vllm if installed, else hf)")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = ap.parse_args(argv)
    backend = args.backend or ("vllm" if _has_vllm() else "hf")

    t0 = time.time()
    path = ensure_default_policy(task=args.task)
    ready = time.time() - t0
    built = json.loads((path / "recipe.json").read_text())
    print(f"policy: {path}\n  ready in {ready:.1f}s; its warm start took "
          f"{built['train_seconds']}s")
    task = make_task(args.task, n_heldout=args.heldout)
    m = measure(path, task, max_tokens=policy_recipe(args.task).max_tokens,
                n_heldout=args.heldout, samples=args.samples, n_train=args.train_prompts,
                k=args.k, backend=backend)
    m.update(policy=str(path), task=args.task, warm_start_seconds=built["train_seconds"])
    _print_report(m, args.k)
    if args.json:
        args.json.write_text(json.dumps(m, indent=2))


def _print_report(m: dict, k: int) -> None:
    h, t, n = m["heldout"], m["train"], m["lengths"]

    def levels(d: dict) -> str:
        return "  ".join(f"L{lv}={a:.3f}" for lv, a in d.items())

    print(f"held-out, {h['prompts']} prompts ({m['backend']}, {m['sampling_seconds']}s):")
    print(f"  greedy   {h['greedy']:.3f} +- {h['greedy_se']:.3f}  {levels(h['greedy_by_difficulty'])}"
          f"  unparsed {h['greedy_unparsed']:.3f}")
    print(f"  sampled  {h['sampled']:.3f} +- {h['sampled_se']:.3f}  "
          f"{levels(h['sampled_by_difficulty'])}  unparsed {h['sampled_unparsed']:.3f}  "
          f"(T=1, mean of {h['samples_per_prompt']} per prompt)")
    print(f"train, {t['prompts']} prompts x {k} samples: pass@1 {t['pass_at_1']:.3f}  "
          f"pass@{k} {t[f'pass_at_{k}']:.3f}  {levels(t['by_difficulty'])}  "
          f"all wrong {t['prompts_all_wrong']:.3f}  all right {t['prompts_all_right']:.3f}")
    print(f"sampled response tokens: mean {n['mean']:.1f}  median {n['median']:.0f}  "
          f"p95 {n['p95']}  max {n['max']}  (p95/median {n['p95_over_median']:.2f})")


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


if __name__ == "__main__":
    main()
