"""The published V0 prior (Qwen3-Embedding backbone + query adapter + TabPFN head), from local files.

Optional: nothing is downloaded. A user who has the files puts them under one directory
(option ``path``) in this layout, or names each one with the options of the same name:

    <path>/v_0_for_grpo_training.pt                            checkpoint   (V0 adapter / backbone)
    <path>/pretrained/tabpfn-v2.5-classifier-v2.5_default.ckpt  tabpfn_head  (TabPFN classifier)
    <path>/Qwen3-Embedding-0.6B/config.json                    embedding_model (a HF model dir,
    <path>/Qwen3-Embedding-0.6B/tokenizer.json                   with model.safetensors or
    <path>/Qwen3-Embedding-0.6B/model.safetensors                model.safetensors.index.json)

and installs the ``tabpfn`` package (the ``v0`` extra; ``python -m cluster.install --gpu``
installs it). Missing files raise ``V0FilesMissing`` naming each one.

Where it runs: on the GPU its actor was given (see ``placement_device``), else the CPU; an
explicit ``device`` option wins. The head is pluggable (``head``, default ``"tabpfn"``;
``register_v0_head``) so that the whole load-and-predict path can be run on CPU with a tiny
stand-in when TabPFN's checkpoint is absent. This module imports no torch at import time; the
network lives in ``actors/priors/v0_model.py``.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from actors.priors.base import (DEFAULT_PRIOR_MEAN, BackendStats, Context, EmbeddingCache,
                                PriorBackend, PriorTraits, check_prob)

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


def placement_device(device: str | None = None, gpu_ids: Sequence | None = None,
                     cuda_available: bool | None = None) -> str:
    """The torch device a backend should use: an explicit ``device`` (anything but None or
    "auto") wins; else "cuda" when this process was given a GPU, else "cpu".

    "Given a GPU": Ray assigned this actor GPUs (``ray.get_gpu_ids()``, looked up only when
    Ray is already running in this process) or, outside Ray, torch sees a CUDA device. Ray
    sets ``CUDA_VISIBLE_DEVICES`` to the assigned GPUs (empty for an actor with ``num_gpus=0``),
    so the GPU such an actor sees is ``cuda`` (index 0). A GPU reserved for an actor whose torch
    has no CUDA raises rather than silently running on the CPU. ``gpu_ids`` and
    ``cuda_available`` are looked up when None (tests pass them).
    """
    if device not in (None, "auto"):
        return str(device)
    if gpu_ids is None:
        gpu_ids = _ray_gpu_ids()
    if cuda_available is None:
        import torch
        cuda_available = bool(torch.cuda.is_available())
    if gpu_ids and not cuda_available:
        raise RuntimeError(
            f"the prior actor was given GPU(s) {list(gpu_ids)} but torch has no CUDA here "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); install the GPU "
            "build (python -m cluster.install --gpu) or set the backend option device: cpu")
    return "cuda" if cuda_available else "cpu"


def _ray_gpu_ids() -> list:
    """GPUs Ray assigned this worker; [] outside a Ray worker (ray is never imported here)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    try:
        return list(ray.get_gpu_ids())
    except Exception:                      # a driver, or an API change: no assignment known
        return []


