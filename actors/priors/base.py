"""The prior backend interface, the constant baseline, and a bounded LRU embedding cache.

No torch / sentence-transformers import here: the registry and the constant backend must load
in milliseconds (``python -m actors.priors --help``, unit tests).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

DEFAULT_PRIOR_MEAN = 0.5


@dataclass(frozen=True)
class Context:
    """The in-context profile of the current policy, as the server hands it to a backend.

    ``prompts`` (N,), ``scores`` (N,) observed success rates in [0, 1], ``ages`` (N,) how many
    policy versions ago each score was observed (0 = the newest version seen), oldest first;
    ``counts`` (N,) the rollouts behind each score (None: one each, or unknown). A score from 16
    rollouts is four times as precise as one from 4 (binomial variance p(1 - p) / n).
    """

    prompts: tuple[str, ...]
    scores: np.ndarray
    ages: np.ndarray
    counts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def empty(cls) -> "Context":
        return cls((), np.zeros(0), np.zeros(0))


@dataclass(frozen=True)
class PriorTraits:
    """What the server and the config check need to know of a backend, declared by the
    backend itself (its class attribute ``traits``) rather than known by its name elsewhere.

    ``scores_prompts``: it tells prompts apart before any of their rollouts (admission by
    selection, ``algo.select: prior``, needs that; a mean for every prompt does not).
    ``fallible``: it may raise, answer garbage or run past the server's budget (a model loaded
    from files, a fit that grows with the window), so the server's ``fallback: auto`` gives it
    the embedded prior to answer for it (``actors/priors/server.py``; never itself).

    Whether a backend takes the server's CPU threads is not declared here: it is whether its
    constructor has a ``threads`` option (``actors.priors.takes_threads``).
    """

    scores_prompts: bool = True
    fallible: bool = True


@dataclass(frozen=True)
class CacheStats:
    """An ``EmbeddingCache``'s counters (``EmbeddingCache.stats``, ``BackendStats.cache``)."""

    entries: int          # texts held
    hits: int             # texts looked up and found
    misses: int           # texts looked up and encoded
    encode_s: float       # seconds spent encoding them


@dataclass(frozen=True)
class BackendStats:
    """What a backend reports of itself (``PriorBackend.stats``; the server's
    ``PriorStats.backend_stats``): its embeddings' cache and its context fits. A backend with
    more to say declares a record that extends this one (``EmbeddedStats``, ``V0Stats``); one
    with nothing to say (the constant prior) reports None.

    ``to_dict``: flat, under the names a results file has carried (bench.prior's prior.json:
    ``cache_entries``, ``cache_hits``, ``cache_misses``, ``encode_s``, then the other fields).
    """

    cache: CacheStats
    fit_s: float          # seconds spent fitting contexts
    n_fits: int           # contexts fitted

    def to_dict(self) -> dict:
        c = self.cache
        return {"cache_entries": c.entries, "cache_hits": c.hits, "cache_misses": c.misses,
                "encode_s": c.encode_s,
                **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "cache"}}


class PriorBackend(ABC):
    """Predicts p(x) = P(current policy solves x) for a batch of prompts from a ``Context``.

    The server calls ``set_context`` whenever its window changed since the last prediction and
    then ``predict``; a backend may fit once per context and reuse the fit across predictions.
    """

    name: str = "backend"
    traits: ClassVar[PriorTraits] = PriorTraits()

    @abstractmethod
    def set_context(self, context: Context) -> None:
        """Replace the in-context profile."""

    @abstractmethod
    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        """Success probabilities (len(prompts),), float; the server validates and clips them."""

    def stats(self) -> BackendStats | None:
        """This backend's own counters for the server's ``stats()`` (None: it keeps none)."""
        return None


def check_prob(name: str, value: float) -> float:
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return v


def recency_weights(ages: np.ndarray, halflife: float | None) -> np.ndarray:
    """w_i = 0.5 ** (age_i / halflife); ages are in policy versions, >= 0. None: all ones.
    (Every backend that discounts old observations weighs them so: the constant one here, the
    embedded one in its fit.)"""
    ages = np.asarray(ages, dtype=np.float64)
    if halflife is None or not np.isfinite(halflife):
        return np.ones_like(ages)
    return np.power(0.5, np.maximum(ages, 0.0) / float(halflife))


def check_halflife(halflife) -> float | None:
    if halflife is None:
        return None
    h = float(halflife)
    if not h > 0:
        raise ValueError(f"halflife must be > 0 versions (or None for no recency weighting), got {halflife!r}")
    return h


class ConstantPrior(PriorBackend):
    """The context's (recency-weighted) mean success rate for every prompt: AUC 0.5 by design."""

    name = "constant"
    # One number for every prompt (selection cannot run on it); a weighted mean cannot fail.
    traits = PriorTraits(scores_prompts=False, fallible=False)

    def __init__(self, prior_mean: float = DEFAULT_PRIOR_MEAN, halflife: float | None = None):
        self.prior_mean = check_prob("prior_mean", prior_mean)
        self.halflife = check_halflife(halflife)
        self._mean = self.prior_mean

    def set_context(self, context: Context) -> None:
        if len(context) == 0:
            self._mean = self.prior_mean
            return
        w = recency_weights(context.ages, self.halflife)
        self._mean = float(w @ context.scores / w.sum())

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        return np.full(len(prompts), self._mean)


class EmbeddingCache:
    """Bounded LRU map prompt text -> embedding (d,), filled in batches by ``encode``.

    ``encode(texts) -> (len(texts), d)`` is called once per ``get`` with the distinct misses;
    ``encode_s`` sums the seconds spent in it. Both embedding backends cache through one.
    """

    def __init__(self, encode: Callable[[list[str]], np.ndarray], capacity: int = 32768):
        if int(capacity) < 1:
            raise ValueError(f"cache_size must be >= 1, got {capacity!r}")
        self._encode = encode
        self.capacity = int(capacity)
        self._store: OrderedDict[str, np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.encode_s = 0.0

    def stats(self) -> CacheStats:
        """The counters a backend's ``stats()`` reports for its embeddings."""
        return CacheStats(entries=len(self), hits=self.hits, misses=self.misses,
                          encode_s=round(self.encode_s, 4))

    def __len__(self) -> int:
        return len(self._store)

    def get(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings (len(texts), d) in order; encodes each distinct uncached text once."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._store))
        self.misses += len(missing)
        self.hits += len(texts) - len(missing)
        fresh = {}
        if missing:
            t0 = time.perf_counter()
            emb = np.asarray(self._encode(missing))
            self.encode_s += time.perf_counter() - t0
            if emb.shape[0] != len(missing):
                raise RuntimeError(f"encoder returned {emb.shape[0]} rows for {len(missing)} texts")
            fresh = dict(zip(missing, emb))
        rows = []
        for t in texts:
            v = fresh.get(t)
            if v is None:
                v = self._store[t]
                self._store.move_to_end(t)
            rows.append(v)
        for t, v in fresh.items():
            self._store[t] = v
            self._store.move_to_end(t)
        while len(self._store) > self.capacity:
            self._store.popitem(last=False)
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)
