"""What identifies a model's files on a node, so that every role of a run can be checked to
load the same model (``model.path`` resolves on each node: a different copy, an older
checkpoint or a half-synced directory on one of them would train and generate with different
weights without a word). Pure standard library; reads no weights."""
from __future__ import annotations

import hashlib
from pathlib import Path

# The files whose content identifies the model (small); weights are identified by name and size
CONTENT = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
WEIGHTS = (".safetensors", ".bin", ".pt")


def fingerprint(model_path: str | Path) -> str:
    """A short digest of the model directory: its small config and tokenizer files' content,
    and each weight file's name and size."""
    root = Path(model_path)
    h = hashlib.sha256()
    for name in CONTENT:
        f = root / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    for f in sorted(p for p in root.iterdir() if p.suffix in WEIGHTS and p.is_file()):
        h.update(f"{f.name}:{f.stat().st_size}\0".encode())
    return h.hexdigest()[:16]


def check_same_model(reports: list[tuple[str, str, str]], model_path: str) -> None:
    """``reports``: (role, node, fingerprint) of every role that loaded the model; RuntimeError
    naming the roles and nodes when they do not all see the same files at ``model_path``."""
    found: dict[str, list[str]] = {}
    for role, node, fp in reports:
        found.setdefault(fp, []).append(f"{role} on {node}")
    if len(found) > 1:
        groups = "; ".join(f"{', '.join(who)} ({fp})" for fp, who in found.items())
        raise RuntimeError(f"model.path {model_path} is not the same model on every node: "
                           f"{groups}. Copy the same files to every node (docs/cluster.md)")