def default_dtype(device: str) -> str:
    """The backbone's dtype: bfloat16 on a GPU (as Qwen3-Embedding ships), float32 on a CPU
    (bfloat16 matmuls are slow or emulated there)."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"


DTYPES = ("float32", "bfloat16", "float16")

# The in-context classifier on V0 features: factory(path, device, n_estimators) -> an object
# with ``fit(X (N, F) float32, y (N,) int64)`` and ``predict_proba(X (M, F)) -> (M, 2)``.
_HEADS: dict[str, str | Callable] = {"tabpfn": "actors.priors.v0_model:build_tabpfn"}


def register_v0_head(name: str, factory: Callable | str) -> None:
    """Add a head for the ``head`` option (a factory, or "module:function"); name must be new."""
    if not name or name in _HEADS:
        raise ValueError(f"v0 head name {name!r} is empty or already registered")
    _HEADS[name] = factory


def _head_factory(name: str) -> Callable:
    """A registered head's factory, or a "module:function" named directly (from a config)."""
    if name not in _HEADS and ":" not in name:
        raise ValueError(f"unknown v0 head {name!r}; valid: {', '.join(sorted(_HEADS))} "
                         "or 'module:function'")
    factory = _HEADS.get(name, name)
    if isinstance(factory, str):
        module, attr = factory.split(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory


def missing_v0_files(files: dict[str, Path]) -> list[str]:
    """Every expected file that is absent, as a path string (empty when all are there)."""
    missing = [str(files[k]) for k in ("checkpoint", "tabpfn_head") if not files[k].is_file()]
    emb = files["embedding_model"]
    missing += [str(emb / f) for f in EMBEDDING_MODEL_FILES if not (emb / f).is_file()]
    if not any((emb / f).is_file() for f in EMBEDDING_WEIGHTS):
        missing.append(str(emb / EMBEDDING_WEIGHTS[0]))
    return missing


@dataclass(frozen=True)
class V0Stats(BackendStats):
    """The V0 prior's ``stats()``: its cache and fits, and where and how it runs."""

    device: str     # "cpu", "cuda", "cuda:1"
    dtype: str      # the backbone's
    head: str       # the in-context classifier's name


class V0Prior(PriorBackend):
    """V0 as published: embed prompts, fit TabPFN in context on (embedding, score >= threshold),
    read P(class 1) for the queries. Context scores are binarized like V0's training labels.

    Options: ``path`` (or the three file options), ``device`` (None / "auto": the GPU the
    actor was given, else the CPU; see ``placement_device``), ``dtype`` (the backbone's; None:
    ``default_dtype(device)``), ``head`` (the in-context classifier, "tabpfn"), ``n_estimators``
    (TabPFN ensemble), ``num_heads`` (adapter attention heads when the checkpoint does not
    say), ``threshold`` (label binarization), ``batch_size``, ``max_length`` (tokens),
    ``prior_mean`` (answer for an empty context; a one-class context gives its mean),
    ``cache_size`` (LRU embedding entries), ``threads`` (torch CPU threads; None: torch's).
    """

    name = "v0"
    # Scores each prompt by its embedding; a user's files, a 0.6B backbone and TabPFN (a GPU,
    # maybe) can fail or run late: ``fallback: auto`` gives it the embedded prior.
    traits = PriorTraits(scores_prompts=True, fallible=True)

    def __init__(self, path: str | None = None, checkpoint: str | None = None,
                 tabpfn_head: str | None = None, embedding_model: str | None = None,
                 device: str | None = None, dtype: str | None = None, head: str = "tabpfn",
                 n_estimators: int = 4, num_heads: int = 3,
                 threshold: float = 0.5, batch_size: int = 8, max_length: int = 2048,
                 prior_mean: float = DEFAULT_PRIOR_MEAN, cache_size: int = 32768,
                 threads: int | None = None):
        self.files = resolve_v0_files(path, checkpoint, tabpfn_head, embedding_model)
        missing = missing_v0_files(self.files)
        if missing:
            raise V0FilesMissing(missing)
        make_head = _head_factory(head)
        if head == "tabpfn":
            try:
                import tabpfn  # noqa: F401
            except ImportError as e:
                raise ImportError("the v0 prior needs the 'tabpfn' package (the 'v0' extra: "
                                  "python -m cluster.install --gpu, or pip install "
                                  "'v05rl[v0]'); its files are present") from e
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES} or None, got {dtype!r}")
        self.threshold = check_prob("threshold", threshold)
        self.prior_mean = check_prob("prior_mean", prior_mean)
        self.device = placement_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.head_name = head
        from actors.priors.v0_model import build_embedder
        if threads is not None:            # CPU threads of torch (the server passes its own)
            import torch
            torch.set_num_threads(int(threads))
        self.embedder = build_embedder(self.files["checkpoint"], self.files["embedding_model"],
                                       device=self.device, num_heads=num_heads,
                                       batch_size=batch_size, max_length=max_length,
                                       dtype=self.dtype)
        self.head = make_head(self.files["tabpfn_head"], self.device, n_estimators)
        self._context = Context.empty()
        self._fitted_mean: float | None = None
        self.cache = EmbeddingCache(self.embedder.encode, cache_size)  # times the encodes
        self.fit_s = 0.0
        self.n_fits = 0

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
        X = self._embed(context.prompts)                                    # (N, F)
        t0 = time.perf_counter()
        self.head.fit(X, labels)
        self.fit_s += time.perf_counter() - t0
        self.n_fits += 1

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        if not len(self._context):
            return np.full(len(prompts), self.prior_mean)
        if self._fitted_mean is not None:
            return np.full(len(prompts), self._fitted_mean)
        proba = np.asarray(self.head.predict_proba(self._embed(prompts)))     # (M, 2)
        if proba.ndim != 2 or proba.shape != (len(prompts), 2):
            raise RuntimeError(f"v0 head {self.head_name!r} returned probabilities of shape "
                               f"{proba.shape} for {len(prompts)} prompts, expected "
                               f"({len(prompts)}, 2)")
        return proba[:, 1]

    def stats(self) -> V0Stats:
        return V0Stats(cache=self.cache.stats(), fit_s=round(self.fit_s, 4), n_fits=self.n_fits,
                       device=self.device, dtype=self.dtype, head=self.head_name)
