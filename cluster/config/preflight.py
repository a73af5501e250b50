"""Checks of the model and the prompts before any actor starts: a clear error instead of a
failure deep inside an engine minutes later.

- the model directory holds a loadable Hugging Face config, weights (every shard its index
  names) and a loadable tokenizer (not just any directory with a config.json), and its
  architecture is one that the installed vLLM generates with, and ``optim.lora``'s target
  modules are linear layers of it;
- the tokenizer encodes every prompt (a sample of each split) to at least one token, with the
  chat template when the generators use it, without its unknown token (the model would not
  see those characters), and no prompt leaves less than one token for the response within
  ``generators.engine.max_model_len``.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import random
import sys
from functools import lru_cache
from pathlib import Path

# What transformers, vLLM and DeepSpeed load weights from: one file, or an index of shards.
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class PreflightError(ValueError):
    pass


def check_model(model_path: str, lora=None) -> None:
    """The directory is a model: its config loads, its weights are there, its tokenizer loads
    (offline); ``lora`` (``optim.lora``, a ``LoraSpec``), when given, targets layers of it."""
    from transformers import AutoConfig, AutoTokenizer

    def unusable(why: str) -> PreflightError:
        return PreflightError(f"model.path {model_path}: not a usable model ({why})")

    def load(what, loader):
        try:
            loader.from_pretrained(model_path, local_files_only=True)
        except Exception as err:  # noqa: BLE001 - transformers raises many kinds
            raise unusable(f"{what} does not load: {type(err).__name__}: "
                           f"{str(err)[:300]}") from None

    load("config", AutoConfig)
    unserved = _unserved_architecture(Path(model_path))
    if unserved:
        raise unusable(unserved)
    missing = _missing_weights(Path(model_path))
    if missing:
        raise unusable(missing)
    if not any((Path(model_path) / f).is_file() for f in _TOKENIZER_FILES):
        raise unusable(f"no tokenizer: none of {', '.join(_TOKENIZER_FILES)}")
    load("tokenizer", AutoTokenizer)
    if lora is not None:
        check_lora(model_path, lora)


def check_lora(model_path: str, spec) -> None:
    """``optim.lora``'s target modules are linear layers of the model (built on the meta
    device from its config: no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from learner.lora import check_targets

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(
            model_path, local_files_only=True))
    try:
        check_targets(model, spec)
    except ValueError as err:
        raise PreflightError(str(err)) from None


# The tables of vLLM's model registry that name a causal LM it can generate with: its own
# implementations and those it runs through its Transformers backend.
_VLLM_TABLES = ("_TEXT_GENERATION_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS",
                "_TRANSFORMERS_BACKEND_MODELS")


@lru_cache(maxsize=1)
def vllm_architectures() -> frozenset[str] | None:
    """The architecture names the installed vLLM generates with, read from its registry's
    source (importing vLLM takes 10-20 s on 2 cores; the launcher's preflight should not);
    None when vLLM or its registry is not where this version keeps it (the check is then
    skipped, and the engine's own start-up error stands)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    registry = Path(list(spec.submodule_search_locations)[0]) / "model_executor" / "models" \
        / "registry.py"
    try:
        tree = ast.parse(registry.read_text())
    except (OSError, SyntaxError):
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in _VLLM_TABLES for t in targets):
                names.update(k.value for k in node.value.keys
                             if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return frozenset(names) or None


def _unserved_architecture(path: Path) -> str | None:
    """Why vLLM would not serve the model in ``path`` (its config.json names no architecture,
    or one the installed vLLM has no causal-LM implementation of), or None."""
    try:
        archs = json.loads((path / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError):
        return None  # the config's own loader has already passed; nothing more to say
    if not archs:
        return "config.json names no architecture ('architectures'), so vLLM cannot pick one"
    known = vllm_architectures()
    if known is None or any(a in known for a in archs):
        return None
    return (f"architecture {', '.join(archs)} is not one the installed vLLM generates with "
            f"(its registry lists {len(known)}, e.g. LlamaForCausalLM, Qwen3ForCausalLM)")


def _missing_weights(path: Path) -> str | None:
    """Why the weights cannot load (none there, or shards that the index names missing), or
    None when they are all there."""
    if any((path / f).is_file() for f in _WEIGHTS):
        return None
    for index in _INDEXES:
        if (path / index).is_file():
            try:
                shards = sorted(set(json.loads((path / index).read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                return f"{index} is not a weight index ({type(err).__name__}: {err})"
            gone = [s for s in shards if not (path / s).is_file()]
            if gone:
                return (f"{len(gone)} of the {len(shards)} weight shards that {index} names are "
                        f"missing: {', '.join(gone[:3])}{', ...' if len(gone) > 3 else ''} "
                        "(an interrupted download?)")
            return None
    return f"no weights: none of {', '.join(_WEIGHTS + _INDEXES)}"


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
                out = render_prompt(tok, p.prompt, engine.prompt_format, engine.system_prompt,
                                    p.messages)
                ids = out if isinstance(out, list) else tok(out, add_special_tokens=True)["input_ids"]
            except Exception as err:  # noqa: BLE001
                raise PreflightError(f"the tokenizer cannot encode {split} prompt {p.id!r} "
                                     f"({p.prompt[:80]!r}): {type(err).__name__}: {err}") from None
            if not ids:
                raise PreflightError(f"the tokenizer encodes {split} prompt {p.id!r} "
                                     f"({p.prompt[:80]!r}) to no token at all")
            if tok.unk_token_id is not None and tok.unk_token_id in ids:
                raise PreflightError(f"the tokenizer cannot encode {split} prompt {p.id!r} "
                                     f"({p.prompt[:80]!r}): {_unknown_pieces(tok, p.prompt)}")
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


def _unknown_pieces(tok, text: str) -> str:
    """Which parts of ``text`` the tokenizer maps to its unknown token (a fast tokenizer says
    where each token came from), for the error message."""
    unk = tok.unk_token_id
    pieces: list[str] = []
    if getattr(tok, "is_fast", False):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]):
            if i == unk and text[a:b] not in pieces:
                pieces.append(text[a:b])
    if not pieces:  # a slow tokenizer, or the unknown token came from the template
        return (f"it holds the unknown token {tok.unk_token!r} (from the prompt, the chat "
                "template or generators.engine.system_prompt)")
    shown = ", ".join(repr(x) for x in pieces[:8]) + (", ..." if len(pieces) > 8 else "")
    return (f"{shown} map to the unknown token {tok.unk_token!r} (the model would not see "
            "them); use a tokenizer that covers them, or clean the dataset")
