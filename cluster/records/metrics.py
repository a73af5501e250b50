"""The figures of a step and of a run, computed by pure functions from what a step saw: a
step's record (``step_metrics`` -> ``cluster.records.step.StepMetrics``), the run's counters
and clock (``Tally``, their one owner) and the run's end (``run_summary`` ->
``cluster.records.summary.RunSummary``); the files themselves are ``cluster.records.files``'s."""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass, replace

import numpy as np

from cluster.records.step import HeldOut, StepMetrics
from cluster.records.summary import RunSummary, Totals
from common.records import Accounting, GeneratorStats, StepResult, mean_extras
from common.types import PromptRecord, TrainBatch
from estimator.core import reward_to_prob


@dataclass(frozen=True)
class StepTimes:
    """Wall-clock marks of one learner step (seconds since the epoch)."""

    start: float        # the trainer asked for a batch
    got_batch: float    # the coordinator handed it over
    trained: float      # train_step returned
    published: float    # every generator loaded the new weights
    end: float          # after the evaluation, if any

    @property
    def eval_s(self) -> float:
        return self.end - self.published


def rates(totals) -> dict:
    """Totals per second of training wall-clock (``train_s``: evaluations excluded, over the
    run and its resumes)."""
    wall = max(1e-9, totals.train_s)
    return {"prompts_per_s": totals.prompts_trained / wall,
            "rollouts_per_s": totals.rollouts / wall,
            "tokens_per_s": totals.tokens_generated / wall}


@dataclass(frozen=True)
class GeneratorActivity:
    """What the generators did between two ``Generator.stats()`` samples (``generator_delta``):
    busy fraction, slot occupancy and decode tokens/s, named as metrics.jsonl and summary.json
    carry them (``to_dict``)."""

    generator_busy_fraction: float = 0.0   # of engine-time with a generate call in progress
    generator_slot_occupancy: float = 0.0  # sequence-seconds over slot-seconds
    decode_tokens_per_s: float = 0.0       # tokens sampled per second, summed over generators

    def to_dict(self) -> dict:
        return asdict(self)


def per_generator(before: list[GeneratorStats | None], after: list[GeneratorStats | None],
                  peaks: list[float] | None = None) -> list[dict]:
    """Each generator's busy fraction, slot occupancy and decode tokens/s between two
    ``Generator.stats()`` samples, and that rate over the generator's measured peak."""
    out = []
    for i, (a, b) in enumerate(zip(before, after)):
        if b is None:
            out.append({"index": i, "alive": False})
            continue
        d = generator_delta([a], [b])
        row = {"index": i, "alive": True, "busy_fraction": d.generator_busy_fraction,
               "slot_occupancy": d.generator_slot_occupancy,
               "decode_tokens_per_s": d.decode_tokens_per_s}
        if peaks:
            row["peak_decode_tokens_per_s"] = peaks[i]
            row["fraction_of_peak"] = d.decode_tokens_per_s / peaks[i] if peaks[i] else None
        out.append(row)
    return out


def generator_delta(before: list[GeneratorStats | None],
                    after: list[GeneratorStats | None]) -> GeneratorActivity:
    """Busy fraction, slot occupancy and decode tokens/s of the generators between two
    ``Generator.stats()`` samples (a generator that restarted in between counts from 0)."""
    busy = seq = tokens = span = slots = 0.0
    for a, b in zip(before, after):
        if b is None:
            continue
        a = a if a is not None and a.uptime_s <= b.uptime_s else None
        dt = b.uptime_s - (a.uptime_s if a else 0.0)
        busy += b.busy_s - (a.busy_s if a else 0.0)
        seq += b.seq_s - (a.seq_s if a else 0.0)
        tokens += b.counts.sampled_tokens - (a.counts.sampled_tokens if a else 0)
        span += dt
        slots += dt * b.max_num_seqs
    live = max(1, sum(b is not None for b in after))
    return GeneratorActivity(
        generator_busy_fraction=min(1.0, busy / span) if span > 0 else 0.0,
        generator_slot_occupancy=min(1.0, seq / slots) if slots > 0 else 0.0,
        decode_tokens_per_s=tokens / (span / live) if span > 0 else 0.0)


