"""The V0 prior server: p(x) = P(current policy solves x) from an in-context policy profile.

The coordinator feeds back each finished prompt as a ``common.types.PriorObservation`` (its
text, observed success rate, policy version and rollouts; ``observe``); the server keeps the
newest ``window`` of them and asks its backend for p on new prompts (``predict``). A plain
class: the launcher wraps it, e.g.

    PriorActor = ray.remote(num_cpus=0.5)(PriorServer)
    prior = PriorActor.remote("embedded", {}, window=256, cpu_threads=1)

The fallback chain, innermost first: a backend that raises, answers garbage or takes longer than
``budget_s`` is answered for by the ``fallback`` backend (by default the embedded prior, for a
backend whose traits say it may fail, the embedded one itself aside: ``PriorTraits``), counted
in ``stats().fallbacks`` by reason; a server that does not answer at all within the
coordinator's ``prior.timeout_s`` makes the coordinator use the empirical mean
(``actors/coordinator.py``).

Offline evaluation: ``python -m actors.priors predict ...`` (the CLI lives in
``actors/priors/cli.py``; ``actors/priors/__main__.py`` runs it, so this module never imports
it). Only the standard library (and ``common.types``, itself pure) is imported at import
time.
"""
from __future__ import annotations

import math
import numbers
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

from common.types import PriorObservation

if TYPE_CHECKING:
    from actors.priors.base import BackendStats

DEFAULT_BUDGET_S = 5.0
AUTO_FALLBACK = "embedded"      # what ``fallback="auto"`` builds, for a backend that may fail


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


def check_observation(item, where: str) -> PriorObservation:
    """``item`` with every field checked and made a plain str, float or int (a NumPy number
    from a caller's arithmetic included), else ValueError naming ``where``."""
    if not isinstance(item, PriorObservation):
        raise ValueError(f"{where}: expected a PriorObservation, got {item!r:.200}")
    version, n = item.version, item.rollouts
    if isinstance(version, bool) or not isinstance(version, numbers.Integral) or version < 0:
        raise ValueError(f"{where}: version must be an int >= 0, got {version!r}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"{where}: rollouts must be an int >= 1, got {n!r}")
    return PriorObservation(check_prompt(item.prompt, where), check_score(item.score, where),
                            int(version), int(n))


def _in_thread(fn: Callable[[], object]) -> Future:
    """Run ``fn`` in a fresh daemon thread; its Future. Daemon: a backend stuck past its budget
    never keeps the process from exiting (a thread pool's workers would be joined at exit)."""
    fut: Future = Future()

    def run():
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001  (handed to the caller)
                fut.set_exception(e)
    threading.Thread(target=run, name="prior-backend", daemon=True).start()
    return fut


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


@dataclass(frozen=True)
class BackendSpec:
    """What a server builds its backends from (``PriorServer``'s arguments of the same names)."""

    backend: str
    options: dict
    fallback: str | None
    fallback_options: dict
    cpu_threads: int


@dataclass
class FallbackCounts:
    """The server's calls answered by its fallback, by reason: ``timeout`` (no answer within
    the budget, or an earlier call still running past it), ``error`` (raised, or garbage)."""

    timeout: int = 0
    error: int = 0

    @property
    def total(self) -> int:
        return self.timeout + self.error


@dataclass(frozen=True)
class PriorStats:
    """The server's ``stats()``: its window, its predictions, its fallback, and its backend's
    own counters (``backend_stats``: None for a backend that keeps none, and while a call past
    its budget still runs: a stuck backend is not asked). ``to_dict``: flat, the backend's
    fields beside the server's, as bench.prior's prior.json carries them."""

    backend: str                    # the primary backend's name
    window: int
    n_context: int                  # observations in the window
    n_observed: int                 # observations taken since the start
    latest_version: int             # the newest policy version they named
    predict_calls: int
    n_predicted: int                # prompts predicted
    mean_latency_ms: float          # per predict call
    last_latency_ms: float
    fallback: str | None            # the fallback backend's name (None: none)
    budget_s: float | None
    fallbacks: FallbackCounts
    n_fallback_predicted: int       # prompts the fallback answered
    last_fallback: str              # why the latest fallback answered ("": never)
    fallback_unavailable: str       # why "auto" has none here ("": it has one, or needs none)
    backend_stats: BackendStats | None

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "backend_stats"}
        out["fallbacks"] = asdict(self.fallbacks)
        return {**out, **(self.backend_stats.to_dict() if self.backend_stats else {})}


