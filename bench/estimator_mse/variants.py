"""EXPERIMENTAL estimators, benchmark-only: candidates that learn the prior's reliability across
the prompts of a batch. Not part of ``estimator/``; the lead decides whether any graduates.

Both run batch by batch (``batch`` prompts share what is learned), on the same
pre-drawn reward streams as V0.5, with {-1,+1} or any binary rewards.

1. ``experimental_v05_median_floor``: V0.5 unchanged except that the per-prompt bias estimate
   delta2 = max(0, (vbar - V)^2 - s2) gets a batch-level floor tau2: the *median* over the batch
   of an unbiased per-prompt estimate of (mu - V)^2 from the k_init rewards. The median is 0
   unless most prompts' priors are off, so with a useful prior the estimator is V0.5 exactly; with
   an uninformative prior the floor stops the real-time test from accepting it (and OSLA from
   stopping at k_init with an estimated MSE of 0).
2. ``experimental_eb_posterior``: empirical Bayes. Per batch and per prior-decile, fit by EM the
   distribution G of the prior's error e = p - p_prior on a grid (the NPMLE), from the k_init
   rewards; the baseline is the posterior mean of mu, and OSLA continues while the posterior
   variance's expected one-step drop exceeds c (the same look-ahead, with a Bayesian MSE).
"""
from __future__ import annotations

import numpy as np

from bench.estimator_mse.montecarlo import Population
from estimator.registry import EstimatorConfig


# -- 1. V0.5 with a batch-level floor on delta2 -----------------------------------------------
def _fuse_floor(vbar, k, prior, sigma2, tau2):
    """V0.5's fusion with delta2 floored at tau2 (tau2 = 0 is V0.5). -> baseline, mse"""
    s2 = sigma2 / k
    delta2 = np.maximum(tau2, (vbar - prior) ** 2 - s2)
    w = delta2 / (delta2 + s2)
    return w * vbar + (1.0 - w) * prior, delta2 * s2 / (delta2 + s2)


def median_error_floor(vbar, k: int, prior, rewards) -> float:
    """Median over prompts of (vbar - V)^2 - vhat / k, vhat the unbiased reward variance of each
    prompt's k binary rewards; each term is unbiased for (mu - V)^2. Clipped at 0."""
    r_lo, r_hi = rewards
    q = (vbar - r_lo) / (r_hi - r_lo)
    vhat = k / (k - 1.0) * (r_hi - r_lo) ** 2 * q * (1.0 - q)
    return max(0.0, float(np.median((vbar - prior) ** 2 - vhat / k)))


def osla_floor(csum, prior, cfg: EstimatorConfig, tau2: float):
    """Predictive one-step look-ahead with the floored fusion (bound noise). -> k_stop, baseline"""
    r_lo, r_hi = cfg.rewards
    sigma2 = (r_hi - r_lo) ** 2 / 4.0
    n = prior.shape[0]
    k_stop, active = np.full(n, cfg.k_init), np.arange(n)
    for k in range(cfg.k_init, cfg.k_max):
        vbar, v = csum[active, k - 1] / k, prior[active]
        base, mse = _fuse_floor(vbar, k, v, sigma2, tau2)
        q = np.clip((base - r_lo) / (r_hi - r_lo), 0.0, 1.0)
        nxt = [_fuse_floor((k * vbar + r) / (k + 1.0), k + 1.0, v, sigma2, tau2)[1]
               for r in (r_hi, r_lo)]
        active = active[mse - (q * nxt[0] + (1.0 - q) * nxt[1]) > cfg.scaled_cost]
        if active.size == 0:
            break
        k_stop[active] = k + 1
    vbar = csum[np.arange(n), k_stop - 1] / k_stop
    return k_stop, _fuse_floor(vbar, k_stop, prior, sigma2, tau2)[0]


def experimental_v05_median_floor(pop: Population, prior, cfg: EstimatorConfig, batch: int):
    """EXPERIMENTAL. -> k_stop (N,), baseline (N,), tau2 per batch (list)"""
    ks, bases, taus = [], [], []
    for s in range(0, pop.p.shape[0], batch):
        csum, v = pop.csum[s:s + batch], prior[s:s + batch]
        tau2 = median_error_floor(csum[:, cfg.k_init - 1] / cfg.k_init, cfg.k_init, v, cfg.rewards)
        k, b = osla_floor(csum, v, cfg, tau2)
        ks.append(k), bases.append(b), taus.append(tau2)
    return np.concatenate(ks), np.concatenate(bases), taus


