"""The embedded prior, the default backend: the window's prompts seen through a few views
(the offline MiniLM sentence embedding, encoder.py; hashed n-grams and surface magnitudes,
views.py), an in-context kernel ridge fitted on them (kernel.py), the view searched for by
leave-one-out or evidence and kept while the window stays much the same.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from actors.priors.base import (DEFAULT_PRIOR_MEAN, BackendStats, Context, EmbeddingCache,
                                PriorBackend, PriorTraits, check_halflife, check_prob)
from actors.priors.embedded.encoder import SentenceEncoder
from actors.priors.embedded.history import FORMS
from actors.priors.embedded.kernel import (FitSettings, Fitted, fit_context, log_length,
                                           predict_fitted)
from actors.priors.embedded.link import LINKS
from actors.priors.embedded.views import SURFACE_NUMBERS, VIEWS, hashed_ngrams, surface_features

# A window smaller than this is searched over every view at every fit (``reselect``): its
# eigendecompositions are cheap (N^3), and a small window's best view moves most.
FULL_SEARCH_BELOW = 128
NO_VIEW = ""  # a full search chose the constant model: until the reselect, no view is fitted


@dataclass(frozen=True)
class EmbeddedStats(BackendStats):
    """The embedded prior's ``stats()``: its cache and fits, and the model it predicts with."""

    n_view_searches: int        # fits that searched every view (the others fit the chosen one)
    model: str | None           # each link's fitted model, " | "-joined (None before a fit)
    loo_mse: float | None       # the first link's leave-one-out error (None: none, or not finite)
    const_loo_mse: float | None  # the constant model's, on the same window


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
        self.prior_mean = check_prob("prior_mean", prior_mean)
        if not 0.0 <= float(eps) < 0.5:
            raise ValueError(f"eps must lie in [0, 0.5), got {eps!r}")
        self.eps = float(eps)
        self.use_length = bool(use_length)
        self.views = (views,) if isinstance(views, str) else tuple(views)
        if not self.views or any(v not in VIEWS for v in self.views):
            raise ValueError(f"views must be a non-empty subset of {VIEWS}, got {views!r}")
        if same_prompt not in (True, False, "level"):
            raise ValueError(f"same_prompt must be true, false or 'level', got {same_prompt!r}")
        self.same_prompt = same_prompt
        weighting = {True: "count", "count": "count", "variance": "variance", False: None}
        if weigh_rollouts not in weighting:
            raise ValueError(f"weigh_rollouts must be true, false, 'variance' or 'count', got "
                             f"{weigh_rollouts!r}")
        self.weigh_rollouts = weighting[weigh_rollouts] is not None
        if not 0.0 <= float(reselect) <= 1.0:
            raise ValueError(f"reselect must lie in [0, 1], got {reselect!r}")
        self.reselect = float(reselect)
        if columns not in ("selected", "all"):
            raise ValueError(f"columns must be 'selected' or 'all', got {columns!r}")
        if link not in LINKS:
            raise ValueError(f"link must be one of {LINKS}, got {link!r}")
        # How each window is fitted, per scale ("average": both, their predictions averaged).
        # The surface view's few magnitudes go without the time decay, and are narrowed to
        # the columns that predict (columns: selected).
        self.fit_settings = {one: FitSettings(
            halflife=check_halflife(halflife), prior_mean=self.prior_mean,
            prior_strength=float(prior_strength), drift=bool(drift), lead=float(lead),
            kernels=(kernels,) if isinstance(kernels, str) else tuple(kernels),
            weighting=weighting[weigh_rollouts] or "count", select=select,
            undecayed=("surface",), selected=("surface",) if columns == "selected" else (),
            history_forms=("level",) if same_prompt == "level" else FORMS, link=one)
            for one in (("identity", "logit") if link == "average" else (link,))}
        self.links = tuple(self.fit_settings)
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
        fit = fit_context(views, ctx.scores, ctx.ages,
                          loglen=log_length(prompts) if self.use_length else None,
                          ids=self._ids(prompts) if self.same_prompt else None,
                          counts=ctx.counts if self.weigh_rollouts else None,
                          settings=self.fit_settings[link])
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

    def stats(self) -> EmbeddedStats:
        fit = self._fits.get(self.links[0])
        return EmbeddedStats(
            cache=self.cache.stats(), fit_s=round(self.fit_s, 4), n_fits=self.n_fits,
            n_view_searches=self.n_view_searches,
            model=" | ".join(f.label() + ("" if k == "identity" else f" ({k})")
                             for k, f in self._fits.items()) if fit else None,
            loo_mse=_finite(fit.loo_mse) if fit else None,
            const_loo_mse=_finite(fit.const_loo_mse) if fit else None)


def _finite(x: float) -> float | None:
    return round(x, 6) if np.isfinite(x) else None
