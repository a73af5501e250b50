"""Arrival model of the estimator benchmark: rollouts, rounds and cancellations of the sequential
and batched plans when rollouts finish at random times.

The model (stated once, used by both drivers below):

- every rollout's generation time is log-normal, median 1 (the time unit), sigma 0.7, independent
  of every other rollout and of its reward; a prompt never waits for an engine (no queueing), so
  prompts are independent of each other;
- rewards arrive in finish order; the n-th reward to arrive for a prompt is the n-th value of its
  pre-drawn reward stream (rewards are i.i.d. and independent of durations, so this has the same
  law, and it shares the Monte Carlo rows' rewards: common random numbers);
- a request is dispatched the moment the state asks, after every arriving reward;
- cancelled rollouts are the least advanced outstanding ones: with one decode speed, those with
  the fewest tokens are the latest dispatched, i.e. the highest indices; the fraction of its
  duration a cancelled rollout had run, (now - start) / duration, counts as spent rollouts.

``run_arrivals`` drives many prompts at once through the estimator's own vectorised rule
(``estimator.state.decide``, the one ``PromptState`` calls); ``drive_prompt_state`` drives the
real ``PromptState`` one prompt at a time with the same durations and rewards, and a unit test
checks that the two agree on every prompt.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from studies.estimator_mse.montecarlo import Population, fused_baseline
from estimator import PromptState
from estimator.registry import Estimator
from estimator.state import decide

DURATION_SIGMA = 0.7  # log-normal shape of a rollout's generation time (median 1)
OUTSTANDING, OBSERVED, CANCELLED = 1, 2, 3  # slot states; 0 = never requested


@dataclass(frozen=True)
class ArrivalRun:
    """Per-prompt outcome of a driver, each (N,)."""

    k: np.ndarray          # observed rewards when the prompt is done
    baseline: np.ndarray   # the estimator's baseline from them
    rounds: np.ndarray     # generation rounds (the longest chain of dependent requests)
    spent: np.ndarray      # rollout equivalents: k + the run fractions of cancelled rollouts
    cancelled: np.ndarray  # rollouts cancelled
    requested: np.ndarray  # rollouts ever requested (observed + cancelled)
    time: np.ndarray       # when the prompt is done (units of the median rollout duration)


def draw_durations(n: int, slots: int, rng: np.random.Generator,
                   sigma: float = DURATION_SIGMA) -> np.ndarray:
    """Generation time of rollout index s of prompt i: log-normal, median 1. -> (N, slots)"""
    return rng.lognormal(0.0, sigma, (n, slots))


def run_arrivals(pop: Population, prior: np.ndarray, est: Estimator, durations: np.ndarray,
                 **rule) -> ArrivalRun:
    """Every prompt's event loop at once: each pass takes the next arriving reward of every
    prompt with rollouts in flight, then applies the estimator's decision (``decide``).

    pop: N prompts' reward streams; prior (N,) on the reward scale; durations (N, S), S bounds the
    requests per prompt (RuntimeError if a prompt needs more); rule: ``decide``'s keywords (the
    measured alternatives; PromptState's defaults when empty).
    """
    n, slots = durations.shape
    rows_all = np.arange(n)
    start = np.full((n, slots), np.inf)       # dispatch time of each slot
    status = np.zeros((n, slots), np.int8)
    rnd = np.zeros((n, slots), np.int64)      # round of each slot
    k, requested, top = (np.zeros(n, np.int64) for _ in range(3))
    rsum, now, spent = np.zeros(n), np.zeros(n), np.zeros(n)
    rows = rows_all
    while rows.size:
        out = (status[rows] == OUTSTANDING).sum(axis=1)
        vbar = np.divide(rsum[rows], k[rows], out=np.zeros(rows.size), where=k[rows] > 0)
        d = decide(est, k[rows], vbar, prior[rows], out, top[rows] + 1, **rule)
        _cancel(rows, d.cancel, status, start, durations, now, spent)
        _dispatch(rows, d.request, status, start, rnd, requested, now, top, slots)
        rows = rows[(status[rows] == OUTSTANDING).any(axis=1)]
        if not rows.size:
            break
        # the next arrival of every prompt still waiting: (R, S) -> slot (R,)
        finish = np.where(status[rows] == OUTSTANDING, start[rows] + durations[rows], np.inf)
        slot = np.argmin(finish, axis=1)
        now[rows] = finish[np.arange(rows.size), slot]
        status[rows, slot] = OBSERVED
        rsum[rows] += pop.rewards[rows, k[rows]]
        k[rows] += 1
        top[rows] = np.maximum(top[rows], rnd[rows, slot])
    cancelled = (status == CANCELLED).sum(axis=1)
    baseline = _baseline(rsum, k, prior, est)
    return ArrivalRun(k, baseline, np.where(status == OBSERVED, rnd, 0).max(axis=1),
                      k + spent, cancelled, requested, now)


def _cancel(rows, count, status, start, durations, now, spent) -> None:
    """Cancel the ``count`` highest-index outstanding slots of each row (least advanced)."""
    sel = np.flatnonzero(count > 0)
    if not sel.size:
        return
    r = rows[sel]
    mask = status[r] == OUTSTANDING                          # (C, S)
    from_top = np.cumsum(mask[:, ::-1], axis=1)[:, ::-1]     # outstanding slots at or above
    hit = mask & (from_top <= count[sel, None])
    ran = (now[r, None] - start[r]) / durations[r]           # fraction of each rollout done
    spent[r] += np.where(hit, ran, 0.0).sum(axis=1)
    status[r] = np.where(hit, CANCELLED, status[r])


def _dispatch(rows, count, status, start, rnd, requested, now, top, slots) -> None:
    """Request ``count`` new slots per row, indices requested .. requested + count - 1."""
    sel = np.flatnonzero(count > 0)
    if not sel.size:
        return
    r = rows[sel]
    lo, hi = requested[r], requested[r] + count[sel]
    if hi.max() > slots:
        raise RuntimeError(f"a prompt requested more than {slots} rollouts; draw more slots")
    s = np.arange(slots)
    new = (s >= lo[:, None]) & (s < hi[:, None])             # (C, S)
    status[r] = np.where(new, OUTSTANDING, status[r])
    start[r] = np.where(new, now[r, None], start[r])
    rnd[r] = np.where(new, (top[r] + 1)[:, None], rnd[r])
    requested[r] = hi


def _baseline(rsum, k, prior, est: Estimator) -> np.ndarray:
    vbar = rsum / np.maximum(k, 1)
    if not est.needs_prior:
        return vbar
    return fused_baseline(vbar, k.astype(float), prior, est.cfg)


def drive_prompt_state(est: Estimator, prior_p: float | None, stream, durations) -> dict:
    """The same model around one real ``PromptState`` (the reference for ``run_arrivals``).

    stream: the prompt's rewards in arrival order; durations: (S,) by rollout index.
    """
    st = PromptState(est, prior_p)
    start, flight, spent, now = {}, [], 0.0, 0.0  # flight: heap of (finish time, index)
    while True:
        for i in sorted(st.outstanding_indices(), reverse=True)[: st.to_cancel()]:
            st.cancel(i)
            spent += (now - start[i]) / durations[i]
        flight = [(t, i) for t, i in flight if i in st.outstanding_indices()]
        heapq.heapify(flight)
        n = st.to_request()
        for i in range(st.requested - n, st.requested):
            start[i] = now
            heapq.heappush(flight, (now + durations[i], i))
        if not flight:
            break
        now, i = heapq.heappop(flight)
        st.add(float(stream[st.k]), index=i)
    assert st.done
    return {"k": st.k, "baseline": st.baseline, "rounds": st.rounds, "spent": st.k + spent,
            "cancelled": st.requested - st.k, "requested": st.requested, "time": now}