# -- 2. empirical-Bayes posterior ------------------------------------------------------------
ERR_GRID = np.linspace(-1.0, 1.0, 41)  # (J,) prior errors e on the probability scale


def _decile_groups(prior_p, n_bins=10):
    """Prior-quantile bin of each prompt (ties collapse bins: a constant prior is one bin)."""
    edges = np.unique(np.quantile(prior_p, np.linspace(0, 1, n_bins + 1)[1:-1]))
    return np.searchsorted(edges, prior_p, side="right")


def fit_error_law(prior_p, hits, k: int, iters: int = 100):
    """NPMLE by EM of G(e | prior bin) from hits (N,) of k rollouts. -> G per prompt (N, J)"""
    group = _decile_groups(prior_p)
    cell = (group * 101 + np.round(prior_p * 100).astype(int)) * (k + 1) + hits
    cells, inv, cnt = np.unique(cell, return_inverse=True, return_counts=True)  # sorted by group
    c_group, c_hits = cells // ((k + 1) * 101), cells % (k + 1)
    c_prior = (cells // (k + 1)) % 101 / 100
    p = np.clip(c_prior[:, None] + ERR_GRID[None, :], 0.0, 1.0)           # (C, J)
    like = p ** c_hits[:, None] * (1.0 - p) ** (k - c_hits[:, None])       # binomial coef cancels
    starts = np.r_[0, np.flatnonzero(np.diff(c_group)) + 1]
    member = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, cells.size]))
    g = np.full((starts.size, ERR_GRID.size), 1.0 / ERR_GRID.size)
    for _ in range(iters):
        post = g[member] * like
        post /= post.sum(axis=1, keepdims=True)
        g = np.add.reduceat(cnt[:, None] * post, starts, axis=0) \
            / np.add.reduceat(cnt, starts)[:, None]
    return g[member][inv]


def _posterior(g, prior_p, hits, k):
    """Posterior weights over the grid and the posterior mean and variance of p. (N, J) ..."""
    p = np.clip(prior_p[:, None] + ERR_GRID[None, :], 0.0, 1.0)
    k = np.broadcast_to(k, hits.shape)
    w = g * p ** hits[:, None] * (1.0 - p) ** (k - hits)[:, None]
    w /= w.sum(axis=1, keepdims=True)
    m = (w * p).sum(axis=1)
    return w, p, m, np.maximum((w * p * p).sum(axis=1) - m * m, 0.0)


def _eb_batch(hits_all, prior_p, cfg: EstimatorConfig):
    """One batch: fit G on the k_init rewards, then OSLA on the posterior variance."""
    scale2 = (cfg.rewards[1] - cfg.rewards[0]) ** 2
    g = fit_error_law(prior_p, hits_all[:, cfg.k_init - 1], cfg.k_init)
    n = prior_p.shape[0]
    k_stop, active = np.full(n, cfg.k_init), np.arange(n)
    for k in range(cfg.k_init, cfg.k_max):
        w, p, m, var = _posterior(g[active], prior_p[active], hits_all[active, k - 1], k)
        after = []
        for lik in (p, 1.0 - p):  # next reward a hit, a miss
            wn = w * lik
            wn /= wn.sum(axis=1, keepdims=True)
            after.append((wn * p * p).sum(axis=1) - (wn * p).sum(axis=1) ** 2)
        gain = scale2 * (var - (m * after[0] + (1.0 - m) * after[1]))
        active = active[gain > cfg.scaled_cost]
        if active.size == 0:
            break
        k_stop[active] = k + 1
    m = _posterior(g, prior_p, hits_all[np.arange(n), k_stop - 1], k_stop)[2]
    return k_stop, cfg.rewards[0] + m * (cfg.rewards[1] - cfg.rewards[0])


def experimental_eb_posterior(pop: Population, prior_p, cfg: EstimatorConfig, batch: int):
    """EXPERIMENTAL. ``prior_p`` on the probability scale. -> k_stop (N,), baseline (N,)"""
    hits = np.cumsum(pop.rewards == pop.reward_range[1], axis=1)  # (N, K) hits in first k
    ks, bases = [], []
    for s in range(0, pop.p.shape[0], batch):
        k, b = _eb_batch(hits[s:s + batch], prior_p[s:s + batch], cfg)
        ks.append(k), bases.append(b)
    return np.concatenate(ks), np.concatenate(bases)
