"""In-context success-rate regression on prompt embeddings: pure NumPy, no torch.

Given a context of N prompts (unit-norm embeddings X, shape (N, d)), their observed success
rates y (N,) and recency weights w (N,), predict the success rate of new prompts. The model is
weighted kernel ridge regression on the residual y - m around the (weighted, slightly shrunk)
context mean m:

    K = B * T + g^2 l l^T      B: base kernel on embeddings, l: standardized log length,
                               T_ij = 0.5 ** (|age_i - age_j| / halflife): time decay
    f(q) = m + K(q, X) @ alpha,        alpha = D (D K D + lam I)^-1 D (y - m),   D = diag(sqrt(w))

Recency enters twice, with one ``halflife`` (in policy versions): the weights
w_i = 0.5 ** (age_i / halflife) make the mean and the LOO criterion follow the current policy,
and the time-decay factor T (a product kernel, still positive semi-definite) discounts what an
old observation says about a prompt now (a query is at age 0), however closely it matches:
weights alone cannot do that when lam is small, since ridge then interpolates every point.

The length weight g and the ridge lam are chosen per context by exact weighted leave-one-out
error, against the constant model f = m, which is always a candidate: a context whose
embeddings carry no signal falls back to its mean. One eigendecomposition of D B D serves every
(g, lam): the rank-1 length term enters through Sherman-Morrison. With M = (D K D + lam I)^-1
and yt = D (y - m), the LOO residual of point i is (M yt)_i / M_ii (already sqrt(w_i)-scaled).
With ``select="evidence"`` (the embedded prior's default) the candidates are ranked instead by
their Gaussian-process evidence, the scores' sampling noise known from their rollout counts
(``neg_log_evidence``, from the same eigendecomposition).

**Drift** (``drift=True``): the policy moves while the window fills, so an observation made
``age`` versions ago understates (or overstates) what the policy does now, and a recency-
weighted mean lags the policy by about the window's mean age times its rate of change. The
kernel then gains a linear term in age, K += g_a^2 a a^T (a: standardized age), with g_a
chosen by the same leave-one-out error (0 among the choices: no drift), so that the trend
and the prompts' difficulty are fitted together (an age trend fitted alone would also pick
up which prompts finish first: the easy, short ones), and a query is predicted ``lead``
versions past the newest observation (the newest scores were generated a version or so
before the version that is asked about). The constant model's candidate becomes a weighted
linear trend on age when that wins leave-one-out.

**Views.** ``X`` may be several feature views of the same prompts (a dict: the sentence
embedding, hashed character n-grams that see the prompt's literal tokens, both
concatenated, a few surface magnitudes). The choice is made in two stages to keep the cost
near one view's: every view and base kernel without the age term, then the age weights on
the best of them. A view in ``undecayed`` goes without T: one coefficient per feature over
the whole window (a step count costs the same at version 3 as at 20); the age term moves it.
A view in ``selected`` keeps only the columns that forward selection by leave-one-out chooses
on the window (``columns.py``), and a query's values are clipped to the window's range.

**Scale** (``link``). The scores may be fitted as probabilities (the default) or as their
empirical logits, predictions then mapped back, the logit fit's level moved so that its
leave-one-out predictions, mapped back, average the window's scores (link.py).

**Rollouts.** With ``counts`` (N,), the rollouts behind each score, a score weighs its recency
weight times its rollout weight (``weights.py``): in the mean, the fit and the leave-one-out
criterion, not in T.

**A prompt seen before** (``ids``): the chosen model's prediction fused with the prompt's own
earlier outcomes, ``history.py``.

``fit_context(X, y, ages, loglen, ids, counts, settings)`` takes what one window holds as its
arguments and how to fit it as a ``FitSettings`` (``halflife``, ``drift``, ``undecayed``,
``selected``, ``link``, ``select``... above), which the embedded prior builds from its options
once. Everything here is task-agnostic: the only inputs are feature vectors of the prompt text,
the generic log length, scores, versions and weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from actors.priors.base import check_halflife, check_prob
from actors.priors.embedded.columns import narrow_views
from actors.priors.embedded.history import FORMS, fit_history, fuse_history
from actors.priors.embedded.link import fit_scale_noise, from_fit_scale, mean_shift, to_fit_scale
from actors.priors.embedded.weights import fit_weights, window_weights

# Ridge strengths, as multiples of the mean eigenvalue of the weighted base kernel (scale-free).
LAMBDA_GRID = tuple(float(x) for x in np.logspace(-2.5, 1.5, 9))
# Weights g of the standardized log-length feature; 0 = not used.
LENGTH_WEIGHTS = (0.0, 0.3, 1.0)
# Weights g_a of the standardized age feature (drift); 0 = no drift.
AGE_WEIGHTS = (0.0, 0.3, 1.0, 3.0)
# Base kernels: "linear" = inner products of centered embeddings, scaled to mean diagonal 1;
# "rbf" = exp(-|x - x'|^2 / median pairwise |x - x'|^2). Each costs one (N, N) eigh per fit.
BASE_KERNELS = ("linear", "rbf")


def log_length(prompts: list[str]) -> np.ndarray:
    """A generic size feature: log(1 + characters). (N,)"""
    return np.log1p(np.array([len(p) for p in prompts], dtype=np.float64))


@dataclass
class Fitted:
    """The chosen model for one context; ``kernel`` None means the constant model."""

    mean: float
    kernel: str | None = None
    halflife: float | None = None
    lam: float = float("inf")
    length_weight: float = 0.0
    loo_mse: float = float("inf")
    const_loo_mse: float = float("inf")
    alpha: np.ndarray | None = None          # (N,)
    X: np.ndarray | None = None              # (N, d) context embeddings
    center: np.ndarray | None = None         # (d,) weighted mean embedding
    scale: float = 1.0                       # linear: mean diag; rbf: median sq. distance
    decay: np.ndarray | None = None          # (N,) 0.5 ** (age / halflife): T(query, x_i)
    len_feat: np.ndarray | None = None       # (N,) standardized log length of the context
    len_mu: float = 0.0
    len_sd: float = 1.0
    drift: float = 0.0                       # constant model: score change per version of age
    lead_shift: float = 0.0                  # constant model: -drift * lead, added
    age_weight: float = 0.0                  # g_a of the age feature (0: none)
    age_feat: np.ndarray | None = None       # (N,) standardized age of the context
    age_query: float = 0.0                   # standardized age of a query (-lead)
    view: str = "embedding"                  # the feature view the kernel is on
    timed: bool = True                       # its base kernel carries the time decay T
    columns: np.ndarray | None = None        # the view's columns chosen (None: all)
    kappa: float | None = None               # history fusion (None: no history used)
    ids: np.ndarray | None = None            # (N,) prompt ids of the context (history)
    y: np.ndarray | None = None              # (N,) its observed scores (history)
    counts: np.ndarray | None = None         # (N,) their rollout weights (history)
    history_form: str | None = None          # "level" or "offset" (history.py)
    resid: np.ndarray | None = None          # (N,) leave-one-out residuals (offset history)
    link: str = "identity"                   # the scale it was fitted on (link.py)

    def label(self) -> str:
        if self.kernel is None:
            return "constant" + (f" drift{-self.drift:+.3g}/v" if self.drift else "") + (
                self._hist())
        age = f"+age{self.age_weight:g}" if self.age_weight else ""
        cols = "" if self.columns is None else " cols" + ",".join(map(str, self.columns))
        return (f"{self.view}:{self.kernel}+len{self.length_weight:g}{age}@lam{self.lam:.3g}"
                + cols + self._hist())

    def _hist(self) -> str:
        if self.kappa is None:
            return ""
        return f" hist{self.kappa:g}" + ("" if self.history_form == "level" else "off")


def base_kernel(kind: str, A: np.ndarray, B: np.ndarray, center: np.ndarray,
                scale: float) -> np.ndarray:
    """(len(A), len(B)) base kernel between embedding sets."""
    if kind == "linear":
        return (A - center) @ (B - center).T / scale
    d2 = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * A @ B.T
    return np.exp(-np.maximum(d2, 0.0) / scale)


def kernel_scale(kind: str, X: np.ndarray, center: np.ndarray) -> float:
    if kind == "linear":
        Xc = X - center
        s = float((Xc * Xc).sum(1).mean())
    else:
        sq = (X * X).sum(1)
        d2 = sq[:, None] + sq[None, :] - 2.0 * X @ X.T
        off = d2[~np.eye(len(X), dtype=bool)]
        s = float(np.median(off)) if off.size else 0.0
    return s if s > 1e-12 else 1.0


def loo_candidates(eig: tuple[np.ndarray, np.ndarray], yt: np.ndarray, g_unit: np.ndarray,
                   wsum: float, length_weights, sigma2: float | None = None,
                   a_unit: np.ndarray | None = None, age_weights=(0.0,)
                   ) -> list[tuple[float, float, float, float, np.ndarray, np.ndarray, float]]:
    """(loo_mse, lam, g, g_a, alpha_tilde, the sqrt(w)-scaled LOO residuals (N,), the negative
    log evidence per score) for every (g_a, lam, g), in that order, all from ``eig``, the
    eigendecomposition (``np.linalg.eigh``) of a kernel Kt (N, N). The kernel fitted is Kt +
    g^2 g_unit g_unit^T + g_a^2 a_unit a_unit^T: the length and age terms enter as one rank-2
    update (Woodbury), so no weight of either costs an eigh. lam runs over LAMBDA_GRID times
    the kernel's mean eigenvalue (its trace / N, the age term's included). The evidence is that
    of yt ~ N(0, s^2 kernel + sigma2 I), s^2 = sigma2 / lam, the scores' sampling noise
    ``sigma2`` known (``weights.sampling_noise``; None: nan)."""
    s, U = eig
    s = np.maximum(s, 0.0)
    n = len(yt)
    F = np.stack([g_unit, np.zeros(n) if a_unit is None else a_unit], axis=1)   # (N, 2)
    ut, Ft = U.T @ yt, U.T @ F                                # (N,), (N, 2)
    U2 = U * U                                                # (N, N)
    age_trace = float(F[:, 1] @ F[:, 1])
    out = []
    for ga in age_weights:
        s_mean = (float(s.sum()) + ga * ga * age_trace) / n or 1.0
        for lam in (c * s_mean for c in LAMBDA_GRID):
            inv = 1.0 / (s + lam)                             # (N,)
            a_y = U @ (inv * ut)                              # A^-1 yt
            a_diag = U2 @ inv                                 # diag(A^-1)
            a_F = U @ (inv[:, None] * Ft)                     # A^-1 F (N, 2)
            FaF, Fay = F.T @ a_F, F.T @ a_y                   # (2, 2), (2,)
            logdet = float(np.log(s + lam).sum())
            for g in length_weights:
                c = np.array([g, ga])
                # Woodbury for A + (F c)(F c)^T: S = I + c F' A^-1 F c (2, 2).
                S = np.eye(2) + c[:, None] * FaF * c[None, :]
                S_inv = np.linalg.inv(S)
                P = a_F * c                                   # A^-1 F diag(c)
                m_y = a_y - P @ (S_inv @ (c * Fay))
                m_diag = a_diag - ((P @ S_inv) * P).sum(1)
                loo = m_y / np.maximum(m_diag, 1e-12)
                nll = float("nan") if sigma2 is None else neg_log_evidence(
                    float(yt @ m_y), logdet + float(np.log(np.linalg.det(S))), lam, sigma2, n)
                out.append((float(loo @ loo) / wsum, lam, g, ga, m_y, loo, nll))
    return out


def neg_log_evidence(quad: float, logdet: float, lam: float, sigma2: float, n: int) -> float:
    """-log p(yt) / n (less the 2 pi term) under yt ~ N(0, s^2 (K + lam I)), s^2 =
    sigma2 / lam: ``quad`` = yt' (K + lam I)^-1 yt, ``logdet`` = log det(K + lam I). The
    constant model's (yt ~ N(0, sigma2 I)) is K = 0 at lam = 1: quad = yt' yt, logdet = 0."""
    return 0.5 * (lam / sigma2 * quad + n * np.log(sigma2 / lam) + logdet) / n


def trend_on_age(y: np.ndarray, ages: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares y ~ a + b * age: (a, b, its exact weighted LOO MSE). The LOO
    residual of point i is e_i / (1 - h_ii) with h the weighted hat matrix's diagonal."""
    A = np.stack([np.ones_like(ages), ages], 1)                  # (N, 2)
    G = A.T @ (A * w[:, None])                                   # (2, 2)
    if abs(np.linalg.det(G)) < 1e-12:                            # one age only: no trend
        return float(w @ y / w.sum()), 0.0, float("inf")
    Ginv = np.linalg.inv(G)
    a, b = Ginv @ (A.T @ (w * y))
    h = w * np.einsum("ij,jk,ik->i", A, Ginv, A)                 # (N,) leverages
    loo = (y - a - b * ages) / np.maximum(1.0 - h, 1e-9)
    return float(a), float(b), float(w @ loo ** 2) / float(w.sum())


