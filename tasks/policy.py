"""The embedded policies: tiny char-level Llamas warm-started on a task, built offline.

No download: ``ensure_default_policy(task=...)`` builds a task's policy deterministically the
first time (random init of ``tasks.policy_model.build_config(**arch)``, then a short
supervised warm start) and caches it under ``<cache>/policy/<recipe-hash>/``. ``POLICIES``
maps a task name to its recipe; without ``task`` the default task's (``tasks.DEFAULT_TASK``,
the stepwise reasoning task of ``tasks/stepwise_policy.py``) is built. The arithmetic policy
(``tasks/arithmetic_policy.py``) answers bare arithmetic in 2-5 tokens.

Each warm start is deliberately imperfect, so that sampled accuracy starts in a middle range
that varies with difficulty: RL then has signal to learn from and a prior has something to
predict.

``python -m tasks.policy [--task NAME]`` builds (or finds) a policy and measures it: the same
command as ``python -m tasks.policy_eval`` (``tasks/policy_eval.py``, which imports this
module; this one never imports it).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks import DEFAULT_TASK, arithmetic, arithmetic_policy, stepwise, stepwise_policy
from tasks.policy_model import CHARS, SPECIALS


@dataclass(frozen=True)
class PolicyRecipe:
    """How one task's embedded policy is built.

    ``recipe``: the training constants (hashed; ``ensure_default_policy(recipe=...)``
    replaces them); ``arch``: ``build_config`` overrides; ``facts``: the task's definition
    that the weights depend on (levels, split, trace format; hashed); ``warm_start(model,
    recipe, log) -> final loss``; ``max_tokens``: the response budget a generator should
    allow this policy.
    """

    task: str
    recipe: dict
    arch: dict
    facts: Callable[[], dict]
    warm_start: Callable
    max_tokens: int


def _registered(module, task: str) -> PolicyRecipe:
    return PolicyRecipe(task=task, recipe=module.RECIPE, arch=module.ARCH, facts=module.facts,
                        warm_start=module.warm_start, max_tokens=module.MAX_TOKENS)


ARITHMETIC = _registered(arithmetic_policy, arithmetic.ArithmeticTask.name)
STEPWISE = _registered(stepwise_policy, stepwise.StepwiseTask.name)
POLICIES: dict[str, PolicyRecipe] = {p.task: p for p in (ARITHMETIC, STEPWISE)}


def policy_recipe(task: str | None = None) -> PolicyRecipe:
    """The registered recipe of ``task`` (default: ``tasks.DEFAULT_TASK``)."""
    task = DEFAULT_TASK if task is None else task
    if task not in POLICIES:
        raise ValueError(f"no embedded policy for task {task!r}; tasks with one: {sorted(POLICIES)}")
    return POLICIES[task]


def recipe_hash(recipe: dict | None = None, *, task: str | None = None) -> str:
    """The cache key of ``task``'s policy built with ``recipe`` (default: the registered one)."""
    pr = policy_recipe(task)
    recipe = pr.recipe if recipe is None else recipe
    # The arithmetic spec is the one of the single-policy days, so its cached builds stay valid.
    spec = dict(recipe=recipe, arch=pr.arch, vocab=SPECIALS + CHARS, **pr.facts())
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    # In the user's cache, not the checkout: `ray job submit --working-dir .` runs from a copy
    # of the repo, and the built policy should be found there too.
    return Path(os.environ.get("V05_CACHE") or Path.home() / ".cache" / "v05rl")


def ensure_default_policy(cache_dir: str | Path | None = None, *, task: str | None = None,
                          recipe: dict | None = None,
                          log: Callable[[str], None] | None = None) -> Path:
    """Path of ``task``'s cached embedded policy checkpoint, building it first if needed.

    ``task`` defaults to ``tasks.DEFAULT_TASK``; the path is
    ``<cache_dir or $V05_CACHE or ~/.cache/v05rl>/policy/<recipe_hash(recipe, task=task)>``.
    Safe under concurrency: one caller builds while the others wait on a file lock, and the
    checkpoint appears atomically (built in a temporary directory, then renamed). ``recipe``
    replaces the registered recipe (tests build tiny variants; the hash keeps them apart).
    """
    pr = policy_recipe(task)
    recipe = pr.recipe if recipe is None else recipe
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / "policy" / recipe_hash(recipe, task=pr.task)
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
            build_policy(tmp, recipe, task=pr.task, log=log or _print)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _print(msg: str) -> None:
    print(f"[tasks.policy] {msg}", file=sys.stderr, flush=True)


def build_policy(out_dir: Path, recipe: dict | None = None, *, task: str | None = None,
                 log: Callable[[str], None] = _print) -> dict:
    """Random init + supervised warm start of ``task``'s policy, saved to ``out_dir``.
    Returns the build stats (also written to ``recipe.json``, last: the build is complete)."""
    import torch
    from transformers import LlamaForCausalLM

    from tasks.policy_model import build_config, build_tokenizer, save_policy

    pr = policy_recipe(task)
    recipe = pr.recipe if recipe is None else recipe
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe["threads"])
    try:
        t0 = time.time()
        torch.manual_seed(recipe["seed"])
        model = LlamaForCausalLM(build_config(**pr.arch))
        final_loss = pr.warm_start(model, recipe, log)
        elapsed = time.time() - t0
    finally:
        torch.set_num_threads(threads)
    save_policy(model, build_tokenizer(pr.arch["max_position_embeddings"]), out_dir)
    stats = dict(task=pr.task, recipe=recipe, recipe_hash=recipe_hash(recipe, task=pr.task),
                 final_loss=final_loss, train_seconds=round(elapsed, 1),
                 max_tokens=pr.max_tokens)
    (out_dir / "recipe.json").write_text(json.dumps(stats, indent=2))  # written last: "complete"
    log(f"saved {out_dir} ({elapsed:.1f}s)")
    return stats


if __name__ == "__main__":
    # ``python -m tasks.policy`` is another name for ``python -m tasks.policy_eval``, run as
    # that script rather than imported: the measurement imports this module, not the reverse.
    import runpy

    runpy.run_module("tasks.policy_eval", run_name="__main__", alter_sys=True)
