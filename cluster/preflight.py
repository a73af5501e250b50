"""Checks of the model and the prompts before any actor starts: a clear error instead of a
failure deep inside an engine minutes later.

- the model directory holds a loadable Hugging Face config and tokenizer (not just any
  directory with a config.json);
- the tokenizer encodes every prompt (a sample of each split) to at least one token, with the
  chat template when the generators use it, and no prompt leaves less than one token for the
  response within ``generators.engine.max_model_len``.
"""
from __future__ import annotations

import random
import sys


class PreflightError(ValueError):
    pass


def check_model(model_path: str) -> None:
    """The directory is a model: its config and tokenizer load (offline)."""
    from transformers import AutoConfig, AutoTokenizer

    for what, load in (("config", AutoConfig), ("tokenizer", AutoTokenizer)):
        try:
            load.from_pretrained(model_path, local_files_only=True)
        except Exception as err:  # noqa: BLE001 - transformers raises many kinds
            raise PreflightError(f"model.path {model_path}: not a usable model ({what} does not "
                                 f"load: {type(err).__name__}: {str(err)[:300]})") from None


def check_prompts(model_path: str, task, engine, max_tokens: int, sample: int = 256,
                  seed: int = 0) -> int:
    """Encode a sample of each split's prompts as the generators will; returns the longest
    prompt in tokens. Raises PreflightError naming the first prompt that fails."""
    from transformers import AutoTokenizer

    from actors.generator import render_prompt

    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    longest = 0
    for split, problems in (("train", task.train()), ("held-out", task.heldout())):
        if not problems:
            raise PreflightError(f"task {task.name}: the {split} split has no prompt")
        rng = random.Random(seed)
        picked = problems if len(problems) <= sample else rng.sample(problems, sample)
        for p in picked:
            try:
                out = render_prompt(tok, p.prompt, engine.prompt_format, engine.system_prompt)
                ids = out if isinstance(out, list) else tok(out, add_special_tokens=True)["input_ids"]
            except Exception as err:  # noqa: BLE001
                raise PreflightError(f"the tokenizer cannot encode {split} prompt {p.id!r} "
                                     f"({p.prompt[:80]!r}): {type(err).__name__}: {err}") from None
            if not ids:
                raise PreflightError(f"the tokenizer encodes {split} prompt {p.id!r} "
                                     f"({p.prompt[:80]!r}) to no token at all")
            longest = max(longest, len(ids))
            if len(ids) + 1 > engine.max_model_len:
                raise PreflightError(
                    f"{split} prompt {p.id!r} has {len(ids)} tokens: no room for a response "
                    f"within generators.engine.max_model_len={engine.max_model_len}")
    if longest + max_tokens > engine.max_model_len:
        print(f"warning: the longest prompt ({longest} tokens) + rollout.max_tokens "
              f"({max_tokens}) exceeds generators.engine.max_model_len "
              f"({engine.max_model_len}); such responses stop early", file=sys.stderr, flush=True)
    return longest