def constant_model(y: np.ndarray, ages: np.ndarray, w: np.ndarray, prior_mean: float,
                   s: "FitSettings") -> tuple[Fitted, np.ndarray, float]:
    """The kernels' baseline, always a candidate (a window whose features carry no signal falls
    back to it): the weighted mean (shrunk by ``s.prior_strength`` pseudo-observations of
    ``prior_mean``, on the fit's scale), or with ``s.drift`` the scores' trend on age when it
    predicts held-out scores better than the mean, both by exact weighted leave-one-out.
    Returns (the model, the scores moved to age 0 by its trend (``y`` without one), the mean of
    the scores not moved)."""
    n, wsum = len(y), float(w.sum())
    # Exact LOO of the constant model (the weighted mean without point i).
    loo_const = y - (w @ y - w * y) / np.maximum(wsum - w, 1e-12)
    const_mse = float(w @ loo_const ** 2) / wsum if n > 1 else float("inf")
    slope = 0.0
    mean_raw = float((w @ y + s.prior_strength * prior_mean) / (wsum + s.prior_strength))
    if s.drift and n >= 8:
        _, b, trend_mse = trend_on_age(y, ages, w)
        if trend_mse < const_mse:  # the trend predicts held-out scores better than a mean
            slope, const_mse = b, trend_mse
            y = y - b * ages       # every score moved to age 0
    mean = float((w @ y + s.prior_strength * prior_mean) / (wsum + s.prior_strength))
    return (Fitted(mean=mean, halflife=s.halflife, loo_mse=const_mse, const_loo_mse=const_mse,
                   drift=slope, lead_shift=-slope * float(s.lead), link=s.link), y, mean_raw)


