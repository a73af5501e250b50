"""What the report reads of a run: ``RunData`` and ``load_run``, from the run's files only
(``metrics.jsonl``, ``prompts.jsonl``, ``dropped.jsonl``, ``inflight_at_end.json``,
``summary.json``, ``config.yaml``; see docs/pipeline.md). The page (``cluster/report/page.py``) and
its sections (``cluster/report/sections.py``) build on it; it imports neither.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cluster.records.step import StepMetrics
from cluster.records.summary import RunSummary

# Parse at most this many lines of prompts.jsonl: beyond, every m-th line of the older part
# and the newest lines whole (the rollout timeline reads those), to stay within seconds.
MAX_PROMPT_LINES = 20_000
TAIL_PROMPT_LINES = 5_000
_UID = re.compile(r'"uid": "((?:[^"\\]|\\.)*)"')


class ReportError(RuntimeError):
    """The run directory cannot be reported (it or its metrics.jsonl is missing)."""


@dataclass
class RunData:
    """What the report reads of a run. Missing files are empty (or None where "absent" and
    "empty" differ: ``dropped``, ``inflight``, ``summary``)."""

    dir: Path
    metrics: list[StepMetrics]          # metrics.jsonl, one record per step
    summary: RunSummary | None = None   # summary.json
    config: dict = field(default_factory=dict)   # config.yaml, parsed
    prompts: list[dict] = field(default_factory=list)  # prompts.jsonl (a sample when huge)
    prompt_lines: int = 0               # lines of prompts.jsonl
    prompt_uids: Counter | None = None  # every line's uid (all lines, also when sampled)
    prompts_stride: int = 1             # 1: every line parsed; m: 1 in m of the older lines
    tail_start: int = 0                 # prompts[tail_start:] are the newest lines, all parsed
    dropped: list[dict] | None = None   # dropped.jsonl
    inflight: list[str] | None = None   # inflight_at_end.json's uids
    bad_lines: int = 0                  # lines that did not parse (a crash mid-write)

    def col(self, get: Callable[[StepMetrics], object]) -> np.ndarray:
        """``get`` of every step's record as floats, NaN where absent, null or not a number
        (``run.col(lambda m: m.reward_mean)``; ``held_out``: a held-out figure's)."""
        return np.array([as_float(get(m)) for m in self.metrics], dtype=float)

    @property
    def steps(self) -> np.ndarray:
        return np.array([as_float(m.step) for m in self.metrics], dtype=float)

    @property
    def t0(self) -> float | None:
        """The run's clock origin: the trainer's start (after the initial evaluation)."""
        t = as_float(self.summary.t_start if self.summary else None)
        if math.isnan(t) and self.metrics:
            t = as_float(self.metrics[0].t_start)
        return None if math.isnan(t) else t

    @property
    def status(self) -> str:
        return "unknown" if self.summary is None else str(self.summary.status)


def held_out(field: str) -> Callable[[StepMetrics], object]:
    """A step's held-out figure ``field`` (a ``HeldOut`` field), None without an evaluation."""
    return lambda m: getattr(m.held_out, field) if m.held_out is not None else None


def as_float(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def _jsonl(path: Path) -> tuple[list[dict], int]:
    """Parsed lines and how many did not parse."""
    if not path.exists():
        return [], 0
    return _parse(path.read_text(errors="replace").splitlines())


def _parse(lines: list[str]) -> tuple[list[dict], int]:
    rows, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def load_run(run_dir: str | Path) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory")
    if not (run_dir / "metrics.jsonl").exists():
        raise ReportError(f"{run_dir}: no metrics.jsonl (not a run directory, or the run wrote "
                          "no step yet)")
    metrics, bad = _jsonl(run_dir / "metrics.jsonl")
    run = RunData(run_dir, [StepMetrics.from_json(m) for m in metrics], bad_lines=bad)
    summary = _json(run_dir / "summary.json")
    run.summary = RunSummary.from_json(summary) if isinstance(summary, dict) else None
    run.config = _config(run_dir / "config.yaml")
    _load_prompts(run, run_dir / "prompts.jsonl")
    if (run_dir / "dropped.jsonl").exists():
        run.dropped, bad = _jsonl(run_dir / "dropped.jsonl")
        run.bad_lines += bad
    inflight = _json(run_dir / "inflight_at_end.json")
    if isinstance(inflight, dict) and isinstance(inflight.get("uids"), list):
        run.inflight = inflight["uids"]
    return run


def _config(path: Path) -> dict:
    if not path.exists():
        return {}
    import yaml

    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _load_prompts(run: RunData, path: Path) -> None:
    if not path.exists():
        return
    text = path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    run.prompt_lines = len(lines)
    if len(lines) <= MAX_PROMPT_LINES:
        run.prompts, bad = _parse(lines)
        run.prompt_uids = Counter(str(p.get("uid")) for p in run.prompts if "uid" in p)
    else:
        head = len(lines) - TAIL_PROMPT_LINES
        run.prompts_stride = m = math.ceil(head / (MAX_PROMPT_LINES - TAIL_PROMPT_LINES))
        sampled, bad = _parse(lines[:head:m])
        tail, bad2 = _parse(lines[head:])
        run.prompts, run.tail_start, bad = sampled + tail, len(sampled), bad + bad2
        run.prompt_uids = Counter(_UID.findall(text))  # every line's, without parsing them
    run.bad_lines += bad
