"""Monte Carlo core of the estimator benchmark: populations, priors, Monte Carlo and exact runs.

Everything here drives the real estimator code (``estimator.fuse``, ``estimator.should_continue``,
``estimator.core.noise_sigma2``); nothing re-implements the fusion or the OSLA test.

Shapes: N prompts, K = k_max reward slots. A population pre-draws each prompt's reward stream
``rewards`` (N, K); a rule that uses k rollouts reads the first k. Reading a pre-drawn stream is
the same in law as drawing one more reward per still-active prompt (rewards are i.i.d.), and it
gives every estimator the same rewards (common random numbers), so their differences are not
swamped by sampling noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from estimator import fuse, should_continue
from estimator.core import noise_sigma2
from estimator.registry import EstimatorConfig

# Prior qualities: name -> (kind, parameter). Probabilities p in [0, 1] throughout.
PRIOR_QUALITIES: dict[str, tuple[str, float]] = {
    "exact": ("exact", 0.0),
    "sd0.05": ("gauss", 0.05),
    "sd0.1": ("gauss", 0.1),
    "sd0.2": ("gauss", 0.2),
    "sd0.3": ("gauss", 0.3),
    "halluc20": ("halluc", 0.2),
    "const0.5": ("const", 0.5),
}


@dataclass(frozen=True)
class Population:
    p: np.ndarray        # (N,) true success rates
    mu: np.ndarray       # (N,) true mean reward r_lo + p (r_hi - r_lo)
    rewards: np.ndarray  # (N, K) pre-drawn reward stream, values in {r_lo, r_hi}
    csum: np.ndarray     # (N, K) csum[:, k-1] = sum of the first k rewards (exact integers)
    reward_range: tuple[float, float]


def draw_population(n: int, k_max: int, rng: np.random.Generator, beta_ab=(0.3, 0.3),
                    reward_range=(-1.0, 1.0)) -> Population:
    """U-shaped true success rates p ~ Beta(a, b) and a binary reward stream per prompt."""
    r_lo, r_hi = reward_range
    p = rng.beta(*beta_ab, size=n)
    hits = rng.random((n, k_max)) < p[:, None]
    rewards = np.where(hits, r_hi, r_lo)
    return Population(p, r_lo + p * (r_hi - r_lo), rewards, np.cumsum(rewards, axis=1),
                      (float(r_lo), float(r_hi)))


def with_rewards(pop: Population, reward_range) -> Population:
    """The same prompts and outcomes on another reward scale (for the convention check)."""
    r_lo, r_hi = reward_range
    rewards = np.where(pop.rewards == pop.reward_range[1], r_hi, r_lo)
    return Population(pop.p, r_lo + pop.p * (r_hi - r_lo), rewards, np.cumsum(rewards, axis=1),
                      (float(r_lo), float(r_hi)))


def head(pop: Population, m: int) -> Population:
    """The first m prompts of a population."""
    return Population(pop.p[:m], pop.mu[:m], pop.rewards[:m], pop.csum[:m], pop.reward_range)


def prior_probs(quality: str, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The V0 prior's success probability for each prompt under a named quality. (N,) -> (N,)"""
    if quality not in PRIOR_QUALITIES:
        raise ValueError(f"unknown prior quality {quality!r}; valid: {list(PRIOR_QUALITIES)}")
    kind, arg = PRIOR_QUALITIES[quality]
    if kind == "exact":
        return p.copy()
    if kind == "gauss":  # additive error on p, clipped back into [0, 1]
        return np.clip(p + rng.normal(0.0, arg, p.shape), 0.0, 1.0)
    if kind == "halluc":  # a fraction `arg` of prompts get the mirrored prediction 1 - p
        return np.where(rng.random(p.shape) < arg, 1.0 - p, p)
    return np.full_like(p, arg)  # const: carries no per-prompt information


def to_reward_scale(prob: np.ndarray, reward_range) -> np.ndarray:
    r_lo, r_hi = reward_range
    return r_lo + prob * (r_hi - r_lo)


def fused_baseline(vbar, k, prior, cfg: EstimatorConfig):
    """The V0.5 baseline exactly as the registry computes it: sigma2 from the noise model."""
    sigma2 = noise_sigma2(vbar, k, prior, cfg.rewards, cfg.noise)
    return fuse(vbar, k, prior, sigma2).baseline


def grpo_baseline(pop: Population, group: int) -> np.ndarray:
    """GRPO / Dr. GRPO baseline: the mean of the first ``group`` rewards. -> (N,)"""
    return pop.csum[:, group - 1] / group


def fixed_k_baseline(pop: Population, prior: np.ndarray, k: int, cfg: EstimatorConfig):
    """V0.5's fused baseline after exactly k rollouts (no OSLA). -> (N,)"""
    return fused_baseline(pop.csum[:, k - 1] / k, float(k), prior, cfg)


def run_osla(pop: Population, prior: np.ndarray, cfg: EstimatorConfig):
    """Monte Carlo OSLA: start every prompt at k_init, ask ``should_continue`` on the still-active
    prompts, give those one more reward, repeat up to k_max. -> (k_stop (N,), baseline (N,))"""
    n = pop.p.shape[0]
    k_stop = np.full(n, cfg.k_init)
    active = np.arange(n)
    for k in range(cfg.k_init, cfg.k_max):
        vbar = pop.csum[active, k - 1] / k
        more = should_continue(vbar, float(k), prior[active], cost=cfg.scaled_cost,
                               k_max=cfg.k_max, lookahead=cfg.lookahead, rewards=cfg.rewards,
                               noise=cfg.noise)
        active = active[np.asarray(more, bool)]
        if active.size == 0:
            break
        k_stop[active] = k + 1
    vbar = pop.csum[np.arange(n), k_stop - 1] / k_stop
    return k_stop, fused_baseline(vbar, k_stop.astype(float), prior, cfg)