@dataclass(frozen=True)
class FitSettings:
    """How ``fit_context`` fits a window, the same for every window: the embedded prior builds
    one per scale from its options, once (``prior.EmbeddedPrior``). Checked when made."""

    halflife: float | None = None     # versions: recency weights and time decay T (None: off)
    prior_mean: float = 0.5           # shrinks the window's mean, as ``prior_strength``
    prior_strength: float = 1.0       # ... pseudo-observations of it (tiny windows)
    kernels: tuple[str, ...] = ("linear",)  # the base kernels searched (``BASE_KERNELS``)
    drift: bool = False               # fit the scores' trend on age ...
    lead: float = 0.0                 # ... and predict this many versions past the newest score
    weighting: str = "count"          # how rollout counts weigh a score (weights.fit_weights)
    select: str = "loo"               # choose the model by "loo" error or by its "evidence"
    undecayed: tuple[str, ...] = ()   # views whose base kernel goes without the time decay T
    selected: tuple[str, ...] = ()    # views narrowed to the columns columns.py chooses
    history_forms: tuple[str, ...] = FORMS  # the history's forms to choose from (history.py)
    link: str = "identity"            # the fit's scale ("logit": empirical logits, link.py)

    def __post_init__(self):
        check_halflife(self.halflife)
        check_prob("prior_mean", self.prior_mean)
        if not self.prior_strength >= 0:
            raise ValueError(f"prior_strength must be >= 0, got {self.prior_strength!r}")
        if not self.lead >= 0:
            raise ValueError(f"lead must be >= 0 versions, got {self.lead!r}")
        if not self.kernels or any(k not in BASE_KERNELS for k in self.kernels):
            raise ValueError(f"kernels must be a non-empty subset of {BASE_KERNELS}, got "
                             f"{self.kernels!r}")
        if self.select not in ("loo", "evidence"):
            raise ValueError(f"select must be 'loo' or 'evidence', got {self.select!r}")