def pair_auc(score, label) -> float:
    """P(score_i > score_j | label_i > label_j), ties in score count 1/2; pairs with equal
    labels are skipped (for binary labels this is the ROC AUC). NaN when no pair differs."""
    s = np.asarray(score, dtype=np.float64)
    y = np.asarray(label, dtype=np.float64)
    ds = np.sign(s[:, None] - s[None, :])
    mask = y[:, None] > y[None, :]
    if not mask.any():
        return math.nan
    return float(((ds[mask] + 1.0) / 2.0).mean())


PRIOR_WINDOW_STEPS = 20  # the prior's corrected error pooled over this many recent steps


def prior_error_terms(p, first) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt terms of the prior's noise-corrected error against the truth.

    p (N,): the prior's success probabilities; first (N, m), m >= 2: each prompt's first m
    rewards on the [0, 1] scale, drawn whatever the stopping rule later decided (the k_init
    rollouts every prompt gets), so that they are i.i.d. given the prompt's true success rate
    mu. With vbar their mean and s2 their sample variance (ddof=1; vbar (1 - vbar) m / (m - 1)
    for binary rewards), E[vbar] = mu and E[s2 / m] = Var(vbar), hence

        sq   = (p - vbar)^2 - s2 / m    unbiased for (p - mu)^2
        bias = p - vbar                 unbiased for p - mu

    The means of ``sq`` and ``bias`` over prompts estimate E[(p - mu)^2] and E[p - mu]; a mean
    of ``sq`` may be negative by chance (a prior nearly exact). Returns (sq, bias), each (N,)."""
    p = np.asarray(p, dtype=np.float64)
    x = np.asarray(first, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != p.shape[0] or x.shape[1] < 2:
        raise ValueError(f"first must be (N={p.shape[0]}, m >= 2) rewards, got {x.shape}")
    m = x.shape[1]
    vbar = x.mean(axis=1)
    return (p - vbar) ** 2 - x.var(axis=1, ddof=1) / m, p - vbar


def prior_error_summary(sq_sum: float, bias_sum: float, n: int) -> dict:
    """The corrected error figures from sums of ``prior_error_terms`` over n prompts:
    ``prior_error_var_corrected`` (estimate of E[(p - mu)^2], may be negative),
    ``prior_error_sd_corrected`` (the square root of its positive part), ``prior_bias``
    (E[p - mu]: > 0, the prior over-predicts success)."""
    if n <= 0:
        return {}
    var = sq_sum / n
    return {"prior_error_var_corrected": var, "prior_error_sd_corrected": math.sqrt(max(0.0, var)),
            "prior_bias": bias_sum / n}


def first_rewards(records: list[PromptRecord], m: int,
                  rewards: tuple[float, float]) -> tuple[list[PromptRecord], np.ndarray]:
    """The records with a prior and at least m rewards, and their first m rewards (in rollout
    index order, the order of ``PromptRecord.rewards``: the first k_init are the prompt's
    initial dispatch) mapped to [0, 1] and clipped (``reward_to_prob``), shape (n, m)."""
    keep = [r for r in records if r.prior_p is not None and len(r.rewards) >= m]
    x = np.array([r.rewards[:m] for r in keep], dtype=np.float64).reshape(len(keep), m)
    return keep, np.asarray(reward_to_prob(x, rewards), dtype=np.float64)


def batch_metrics(records: list[PromptRecord], estimator_k_init: int,
                  rewards: tuple[float, float]) -> dict:
    """What the trained prompts looked like: rewards, k, rounds, the prior's calibration.
    ``rewards``: the task's (r_lo, r_hi); a prompt's observed success rate is its mean reward
    on that range (``estimator.core.reward_to_prob``, clipped: overlong-shaped rewards fall
    below r_lo), the rate the prior is trained on (``actors.prompts.success_rate``)."""
    if not records:
        return {"prompts": 0, "reward_mean": math.nan, "rollouts": 0, "tokens_generated": 0, "k_mean": math.nan,
                "k_hist": [], "prior_accept_rate": None, "unparsed_fraction": 0.0}
    ks = np.array([r.k for r in records])
    accepted = [r.prior_accepted for r in records if r.prior_accepted is not None]
    with_prior = [r for r in records if r.prior_p is not None]
    rollouts = int(ks.sum())
    out = {"prompts": len(records),
           "reward_mean": float(np.mean([x for r in records for x in r.rewards])),
           "rollouts": rollouts, "tokens_generated": int(sum(r.tokens for r in records)),
           "k_mean": float(ks.mean()), "k_hist": np.bincount(ks).tolist(),
           "extra_rollouts": int(np.maximum(ks - estimator_k_init, 0).sum()),
           "rounds_mean": float(np.mean([r.rounds for r in records])),
           "cancelled_rollouts": int(sum(r.cancelled_rollouts for r in records)),
           "prior_accept_rate": float(np.mean(accepted)) if accepted else None,
           "unparsed_fraction": sum(r.unparsed for r in records) / max(1, rollouts),
           # a reward function's other numbers: each's mean over the step's rollouts
           "reward_extras": mean_extras([r.reward_extras for r in records],
                                        [r.k for r in records]),
           "response_len_mean": float(np.mean([n for r in records for n in r.lengths]))}
    if with_prior:
        # The prior's running error: |p - observed success rate| over this step's prompts.
        obs = np.asarray(reward_to_prob(np.array([np.mean(r.rewards) for r in with_prior]),
                                        rewards), dtype=np.float64)
        out["prior_abs_error"] = float(np.mean(np.abs(np.array([r.prior_p for r in with_prior])
                                                      - obs)))
        # Within-step ranking: does the prior order this step's prompts by success rate?
        out["prior_auc"] = pair_auc([r.prior_p for r in with_prior], obs)
        out["prior_prompts"] = len(with_prior)
        out.update(corrected_prior_error(with_prior, estimator_k_init, rewards))
    return out


def corrected_prior_error(records: list[PromptRecord], k_init: int,
                          rewards: tuple[float, float]) -> dict:
    """The prior's error against the truth, corrected for the noise of observed rates, from
    each prompt's first ``k_init`` rewards (``prior_error_terms``): ``prior_error_var_corrected``,
    ``prior_error_sd_corrected``, ``prior_bias``, and ``prior_error_n`` (the prompts counted;
    ``pool_prior_error`` pools steps by it). Empty when k_init < 2 (no variance to correct
    with) or no prompt has a prior."""
    if k_init < 2:
        return {}
    keep, x = first_rewards(records, k_init, rewards)
    if not keep:
        return {}
    sq, bias = prior_error_terms([r.prior_p for r in keep], x)
    return {**prior_error_summary(float(sq.sum()), float(bias.sum()), len(keep)),
            "prior_error_n": len(keep)}


def pool_prior_error(steps) -> dict:
    """``prior_error_summary`` over the prompts of several steps' metrics (each weighted by
    its ``prior_error_n``; steps without the figures are skipped), with ``prior_error_n``."""
    n = sq = bias = 0.0
    for m in steps:
        k, var, b = m.get("prior_error_n"), m.get("prior_error_var_corrected"), m.get("prior_bias")
        if k and var is not None and b is not None:
            n, sq, bias = n + k, sq + var * k, bias + b * k
    return {**prior_error_summary(sq, bias, int(n)), "prior_error_n": int(n)} if n else {}


def rolling_prior_error(steps: list[dict], window: int = PRIOR_WINDOW_STEPS) -> dict:
    """``pool_prior_error`` over each step and the ``window - 1`` before it: arrays (one per
    step, NaN where no step of the window has the figures) of ``prior_error_sd_corrected``
    and ``prior_bias``."""
    out = {k: np.full(len(steps), np.nan) for k in ("prior_error_sd_corrected", "prior_bias")}
    for i in range(len(steps)):
        pooled = pool_prior_error(steps[max(0, i - window + 1):i + 1])
        for k, a in out.items():
            a[i] = pooled.get(k, np.nan)
    return out


# Every field of the learner's ``StepResult`` and the ``StepMetrics`` field that carries it
# (the same name but for the batch's sizes, which the step record names as the learner's
# beside its own trained_samples and trained_tokens). A field added to StepResult fails
# tests/unit/test_run_writer.py until it is named here.
LEARNER_FIELDS = {
    "loss": "loss", "grad_norm": "grad_norm", "grad_noise_to_signal": "grad_noise_to_signal",
    "clip_fraction": "clip_fraction", "approx_kl": "approx_kl", "kl": "kl",
    "entropy": "entropy", "is_weight": "is_weight", "truncated_fraction": "truncated_fraction",
    "dual_clip_fraction": "dual_clip_fraction", "n_tokens": "learner_tokens",
    "n_samples": "learner_samples", "skipped": "skipped", "skip_reason": "skip_reason",
    "updates_applied": "updates_applied", "consecutive_skips": "consecutive_skips",
    "learner_step_s": "learner_step_s", "lr": "lr", "micro_batches": "micro_batches"}


def step_metrics(step: int, version: int, batch: TrainBatch, learner: StepResult, t: StepTimes,
                 generators: GeneratorActivity, k_init: int, rewards: tuple[float, float],
                 tally: Tally, held_out: HeldOut | None,
                 nodes_alive: int | None = None) -> StepMetrics:
    """One step's record, counted in ``tally`` (``rewards``: the task's range, see
    ``batch_metrics``; ``generators``: what they did during the step; ``held_out``: the
    evaluation that ended the step, if any)."""
    staleness = np.array([batch.version - v for v in batch.sample_versions()] or [0])
    tokens = batch.sample_tokens()
    step_s = t.published - t.start
    figures = {
        **batch_metrics(batch.records, k_init, rewards), "trained_samples": len(tokens),
        # rollouts the batch did not train: cut by its cap at S samples, held out by the oracle
        "rollouts_not_trained": sum(r.k - r.trained_samples for r in batch.records
                                    if r.trained_samples is not None),
        "trained_tokens": sum(tokens), "generated_rollouts": batch.rollouts_generated,
        **{ours: getattr(learner, theirs) for theirs, ours in LEARNER_FIELDS.items()},
        "staleness_mean": float(staleness.mean()), "staleness_max": int(staleness.max()),
        "step_time_s": step_s, "learner_wait_s": t.got_batch - t.start,
        "train_time_s": t.trained - t.got_batch, "sync_time_s": t.published - t.trained,
        "learner_idle_fraction": (t.got_batch - t.start) / step_s if step_s > 0 else 0.0,
        "inflight_prompts": batch.inflight_prompts, **generators.to_dict(),
        "t_start": t.start, "t_train_start": t.got_batch, "t_train_end": t.trained,
        "t_step_end": t.published, "eval_time_s": t.eval_s}
    running = tally.step(len(batch.records), learner.skipped, figures)
    return StepMetrics(step=step, policy_version=version, **figures, **running,
                       held_out=held_out, nodes_alive=nodes_alive)


def run_summary(cfg, acct: Accounting, totals: Totals, steps: int, version: int, wall: float,
                initial: HeldOut | None, final: HeldOut | None, extras: dict) -> RunSummary:
    """summary.json: the coordinator's accounting, the run's counters, rates over training
    wall-clock (``totals.train_s``: evaluations excluded, over the run and its resumes, as
    the counters are), the held-out accuracy at the start and the end. ``wall``: this
    process's wall-clock since its loop started (``wall_time_s``); ``extras``: the
    generators over the run and the start (``cluster.run.start.run_extras``)."""
    # Prompts of a step the learner skipped (NaN) count as dropped, with their reason.
    acct = replace(acct, drop_reasons=replace(acct.drop_reasons,
                                              learner_nan_skip=totals.prompts_skipped_nan))
    train_wall = max(1e-9, totals.train_s)
    per_s = rates(totals)
    return RunSummary(
        steps=steps, policy_version=version, totals=totals, accounting=acct, mode=cfg.mode,
        algo=cfg.algo.name, wall_time_s=wall, train_wall_time_s=train_wall,
        prompts_per_s=per_s["prompts_per_s"], rollouts_per_s=per_s["rollouts_per_s"],
        learner_idle_fraction=totals.learner_wait_s / train_wall, **extras,
        eval_metric=cfg.run.eval_metric, eval_initial=initial, eval_final=final,
        **run_prior_error(totals))


def run_prior_error(totals: Totals) -> dict:
    """The prior's error over every trained prompt of the run (resumes included), from the
    run's running sums: ``prior_abs_error`` (mean |p - observed success|) and the
    noise-corrected ``prior_error_var_corrected``, ``prior_error_sd_corrected``, ``prior_bias``
    (``corrected_prior_error``, pooled over ``prior_error_n`` prompts)."""
    out = {}
    if totals.prior_error_prompts:
        out["prior_abs_error"] = totals.prior_error_sum / totals.prior_error_prompts
    if totals.prior_error_n:
        out.update(prior_error_summary(totals.prior_error_sq_sum, totals.prior_bias_sum,
                                       totals.prior_error_n))
    return out


class Tally:
    """The one owner of the run's counters (``totals``, restored from a checkpoint) and of the
    training wall-clock on them: ``train_s`` counts up to the last ``tick``; the time between a
    ``tick`` and the next ``skip`` (an evaluation) is not training. Rates, the summary's
    ``train_wall_time_s`` and the ``run.max_train_s`` budget all read ``totals.train_s``.
    Also the prior's noise-corrected error pooled over the run and the last
    ``PRIOR_WINDOW_STEPS`` steps (this process's; a resume starts the window afresh)."""

    def __init__(self, restored: dict | None = None, now: float | None = None):
        self.totals = Totals.from_json(restored)
        self.prior_window: deque[dict] = deque(maxlen=PRIOR_WINDOW_STEPS)
        self.mark = time.time() if now is None else now

    def tick(self, now: float) -> float:
        """Count the time since the last mark as training; returns ``train_s``."""
        self.totals.train_s += max(0.0, now - self.mark)
        self.mark = now
        return self.totals.train_s

    def skip(self, now: float) -> None:
        """The time since the last mark was not training (an evaluation, the start)."""
        self.mark = now

    def step(self, prompts: int, skipped: bool, m: dict) -> dict:
        """Count a step's prompts, rollouts and waits (``m``: its figures); returns the
        running figures: the prior's error over the run and the window, and the rates."""
        t = self.totals
        t.nan_skipped_steps += skipped
        if skipped:
            t.prompts_skipped_nan += prompts
        else:
            t.prompts_trained += prompts
        t.rollouts += m["rollouts"]
        t.tokens_generated += m["tokens_generated"]
        t.learner_wait_s += m["learner_wait_s"]
        out = {}
        if m.get("prior_abs_error") is not None:  # the prior's running error over the run
            t.prior_error_sum += m["prior_abs_error"] * m["prior_prompts"]
            t.prior_error_prompts += m["prior_prompts"]
            out["prior_abs_error_running"] = t.prior_error_sum / t.prior_error_prompts
        return {**out, **self.prior_error(m), **rates(t)}

    def evaluation(self, held_out: HeldOut) -> None:
        self.totals.eval_time_s += held_out.duration_s
        self.totals.last_eval_train_s = self.totals.train_s
        self.totals.last_eval_rollouts = self.totals.rollouts_generated

    def update_failures(self, n: int) -> None:
        """Generators that failed to load a published version."""
        self.totals.generator_update_failures += n

    def prior_error(self, m: dict) -> dict:
        """Pool the step's ``corrected_prior_error`` into the run's sums and the window:
        ``prior_error_sd_corrected_{running,window}``, ``prior_bias_{running,window}``, ..."""
        t = self.totals
        if m.get("prior_error_n"):
            n = m["prior_error_n"]
            t.prior_error_sq_sum += m["prior_error_var_corrected"] * n
            t.prior_bias_sum += m["prior_bias"] * n
            t.prior_error_n += n
            self.prior_window.append(m)
        if not t.prior_error_n:
            return {}
        out = {}
        for when, pooled in (("running", prior_error_summary(
                t.prior_error_sq_sum, t.prior_bias_sum, t.prior_error_n)),
                             ("window", pool_prior_error(self.prior_window))):
            for key in ("prior_error_sd_corrected", "prior_error_var_corrected", "prior_bias"):
                if key in pooled:
                    out[f"{key}_{when}"] = pooled[key]
        return out
