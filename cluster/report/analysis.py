"""The numbers behind the report's checks and calibration table, from ``RunData`` alone (no
HTML, no matplotlib): the prompt accounting (``accounting_checks``; ``cluster/report/page.py``
derives the ``--check`` exit code from it) and the prior's reliability bins.
"""
from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np

from cluster.records.summary import RunSummary
from cluster.report.data import RunData, as_float


def file_counts(run: RunData) -> dict[str, int | None]:
    """What the run's files count, under the summary.json key each is checked against
    (None: the file is absent)."""
    return {"prompts_trained": run.prompt_lines if (run.dir / "prompts.jsonl").exists() else None,
            "prompts_dropped": None if run.dropped is None else len(run.dropped),
            "prompts_in_flight_at_end": None if run.inflight is None else len(run.inflight)}


def summary_accounting(s: RunSummary | None) -> dict:
    """The prompt counts summary.json holds, under the names ``file_counts`` uses: the
    trained prompts (the run's counters) and, when the coordinator's accounting was
    collected (not in a stalled run), admitted, dropped (with ``drop_reasons``) and in flight
    at the end."""
    if s is None:
        return {}
    out = {"prompts_trained": s.totals.prompts_trained}
    a = s.accounting
    if a is not None:
        out.update(prompts_admitted=a.scheduler.prompts_admitted,
                   prompts_dropped=a.prompts_dropped,
                   prompts_in_flight_at_end=a.prompts_in_flight_at_end,
                   drop_reasons=asdict(a.drop_reasons))
    return out


def accounting_checks(run: RunData) -> list[tuple[str, bool | None, str]]:
    """(what, holds, detail) per check; holds None: not checkable from what the run wrote."""
    s = summary_accounting(run.summary)
    keys = ("prompts_admitted", "prompts_trained", "prompts_dropped", "prompts_in_flight_at_end")
    v = {k: s.get(k) for k in keys}
    out = []
    if all(isinstance(x, int) for x in v.values()):
        a, t, d, f = (v[k] for k in keys)
        out.append(("admitted = trained + dropped + in flight", a == t + d + f,
                    f"{a} {'=' if a == t + d + f else '≠'} {t} + {d} + {f} = {t + d + f}"))
    else:
        out.append(("admitted = trained + dropped + in flight", None,
                    "summary.json has no accounting" + (" (stalled run)" if run.status == "stalled"
                                                        else "")))
    reasons = s.get("drop_reasons")
    if isinstance(reasons, dict) and isinstance(v["prompts_dropped"], int):
        n = sum(x for x in reasons.values() if isinstance(x, int))
        out.append(("drop reasons add up to dropped", n == v["prompts_dropped"],
                    f"{n} by reason, {v['prompts_dropped']} dropped"))
    files = file_counts(run)
    for what, key in (("prompts.jsonl lines = trained", "prompts_trained"),
                      ("dropped.jsonl lines = dropped", "prompts_dropped"),
                      ("inflight_at_end.json uids = in flight", "prompts_in_flight_at_end")):
        n = files[key]
        if n is not None and isinstance(v[key], int):
            out.append((what, n == v[key], f"{n} in the file, {v[key]} in summary.json"))
    if run.prompt_uids is not None:
        twice = sorted(u for u, c in run.prompt_uids.items() if c > 1)
        both = sorted(set(run.prompt_uids) & {str(d.get("uid")) for d in run.dropped or []})
        out.append(("no prompt trained twice", not twice, ", ".join(twice[:10]) or "none"))
        if run.dropped is not None:
            out.append(("no prompt both trained and dropped", not both, ", ".join(both[:10]) or "none"))
    return out


def reliability_bins(prompts: list[dict], reward_range: tuple[float, float] | None = None,
                     nbins: int = 10) -> tuple[list[dict], str]:
    """Predicted p against observed success of each prompt with a prior. Success: the mean
    reward rescaled to [0, 1] by the task's reward range (``reward_range``, the config's
    ``task.reward_low/high``, as ``batch_metrics``; else the range the run's rewards span)."""
    pairs = []
    for p in prompts:
        prior_p, rewards = as_float(p.get("prior_p")), p.get("rewards")
        if math.isnan(prior_p) or not isinstance(rewards, list) or not rewards:
            continue
        rewards = [as_float(r) for r in rewards]
        if not any(math.isnan(r) for r in rewards):
            pairs.append((prior_p, rewards))
    if not pairs:
        return [], "no prompt in prompts.jsonl has a prior_p and rewards"
    lo, hi = reward_range or (min(min(r) for _, r in pairs), max(max(r) for _, r in pairs))
    if hi <= lo:
        return [], f"every reward is {lo:g}: success is undefined"
    bins = [{"lo": i / nbins, "hi": (i + 1) / nbins, "ps": [], "os": []} for i in range(nbins)]
    for p, r in pairs:
        b = bins[min(nbins - 1, max(0, int(p * nbins)))]
        b["ps"].append(p)
        b["os"].append(min(1.0, max(0.0, (sum(r) / len(r) - lo) / (hi - lo))))
    for b in bins:
        ps, os_ = b.pop("ps"), b.pop("os")
        b["n"] = len(ps)
        b["p"] = float(np.mean(ps)) if ps else math.nan
        b["obs"] = float(np.mean(os_)) if os_ else math.nan
        b["se"] = float(np.std(os_, ddof=1) / math.sqrt(len(os_))) if len(os_) > 1 else 0.0
    return bins, ""