def fit_context(X, y: np.ndarray, ages: np.ndarray | None = None,
                loglen: np.ndarray | None = None, ids: np.ndarray | None = None,
                counts: np.ndarray | None = None,
                settings: FitSettings = FitSettings()) -> Fitted:
    """Choose (view, kernel, length and age weights, lam) by weighted LOO MSE (or evidence) on
    one window, fit it, and with ``ids`` the history fusion's kappa (the module docstring);
    ``settings`` say how, the arguments what the window holds.

    X: (N, d), or {view name: (N, d_view)} (empty: the constant model alone); y: (N,) in
    [0, 1], ages: (N,) policy versions ago (None: all 0), loglen: (N,) or None (no length
    feature), ids: (N,) ints, equal for the same prompt (None: no history), counts: (N,)
    rollouts per score, weighed by ``settings.weighting`` (weights.py; None: equal)."""
    s = settings
    views = {k: np.asarray(v, dtype=np.float64) for k, v in
             (X.items() if isinstance(X, dict) else (("embedding", X),))}
    y = np.asarray(y, dtype=np.float64)
    ages = np.zeros(len(y)) if ages is None else np.maximum(np.asarray(ages, np.float64), 0.0)
    decay, T, rw = window_weights(ages, s.halflife, counts)
    fw = fit_weights(rw, counts, y, s.weighting)
    w = decay * fw
    n, wsum = len(y), float(w.sum())
    sigma2 = fit_scale_noise(s.link, y, counts, fw) if s.select == "evidence" else None
    y_raw, prior_mean = to_fit_scale(s.link, y, counts, s.prior_mean)  # on the fit's scale
    best, y_moved, mean_raw = constant_model(y_raw, ages, w, prior_mean, s)
    if n < 4:
        return best
    mean, slope = best.mean, best.drift
    wn, sw = w / wsum, np.sqrt(w)
    yt = sw * (y_moved - mean)
    side, length_weights, age_weights = _side_features(loglen, ages, wn, s.drift, s.lead)
    # The kernel models are fitted around the plain mean (the age term is theirs).
    search = _Search(best=best, y_raw=y_raw, sw=sw, wsum=wsum, len_feat=side["len_feat"],
                     length_weights=length_weights, age_feat=side["age_feat"],
                     ym=yt if not slope else sw * (y_raw - mean_raw),
                     loo_pred=(w @ y_raw - w * y_raw) / np.maximum(wsum - w, 1e-12),
                     sigma2=sigma2, crit=best.loo_mse if sigma2 is None else
                     neg_log_evidence(float(yt @ yt), 0.0, 1.0, sigma2, n),
                     fields=dict(mean=mean_raw if slope else mean, halflife=s.halflife,
                                 link=s.link, const_loo_mse=best.const_loo_mse, decay=decay,
                                 **side))
    views, columns = narrow_views(views, s.selected, y_raw, w,
                                  side["age_feat"] if s.drift else None)
    search.two_stages(_base_kernels(views, s.kernels, wn, T, s.undecayed, columns), age_weights)
    search.calibrate(s.link, y, w)
    best = search.best
    if ids is not None:
        best.decay = decay  # the constant model's too: the history discounts by it
        fit_history(best, np.asarray(ids), y_raw, search.loo_pred, T, w, rw, s.history_forms)
    return best


