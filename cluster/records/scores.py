"""The evaluation figures of ``python -m cluster.evaluate`` (pure: NumPy and the standard
library), from each prompt's graded answers:

- ``mean@n``: the mean over a prompt's n sampled answers of their correctness, averaged over
  prompts (the training run's ``eval_sampled``);
- ``pass@k``: the chance that at least one of k answers is right, by the unbiased estimator
  1 - C(n - c, k) / C(n, k) from c right of n (Chen et al., 2021), for k <= n;
- ``maj@k``: whether the most frequent answer among the first k (by what the grader read;
  ties broken by first appearance) is right, unread answers not voting;
- ``greedy``: the greedy answer's correctness.

Each figure is a mean over prompts with its standard error (prompts are the independent
units), overall and per ``data_source``.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class PromptAnswers:
    """One prompt's graded answers: each sampled answer's correctness and what the grader
    read of it (None: nothing), and the greedy answer's correctness (None: not asked)."""

    source: str
    correct: list[bool] = field(default_factory=list)
    read: list[str | None] = field(default_factory=list)
    greedy: bool | None = None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c right answers of n (k <= n)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} answers a prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_right(correct: list[bool], read: list[str | None], k: int) -> bool:
    """Whether the most frequent answer read among the first k is right (none read: no)."""
    votes = [(r, ok) for r, ok in zip(read[:k], correct[:k]) if r is not None]
    if not votes:
        return False
    counts = Counter(r for r, _ in votes)
    top = max(counts.values())
    winner = next(r for r, _ in votes if counts[r] == top)  # ties: the first to appear
    return next(ok for r, ok in votes if r == winner)


def mean_se(x: list[float]) -> dict:
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return {"mean": None, "se": None}
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else None
    return {"mean": float(a.mean()), "se": se}


def figures(prompts: list[PromptAnswers], ks: list[int]) -> dict:
    """mean@n, pass@k and maj@k for each k in ``ks``, greedy; each {mean, se} over prompts."""
    n = min((len(p.correct) for p in prompts), default=0)
    out: dict = {"prompts": len(prompts), "n": n}
    if n:
        out[f"mean@{n}"] = mean_se([float(np.mean(p.correct[:n])) for p in prompts])
        for k in [k for k in ks if k <= n]:
            out[f"pass@{k}"] = mean_se([pass_at_k(n, sum(p.correct[:n]), k) for p in prompts])
            out[f"maj@{k}"] = mean_se([float(majority_right(p.correct, p.read, k))
                                       for p in prompts])
    greedy = [float(p.greedy) for p in prompts if p.greedy is not None]
    if greedy:
        out["greedy"] = mean_se(greedy)
    return out


def by_source(prompts: list[PromptAnswers], ks: list[int]) -> dict:
    """``figures`` overall (``all``) and per data source (a source of "" is "(none)")."""
    out = {"all": figures(prompts, ks)}
    sources = sorted({p.source for p in prompts})
    if len(sources) > 1 or (sources and sources[0]):
        for s in sources:
            out[s or "(none)"] = figures([p for p in prompts if p.source == s], ks)
    return out


def table(result: dict) -> str:
    """The figures as a text table: a row per data source, a column per figure."""
    rows = list(result.items())
    cols = [c for c in rows[0][1] if c not in ("prompts", "n")]
    head = ["source", "prompts", *cols]
    lines = [head]
    for name, f in rows:
        cells = [name, str(f["prompts"])]
        for c in cols:
            v = f.get(c) or {}
            cells.append("-" if v.get("mean") is None else
                         f"{v['mean']:.3f}" + ("" if v.get("se") is None else f" +- {v['se']:.3f}"))
        lines.append(cells)
    width = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, width)).rstrip() for r in lines)