# -- exact per-prompt expectations (dynamic programming over the hit count) ----------------------
def _step(mass: np.ndarray, p: np.ndarray) -> np.ndarray:
    """One more Bernoulli(p) reward: hit-count distribution (M, k+1) -> (M, k+2)."""
    out = np.zeros((mass.shape[0], mass.shape[1] + 1))
    out[:, :-1] += mass * (1.0 - p[:, None])
    out[:, 1:] += mass * p[:, None]
    return out


def _vbar_grid(k: int, reward_range) -> np.ndarray:
    """Empirical mean for h = 0..k hits of k, computed as the Monte Carlo run does (sum / k)."""
    r_lo, r_hi = reward_range
    h = np.arange(k + 1)
    return (h * r_hi + (k - h) * r_lo) / k


def exact_rule(p, prior, cfg: EstimatorConfig, adaptive: bool, k_fixed: int | None = None):
    """Exact law of a stopping rule per prompt, by summing over every reward path's hit count.

    adaptive=True: OSLA from cfg.k_init to cfg.k_max; False: stop at ``k_fixed``.
    Returns dict of (M,) arrays ``mean_baseline``, ``sq_err`` (E[(baseline - mu)^2]), ``quad_err``
    (E[(baseline - mu)^4], for the exact standard error of an MSE) and ``k_pmf`` (M, k_end + 1).
    No Monte Carlo noise: this is the reference the MC run must match.
    """
    r_lo, r_hi = cfg.rewards
    p, prior = np.asarray(p, float), np.asarray(prior, float)
    mu = r_lo + p * (r_hi - r_lo)
    k_start = cfg.k_init if adaptive else k_fixed
    k_end = cfg.k_max if adaptive else k_fixed
    mass = np.ones((p.shape[0], 1))
    for _ in range(k_start):
        mass = _step(mass, p)
    mean_b, sq, quad = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    k_pmf = np.zeros((p.shape[0], k_end + 1))
    for k in range(k_start, k_end + 1):
        vbar = np.broadcast_to(_vbar_grid(k, cfg.rewards), mass.shape)
        if adaptive and k < k_end:
            cont = np.asarray(should_continue(vbar, float(k), prior[:, None], cost=cfg.scaled_cost,
                                              k_max=cfg.k_max, lookahead=cfg.lookahead,
                                              rewards=cfg.rewards, noise=cfg.noise), bool)
        else:
            cont = np.zeros(mass.shape, bool)
        stop = np.where(cont, 0.0, mass)
        base = fused_baseline(vbar, float(k), prior[:, None], cfg)
        mean_b += (stop * base).sum(axis=1)
        sq += (stop * (base - mu[:, None]) ** 2).sum(axis=1)
        quad += (stop * (base - mu[:, None]) ** 4).sum(axis=1)
        k_pmf[:, k] = stop.sum(axis=1)
        if not cont.any():
            break
        mass = _step(np.where(cont, mass, 0.0), p)
    return {"mean_baseline": mean_b, "sq_err": sq, "quad_err": quad, "k_pmf": k_pmf, "mu": mu}


def binomial_pmf(p, k: int) -> np.ndarray:
    """P(h hits of k | p) for h = 0..k. (M,) -> (M, k+1)"""
    from math import comb
    h = np.arange(k + 1)
    coef = np.array([comb(k, int(j)) for j in h], dtype=float)
    p = np.asarray(p, float)[:, None]
    return coef * p ** h * (1.0 - p) ** (k - h)


def conditional_moments(p, prior, cfg: EstimatorConfig, k: int):
    """Exact per-prompt bias E[baseline | p, prior] - mu of the fused baseline at fixed k and
    the baseline's standard deviation, by summing over the binomial law of the hit count.
    -> bias (M,), sd (M,)"""
    r_lo, r_hi = cfg.rewards
    vbar = np.broadcast_to(_vbar_grid(k, cfg.rewards), (np.size(p), k + 1))
    base = fused_baseline(vbar, float(k), np.asarray(prior, float)[:, None], cfg)
    pmf = binomial_pmf(p, k)
    mean = (pmf * base).sum(axis=1)
    sd = np.sqrt(np.maximum((pmf * (base - mean[:, None]) ** 2).sum(axis=1), 0.0))
    return mean - (r_lo + np.asarray(p, float) * (r_hi - r_lo)), sd


def conditional_bias(p, prior, cfg: EstimatorConfig, k: int) -> np.ndarray:
    """Exact per-prompt conditional bias of the fused baseline at fixed k. -> (M,)"""
    return conditional_moments(p, prior, cfg, k)[0]


def mc_conditional_bias(p, prior, cfg: EstimatorConfig, k: int, reps: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Monte Carlo estimate of the same conditional bias from ``reps`` draws per prompt. -> (M,)"""
    r_lo, r_hi = cfg.rewards
    hits = rng.binomial(k, np.repeat(np.asarray(p, float)[:, None], reps, axis=1))  # (M, reps)
    vbar = (hits * r_hi + (k - hits) * r_lo) / k
    err = fused_baseline(vbar, float(k), np.asarray(prior, float)[:, None], cfg) \
        - (r_lo + np.asarray(p)[:, None] * (r_hi - r_lo))
    return err.mean(axis=1)