@dataclass
class _Search:
    """``fit_context``'s leave-one-out search over the kernel models of one context: the best
    model so far (the constant one to start with) and its leave-one-out predictions, and the
    best candidate without the age term (``top``: its base kernel and that kernel's
    eigendecomposition, for stage 2), even if it lost to the constant."""

    best: Fitted
    loo_pred: np.ndarray       # (N,) the best model's prediction of each point without it
    y_raw: np.ndarray
    sw: np.ndarray             # sqrt of the recency weights
    wsum: float
    ym: np.ndarray             # the targets, sqrt(w)-scaled, around the mean
    len_feat: np.ndarray
    length_weights: tuple
    age_feat: np.ndarray
    fields: dict               # the Fitted fields every kernel model shares
    crit: float                # the best model's criterion: LOO MSE, or -log evidence / N
    sigma2: float | None = None  # the scores' sampling noise: choose by evidence (None: LOO)
    top: tuple | None = None
    top_crit: float = float("inf")

    def two_stages(self, kernel_matrices, age_weights) -> None:
        """Stage 1: every (base kernel fields, matrix) of ``kernel_matrices`` without the age
        term, each from one eigendecomposition; stage 2: the age weights on the best of them,
        from the same one (the age term is a rank-1 update of its kernel)."""
        for base, BT in kernel_matrices:
            self.over(base, np.linalg.eigh(BT * np.outer(self.sw, self.sw)), (0.0,))
        if len(age_weights) > 1 and self.top is not None:
            self.over(*self.top, age_weights[1:])

    def calibrate(self, link: str, y: np.ndarray, w: np.ndarray) -> None:
        """The best model's level moved so that its leave-one-out predictions, mapped back to
        probabilities, average the scores ``y`` (``link.mean_shift``: a logit fit's; nothing
        on the probability scale); those predictions moved with it."""
        shift = mean_shift(link, self.loo_pred, y, w)
        self.best.mean += shift
        self.loo_pred = self.loo_pred + shift

    def over(self, base: dict, eig, age_weights) -> None:
        """Every (age weight, lam, length weight) on one base kernel, from its
        eigendecomposition ``eig`` (of the sqrt(w)-scaled matrix)."""
        sw = self.sw
        for mse, lam, g, ga, m_y, loo, nll in loo_candidates(
                eig, self.ym, sw * self.len_feat, self.wsum, self.length_weights,
                self.sigma2, sw * self.age_feat, age_weights):
            crit = mse if self.sigma2 is None else nll
            if ga == 0.0 and crit < self.top_crit:
                self.top, self.top_crit = (base, eig), crit
            if crit < self.crit:
                self.best = Fitted(lam=lam, length_weight=g, loo_mse=mse, alpha=sw * m_y,
                                   age_weight=ga, **self.fields, **base)
                self.loo_pred, self.crit = self.y_raw - loo / sw, crit