class PriorServer:
    """Window of recent observations + a backend (+ a fallback backend). Methods are synchronous
    and cheap to call through a Ray handle; ``ready()`` returns once the backends are loaded.

    ``fallback``: the backend that answers when the primary one raises, returns garbage or
    exceeds ``budget_s`` seconds ("auto": the embedded prior when the primary's traits say it
    may fail (``PriorTraits.fallible``) and it is not the embedded prior itself, and only if it
    can be built here; None: no fallback, errors reach the caller).
    ``fallback_options``: its options. ``budget_s``: seconds the primary has for one
    ``predict`` (its context refit included) before the fallback answers; it needs a fallback
    (None: no limit). The primary then runs in a helper thread; a call past its budget keeps
    running there and its answer is dropped; until it ends, predictions come from the fallback.
    """

    def __init__(self, backend: str = "embedded", options: dict | None = None,
                 window: int = 256, cpu_threads: int = 1, fallback: str | None = "auto",
                 fallback_options: dict | None = None, budget_s: float | None = DEFAULT_BUDGET_S,
                 log_path: str | None = None):
        from common.logs import to_file

        to_file(log_path)
        if int(window) < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if int(cpu_threads) < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads!r}")
        if budget_s is not None and not float(budget_s) > 0:
            raise ValueError(f"budget_s must be > 0 seconds or None, got {budget_s!r}")
        _limit_threads(int(cpu_threads))
        self.backend_name = backend
        spec = BackendSpec(backend, dict(options or {}), fallback, dict(fallback_options or {}),
                           int(cpu_threads))
        self.budget_s = float(budget_s) if budget_s is not None else None
        self.window = int(window)
        self._job: Future | None = None     # the primary's call in its helper thread
        self.backend = _build(spec.backend, spec.options, spec.cpu_threads)
        self.fallback_name, self.fallback, self.fallback_unavailable = _build_fallback(spec)
        self._items: deque[PriorObservation] = deque(maxlen=self.window)
        self._dirty = True                  # the primary's context is stale
        self._fallback_dirty = True         # the fallback's context is stale
        self._latest_version = 0
        self._n_observed = 0
        self._n_calls = 0
        self._n_predicted = 0
        self._latency_s = 0.0
        self._last_latency_s = 0.0
        self.fallbacks = FallbackCounts()
        self._n_fallback_predicted = 0
        self.last_fallback = ""

    def ready(self) -> bool:
        return True

    def observe(self, items: Iterable[PriorObservation]) -> int:
        """Add finished prompts to the window (newest last); returns the window size. All
        items are validated before any is added (``check_observation``)."""
        checked = [check_observation(item, f"observe item {i}") for i, item in enumerate(items)]
        for o in checked:
            self._items.append(o)
            self._latest_version = max(self._latest_version, o.version)
        self._n_observed += len(checked)
        if checked:
            self._dirty = self._fallback_dirty = True
        return len(self._items)

    def _context(self):
        import numpy as np
        from actors.priors import Context
        if not self._items:
            return Context.empty()
        items = self._items
        versions = np.array([o.version for o in items], dtype=np.float64)
        return Context(tuple(o.prompt for o in items),
                       np.array([o.score for o in items], dtype=np.float64),
                       np.maximum(self._latest_version - versions, 0.0),
                       np.array([o.rollouts for o in items], dtype=np.float64))

    def predict(self, prompts: Sequence[str]) -> list[float]:
        """p in [0, 1] for each prompt, in order."""
        if isinstance(prompts, str):
            raise ValueError("predict takes a list of prompts, got a single string")
        prompts = [check_prompt(p, f"predict prompt {i}") for i, p in enumerate(prompts)]
        if not prompts:
            return []
        t0 = time.perf_counter()
        if self.fallback is None:
            p = self._primary(prompts)
        else:
            p = self._guarded(prompts)
        out = p.clip(0.0, 1.0).tolist()
        dt = time.perf_counter() - t0
        self._n_calls += 1
        self._n_predicted += len(prompts)
        self._latency_s += dt
        self._last_latency_s = dt
        return out

    def _primary(self, prompts: list[str]):
        """The primary backend's checked answer, refit first if the window changed."""
        context = self._context() if self._dirty else None
        self._dirty = False
        try:
            return self._call_primary(prompts, context)
        except BaseException:
            self._dirty = True              # refit on the next call: the fit may be half done
            raise

    def _call_primary(self, prompts: list[str], context):
        """May run in the helper thread: touches the backend only, never the window."""
        if context is not None:
            self.backend.set_context(context)
        return _checked(self.backend_name, self.backend.predict(prompts), len(prompts))

    def _guarded(self, prompts: list[str]):
        """The primary's answer within ``budget_s``, else the fallback's (counted)."""
        if self._job is not None and not self._job.done():
            return self._fall_back(prompts, "timeout", "an earlier call is still running "
                                   f"past its budget of {self.budget_s} s")
        context = self._context() if self._dirty else None
        self._dirty = False                 # the context travels with the job
        self._job = _in_thread(lambda: self._call_primary(prompts, context))
        try:
            return self._job.result(timeout=self.budget_s)
        except FutureTimeout:
            self._dirty = True              # whether its refit lands is unknown: redo it
            return self._fall_back(prompts, "timeout", f"no answer within {self.budget_s} s")
        except Exception as e:  # noqa: BLE001  (any failure of the primary: answer anyway)
            self._dirty = True
            return self._fall_back(prompts, "error", f"{type(e).__name__}: {e}")

    def _fall_back(self, prompts: list[str], reason: str, detail: str):
        """The fallback's answer, counted under ``reason`` ("timeout" or "error")."""
        if reason == "timeout":
            self.fallbacks.timeout += 1
        else:
            self.fallbacks.error += 1
        self._n_fallback_predicted += len(prompts)
        self.last_fallback = f"{reason}: {self.backend_name}: {detail}"[:500]
        if self._fallback_dirty:
            self.fallback.set_context(self._context())
            self._fallback_dirty = False
        return _checked(self.fallback_name, self.fallback.predict(prompts), len(prompts))

    def stats(self) -> PriorStats:
        calls = self._n_calls
        idle = self._job is None or self._job.done()  # a stuck backend is not asked
        return PriorStats(
            backend=self.backend_name, window=self.window, n_context=len(self._items),
            n_observed=self._n_observed, latest_version=self._latest_version,
            predict_calls=calls, n_predicted=self._n_predicted,
            mean_latency_ms=1e3 * self._latency_s / calls if calls else 0.0,
            last_latency_ms=1e3 * self._last_latency_s, fallback=self.fallback_name,
            budget_s=self.budget_s, fallbacks=replace(self.fallbacks),
            n_fallback_predicted=self._n_fallback_predicted, last_fallback=self.last_fallback,
            fallback_unavailable=self.fallback_unavailable,
            backend_stats=self.backend.stats() if idle else None)


