"""The published V0 prior (Qwen3-Embedding backbone + query adapter + TabPFN head), from local files.

Optional: nothing is downloaded. A user who has the files puts them under one directory
(option ``path``) in this layout, or names each one with the options of the same name:

    <path>/v_0_for_grpo_training.pt                            checkpoint   (V0 adapter / backbone)
    <path>/pretrained/tabpfn-v2.5-classifier-v2.5_default.ckpt  tabpfn_head  (TabPFN classifier)
    <path>/Qwen3-Embedding-0.6B/config.json                    embedding_model (a HF model dir,
    <path>/Qwen3-Embedding-0.6B/tokenizer.json                   with model.safetensors or
    <path>/Qwen3-Embedding-0.6B/model.safetensors                model.safetensors.index.json)

and installs the ``tabpfn`` package. Missing files raise ``V0FilesMissing`` naming each one.
This module imports no torch; the network lives in ``actors/priors/v0_model.py``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from actors.priors.base import (DEFAULT_PRIOR_MEAN, Context, EmbeddingCache, PriorBackend,
                                check_prob)

CHECKPOINT = "v_0_for_grpo_training.pt"
TABPFN_HEAD = "pretrained/tabpfn-v2.5-classifier-v2.5_default.ckpt"
EMBEDDING_MODEL = "Qwen3-Embedding-0.6B"
EMBEDDING_MODEL_FILES = ("config.json", "tokenizer.json")
EMBEDDING_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


class V0FilesMissing(FileNotFoundError):
    """The V0 backend's files are not all present; ``missing`` lists the absent paths."""

    def __init__(self, missing: list[str]):
        self.missing = missing
        listing = "\n  ".join(missing)
        super().__init__(
            f"the v0 prior needs local files that are missing:\n  {listing}\n"
            f"expected layout under the 'path' option: {CHECKPOINT}, {TABPFN_HEAD}, "
            f"{EMBEDDING_MODEL}/{{{', '.join(EMBEDDING_MODEL_FILES)}, {EMBEDDING_WEIGHTS[0]}}} "
            "(nothing is downloaded; use backend 'embedded' for the offline default)")


def resolve_v0_files(path: str | Path | None, checkpoint: str | Path | None = None,
                     tabpfn_head: str | Path | None = None,
                     embedding_model: str | Path | None = None) -> dict[str, Path]:
    """The three locations (explicit options win over the layout under ``path``)."""
    if path is None and None in (checkpoint, tabpfn_head, embedding_model):
        raise ValueError("the v0 prior needs option 'path' (a directory with the V0 files) "
                         "or all of 'checkpoint', 'tabpfn_head', 'embedding_model'")
    root = Path(path) if path is not None else Path(".")
    pick = lambda given, default: Path(given) if given is not None else root / default  # noqa: E731
    return {"checkpoint": pick(checkpoint, CHECKPOINT),
            "tabpfn_head": pick(tabpfn_head, TABPFN_HEAD),
            "embedding_model": pick(embedding_model, EMBEDDING_MODEL)}


def missing_v0_files(files: dict[str, Path]) -> list[str]:
    """Every expected file that is absent, as a path string (empty when all are there)."""
    missing = [str(files[k]) for k in ("checkpoint", "tabpfn_head") if not files[k].is_file()]
    emb = files["embedding_model"]
    missing += [str(emb / f) for f in EMBEDDING_MODEL_FILES if not (emb / f).is_file()]
    if not any((emb / f).is_file() for f in EMBEDDING_WEIGHTS):
        missing.append(str(emb / EMBEDDING_WEIGHTS[0]))
    return missing


class V0Prior(PriorBackend):
    """V0 as published: embed prompts, fit TabPFN in context on (embedding, score >= threshold),
    read P(class 1) for the queries. Context scores are binarized like V0's training labels.

    Options: ``path`` (or the three file options), ``device``, ``n_estimators`` (TabPFN
    ensemble), ``num_heads`` (adapter attention heads when the checkpoint does not say),
    ``threshold`` (label binarization), ``batch_size``, ``max_length`` (tokens),
    ``prior_mean`` (answer for an empty context; a one-class context gives its mean),
    ``cache_size`` (LRU embedding entries).
    """

    name = "v0"

    def __init__(self, path: str | None = None, checkpoint: str | None = None,
                 tabpfn_head: str | None = None, embedding_model: str | None = None,
                 device: str = "cpu", n_estimators: int = 4, num_heads: int = 3,
                 threshold: float = 0.5, batch_size: int = 8, max_length: int = 2048,
                 prior_mean: float = DEFAULT_PRIOR_MEAN, cache_size: int = 32768):
        self.files = resolve_v0_files(path, checkpoint, tabpfn_head, embedding_model)
        missing = missing_v0_files(self.files)
        if missing:
            raise V0FilesMissing(missing)
        try:
            import tabpfn  # noqa: F401
        except ImportError as e:
            raise ImportError("the v0 prior needs the 'tabpfn' package (pip install tabpfn); "
                              "its files are present") from e
        self.threshold = check_prob("threshold", threshold)
        self.prior_mean = check_prob("prior_mean", prior_mean)
        from actors.priors.v0_model import build_embedder, build_tabpfn
        self.embedder = build_embedder(self.files["checkpoint"], self.files["embedding_model"],
                                       device=device, num_heads=num_heads,
                                       batch_size=batch_size, max_length=max_length)
        self.tabpfn = build_tabpfn(self.files["tabpfn_head"], device, n_estimators)
        self._context = Context.empty()
        self._fitted_mean: float | None = None
        self.cache = EmbeddingCache(self.embedder.encode, cache_size)

    def _embed(self, prompts: Sequence[str]) -> np.ndarray:
        return self.cache.get(list(prompts))                                 # (n, 1008 or 1024)

    def set_context(self, context: Context) -> None:
        self._context = context
        self._fitted_mean = None
        if not len(context):
            return
        labels = (context.scores >= self.threshold).astype(np.int64)       # (N,)
        if labels.min() == labels.max():
            # TabPFN needs both classes; a one-class context says only its mean.
            self._fitted_mean = float(context.scores.mean())
            return
        self.tabpfn.fit(self._embed(context.prompts), labels)

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        if not len(self._context):
            return np.full(len(prompts), self.prior_mean)
        if self._fitted_mean is not None:
            return np.full(len(prompts), self._fitted_mean)
        proba = self.tabpfn.predict_proba(self._embed(prompts))                # (M, 2)
        return np.asarray(proba)[:, 1]