def _base_kernels(views: dict, kernels, wn: np.ndarray, T: np.ndarray | None, undecayed=(),
                  columns=None):
    """Every candidate base kernel of the context, time-decayed (but the ``undecayed`` views'):
    per view and base kernel, yields (its ``Fitted`` fields, the (N, N) matrix). ``columns``:
    {view: the indices of its columns that ``views`` holds} for the narrowed views."""
    for view, Xv in views.items():
        cols = (columns or {}).get(view)
        center = wn @ Xv                                       # (d,)
        for kind in kernels:
            scale = kernel_scale(kind, Xv, center)
            B = base_kernel(kind, Xv, Xv, center, scale)
            timed = T is not None and view not in undecayed
            yield ({"view": view, "kernel": kind, "X": Xv, "center": center, "scale": scale,
                    "timed": timed, "columns": cols}, B * T if timed else B)


def _side_features(loglen, ages: np.ndarray, wn: np.ndarray, drift: bool, lead: float):
    """The generic features beside the views, standardised over the window: ({len_feat,
    len_mu, len_sd, age_feat, age_query} as ``Fitted`` holds them, the length weights offered,
    the age weights offered). A query's age is ``lead`` versions past the newest score; the
    age weights are more than 0 only with ``drift`` and ages that differ."""
    n = len(ages)
    len_feat, len_mu, len_sd = _standardised(loglen, wn) if loglen is not None else \
        (np.zeros(n), 0.0, 1.0)
    age_feat, age_mu, age_sd = _standardised(ages, wn)
    side = dict(len_feat=len_feat, len_mu=len_mu, len_sd=len_sd or 1.0, age_feat=age_feat,
                age_query=(-float(lead) - age_mu) / (age_sd or 1.0))
    return (side, LENGTH_WEIGHTS if loglen is not None else (0.0,),
            AGE_WEIGHTS if drift and age_sd > 0 else (0.0,))


