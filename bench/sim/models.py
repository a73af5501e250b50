"""Models and configuration of the cluster simulator (``bench.sim``). Pure NumPy, no ML stack.

Every model is a small frozen dataclass whose defaults describe a Qwen3-4B-like policy served by
vLLM on H100/H200-class GPUs, trained on DAPO-Math-like prompts. docs/simulator.md states each
default, what it is assumed from and how rough it is. Times are seconds, lengths are tokens.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from estimator import EstimatorConfig


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class DecodeModel:
    """Time of one decode step of a continuous-batching engine (vLLM) running n sequences.

    Memory-bound decode: every step reads the weights once (``a_s``) plus each running
    sequence's KV cache and does its share of compute (``b_s`` per sequence), so throughput
    n / (a_s + b_s n) grows with the batch and saturates at 1 / b_s tokens/s. ``table`` (measured
    (n, seconds) points, interpolated linearly, extrapolated along the last segment) overrides
    a_s and b_s: the calibration hook uses it.
    """

    a_s: float = 0.006            # per-step cost independent of batch (weights read, launch)
    b_s: float = 0.0001           # per-sequence cost per step (KV read at ~3k context, compute)
    max_num_seqs: int = 256       # running sequences per engine: what an H200's KV cache holds
                                  # at ~2.9k tokens of average context (docs/simulator.md)
    table: tuple | None = None    # ((n, seconds), ...) measured points, n ascending

    def __post_init__(self):
        _check(self.max_num_seqs >= 1, f"decode.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        _check(self.a_s >= 0 and self.b_s >= 0 and self.a_s + self.b_s > 0,
               f"decode.a_s and decode.b_s must be >= 0, not both 0 (got {self.a_s}, {self.b_s})")
        if self.table is not None:
            pts = np.asarray(self.table, dtype=float)
            _check(pts.ndim == 2 and pts.shape[1] == 2 and len(pts) >= 1,
                   "decode.table must be a list of [n, seconds] pairs")
            _check(bool((pts[:, 0] >= 1).all() and (np.diff(pts[:, 0]) > 0).all()),
                   "decode.table batch sizes n must be >= 1 and strictly increasing")
            _check(bool((pts[:, 1] > 0).all()), "decode.table step times must be > 0")

    def step_times(self) -> np.ndarray:
        """Seconds per decode step for n = 0..max_num_seqs running sequences, shape (max+1,)."""
        n = np.arange(self.max_num_seqs + 1, dtype=float)
        if self.table is None:
            t = self.a_s + self.b_s * n
        else:
            pts = np.asarray(self.table, dtype=float)
            t = np.interp(n, pts[:, 0], pts[:, 1])
            if len(pts) >= 2:  # np.interp clamps; extrapolate along the last segment instead
                (n0, t0), (n1, t1) = pts[-2], pts[-1]
                over = n > n1
                t[over] = t1 + (n[over] - n1) * max(0.0, (t1 - t0) / (n1 - n0))
        t[0] = np.nan  # an empty engine does not step
        return t

    def peak_tokens_per_s(self) -> float:
        return self.max_num_seqs / float(self.step_times()[-1])


def _phi(z: np.ndarray) -> np.ndarray:
    """Standard normal CDF (no scipy dependency)."""
    return 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))


@dataclass(frozen=True)
class LengthModel:
    """Response lengths: log-normal, truncated at ``max_tokens``, correlated within a prompt.

    ln L = ln(median) + sigma (sqrt(s) z_prompt + sqrt(1 - s) z_rollout), s = ``prompt_share``:
    some problems need long solutions for every sample. With ``file`` (one integer per line) the
    marginal is that file's empirical distribution instead (quantile of Phi(z)), keeping the same
    within-prompt correlation.
    """

    median: float = 2500.0
    sigma: float = 0.7
    prompt_share: float = 0.5
    max_tokens: int = 20480       # DAPO's response length (configs/qwen3-4b-dapo-32gpu.yaml)
    min_tokens: int = 16
    prompt_tokens: int = 256      # trained (not generated) tokens per rollout; prefill is ignored
    file: str | None = None
    values: tuple | None = None   # empirical lengths given inline (calibration); beats ``file``

    def __post_init__(self):
        _check(self.median > 0, f"length.median must be > 0, got {self.median}")
        _check(self.sigma >= 0, f"length.sigma must be >= 0, got {self.sigma}")
        _check(0 <= self.prompt_share <= 1, f"length.prompt_share must be in [0, 1], got {self.prompt_share}")
        _check(1 <= self.min_tokens <= self.max_tokens,
               f"need 1 <= length.min_tokens <= length.max_tokens, got {self.min_tokens}, {self.max_tokens}")
        _check(self.prompt_tokens >= 0, f"length.prompt_tokens must be >= 0, got {self.prompt_tokens}")

    def empirical(self) -> np.ndarray | None:
        if self.values is not None:
            vals = np.asarray(self.values, dtype=float)
        elif self.file is not None:
            path = Path(self.file)
            _check(path.is_file(), f"length.file {self.file!r} does not exist")
            vals = np.array([float(x) for x in path.read_text().split()])
        else:
            return None
        _check(vals.size >= 1 and bool((vals >= 1).all()),
               "response lengths must be a non-empty list of integers >= 1")
        return np.sort(vals)

    def draw(self, z_prompt: np.ndarray, z_roll: np.ndarray) -> np.ndarray:
        """(N,), (N, K) standard normals -> (N, K) integer lengths in [min_tokens, max_tokens]."""
        s = self.prompt_share
        z = math.sqrt(s) * z_prompt[:, None] + math.sqrt(1.0 - s) * z_roll
        emp = self.empirical()
        if emp is None:
            length = np.exp(math.log(self.median) + self.sigma * z)
        else:
            length = np.quantile(emp, np.clip(_phi(z), 0.0, 1.0))
        return np.clip(np.rint(length), self.min_tokens, self.max_tokens).astype(np.int64)


def parse_prior(quality: str) -> tuple[str, float]:
    """The prior's quality (on the probability scale, against the true success rate p):

    - 'exact': the prior is p;
    - 'errX': p + s z, z ~ N(0, 1), clipped to [0, 1], with the scale s chosen so that the
      standard deviation of (prior - p) over the prompt population is X: the quantity that
      ``studies.prior_truth`` measures (its ``error_sd`` with the truth's sampling noise removed);
      zero-mean, no bias (docs/simulator.md, "The prior's error");
    - 'sdX': the same with the scale s = X itself (before clipping: at X = 0.2 on the default
      U-shaped population the error's sd is 0.161, since p near 0 or 1 clips most of it);
    - 'hallucX': a fraction X gets 1 - p; 'constX': X for every prompt.
    """
    if quality == "exact":
        return "exact", 0.0
    for kind in ("sd", "err", "halluc", "const"):
        if quality.startswith(kind):
            try:
                val = float(quality[len(kind):])
            except ValueError:
                break
            if 0 <= val <= 1:
                return kind, val
    raise ValueError("prompts.prior must be exact, errX, sdX, hallucX or constX with X in "
                     f"[0, 1], got {quality!r}")


_SCALE_DRAWS = 200_000  # prompts in the fixed sample that maps an error sd to a noise scale


def _population(beta_a: float, beta_b: float, p_values: tuple | None):
    """A fixed sample of the prompt population's p and of the prior's standard normals."""
    rng = np.random.default_rng([12345, 1])
    if p_values is not None:
        p = np.asarray(p_values, float)[rng.integers(0, len(p_values), _SCALE_DRAWS)]
    else:
        p = rng.beta(beta_a, beta_b, _SCALE_DRAWS)
    return p, np.random.default_rng([12345, 2]).normal(size=_SCALE_DRAWS)


@functools.lru_cache(maxsize=64)
def noise_scale_for_error_sd(error_sd: float, beta_a: float = 0.3, beta_b: float = 0.3,
                             p_values: tuple | None = None) -> float:
    """The scale s of the 'errX' prior: clip(p + s z) - p has sd ``error_sd`` over the
    population (bisection; the clipped error grows monotonically with s)."""
    if error_sd <= 0:
        return 0.0
    p, z = _population(beta_a, beta_b, p_values)
    sd = lambda s: float(np.std(np.clip(p + s * z, 0.0, 1.0) - p))  # noqa: E731
    hi = 1.0
    while sd(hi) < error_sd:
        hi *= 2
        _check(hi <= 64, f"no Gaussian prior on this population has error sd {error_sd} "
               f"(the most a clipped one reaches is {sd(64.0):.3f})")
    lo = 0.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sd(mid) < error_sd else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class PromptModel:
    """True success rates p ~ Beta(a, b) (U-shaped) or resampled from measured (p, prior) pairs;
    the V0 prior's prediction of p with a named quality (see :func:`parse_prior`). ``prior``'s
    default is the old assumption; ``python -m bench.sim`` sets it from a measurement
    (bench/sim/measured.py)."""

    beta_a: float = 0.3
    beta_b: float = 0.3
    prior: str = "sd0.2"
    p_values: tuple | None = None       # measured per-prompt success rates (calibration)
    prior_values: tuple | None = None   # the prior's p for the same prompts, paired

    def __post_init__(self):
        _check(self.beta_a > 0 and self.beta_b > 0, "prompts.beta_a and prompts.beta_b must be > 0")
        parse_prior(self.prior)
        if self.p_values is not None:
            p = np.asarray(self.p_values, float)
            _check(p.size >= 1 and bool(((p >= 0) & (p <= 1)).all()), "prompts.p_values must lie in [0, 1]")
            if self.prior_values is not None:
                q = np.asarray(self.prior_values, float)
                _check(q.shape == p.shape, "prompts.prior_values must pair one-to-one with p_values")
                _check(bool(((q >= 0) & (q <= 1)).all()), "prompts.prior_values must lie in [0, 1]")

    def draw(self, n: int, rng: np.random.Generator, prior_rng: np.random.Generator):
        """-> p (n,), prior probability (n,). The prior has its own stream so that changing its
        quality leaves p, rewards and lengths unchanged (common random numbers)."""
        if self.p_values is not None:
            idx = rng.integers(0, len(self.p_values), n)
            p = np.asarray(self.p_values, float)[idx]
            if self.prior_values is not None:
                return p, np.asarray(self.prior_values, float)[idx]
        else:
            p = rng.beta(self.beta_a, self.beta_b, n)
        kind, val = parse_prior(self.prior)
        noise, flip = prior_rng.normal(0.0, 1.0, n), prior_rng.random(n)
        if kind == "exact":
            return p, p.copy()
        if kind in ("sd", "err"):
            return p, np.clip(p + self.noise_scale() * noise, 0.0, 1.0)
        if kind == "halluc":  # the mirrored prediction, as in studies/estimator_mse/montecarlo.py
            return p, np.where(flip < val, 1.0 - p, p)
        return p, np.full(n, val)

    def noise_scale(self) -> float:
        """The Gaussian prior's scale before clipping ('sdX': X; 'errX': from X)."""
        kind, val = parse_prior(self.prior)
        if kind == "err":
            return noise_scale_for_error_sd(val, self.beta_a, self.beta_b, self.p_values)
        return val if kind == "sd" else 0.0

    def prior_error_sd(self, n: int = 100_000, seed: int = 0) -> float:
        """sd of (prior - p) over ``n`` drawn prompts: what this model's prior error is, on the
        probability scale, whatever kind it is (measured pairs included)."""
        p, q = self.draw(n, np.random.default_rng([seed, 97]), np.random.default_rng([seed, 96]))
        return float(np.std(q - p))


@dataclass(frozen=True)
class LearnerModel:
    """Learner time per step = step_overhead_s + trained tokens * s_per_token_gpu / learner GPUs;
    weight sync costs sync_s (learner broadcast, and each engine pauses that long)."""

    s_per_token_gpu: float = 1.0e-4   # one GPU trains ~10k tokens/s of a 4B model
    step_overhead_s: float = 5.0      # optimizer step, ZeRO-3 gathers, batch assembly
    sync_s: float = 3.0               # 8 GB of bf16 weights broadcast + engine reload

    def __post_init__(self):
        _check(self.s_per_token_gpu >= 0, f"learner.s_per_token_gpu must be >= 0, got {self.s_per_token_gpu}")
        _check(self.step_overhead_s >= 0, f"learner.step_overhead_s must be >= 0, got {self.step_overhead_s}")
        _check(self.sync_s >= 0, f"learner.sync_s must be >= 0, got {self.sync_s}")


@dataclass(frozen=True)
class SimConfig:
    """The cluster, the algorithms' knobs and the run budget."""

    n_gpus: int = 32
    prior_gpus: int = 1               # V0.5 only: the V0 prior server's GPU (GRPO has none)
    n_generators: int = 17            # one engine each; learner GPUs = the rest
    gpus_per_generator: int = 1
    batch_prompts: int = 2048         # B: prompts per learner step (the shipped 32-GPU config)
    group_size: int = 16              # G of GRPO
    # V0.5's budget, at the estimator's own defaults (and checked by it):
    k_init: int = EstimatorConfig.k_init
    k_max: int = EstimatorConfig.k_max
    cost: float = EstimatorConfig.cost          # per rollout, on the {-1, +1} reward scale
    plan: str = EstimatorConfig.plan            # "batched" or "sequential"
    max_rounds: int | None = EstimatorConfig.max_rounds  # batched: most rounds per prompt
    max_staleness: int = 6            # async: no trained sample older than this (versions)
    max_inflight_prompts: int | None = None
    equal_mse_group: int | None = None  # G of async_grpo_equal_mse (set from a V0.5 run)
    best_grpo_group: int = 4          # G of async_grpo_best_g (python -m bench.sim reads it
                                      # from bench/results/learning.json when that names one)
    oversample: float = 0.1           # sync_grpo16_colocated_oversample: admit ceil((1 + this)
                                      # x B) prompts per step, train the first B to finish
    select_floor: float = 0.1         # *_select modes: the selection's exploration floor
                                      # (algo.select_floor; actors/scheduler/selection.py)
    steps: int = 40                   # budget: learner steps per mode ...
    max_hours: float | None = None    # ... or simulated hours, whichever ends first
    warmup_steps: int | None = None   # rates after this many steps; None: max_staleness + 2
    overlap_slowdown: float = 1.0     # async only: factor on decode and learner times (shared cores)
    dispatch_latency_s: float = 0.01  # coordinator -> engine request latency (one Ray call)
    seed: int = 0
    decode: DecodeModel = field(default_factory=DecodeModel)
    length: LengthModel = field(default_factory=LengthModel)
    prompts: PromptModel = field(default_factory=PromptModel)
    learner: LearnerModel = field(default_factory=LearnerModel)

    def __post_init__(self):
        self.estimator_config()  # the budget, plan and cost: the estimator's rules
        for name in ("n_gpus", "n_generators", "gpus_per_generator", "batch_prompts",
                     "group_size", "steps"):
            _check(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        _check(self.learner_gpus_for(True) >= 1, f"n_gpus ({self.n_gpus}) must leave >= 1 learner "
               f"GPU after {self.n_generators} generators x {self.gpus_per_generator} and "
               f"{self.prior_gpus} prior GPU(s)")
        _check(self.max_staleness >= 0, f"max_staleness must be >= 0, got {self.max_staleness}")
        _check(self.warmup < self.steps, f"warm-up ({self.warmup} steps) must be shorter than "
               f"the run ({self.steps} steps)")
        _check(self.equal_mse_group is None or self.equal_mse_group >= 1, "equal_mse_group must be >= 1")
        _check(self.best_grpo_group >= 1, f"best_grpo_group must be >= 1, got {self.best_grpo_group}")
        _check(self.oversample >= 0, f"oversample must be >= 0, got {self.oversample}")
        _check(0 < self.select_floor <= 1, f"select_floor must lie in (0, 1], got "
               f"{self.select_floor}")
        _check(self.overlap_slowdown >= 1.0, f"overlap_slowdown must be >= 1, got {self.overlap_slowdown}")
        _check(self.dispatch_latency_s >= 0, f"dispatch_latency_s must be >= 0, got {self.dispatch_latency_s}")
        _check(self.max_hours is None or self.max_hours > 0, "max_hours must be > 0")
        _check(self.prior_gpus >= 0, f"prior_gpus must be >= 0, got {self.prior_gpus}")
        _check(self.max_inflight_prompts is None or self.max_inflight_prompts >= 1,
               "max_inflight_prompts must be >= 1")

    def estimator_config(self) -> EstimatorConfig:
        """V0.5's estimator settings (on the default {-1, +1} rewards of the prompt model)."""
        return EstimatorConfig(k_init=self.k_init, k_max=self.k_max, cost=self.cost,
                               plan=self.plan, max_rounds=self.max_rounds)

    def usable_gpus(self, needs_prior: bool) -> int:
        """GPUs that generate or train: V0.5 gives ``prior_gpus`` of them to its prior."""
        return self.n_gpus - (self.prior_gpus if needs_prior else 0)

    def learner_gpus_for(self, needs_prior: bool) -> int:
        return self.usable_gpus(needs_prior) - self.n_generators * self.gpus_per_generator

    @property
    def warmup(self) -> int:
        """Learner steps before the steady-state window: the pipeline fills in max_staleness
        + 1 versions, one more for margin (the issue's rule: after max_staleness + 2 steps)."""
        return self.max_staleness + 2 if self.warmup_steps is None else self.warmup_steps

    @property
    def reward_slots(self) -> int:
        return 2 * max(self.group_size, self.k_max, self.equal_mse_group or 0,
                       self.best_grpo_group)

    @property
    def oversampled_prompts(self) -> int:
        """Prompts admitted per step by the over-sampling barrier: ceil((1 + oversample) B)."""
        return math.ceil((1.0 + self.oversample) * self.batch_prompts - 1e-9)


# -- loading, overrides --------------------------------------------------------------------

def _tuplify(x):
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


def from_dict(d: dict, base: SimConfig | None = None, _cls=SimConfig, _prefix=""):
    """Nested dict -> config dataclass (unknown keys raise ValueError naming them)."""
    base = base if base is not None else _cls()
    if not isinstance(d, dict):
        raise ValueError(f"config section {_prefix or 'root'!r} must be a mapping, got {type(d).__name__}")
    known = {f.name for f in fields(_cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown config key(s) {[_prefix + k for k in unknown]}; valid: {sorted(known)}")
    kw = {}
    for k, v in d.items():
        cur = getattr(base, k)
        kw[k] = from_dict(v, cur, type(cur), f"{_prefix}{k}.") if is_dataclass(cur) else _tuplify(v)
    return replace(base, **kw)


def load_file(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config file {path!r} does not exist")
    text = p.read_text()
    return json.loads(text) if p.suffix == ".json" else (yaml.safe_load(text) or {})


def parse_overrides(items: list[str]) -> dict:
    """['decode.a_s=0.005', 'n_generators=16'] -> nested dict (values parsed as YAML)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value (dotted keys for sections)")
        key, val = item.split("=", 1)
        node = out
        *parents, leaf = key.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(val)
    return out
