"""The scenarios of the estimator benchmark and the result they write (``run_benchmark``).

GRPO-G against V0.5 (fixed k and OSLA variants) per prior quality, the bias against k, the
reward-convention check, decision timings, and the batched against
sequential budget plans under the arrival model (``plans.py``). Population, priors and the
exact/Monte Carlo machinery are in ``montecarlo.py``; the figure in ``plot.py``.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from studies.estimator_mse import montecarlo as mc
from studies.estimator_mse import plans
from studies.estimator_mse.arrivals import DURATION_SIGMA
from estimator import DEFAULT_COST, DEFAULT_REWARDS, noise_bound, plan_batched, should_continue
from estimator.registry import EstimatorConfig

ARRIVAL_MODEL = (f"rollout durations i.i.d. log-normal (median 1, sigma {DURATION_SIGMA}), "
                 "independent of rewards; rewards arrive in finish order; requests dispatched "
                 "at once, no queueing; cancelled = the latest dispatched (fewest tokens), their "
                 "run fraction elapsed/duration counted as spent rollouts")


@dataclass(frozen=True)
class BenchConfig:
    n_prompts: int = 200_000        # Monte Carlo population
    n_exact: int = 20_000           # prompts for the exact (DP) per-prompt expectations
    beta_ab: tuple = (0.3, 0.3)     # true p ~ Beta(a, b): U-shaped, many all-right/-wrong prompts
    rewards: tuple = DEFAULT_REWARDS
    k_init: int = EstimatorConfig.k_init
    k_max: int = EstimatorConfig.k_max
    grpo_groups: tuple = (2, 4, 8, 16)
    priors: tuple = tuple(mc.PRIOR_QUALITIES)
    bias_ks: tuple = (1, 2, 4, 8, 16, 32, 64)
    grid_points: int = 101          # worst-case bias over a (p, prior) grid of this side
    mc_bias_prompts: int = 200      # Monte Carlo check of the exact conditional bias
    mc_bias_reps: int = 4000
    timing_n: int = 1_000_000
    convention_check: bool = True   # rerun OSLA on {0,1} with cost c/4, same outcomes
    n_arrivals: int = 100_000       # prompts for batched vs sequential under the arrival model
    arrival_slots: int = 64         # most rollout indices one prompt may request
    plan_variants: bool = True      # also run the alternatives docs/estimator.md cites
    seed: int = 0

    @property
    def cost(self) -> float:
        """The paper's c = 0.0039 on this reward range: the estimator rescales its configured
        {-1,+1} cost by ((r_hi - r_lo) / 2)^2 (c/4 on {0,1})."""
        return est_config(self).scaled_cost


QUICK = BenchConfig(n_prompts=20_000, n_exact=2_000, bias_ks=(1, 4, 16, 64), grid_points=41,
                    mc_bias_prompts=50, mc_bias_reps=1000, timing_n=100_000,
                    n_arrivals=5_000)

# V0.5 variants: (label, adaptive, lookahead, noise)
V05_VARIANTS = [("v05_k4", False, "predictive", "bound"),
                ("v05_k4", False, "predictive", "bernoulli"),
                ("v05_osla", True, "predictive", "bound"),
                ("v05_osla", True, "plugin", "bound"),
                ("v05_osla", True, "predictive", "bernoulli"),
                ("v05_osla", True, "plugin", "bernoulli")]


def est_config(cfg: BenchConfig, lookahead="predictive", noise="bound", rewards=None):
    """The estimator's config for a scenario; the cost is the paper's c on {-1,+1}, which the
    estimator rescales to ``rewards`` itself."""
    rewards = tuple(rewards or cfg.rewards)
    return EstimatorConfig(k_init=cfg.k_init, k_max=cfg.k_max, cost=DEFAULT_COST,
                           lookahead=lookahead, noise=noise, rewards=rewards)


def summarise(baseline, mu, k_stop, k_max) -> dict:
    """MSE, bias (each with its Monte Carlo standard error), rollouts and their histogram."""
    err = baseline - mu
    n = err.size
    hist = np.bincount(np.asarray(k_stop, int), minlength=k_max + 1)[: k_max + 1] / n
    return {"mse": float(np.mean(err ** 2)), "mse_se": float(np.std(err ** 2) / np.sqrt(n)),
            "bias": float(err.mean()), "bias_se": float(err.std() / np.sqrt(n)),
            "mean_k": float(np.mean(k_stop)), "k_hist": [float(h) for h in hist]}


def grpo_rows(cfg: BenchConfig, pop: mc.Population) -> list[dict]:
    rows = []
    for g in cfg.grpo_groups:
        row = summarise(mc.grpo_baseline(pop, g), pop.mu, np.full(pop.p.size, g), cfg.k_max)
        rows.append({"estimator": f"grpo_G{g}", "group": g, **row})
    return rows


def v05_row(cfg, pop, prior, quality, variant) -> dict:
    """One (V0.5 variant, prior quality) scenario: Monte Carlo on the population, and the exact
    per-prompt expectations on its first n_exact prompts (conditional bias, MC cross-check)."""
    label, adaptive, lookahead, noise = variant
    ecfg = est_config(cfg, lookahead, noise)
    if adaptive:
        k_stop, base = mc.run_osla(pop, prior, ecfg)
    else:
        k_stop = np.full(pop.p.size, cfg.k_init)
        base = mc.fixed_k_baseline(pop, prior, cfg.k_init, ecfg)
    row = {"estimator": label, "prior": quality, "lookahead": lookahead if adaptive else None,
           "noise": noise, **summarise(base, pop.mu, k_stop, cfg.k_max)}
    m = min(cfg.n_exact, pop.p.size)
    ex = mc.exact_rule(pop.p[:m], prior[:m], ecfg, adaptive, None if adaptive else cfg.k_init)
    cond_bias = ex["mean_baseline"] - ex["mu"]
    mc_sub = (base[:m] - pop.mu[:m]) ** 2
    k_grid = np.arange(ex["k_pmf"].shape[1])
    row.update({"exact_mse": float(ex["sq_err"].mean()),
                "exact_mean_k": float((ex["k_pmf"] * k_grid).sum(axis=1).mean()),
                # z-score of the MC MSE on these prompts, with the exact standard error
                "mc_minus_exact_mse_in_se": float((mc_sub.mean() - ex["sq_err"].mean()) / max(
                    np.sqrt(np.sum(ex["quad_err"] - ex["sq_err"] ** 2)) / m, 1e-300)),
                "cond_bias_mean_abs": float(np.abs(cond_bias).mean()),
                "cond_bias_max_abs": float(np.abs(cond_bias).max())})
    return row


def add_grpo_reference(rows: list[dict], pop: mc.Population, rewards) -> float:
    """GRPO's MSE at the same mean rollouts: E[Var r] / k (exact for the population; at a
    fractional k this is a lower bound on any mix of group sizes, so it favours GRPO)."""
    r_lo, r_hi = rewards
    var_r = float(np.mean((r_hi - r_lo) ** 2 * pop.p * (1 - pop.p)))
    for row in rows:
        row["grpo_mse_same_k"] = var_r / row["mean_k"]
        row["mse_ratio_vs_grpo_same_k"] = row["mse"] / row["grpo_mse_same_k"]
    return var_r


def bias_vs_k(cfg: BenchConfig, pop: mc.Population, priors: dict, rng) -> dict:
    """Exact conditional bias E[baseline | p, prior] - mu of the fused baseline at fixed k."""
    out = {"k": list(cfg.bias_ks), "per_prior": {}, "worst_case_grid": {}}
    m = min(cfg.n_exact, pop.p.size)
    g = np.linspace(0.0, 1.0, cfg.grid_points)
    gp, gv = (a.ravel() for a in np.meshgrid(g, g))
    for noise in ("bound", "bernoulli"):
        ecfg = est_config(cfg, noise=noise)
        sigma = np.sqrt(noise_bound(cfg.rewards))
        for q, prior in priors.items():
            b = [np.abs(mc.conditional_bias(pop.p[:m], prior[:m], ecfg, k)) for k in cfg.bias_ks]
            out["per_prior"][f"{q}/{noise}"] = {
                "mean_abs": [float(x.mean()) for x in b], "max_abs": [float(x.max()) for x in b]}
        wc = [np.abs(mc.conditional_bias(gp, mc.to_reward_scale(gv, cfg.rewards), ecfg, k)).max()
              for k in cfg.bias_ks]
        out["worst_case_grid"][noise] = {
            "max_abs": [float(x) for x in wc],
            "max_abs_times_sqrt_k_over_sigma": [float(x * np.sqrt(k) / sigma)
                                                for x, k in zip(wc, cfg.bias_ks)]}
    out["mc_check"] = mc_bias_check(cfg, pop, priors, rng)
    return out


def mc_bias_check(cfg, pop, priors, rng) -> dict:
    """Monte Carlo estimates of the conditional bias against the exact sums, as z-scores with
    the exact standard error sd / sqrt(reps) (prompts with sd = 0 must match exactly)."""
    m = min(cfg.mc_bias_prompts, pop.p.size)
    quality = "sd0.1" if "sd0.1" in priors else next(iter(priors))
    z, flat = [], 0.0
    for k in (cfg.k_init, cfg.k_max):
        args = (pop.p[:m], priors[quality][:m], est_config(cfg), k)
        exact, sd = mc.conditional_moments(*args)
        diff = np.abs(mc.mc_conditional_bias(*args, cfg.mc_bias_reps, rng) - exact)
        noisy = sd > 1e-12
        z.append(diff[noisy] / (sd[noisy] / np.sqrt(cfg.mc_bias_reps)))
        flat = max(flat, float(np.max(diff[~noisy], initial=0.0)))
    z = np.concatenate(z)
    return {"prior": quality, "prompts": m, "reps": cfg.mc_bias_reps, "ks": [cfg.k_init, cfg.k_max],
            "max_abs_z": float(z.max(initial=0.0)), "fraction_abs_z_over_3": float(np.mean(z > 3)),
            "max_abs_diff_where_sd_0": flat}


def convention_check(cfg, pop, prior_p) -> dict:
    """{0,1} with cost c/4 must reproduce {-1,+1}: same stopping k, MSE exactly 1/4."""
    pm1, pop01 = mc.with_rewards(pop, (-1.0, 1.0)), mc.with_rewards(pop, (0.0, 1.0))
    worst_k, worst_mse = 0.0, 0.0
    for _, _, lookahead, noise in (v for v in V05_VARIANTS if v[1]):
        for p_hat in prior_p.values():
            k_a, b_a = mc.run_osla(pm1, 2.0 * p_hat - 1.0,
                                         est_config(cfg, lookahead, noise, (-1.0, 1.0)))
            k_b, b_b = mc.run_osla(pop01, p_hat,
                                         est_config(cfg, lookahead, noise, (0.0, 1.0)))
            mse_a, mse_b = np.mean((b_a - pm1.mu) ** 2), np.mean((b_b - pop01.mu) ** 2)
            worst_k = max(worst_k, float(np.mean(k_a != k_b)))
            worst_mse = max(worst_mse, float(abs(4 * mse_b - mse_a) / max(mse_a, 1e-300)))
    return {"max_fraction_prompts_with_different_k": worst_k,
            "max_relative_diff_4mse01_vs_mse_pm1": worst_mse}


def time_decisions(cfg: BenchConfig, rng) -> dict:
    """Prompt-decisions per second of the vectorised ``should_continue`` and ``plan_batched``
    (best of 5), by wall clock and by this process's CPU time (the latter is robust to other
    jobs on the machine). The plan is timed on the same states, 1/10 as many of them."""
    n = cfg.timing_n
    r_lo, r_hi = cfg.rewards
    k = rng.integers(cfg.k_init, cfg.k_max + 1, n).astype(float)
    vbar = r_lo + (r_hi - r_lo) * rng.binomial(k.astype(int), 0.5) / k
    prior = mc.to_reward_scale(rng.random(n), cfg.rewards)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # other jobs slow the wall
    out = {"n_prompts": n, "load_avg_1min": load}
    for lookahead in ("predictive", "plugin"):
        for noise in ("bound", "bernoulli"):
            wall, cpu = np.inf, np.inf
            for _ in range(5):
                t0, c0 = time.perf_counter(), time.process_time()
                should_continue(vbar, k, prior, cost=cfg.cost, k_max=cfg.k_max,
                                lookahead=lookahead, rewards=cfg.rewards, noise=noise)
                wall = min(wall, time.perf_counter() - t0)
                cpu = min(cpu, time.process_time() - c0)
            out[f"{lookahead}/{noise}"] = n / wall
            out[f"{lookahead}/{noise}/per_cpu_s"] = n / max(cpu, 1e-9)
    m = max(n // 10, 1)
    plan = out["plan_batched"] = {"n_prompts": m}
    for lookahead in ("predictive", "plugin"):
        wall, cpu = np.inf, np.inf
        for _ in range(5):
            t0, c0 = time.perf_counter(), time.process_time()
            plan_batched(vbar[:m], k[:m], prior[:m], cost=cfg.cost, k_max=cfg.k_max,
                         lookahead=lookahead, rewards=cfg.rewards)
            wall = min(wall, time.perf_counter() - t0)
            cpu = min(cpu, time.process_time() - c0)
        plan[f"{lookahead}/bound"] = m / wall
        plan[f"{lookahead}/bound/per_cpu_s"] = m / max(cpu, 1e-9)
    return out


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "numpy": np.__version__}


def fmt_row(r: dict) -> str:
    tags = [r.get("lookahead"), r.get("noise"), r.get("batch") and f"B{r['batch']}"]
    name = "/".join([r["estimator"]] + [t for t in tags if t])
    ratio = r.get("mse_ratio_vs_grpo_same_k")
    return (f"{name:<32} {r.get('prior', '-'):<9} k={r['mean_k']:5.2f}  mse={r['mse']:.5f}"
            f" ±{r['mse_se']:.5f}  bias={r['bias']:+.4f}"
            + (f"  mse/grpo@k={ratio:5.2f}" if ratio is not None else ""))


def run_scenarios(cfg: BenchConfig, pop, priors: dict, log=print):
    """GRPO-G rows, then every (V0.5 variant, prior quality) row. -> grpo, v05, E[Var r]"""
    grpo = grpo_rows(cfg, pop)
    for r in grpo:
        log(fmt_row(r))
    rows, t0 = [], time.perf_counter()
    for i, q in enumerate(cfg.priors):
        new = [v05_row(cfg, pop, priors[q], q, variant) for variant in V05_VARIANTS]
        var_r = add_grpo_reference(new, pop, cfg.rewards)
        for r in new:
            log(fmt_row(r))
        rows += new
        log(f"  [{i + 1}/{len(cfg.priors)} prior qualities, {time.perf_counter() - t0:.1f}s]")
    return grpo, rows, var_r


def _timed(timing: dict, key: str, fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    timing[key] = time.perf_counter() - t0
    return out


def run_benchmark(cfg: BenchConfig, out: str | Path | None = None, plot: bool = True,
                  log=print, made_by: dict | None = None) -> dict:
    """Run every scenario; write ``<out>.json`` (and ``<out>.png``) when ``out`` is given.
    ``made_by``: the invocation's ``command``, ``date`` and ``commit``
    (``studies.provenance.provenance``, as the CLI passes it), written first; without it, the
    date alone (a call from Python has no command)."""
    t_start, timing = time.perf_counter(), {}
    rng = np.random.default_rng(cfg.seed)
    pop = mc.draw_population(cfg.n_prompts, cfg.k_max, rng, cfg.beta_ab, cfg.rewards)
    prior_p = {q: mc.prior_probs(q, pop.p, rng) for q in cfg.priors}  # (N,) probabilities
    priors = {q: mc.to_reward_scale(x, cfg.rewards) for q, x in prior_p.items()}
    grpo, rows, var_r = _timed(timing, "scenarios_s", run_scenarios, cfg, pop, priors, log)
    bias = _timed(timing, "bias_vs_k_s", bias_vs_k, cfg, pop, priors, rng)
    wc = bias["worst_case_grid"]["bound"]["max_abs_times_sqrt_k_over_sigma"]
    log(f"bias vs k ({timing['bias_vs_k_s']:.1f}s): worst |bias| sqrt(k)/sigma per k: "
        + " ".join(f"{x:.3f}" for x in wc))
    conv = (_timed(timing, "convention_check_s", convention_check, cfg, pop, prior_p)
            if cfg.convention_check else None)
    arrivals = min(cfg.n_arrivals, pop.p.size)
    log(f"batched vs sequential plans under the arrival model, {arrivals:,} prompts:")
    versus, plan_variants = _timed(
        timing, "plans_s", plans.compare_plans, mc.head(pop, arrivals),
        {q: x[:arrivals] for q, x in priors.items()}, est_config(cfg), cfg.arrival_slots,
        np.random.default_rng([cfg.seed, 1]), cfg.plan_variants, log)  # own stream: CRN above
    timing["decisions_per_s"] = time_decisions(cfg, rng)
    for name, d in (("should_continue", timing["decisions_per_s"]),
                    ("plan_batched", timing["decisions_per_s"]["plan_batched"])):
        log(f"{name} decisions/s (wall, per CPU-second): " + ", ".join(
            f"{k} {v / 1e6:.2f}M {d[k + '/per_cpu_s'] / 1e6:.2f}M"
            for k, v in d.items() if k.count("/") == 1))
    timing["total_s"] = time.perf_counter() - t_start
    loses = [{key: r[key] for key in ("estimator", "lookahead", "noise", "prior", "mean_k", "mse",
                                      "mse_ratio_vs_grpo_same_k")}
             for r in rows if r["mse_ratio_vs_grpo_same_k"] > 1.0]
    stamp = made_by or {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    result = {**stamp, "config": {**asdict(cfg), "cost": cfg.cost,
                                  "prior_qualities": {q: mc.PRIOR_QUALITIES[q]
                                                      for q in cfg.priors}},
              "machine": machine(),
              "population_var_reward": var_r, "grpo": grpo, "v05": rows, "bias_vs_k": bias,
              "convention_check": conv, "timing": timing,
              "v05_loses": loses, "batched_vs_sequential": versus,
              "plan_variants": plan_variants, "arrival_model": ARRIVAL_MODEL}
    if out is not None:
        write_outputs(result, Path(out), plot)
    return result


def write_outputs(result: dict, out: Path, plot: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(result, indent=1))
    if plot:
        from studies.estimator_mse.plot import plot_results  # matplotlib only when plotting
        plot_results(result, Path(f"{out}.png"))