def _standardised(x: np.ndarray, wn: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(x - its weighted mean) / its weighted sd (1 when it is 0), the mean and that sd."""
    x = np.asarray(x, dtype=np.float64)
    mu = float(wn @ x)
    sd = float(np.sqrt(wn @ (x - mu) ** 2))
    return (x - mu) / (sd or 1.0), mu, sd


def predict_fitted(fit: Fitted, Q, loglen: np.ndarray | None = None,
                   ids: np.ndarray | None = None) -> np.ndarray:
    """Predictions (M,) for queries Q: (M, d) in the fit's view, or {view: (M, d_view)} as
    ``fit_context`` took; probabilities (from the fit's ``link`` scale), not clipped.
    ``loglen`` (M,) is needed when the fit uses the length feature; ``ids`` (M,) (the
    context's ids for prompts seen, any other value for new ones) when it uses the history."""
    if isinstance(Q, dict):
        Q = Q[fit.view] if fit.kernel is not None else next(iter(Q.values()))
    Q = np.asarray(Q, dtype=np.float64)
    if fit.kernel is not None and fit.columns is not None:  # within the window's range
        Q = np.clip(Q[:, fit.columns], fit.X.min(axis=0), fit.X.max(axis=0))
    if fit.kernel is None:
        f = np.full(len(Q), fit.mean + fit.lead_shift)
    else:
        Kq = base_kernel(fit.kernel, Q, fit.X, fit.center, fit.scale)   # (M, N)
        if fit.timed:
            Kq = Kq * fit.decay
        if fit.length_weight:
            if loglen is None:
                raise ValueError("this fit uses the length feature: pass loglen for the queries")
            lq = (np.asarray(loglen, dtype=np.float64) - fit.len_mu) / fit.len_sd
            Kq = Kq + fit.length_weight ** 2 * np.outer(lq, fit.len_feat)
        if fit.age_weight:
            Kq = Kq + fit.age_weight ** 2 * fit.age_query * fit.age_feat[None, :]
        f = fit.mean + Kq @ fit.alpha
    return from_fit_scale(fit.link, f if fit.kappa is None else fuse_history(fit, f, ids))
