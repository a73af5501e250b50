"""The V0 prior server: p(x) = P(current policy solves x) from an in-context policy profile.

The coordinator feeds back (prompt, observed success rate, policy version) as prompts finish
(``observe``); the server keeps the newest ``window`` of them and asks its backend for p on new
prompts (``predict``). A plain class: the launcher wraps it, e.g.

    PriorActor = ray.remote(num_cpus=0.5)(PriorServer)
    prior = PriorActor.remote("embedded", {}, window=256, cpu_threads=1)

Offline evaluation: ``python -m actors.prior predict --context C.jsonl --queries Q.jsonl`` (the
CLI lives in ``actors/prior_cli.py``). Only the standard library is imported at import time.
"""
from __future__ import annotations

import math
import numbers
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence


class PriorOutputError(RuntimeError):
    """A backend returned something that is not one finite number per prompt."""


def check_score(score, where: str) -> float:
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        raise ValueError(f"{where}: score must be a number in [0, 1], got {score!r}")
    s = float(score)
    if math.isnan(s) or not 0.0 <= s <= 1.0:
        raise ValueError(f"{where}: score {score!r} is outside [0, 1] or NaN")
    return s


def check_prompt(prompt, where: str) -> str:
    if not isinstance(prompt, str):
        raise ValueError(f"{where}: prompt must be a string, got {type(prompt).__name__}")
    return prompt


def _limit_threads(n: int) -> None:
    """Cap BLAS (NumPy) threads; torch's are capped by the encoder (``threads`` option)."""
    import numpy  # noqa: F401  (load OpenBLAS first: threadpoolctl caps only loaded pools)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(n)


def make_prior(name: str, **options):
    """Build a prior backend by config name (see ``actors.priors``); ValueError lists valid names."""
    from actors.priors import make_prior as _make
    return _make(name, **options)


def prior_names() -> list[str]:
    from actors.priors import prior_names as _names
    return _names()


class PriorServer:
    """Window of recent observations + a backend. Methods are synchronous and cheap to call
    through a Ray handle; ``ready()`` returns once the backend (and its encoder) is loaded."""

    def __init__(self, backend: str = "embedded", options: dict | None = None,
                 window: int = 256, cpu_threads: int = 1):
        if int(window) < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if int(cpu_threads) < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads!r}")
        _limit_threads(int(cpu_threads))
        opts = dict(options or {})
        if backend == "embedded":
            opts.setdefault("threads", int(cpu_threads))
        self.backend_name = backend
        self.backend = make_prior(backend, **opts)
        self.window = int(window)
        self._items: deque[tuple[str, float, int]] = deque(maxlen=self.window)
        self._dirty = True
        self._latest_version = 0
        self._n_observed = 0
        self._n_calls = 0
        self._n_predicted = 0
        self._latency_s = 0.0
        self._last_latency_s = 0.0

    def ready(self) -> bool:
        return True

    def observe(self, items: Iterable[Sequence]) -> int:
        """Add (prompt, success rate in [0, 1], policy version) triples; returns the window size.
        All items are validated before any is added."""
        checked = []
        for i, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) != 3:
                raise ValueError(f"observe item {i}: expected (prompt, score, version), got {item!r}")
            prompt, score, version = item
            where = f"observe item {i}"
            if isinstance(version, bool) or not isinstance(version, numbers.Integral) or version < 0:
                raise ValueError(f"{where}: version must be an int >= 0, got {version!r}")
            checked.append((check_prompt(prompt, where), check_score(score, where), int(version)))
        for it in checked:
            self._items.append(it)
            self._latest_version = max(self._latest_version, it[2])
        self._n_observed += len(checked)
        self._dirty = self._dirty or bool(checked)
        return len(self._items)

    def _context(self):
        import numpy as np
        from actors.priors import Context
        prompts = tuple(p for p, _, _ in self._items)
        scores = np.array([s for _, s, _ in self._items], dtype=np.float64)
        ages = np.array([self._latest_version - v for _, _, v in self._items], dtype=np.float64)
        return Context(prompts, scores, np.maximum(ages, 0.0))

    def predict(self, prompts: Sequence[str]) -> list[float]:
        """p in [0, 1] for each prompt, in order."""
        import numpy as np
        if isinstance(prompts, str):
            raise ValueError("predict takes a list of prompts, got a single string")
        prompts = [check_prompt(p, f"predict prompt {i}") for i, p in enumerate(prompts)]
        t0 = time.perf_counter()
        if self._dirty:
            self.backend.set_context(self._context())
            self._dirty = False
        if not prompts:
            return []
        raw = self.backend.predict(prompts)
        try:
            p = np.asarray(raw, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as e:
            raise PriorOutputError(f"prior backend {self.backend_name!r} returned non-numeric "
                                   f"output: {raw!r:.200}") from e
        if p.shape != (len(prompts),):
            raise PriorOutputError(f"prior backend {self.backend_name!r} returned {p.size} values "
                                   f"for {len(prompts)} prompts")
        bad = np.flatnonzero(~np.isfinite(p))
        if bad.size:
            raise PriorOutputError(f"prior backend {self.backend_name!r} returned non-finite "
                                   f"values at positions {bad[:10].tolist()}: {p[bad[:10]].tolist()}")
        out = np.clip(p, 0.0, 1.0).tolist()
        dt = time.perf_counter() - t0
        self._n_calls += 1
        self._n_predicted += len(prompts)
        self._latency_s += dt
        self._last_latency_s = dt
        return out

    def stats(self) -> dict:
        calls = self._n_calls
        return {"backend": self.backend_name, "window": self.window,
                "n_context": len(self._items), "n_observed": self._n_observed,
                "latest_version": self._latest_version, "predict_calls": calls,
                "n_predicted": self._n_predicted,
                "mean_latency_ms": 1e3 * self._latency_s / calls if calls else 0.0,
                "last_latency_ms": 1e3 * self._last_latency_s, **self.backend.stats()}


if __name__ == "__main__":
    # ``python -m actors.prior predict ...`` keeps working; the CLI is its own module.
    from actors.prior_cli import main
    sys.exit(main())
