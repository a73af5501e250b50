"""What one chaos scenario reports, and the evidence it is judged on (the run's own files).

``prompts_lost`` and ``prompts_trained_twice`` come from ``cluster.records.metrics.prompt_fates``: every
uid the sampler handed out (``s0 .. s<data_pos - 1>``) must appear exactly once across
prompts.jsonl, dropped.jsonl and inflight_at_end.json, after the crash and the resume.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Outcome:
    """One row of ``bench/results/chaos.json``'s ``scenarios``."""

    name: str
    injected: str               # what was done to the system, in words
    survived: bool              # the run (or the run and its resume) completed its steps
    prompts_lost: int | None    # admitted uids with no fate (None: no run dir to judge)
    prompts_trained_twice: int | None
    hung: bool                  # past its wall-clock budget, or stopped by the watchdog
    recovery_time_s: float | None
    recovery: str               # how recovery_time_s is measured in this scenario
    wall_s: float               # the scenario's wall-clock, setup of shared actors excluded
    budget_s: float
    what_happened: str = ""     # what the system did, in words (from the evidence)
    detail: dict = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return bool(self.survived and self.prompts_lost == 0
                    and self.prompts_trained_twice == 0 and not self.hung)

    def to_dict(self) -> dict:
        return {**asdict(self), "clean": self.clean}


def read_jsonl(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def summary_of(run_dir: Path) -> dict | None:
    f = Path(run_dir) / "summary.json"
    return json.loads(f.read_text()) if f.is_file() else None


def evidence(run_dir: Path) -> dict:
    """Fates by uid and the accounting identity, from a finished run's files."""
    from cluster.records.files import prompt_fates

    summary = summary_of(run_dir)
    if summary is None or "data_pos" not in summary:
        return {"fates": None, "summary_status": (summary or {}).get("status", "missing")}
    fates = prompt_fates(run_dir)
    acct = {k: summary.get(k) for k in ("prompts_admitted", "prompts_trained", "prompts_dropped",
                                         "prompts_in_flight_at_end")}
    acct["identity_holds"] = acct["prompts_admitted"] == (
        acct["prompts_trained"] + acct["prompts_dropped"] + acct["prompts_in_flight_at_end"])
    acct["by_uid_holds"] = fates["admitted"] == (fates["trained"] + fates["dropped"]
                                                 + fates["in_flight"])
    short = {k: (v if not isinstance(v, list) else v[:20]) for k, v in fates.items()}
    return {"fates": short, "lost": fates["lost"], "trained_twice": fates["trained_twice"],
            # a prompt deferred and also admitted (or deferred twice) has two fates as well
            "trained_and_dropped": fates["trained_and_dropped"] + fates["deferred_twice"],
            "unknown": fates["unknown"],
            "accounting": acct, "drop_reasons": summary.get("drop_reasons", {})}


def timeline(run_dir: Path, t_fault: float | None, t_recovered: float | None) -> dict:
    """When each step ended, and the fault and the recovery, in seconds since the run's first
    step started (the plot's data; after a resume the steps kept from before the crash come
    first, then the gap)."""
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    if not rows:
        return {}
    t0 = rows[0]["t_start"]
    rel = lambda t: None if t is None else round(t - t0, 2)  # noqa: E731
    return {"step": [r["step"] for r in rows], "step_end_s": [rel(r["t_step_end"]) for r in rows],
            "skipped": [bool(r.get("skipped")) for r in rows],
            "fault_s": rel(t_fault), "recovered_s": rel(t_recovered)}


def judge(name: str, injected: str, run_dir: Path | None, *, completed: bool, hung: bool,
          wall_s: float, budget_s: float, recovery_time_s: float | None, recovery: str,
          what_happened: str = "", t_fault: float | None = None,
          t_recovered: float | None = None, **detail) -> Outcome:
    """The scenario's row: lost / trained twice by uid from ``run_dir``'s files."""
    ev = evidence(run_dir) if run_dir is not None else {"fates": None}
    if run_dir is not None:
        detail["timeline"] = timeline(run_dir, t_fault, t_recovered)
    lost = twice = None
    if ev.get("fates") is not None:
        lost = len(ev["lost"])
        # Trained and also dropped is a double fate too: count it with the twice-trained.
        twice = len(ev["trained_twice"]) + len(ev["trained_and_dropped"])
        detail["lost_uids"] = ev["lost"][:20]
        detail["trained_twice_uids"] = ev["trained_twice"][:20]
        detail["fates"] = ev["fates"]
        detail["accounting"] = ev["accounting"]
        detail["drop_reasons"] = ev["drop_reasons"]
    return Outcome(name=name, injected=injected, survived=completed, prompts_lost=lost,
                   prompts_trained_twice=twice, hung=hung or wall_s > budget_s,
                   recovery_time_s=None if recovery_time_s is None else round(recovery_time_s, 2),
                   recovery=recovery, wall_s=round(wall_s, 1), budget_s=budget_s,
                   what_happened=what_happened, detail=detail)


def first_step_after(run_dir: Path, t: float, after_step: int = 0) -> dict | None:
    """The first metrics.jsonl row of a step after ``after_step`` that ended after time ``t``."""
    for row in read_jsonl(Path(run_dir) / "metrics.jsonl"):
        if row["step"] > after_step and row["t_step_end"] > t:
            return row
    return None


def drawn_identity(out: Outcome, run_dir: Path) -> Outcome:
    """Admission by selection: every prompt drawn ended once, as admitted, deferred or still
    waiting (summary.json, resumes included): the figures in ``detail["drawn"]``, and the
    row not survived where they do not add up."""
    s = summary_of(run_dir) or {}
    keys = ("prompts_drawn", "prompts_admitted", "prompts_deferred", "prompts_waiting_at_end",
            "prior_fallbacks")
    d = {k: s.get(k) for k in keys}
    holds = None not in d.values() and d["prompts_drawn"] == (
        d["prompts_admitted"] + d["prompts_deferred"] + d["prompts_waiting_at_end"])
    out.detail["drawn"] = {**d, "identity_holds": holds}
    out.survived = bool(out.survived and holds)
    out.what_happened += (f" Selection: {d['prompts_drawn']} prompts drawn = "
                          f"{d['prompts_admitted']} admitted + {d['prompts_deferred']} deferred "
                          f"+ {d['prompts_waiting_at_end']} waiting"
                          + ("" if holds else ": does NOT add up") + ".")
    return out
