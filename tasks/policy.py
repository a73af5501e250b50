"""The embedded default policy: a tiny char-level Llama warm-started on arithmetic.

No download: ``ensure_default_policy()`` builds it deterministically the first time (random
init of ``tasks.policy_model.build_config()``, then a short supervised warm start on the
arithmetic train split) and caches it under ``<cache>/policy/<recipe-hash>/``. The warm start
is deliberately short, so that held-out accuracy starts in a middle range that varies with
difficulty: RL then has signal to learn from and a prior has something to predict.

``python -m tasks.policy`` builds (or finds) it and prints held-out accuracy by difficulty.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from tasks import arithmetic
from tasks.base import Problem, Task
from tasks.policy_model import CHARS, DEFAULT_ARCH, EOS, PAD, SPECIALS, vocab


# Every constant that changes the built weights. Any change here (or in the architecture,
# vocabulary, difficulty levels or split) changes the hash, so the cache rebuilds. Bump
# `version` when the training code itself changes.
RECIPE = dict(
    version=1,
    seed=1,
    steps=1500,
    batch_size=64,
    lr=1e-3,
    min_lr=1e-4,
    warmup_steps=50,
    weight_decay=0.01,
    difficulties=[1, 2, 3, 4],
    # One thread: bitwise-reproducible on a given torch build, and much faster than two OpenMP
    # threads when the two cores are shared with other processes (measured 3-8x).
    threads=1,
)


def recipe_hash(recipe: dict = RECIPE) -> str:
    spec = dict(recipe=recipe, arch=DEFAULT_ARCH, vocab=SPECIALS + CHARS,
                levels={k: asdict(v) for k, v in arithmetic.LEVELS.items()},
                split=[arithmetic.SPLIT_SALT, arithmetic.HELDOUT_FRACTION])
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    # In the user's cache, not the checkout: `ray job submit --working-dir .` runs from a copy
    # of the repo, and the built policy should be found there too.
    return Path(os.environ.get("V05_CACHE") or Path.home() / ".cache" / "v05rl")


def ensure_default_policy(cache_dir: str | Path | None = None, *, recipe: dict | None = None,
                          log: Callable[[str], None] | None = None) -> Path:
    """Path of the cached default policy checkpoint, building it first if needed.

    Safe under concurrency: one caller builds while the others wait on a file lock, and the
    checkpoint appears atomically (built in a temporary directory, then renamed). ``recipe``
    overrides ``RECIPE`` (tests build tiny variants; the hash keeps them apart).
    """
    recipe = RECIPE if recipe is None else recipe
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / "policy" / recipe_hash(recipe)
    if (final / "recipe.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (final / "recipe.json").exists():  # another process built it while we waited
            return final
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            build_policy(tmp, recipe, log=log or _print)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _print(msg: str) -> None:
    print(f"[tasks.policy] {msg}", file=sys.stderr, flush=True)


def build_policy(out_dir: Path, recipe: dict = RECIPE,
                 log: Callable[[str], None] = _print) -> dict:
    """Random init + supervised warm start, saved to ``out_dir``. Returns the build stats."""
    import torch
    from transformers import LlamaForCausalLM

    from tasks.policy_model import build_config, build_tokenizer, save_policy

    threads = torch.get_num_threads()
    torch.set_num_threads(recipe["threads"])
    try:
        t0 = time.time()
        torch.manual_seed(recipe["seed"])
        model = LlamaForCausalLM(build_config())
        final_loss = warm_start(model, recipe, log)
        elapsed = time.time() - t0
    finally:
        torch.set_num_threads(threads)
    save_policy(model, build_tokenizer(), out_dir)
    stats = dict(recipe=recipe, recipe_hash=recipe_hash(recipe), final_loss=final_loss,
                 train_seconds=round(elapsed, 1))
    (out_dir / "recipe.json").write_text(json.dumps(stats, indent=2))  # written last: "complete"
    log(f"saved {out_dir} ({elapsed:.1f}s)")
    return stats


def encode_batch(problems: Sequence[Problem]):
    """Teacher-forcing tensors for prompt + answer + EOS, loss on the answer and EOS only.

    Returns input_ids, attention_mask, labels, each (B, T) with right padding; labels are
    -100 on the prompt and the padding.
    """
    import torch

    v = vocab()
    seqs, labels = [], []
    for p in problems:
        prompt = [v[c] for c in p.prompt]
        answer = [v[c] for c in p.answer] + [v[EOS]]
        seqs.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    t = max(map(len, seqs))
    ids = torch.tensor([s + [v[PAD]] * (t - len(s)) for s in seqs])
    lab = torch.tensor([s + [-100] * (t - len(s)) for s in labels])
    mask = (torch.arange(t)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]).long()
    return ids, mask, lab


def _lr_at(step: int, recipe: dict) -> float:
    """Linear warmup, then cosine decay from lr to min_lr."""
    if step < recipe["warmup_steps"]:
        return recipe["lr"] * (step + 1) / recipe["warmup_steps"]
    frac = (step - recipe["warmup_steps"]) / max(1, recipe["steps"] - recipe["warmup_steps"])
    return recipe["min_lr"] + 0.5 * (recipe["lr"] - recipe["min_lr"]) * (1 + math.cos(math.pi * frac))


def warm_start(model, recipe: dict, log: Callable[[str], None]) -> float:
    """AdamW with teacher forcing on the arithmetic train stream; returns the last loss."""
    import torch

    stream = arithmetic.train_stream(recipe["seed"], recipe["difficulties"])
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"],
                            weight_decay=recipe["weight_decay"])
    model.train()
    t0, loss_avg = time.time(), None
    for step in range(recipe["steps"]):
        ids, mask, labels = encode_batch([next(stream) for _ in range(recipe["batch_size"])])
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, recipe)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_avg = loss.item() if loss_avg is None else 0.9 * loss_avg + 0.1 * loss.item()
        if step % 100 == 0 or step == recipe["steps"] - 1:
            log(f"step {step + 1}/{recipe['steps']} loss {loss_avg:.3f} "
                f"elapsed {time.time() - t0:.1f}s")
    model.eval()
    return float(loss_avg)


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
    """Fraction of ``problems`` solved, overall and by difficulty.

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
    verdicts = [task.score(p, t) for p, t in zip(problems, texts)]
    solved: dict[int, list[bool]] = {}
    for p, v in zip(problems, verdicts):
        solved.setdefault(p.difficulty, []).append(v.reward == task.rewards[1])
    n = max(1, len(problems))
    return dict(overall=sum(sum(s) for s in solved.values()) / n,
                by_difficulty={d: sum(s) / len(s) for d, s in sorted(solved.items())},
                unparsed=sum(not v.parsed for v in verdicts) / n)


def main() -> None:
    t0 = time.time()
    path = ensure_default_policy()
    print(f"policy: {path} (ready in {time.time() - t0:.1f}s)")
    heldout = arithmetic.ArithmeticTask(n_heldout=200).heldout()  # 50 per level
    for temperature in (0.0, 1.0):
        acc = evaluate_accuracy(path, heldout, temperature=temperature)
        levels = "  ".join(f"L{d}={a:.2f}" for d, a in acc["by_difficulty"].items())
        print(f"held-out accuracy T={temperature:.0f}: overall={acc['overall']:.3f}  {levels}  "
              f"unparsed={acc['unparsed']:.3f}")


if __name__ == "__main__":
    main()