def _checked(name: str, raw, n: int):
    """The backend's output as a float array (n,) of finite numbers, else PriorOutputError."""
    import numpy as np
    try:
        p = np.asarray(raw, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as e:
        raise PriorOutputError(f"prior backend {name!r} returned non-numeric "
                               f"output: {raw!r:.200}") from e
    if p.shape != (n,):
        raise PriorOutputError(f"prior backend {name!r} returned {p.size} values for {n} prompts")
    bad = np.flatnonzero(~np.isfinite(p))
    if bad.size:
        raise PriorOutputError(f"prior backend {name!r} returned non-finite values at "
                               f"positions {bad[:10].tolist()}: {p[bad[:10]].tolist()}")
    return p


def _build(name: str, options: dict, cpu_threads: int):
    """Backend ``name`` with ``options``, and the server's ``cpu_threads`` as its ``threads``
    option when it takes one (``actors.priors.takes_threads``) and the options leave it unset."""
    from actors.priors import takes_threads

    opts = dict(options)
    if takes_threads(name):
        opts.setdefault("threads", cpu_threads)
    return make_prior(name, **opts)


def _build_fallback(b: BackendSpec):
    """(name, backend, why none) for the fallback. "auto" builds ``AUTO_FALLBACK`` for a
    primary whose traits say it may fail (never for the fallback itself) and tolerates one
    that cannot be built here (its extra not installed), saying why; a named one must build."""
    if b.fallback in (None, "none"):
        return None, None, ""
    if b.fallback == "auto":
        from actors.priors import backend_traits

        if b.backend == AUTO_FALLBACK or not backend_traits(b.backend).fallible:
            return None, None, ""
        try:
            return AUTO_FALLBACK, _build(AUTO_FALLBACK, b.fallback_options, b.cpu_threads), ""
        except (ImportError, OSError) as e:
            return None, None, f"{AUTO_FALLBACK}: {type(e).__name__}: {e}"[:500]
    if b.fallback == b.backend:
        raise ValueError(f"the fallback must differ from the backend, got {b.fallback!r} for both")
    return b.fallback, _build(b.fallback, b.fallback_options, b.cpu_threads), ""
