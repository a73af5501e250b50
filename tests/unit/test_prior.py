"""The prior server and its backends: kernel math, cache, registry, validation, the fallback
chain, CLI. (The v0 backend: test_prior_v0.py.)

The embedded backend runs the real offline MiniLM, loaded once for the module.
"""
import json
import math
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from actors.priors.server import (FallbackCounts, PriorOutputError, PriorServer, PriorStats,
                                  make_prior, prior_names)
from actors.priors import backend_traits, register_prior, takes_threads
from actors.priors.base import (CacheStats, Context, EmbeddingCache, PriorBackend, PriorTraits,
                                recency_weights)
from actors.priors.embedded.kernel import (LAMBDA_GRID, LENGTH_WEIGHTS, FitSettings, fit_context,
                                           log_length, loo_candidates, predict_fitted)
from actors.priors.embedded.prior import EmbeddedStats
from common.types import PriorObservation

REPO = Path(__file__).resolve().parents[2]

EASY = [f"What is {a} plus {a + 3}?" for a in range(2, 14)] + \
       [f"{n} has {a} apples and eats one. How many apples are left?"
        for n, a in zip(["Ann", "Bob", "Cat", "Dan", "Eve", "Fay"], range(3, 9))]
HARD = [f"Prove that for every prime p > {a}, the sum of the quadratic residues modulo p "
        f"is divisible by p, and determine when p^2 divides it." for a in range(3, 15)] + \
       [f"Let f be a continuous function with f(x+y) = f(x)f(y) + {a}. Classify all such f "
        "and prove your classification is complete." for a in range(2, 8)]


def observed(prompts, score, version=0):
    """One PriorObservation per prompt, all with ``score`` at ``version`` (one rollout)."""
    return [PriorObservation(p, score, version) for p in prompts]


def auc(score, label):
    s, y = np.asarray(score, float), np.asarray(label, float)
    pos, neg = s[y > 0.5], s[y <= 0.5]
    return np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])


# -- kernel math (pure NumPy) -----------------------------------------------------------------
def brute_loo(K, y, w, mean, lam, g, l):
    """Refit weighted kernel ridge without point i, for each i: the obviously-correct LOO."""
    Kf = K + g * g * np.outer(l, l)
    err = 0.0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        Wk = np.diag(1.0 / w[keep])
        alpha = np.linalg.solve(Kf[np.ix_(keep, keep)] + lam * Wk, y[keep] - mean)
        pred = mean + Kf[i, keep] @ alpha
        err += w[i] * (y[i] - pred) ** 2
    return err / w.sum()


def test_closed_form_loo_matches_refitting():
    rng = np.random.default_rng(0)
    n = 12
    X = rng.normal(size=(n, 5))
    K = X @ X.T / 5
    y = rng.uniform(size=n)
    w = rng.uniform(0.3, 1.0, size=n)
    l = rng.normal(size=n)
    mean = float(w @ y / w.sum())
    sw = np.sqrt(w)
    cands = loo_candidates(np.linalg.eigh(K * np.outer(sw, sw)), sw * (y - mean), sw * l,
                           w.sum(), LENGTH_WEIGHTS)
    assert len(cands) == len(LAMBDA_GRID) * len(LENGTH_WEIGHTS)
    for mse, lam, g, *_ in cands[::4]:
        assert mse == pytest.approx(brute_loo(K, y, w, mean, lam, g, l), rel=1e-6)


def test_fit_separates_two_clusters_and_falls_back_to_the_mean():
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(2, 16))
    X = np.concatenate([centers[0] + 0.1 * rng.normal(size=(20, 16)),
                        centers[1] + 0.1 * rng.normal(size=(20, 16))])
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.r_[np.full(20, 0.9), np.full(20, 0.1)]
    fit = fit_context(X, y)
    assert fit.kernel == "linear" and fit.loo_mse < fit.const_loo_mse
    p = predict_fitted(fit, X[[0, 39]])
    assert p[0] > 0.7 and p[1] < 0.3
    flat = fit_context(X, np.full(40, 0.25))
    assert flat.kernel is None and flat.label() == "constant"
    assert predict_fitted(flat, X[:3]) == pytest.approx(flat.mean)


def test_length_feature_is_used_when_it_carries_the_signal():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 8))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    loglen = rng.uniform(2, 6, size=60)
    y = (loglen < 4).astype(float)                           # short prompts are the easy ones
    fit = fit_context(X, y, loglen=loglen)
    assert fit.length_weight > 0
    with pytest.raises(ValueError, match="loglen"):
        predict_fitted(fit, X[:2])
    p = predict_fitted(fit, X[:2], np.array([2.5, 5.5]))
    assert p[0] > p[1]


def test_recency_weights_and_log_length():
    assert recency_weights(np.array([0.0, 4.0, 8.0]), 4.0) == pytest.approx([1, 0.5, 0.25])
    assert recency_weights(np.array([0.0, 9.0]), None) == pytest.approx([1, 1])
    assert log_length(["", "abc"]) == pytest.approx([0.0, math.log(4)])


# -- cache, registry, constant backend --------------------------------------------------------
def test_embedding_cache_is_a_bounded_lru_that_encodes_each_miss_once():
    calls = []

    def encode(texts):
        calls.append(list(texts))
        return np.array([[len(t), 1.0] for t in texts])
    cache = EmbeddingCache(encode, capacity=2)
    out = cache.get(["a", "bb", "a"])
    assert calls == [["a", "bb"]] and out[:, 0].tolist() == [1, 2, 1]
    cache.get(["a"])                                         # hit: "a" becomes most recent
    cache.get(["ccc"])                                       # evicts "bb"
    assert calls[-1] == ["ccc"] and len(cache) == 2
    cache.get(["bb", "a"])
    assert calls[-1] == ["bb"] and (cache.hits, cache.misses) == (3, 4)
    with pytest.raises(ValueError, match="cache_size"):
        EmbeddingCache(encode, 0)


def test_embedding_cache_times_its_encodes_only():
    def slow(texts):
        time.sleep(0.05)
        return np.ones((len(texts), 2))
    cache = EmbeddingCache(slow)
    assert cache.stats() == CacheStats(entries=0, hits=0, misses=0, encode_s=0.0)
    cache.get(["a", "b"])
    spent = cache.encode_s
    assert spent >= 0.05
    cache.get(["a", "b"])                                    # all hits: nothing encoded
    assert cache.encode_s == spent
    assert cache.stats() == CacheStats(entries=2, hits=2, misses=2, encode_s=round(spent, 4))


def test_registry_names_and_errors():
    assert {"embedded", "v0", "constant"} <= set(prior_names())
    with pytest.raises(ValueError, match="unknown prior backend 'nope'.*constant.*embedded.*v0"):
        make_prior("nope")
    with pytest.raises(ValueError, match="bad options for prior backend 'constant'"):
        make_prior("constant", window=3)
    with pytest.raises(ValueError, match="already registered"):
        register_prior("constant", object)


def test_constant_backend_is_the_recency_weighted_mean():
    b = make_prior("constant", halflife=1.0)
    b.set_context(Context.empty())
    assert b.predict(["x", "y"]).tolist() == [0.5, 0.5]
    b.set_context(Context(("a", "b"), np.array([1.0, 0.0]), np.array([0.0, 1.0])))
    assert b.predict(["x"])[0] == pytest.approx(1 / 1.5)


# -- the server: validation, window, stats, garbage output ------------------------------------
def test_server_validates_observations_atomically_and_bounds_the_window():
    s = PriorServer("constant", {}, window=3)
    ok = PriorObservation("ok", 0.5, 0)
    for bad, msg in [(PriorObservation("p", 1.5, 0), "score 1.5 is outside"),
                     (PriorObservation("p", float("nan"), 0), "score nan is outside"),
                     (PriorObservation("p", True, 0), "score must be a number"),
                     (PriorObservation("p", "0.5", 0), "score must be a number"),
                     (PriorObservation("p", 0.5, -1), "version must be an int >= 0"),
                     (PriorObservation("p", 0.5, 1.0), "version must be an int >= 0"),
                     (PriorObservation(7, 0.5, 0), "prompt must be a string"),
                     (("p", 0.5, 0), "expected a PriorObservation"),
                     ({"prompt": "p", "score": 0.5, "version": 0}, "expected a PriorObservation"),
                     (None, "expected a PriorObservation")]:
        with pytest.raises(ValueError, match=rf"^observe item 1: {msg}"):
            s.observe([ok, bad])                             # the bad one is named by index
        with pytest.raises(ValueError, match=rf"^observe item 0: {msg}"):
            s.observe([bad, ok])
    assert s.stats().n_context == 0 and s.stats().n_observed == 0   # nothing half-added
    s.observe([PriorObservation(f"p{i}", i / 4, i) for i in range(5)])
    st = s.stats()
    assert st.n_context == 3 and st.n_observed == 5 and st.latest_version == 4
    assert s.predict(["q"]) == [pytest.approx(np.mean([0.5, 0.75, 1.0]))]
    assert s.predict([]) == [] and s.stats().predict_calls == 1
    with pytest.raises(ValueError, match="single string"):
        s.predict("q")
    with pytest.raises(ValueError, match="window"):
        PriorServer("constant", {}, window=0)


class _Garbage(PriorBackend):
    name = "garbage"

    def __init__(self, values=(0.5, float("nan"))):
        self.values = values

    def set_context(self, context):
        pass

    def predict(self, prompts):
        return np.array(self.values)


register_prior("test-garbage", _Garbage)


def test_server_rejects_non_finite_or_misshapen_backend_output():
    with pytest.raises(PriorOutputError, match=r"non-finite values at positions \[1\]"):
        PriorServer("test-garbage", {}, fallback=None).predict(["a", "b"])
    with pytest.raises(PriorOutputError, match="3 values for 2 prompts"):
        PriorServer("test-garbage", {"values": (0.1, 0.2, 0.3)}, fallback=None).predict(["a", "b"])


# -- the fallback chain: a slow, failing or garbage backend is answered for, and counted --------
class _Stuck(PriorBackend):
    """Blocks in predict until released: a backend past any budget, with no timing involved."""
    name = "stuck"

    def __init__(self):
        self.release = threading.Event()
        self.calls = self.contexts = 0

    def set_context(self, context):
        self.contexts += 1

    def predict(self, prompts):
        self.calls += 1
        self.release.wait(120)
        return np.full(len(prompts), 0.9)


class _Raises(PriorBackend):
    name = "raises"

    def set_context(self, context):
        pass

    def predict(self, prompts):
        raise RuntimeError("CUDA out of memory (simulated)")


register_prior("test-stuck", _Stuck)
register_prior("test-raises", _Raises)
CONTEXT = observed("ab", 1.0) + observed("c", 0.0)           # the constant prior says 2/3


def test_a_backend_past_its_budget_is_answered_by_the_fallback_and_counted():
    s = PriorServer("test-stuck", {}, fallback="constant", budget_s=0.05)
    s.observe(CONTEXT)
    try:
        assert s.predict(["q1", "q2"]) == [pytest.approx(2 / 3)] * 2
        st = s.stats()
        assert st.fallback == "constant" and st.fallbacks == FallbackCounts(timeout=1, error=0)
        assert "test-stuck: no answer within 0.05 s" in st.last_fallback
        # Still stuck: answered by the fallback at once, the backend is not called again.
        assert s.predict(["q3"]) == [pytest.approx(2 / 3)]
        assert s.stats().fallbacks.timeout == 2 and s.backend.calls == 1
        assert "still running" in s.stats().last_fallback
        assert s.stats().n_fallback_predicted == 3 and s.stats().predict_calls == 2
    finally:
        s.backend.release.set()
    s._job.result(timeout=60)                                # the late call ends; its answer is dropped
    s.budget_s = 60.0                                        # no timing in what follows
    assert s.predict(["q4"]) == [pytest.approx(0.9)]         # the backend answers again...
    assert s.backend.contexts == 2                           # ...after a refit (its last one may not have landed)
    assert s.stats().fallbacks == FallbackCounts(timeout=2, error=0)


def test_the_servers_stats_are_a_record_and_flat_under_the_old_names_in_a_file():
    """Issue 44: ``stats()`` is a ``PriorStats`` read by attribute (its fallbacks a
    ``FallbackCounts``, its backend's own counters a ``BackendStats`` or None); bench.prior
    writes ``to_dict()``: the server's names, then the backend's, flat as before."""
    s = PriorServer("test-raises", {}, fallback="constant", budget_s=60.0)
    s.observe(CONTEXT)
    s.predict(["q"])
    st = s.stats()
    assert isinstance(st, PriorStats) and st.backend_stats is None   # it keeps no counters
    assert st.fallbacks == FallbackCounts(error=1) and st.fallbacks.total == 1
    server_names = ["backend", "window", "n_context", "n_observed", "latest_version",
                    "predict_calls", "n_predicted", "mean_latency_ms", "last_latency_ms",
                    "fallback", "budget_s", "fallbacks", "n_fallback_predicted",
                    "last_fallback", "fallback_unavailable"]
    assert list(st.to_dict()) == server_names
    assert st.to_dict()["fallbacks"] == {"timeout": 0, "error": 1}
    own = EmbeddedStats(cache=CacheStats(entries=3, hits=1, misses=3, encode_s=0.5), fit_s=0.1,
                        n_fits=1, n_view_searches=1, model="m", loo_mse=None, const_loo_mse=0.2)
    flat = replace(st, backend_stats=own).to_dict()
    assert list(flat) == server_names + ["cache_entries", "cache_hits", "cache_misses",
                                         "encode_s", "fit_s", "n_fits", "n_view_searches",
                                         "model", "loo_mse", "const_loo_mse"]
    assert json.loads(json.dumps(flat))["cache_misses"] == 3


def test_a_failing_or_garbage_backend_is_answered_by_the_fallback_and_counted():
    s = PriorServer("test-raises", {}, fallback="constant", budget_s=60.0)
    s.observe(CONTEXT)
    assert s.predict(["q"]) == [pytest.approx(2 / 3)]
    st = s.stats()
    assert st.fallbacks == FallbackCounts(timeout=0, error=1)
    assert "RuntimeError: CUDA out of memory (simulated)" in st.last_fallback
    g = PriorServer("test-garbage", {}, fallback="constant", budget_s=60.0)
    g.observe(CONTEXT)
    assert g.predict(["a", "b"]) == [pytest.approx(2 / 3)] * 2
    assert g.stats().fallbacks.error == 1 and "non-finite" in g.stats().last_fallback
    # No budget: the primary runs in the caller's thread, errors still fall back.
    n = PriorServer("test-raises", {}, fallback="constant", budget_s=None)
    assert n.predict(["q"]) == [0.5] and n.stats().fallbacks.error == 1


def test_without_a_fallback_errors_reach_the_caller_and_options_are_checked():
    s = PriorServer("test-raises", {}, fallback=None)
    with pytest.raises(RuntimeError, match="simulated"):
        s.predict(["q"])
    assert s.stats().fallback is None and s.stats().fallbacks == FallbackCounts()
    assert PriorServer("constant", {}).stats().fallback is None     # "auto": none needed
    with pytest.raises(ValueError, match="must differ"):
        PriorServer("constant", {}, fallback="constant")
    with pytest.raises(ValueError, match="budget_s"):
        PriorServer("constant", {}, budget_s=0)
    with pytest.raises(ValueError, match="unknown prior backend 'nope'"):
        PriorServer("constant", {}, fallback="nope")


class _Sure(PriorBackend):
    """Declares it cannot fail, and takes the server's threads."""
    name = "sure"
    traits = PriorTraits(scores_prompts=False, fallible=False)

    def __init__(self, threads: int | None = None):
        self.threads = threads

    def set_context(self, context):
        pass

    def predict(self, prompts):
        return np.full(len(prompts), 0.5)


register_prior("test-sure", _Sure)
register_prior("test-factory", lambda: _Sure())   # a factory, not a class: no traits declared


def test_the_server_reads_each_backends_traits_from_the_backend():
    """Issue 44: what the server and the config check know of a backend is declared on the
    backend (``traits``) or read from its constructor (a ``threads`` option), not a list of
    names in server.py."""
    assert backend_traits("constant") == PriorTraits(scores_prompts=False, fallible=False)
    assert backend_traits("embedded") == backend_traits("v0") == PriorTraits(True, True)
    assert backend_traits("test-raises") == PriorTraits()    # a backend that declares nothing
    assert backend_traits("test-factory") == PriorTraits()
    assert [takes_threads(n) for n in ("embedded", "v0", "constant", "test-sure")] == \
        [True, True, False, True]
    # "auto" gives a backend that may fail the embedded prior, and one that cannot none.
    sure = PriorServer("test-sure", {}, cpu_threads=3)
    assert sure.stats().fallback is None and sure.backend.threads == 3
    assert PriorServer("test-sure", {"threads": 2}, cpu_threads=3).backend.threads == 2
    raises = PriorServer("test-raises", {}, fallback_options={"model_dir": "/nonexistent"})
    assert "embedded: FileNotFoundError" in raises.stats().fallback_unavailable


# -- the embedded backend (real MiniLM) -------------------------------------------------------
@pytest.fixture(scope="module")
def encoder():
    from actors.priors.embedded import SentenceEncoder
    return SentenceEncoder(threads=1)


def test_embedded_ranks_a_separable_context_and_caches(encoder):
    s = PriorServer("embedded", {"encoder": encoder}, window=256)
    assert s.predict(EASY[:2]) == [0.5, 0.5]                 # empty context: the prior mean
    s.observe(observed(EASY[:-4], 0.9) + observed(HARD[:-4], 0.1))
    queries = EASY[-4:] + HARD[-4:]
    p = s.predict(queries)
    assert auc(p, [1] * 4 + [0] * 4) == 1.0
    assert all(0.01 <= x <= 0.99 for x in p)
    misses = s.stats().backend_stats.cache.misses
    assert s.predict(queries) == p and s.stats().backend_stats.cache.misses == misses
    st = s.backend.stats()                                   # the backend's own counters
    assert st.cache.misses == misses and st.cache.encode_s > 0 and st.n_fits == 1
    assert st.cache.entries == len(s.backend.cache) == misses


def test_embedded_follows_the_policy_through_recency_and_the_window(encoder):
    old = observed(EASY[:9], 0.05) + observed(HARD[:9], 0.95)
    new = observed(EASY[9:], 0.95, 12) + observed(HARD[9:], 0.05, 12)
    s = PriorServer("embedded", {"encoder": encoder, "halflife": 2.0}, window=256)
    s.observe(old + new)
    easy_q, hard_q = "What is 40 plus 2?", HARD[0].replace("p > 3", "p > 31")
    p_easy, p_hard = s.predict([easy_q, hard_q])
    assert p_easy > p_hard                                   # the version-12 profile wins
    flat = PriorServer("embedded", {"encoder": encoder, "halflife": None}, window=len(new))
    flat.observe(old + new)                                  # the window drops the old items
    assert flat.stats().n_context == len(new)
    assert flat.predict([EASY[0]])[0] > flat.predict([HARD[0]])[0]
    # No recency: the two profiles cancel out in the sentence embedding (the n-gram view
    # would match hard_q to its near-copy HARD[0] letter by letter instead).
    both = PriorServer("embedded", {"encoder": encoder, "halflife": None,
                                    "views": ["embedding"]}, window=256)
    both.observe(old + new)
    q_easy, q_hard = both.predict([easy_q, hard_q])
    assert abs(q_easy - q_hard) < p_easy - p_hard


def test_auto_fallback_is_the_embedded_prior_when_it_can_be_built(encoder):
    s = PriorServer("test-raises", {}, fallback_options={"encoder": encoder}, budget_s=60.0)
    assert s.stats().fallback == "embedded"
    s.observe(observed(EASY[:-4], 0.9) + observed(HARD[:-4], 0.1))
    p = s.predict(EASY[-4:] + HARD[-4:])
    assert auc(p, [1] * 4 + [0] * 4) == 1.0                 # the embedded prior's ranking
    assert s.stats().fallbacks == FallbackCounts(timeout=0, error=1)
    # Not buildable here (e.g. the 'prior' extra missing): no fallback, and stats say why.
    u = PriorServer("test-raises", {}, fallback_options={"model_dir": "/nonexistent/minilm"})
    st = u.stats()
    assert st.fallback is None and "encoder model directory not found" in st.fallback_unavailable
    with pytest.raises(RuntimeError, match="simulated"):
        u.predict(["q"])


def test_a_backend_past_its_budget_is_answered_by_the_embedded_prior(encoder):
    """The published V0 stuck on its GPU (here a backend that never answers) past the server's
    budget: with the default fallback the embedded prior answers, counted as a timeout."""
    s = PriorServer("test-stuck", {}, fallback_options={"encoder": encoder}, budget_s=0.2)
    try:
        assert s.stats().fallback == "embedded"
        s.observe(observed(EASY[:-4], 0.9) + observed(HARD[:-4], 0.1))
        p = s.predict(EASY[-4:] + HARD[-4:])
        assert auc(p, [1] * 4 + [0] * 4) == 1.0             # the embedded prior's ranking
        st = s.stats()
        assert st.fallbacks == FallbackCounts(timeout=1, error=0)
        assert "test-stuck: no answer within 0.2 s" in st.last_fallback
    finally:
        s.backend.release.set()
    s._job.result(timeout=60)


# -- the CLI -----------------------------------------------------------------------------------
def _cli(*args, cwd=REPO, module="actors.priors"):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_cli_predicts_one_line_per_query_in_order(tmp_path, capsys):
    """The default (embedded) backend through the CLI's main in this process (a fresh
    interpreter would only load torch and the encoder again), then the command itself."""
    from actors.priors.cli import main

    ctx = _write(tmp_path / "c.jsonl", [{"prompt": p, "score": 0.9} for p in EASY[:-3]]
                 + [{"prompt": p, "score": 0.1} for p in HARD[:-3]])
    q = _write(tmp_path / "q.jsonl", [{"prompt": p} for p in [HARD[-1], EASY[-1], HARD[-2]]])
    capsys.readouterr()
    rc = main(["predict", "--context", ctx, "--queries", q])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert [r["prompt"] for r in rows] == [HARD[-1], EASY[-1], HARD[-2]]
    assert rows[1]["p"] > max(rows[0]["p"], rows[2]["p"]) and all(0 <= r["p"] <= 1 for r in rows)
    const = _cli("predict", "--context", ctx, "--queries", q, "--backend", "constant")
    assert const.returncode == 0, const.stderr
    assert [json.loads(x)["p"] for x in const.stdout.splitlines()] == [pytest.approx(0.5)] * 3


@pytest.mark.parametrize("line, msg", [
    ('{"prompt": "a", "score": 1.5}', "c.jsonl:2: score 1.5 is outside"),
    ('{"prompt": "a", "score": NaN}', "c.jsonl:2: score nan"),
    ('{"prompt": "a"}', 'c.jsonl:2: missing "score"'),
    ("not json", "c.jsonl:2: not valid JSON")])
def test_cli_bad_lines_exit_2_naming_file_and_line(tmp_path, line, msg):
    ctx = _write(tmp_path / "c.jsonl", ['{"prompt": "ok", "score": 0.5}', line])
    q = _write(tmp_path / "q.jsonl", ['{"prompt": "x"}'])
    out = _cli("predict", "--context", ctx, "--queries", q, "--backend", "constant")
    assert out.returncode == 2 and msg in out.stderr and out.stdout == ""


def test_cli_errors_for_backend_problems_and_help_is_light(tmp_path):
    ctx = _write(tmp_path / "c.jsonl", ['{"prompt": "ok", "score": 0.5}'])
    q = _write(tmp_path / "q.jsonl", ['{"prompt": 3}'])
    assert "q.jsonl:1: prompt must be a string" in _cli(
        "predict", "--context", ctx, "--queries", q, "--backend", "constant").stderr
    q = _write(tmp_path / "q.jsonl", ['{"prompt": "x"}'])
    v0 = _cli("predict", "--context", ctx, "--queries", q, "--backend", "v0",
              "--option", f"path={tmp_path}")
    assert v0.returncode == 2 and "v_0_for_grpo_training.pt" in v0.stderr
    bad = _cli("predict", "--context", ctx, "--queries", q, "--backend", "nope")
    assert bad.returncode == 2 and "valid: constant, embedded" in bad.stderr
    helped = _cli("--help")
    assert helped.returncode == 0 and "predict" in helped.stdout
    own = _cli("predict", "--help", module="actors.priors.cli")       # the CLI's own module
    assert own.returncode == 0 and "--fallback" in own.stdout
    probe = subprocess.run([sys.executable, "-c",
                            "import sys, actors.priors.server, actors.priors.cli, actors.priors, "
                            "actors.priors.v0; "
                            "print(sorted(m for m in ('torch', 'sentence_transformers', "
                            "'transformers', 'ray') if m in sys.modules))"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "[]"


def test_drift_follows_a_policy_that_improves_while_the_window_fills():
    # Two clusters of prompts (easy, hard); the policy gains 0.02 per version on both. The
    # window holds 16 versions of binomial observations (k = 8). A recency-weighted fit lags
    # by about the mean age times the rate; the drift term removes most of it.
    rng = np.random.default_rng(5)
    centers = rng.normal(size=(2, 16))
    n_per, V = 16, 16
    X, y, ages, base = [], [], [], []
    for age in range(V):
        for c, b0 in ((0, 0.7), (1, 0.3)):
            Xi = centers[c] + 0.1 * rng.normal(size=(n_per // 2, 16))
            mu = b0 - 0.02 * age             # what the policy did ``age`` versions ago
            X.append(Xi)
            y.append(rng.binomial(8, mu, size=n_per // 2) / 8)
            ages += [age] * (n_per // 2)
    X = np.concatenate(X)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y, ages = np.concatenate(y), np.array(ages, float)
    Q = np.stack([centers[0], centers[1]])
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    truth = np.array([0.7, 0.3])             # now, at age 0
    plain = predict_fitted(fit_context(X, y, ages, settings=FitSettings(halflife=8.0)), Q)
    fit = fit_context(X, y, ages, settings=FitSettings(halflife=8.0, drift=True))
    drifted = predict_fitted(fit, Q)
    assert fit.age_weight > 0 and "+age" in fit.label()
    assert np.mean(plain - truth) < -0.08              # the lag (a kernel fit shrinks, too)
    assert abs(np.mean(drifted - truth)) < 0.04         # most of it gone
    # lead moves the prediction further along the trend (about 0.02 a version).
    ahead = predict_fitted(fit_context(X, y, ages, settings=FitSettings(halflife=8.0, drift=True,
                                                                       lead=2.0)), Q)
    assert np.all(ahead - drifted > 0.015) and np.all(ahead - drifted < 0.08)


def test_drift_is_dropped_when_the_scores_do_not_move():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(120, 8))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    ages = np.repeat(np.arange(12.0), 10)
    y = rng.binomial(8, 0.5, size=120) / 8
    fit = fit_context(X, y, ages, settings=FitSettings(halflife=8.0, drift=True, lead=1.0))
    p = predict_fitted(fit, X[:5])
    # Leave-one-out finds no trend worth its noise: the prediction stays near the mean.
    assert np.all(np.abs(p - 0.5) < 0.06)


# -- views and repeats (issue 29) ---------------------------------------------------------------
class NoiseEncoder:
    """A sentence encoder that sees nothing: a fixed random vector per text."""

    dim = 8

    def encode(self, texts):
        out = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=self.dim) for t in texts]
        out = np.array(out, dtype=np.float32).reshape(len(texts), self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def rule_prompts(n: int, seed: int):
    """Prompts whose success rate follows the step count they spell out ("x3") and nothing
    a sentence embedding would see: (prompts, their noisy rates)."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(1, 9, size=n)
    prompts = [f"apply the rule x{k} to {rng.integers(100, 999)}" for k in steps]
    return prompts, np.clip(0.92 ** (3 * steps) + rng.normal(0, 0.03, size=n), 0, 1)


def test_the_ngram_view_is_chosen_where_only_the_prompts_literal_tokens_carry_the_signal():
    from actors.priors.base import Context
    from actors.priors.embedded import EmbeddedPrior

    prompts, y = rule_prompts(120, seed=3)
    prior = EmbeddedPrior(encoder=NoiseEncoder(), halflife=None, drift=False,
                          views=("embedding", "ngram", "both"))
    prior.set_context(Context(tuple(prompts[:100]), y[:100], np.zeros(100)))
    p = prior.predict(prompts[100:])
    assert prior.stats().model.split(":")[0] in ("ngram", "both")
    assert np.corrcoef(p, y[100:])[0, 1] > 0.8
    blind = EmbeddedPrior(encoder=NoiseEncoder(), halflife=None, drift=False,
                          views=("embedding",))
    blind.set_context(Context(tuple(prompts[:100]), y[:100], np.zeros(100)))
    assert np.abs(blind.predict(prompts[100:]) - y[100:]).mean() > \
        2 * np.abs(p - y[100:]).mean()


def test_a_refit_searches_the_chosen_view_alone_until_a_quarter_of_the_window_is_new():
    from actors.priors.base import Context
    from actors.priors.embedded.prior import FULL_SEARCH_BELOW, EmbeddedPrior

    prompts, y = rule_prompts(420, seed=5)
    # One link: each link keeps its own view (n_view_searches counts each link's searches).
    prior = EmbeddedPrior(encoder=NoiseEncoder(), halflife=None, drift=False, link="identity")
    seen = []

    def fit_on(lo, hi):
        prior.set_context(Context(tuple(prompts[lo:hi]), y[lo:hi], np.zeros(hi - lo)))
        p = prior.predict(prompts[400:])
        seen.append((prior.stats().n_view_searches, prior.stats().model.split(":")[0]))
        return p

    fit_on(0, 200)
    assert seen[-1][0] == 1 and seen[-1][1] != "embedding"   # a view that reads the tokens
    chosen = seen[-1][1]
    p = fit_on(20, 220)                   # 10% new: the chosen view alone
    assert seen[-1] == (1, chosen)
    full = EmbeddedPrior(encoder=NoiseEncoder(), halflife=None, drift=False, reselect=0.0,
                         link="identity")
    full.set_context(Context(tuple(prompts[20:220]), y[20:220], np.zeros(200)))
    p_full = full.predict(prompts[400:])
    if full.stats().model.split(":")[0] == chosen:   # the same choice: the same fit
        assert p == pytest.approx(p_full)
    fit_on(60, 260)                       # 30% new since the search: every view again
    assert seen[-1][0] == 2
    fit_on(60, 60 + FULL_SEARCH_BELOW - 1)  # a small window: every view at every fit
    fit_on(61, 60 + FULL_SEARCH_BELOW)
    assert seen[-1][0] == 4
    assert full.stats().n_view_searches == full.stats().n_fits == 1
    with pytest.raises(ValueError, match="reselect"):
        EmbeddedPrior(encoder=NoiseEncoder(), reselect=1.5)


def test_a_constant_chosen_at_a_full_search_is_kept_like_a_view():
    """Scores that no view explains: the full search keeps the mean, and the refits until a
    quarter of the window is new fit no view (before, each refit searched every view again,
    3-5x a kept view's refit when the constant won); then every view is searched again."""
    from actors.priors.base import Context
    from actors.priors.embedded import EmbeddedPrior

    prompts, _ = rule_prompts(420, seed=6)
    y = np.random.default_rng(1).binomial(4, 0.5, 420) / 4   # 4 rollouts of a coin each
    # Views that do not depend on NoiseEncoder's hash(), which is salted per process.
    prior = EmbeddedPrior(encoder=NoiseEncoder(), halflife=None, drift=False,
                          views=("ngram", "surface"), link="identity")
    models = []
    for lo in (0, 20, 60):
        prior.set_context(Context(tuple(prompts[lo:lo + 200]), y[lo:lo + 200], np.zeros(200),
                                  np.full(200, 4.0)))
        p = prior.predict(prompts[400:])
        models.append((prior.stats().n_view_searches, prior.stats().model))
    assert models[:2] == [(1, "constant"), (1, "constant")]   # 10% new: no view fitted
    assert p == pytest.approx(np.full(20, p[0])) or models[2][1] != "constant"
    assert models[2][0] == 2                                 # 30% new: every view again


def indistinct_window(rng, n_prompts: int, reps: int):
    """Unit features in 3 dimensions for ``n_prompts`` prompts (too few to tell them apart),
    and the ids of a window that holds each prompt ``reps`` times."""
    X0 = rng.normal(size=(n_prompts, 3))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    return X0, np.tile(np.arange(n_prompts), reps)


def test_a_recurring_prompt_is_pulled_toward_its_own_earlier_outcomes():
    rng = np.random.default_rng(4)
    n_prompts, reps = 40, 3
    truth = rng.uniform(0.05, 0.95, size=n_prompts)
    X0, ids = indistinct_window(rng, n_prompts, reps)
    y = np.clip(truth[ids] + rng.normal(0, 0.05, size=len(ids)), 0, 1)
    fit = fit_context(X0[ids], y, ids=ids)
    plain = fit_context(X0[ids], y)
    assert fit.kappa is not None and "hist" in fit.label()
    seen = predict_fitted(fit, X0[:10], ids=np.arange(10))
    alone = predict_fitted(plain, X0[:10])
    assert np.abs(seen - truth[:10]).mean() < 0.5 * np.abs(alone - truth[:10]).mean()
    assert np.abs(seen - truth[:10]).mean() < 0.08
    with pytest.raises(ValueError, match="ids"):
        predict_fitted(fit, X0[:2])
    new = predict_fitted(fit, X0[:10], ids=np.full(10, -1))  # never seen: the model alone
    assert new == pytest.approx(predict_fitted(fit.__class__(**{**fit.__dict__, "kappa": None}),
                                               X0[:10]))
    # repeats that carry nothing beyond the model (scores independent of the prompt) move
    # its predictions little, if leave-one-out keeps a history at all
    noise = np.clip(0.5 + rng.normal(0, 0.1, size=len(ids)), 0, 1)
    flat = fit_context(X0[ids], noise, ids=ids)
    moved = predict_fitted(flat, X0[:10], ids=np.arange(10)) - predict_fitted(
        flat.__class__(**{**flat.__dict__, "kappa": None}), X0[:10])
    assert flat.kappa is None or np.abs(moved).mean() < 0.05
    from actors.priors.embedded import EmbeddedPrior

    with pytest.raises(ValueError, match="same_prompt must be true, false or 'level'"):
        EmbeddedPrior(encoder=NoiseEncoder(), same_prompt="offset")


def test_while_the_policy_improves_a_prompts_history_counts_as_its_offset_from_the_model():
    """Each prompt sits a fixed offset from a level that rises 0.02 a version; the window
    holds it 4 times, 6 versions apart. Its old scores at face value lag by what the policy
    gained since; its offset from the model's prediction then does not (history.py)."""
    rng = np.random.default_rng(5)
    n_prompts, reps = 40, 4
    offset = rng.normal(0, 0.12, size=n_prompts)
    X0, ids = indistinct_window(rng, n_prompts, reps)
    ages = np.repeat(np.arange(reps)[::-1] * 6.0, n_prompts) + rng.uniform(0, 5, len(ids))
    y = np.clip(0.7 - 0.02 * ages + offset[ids] + rng.normal(0, 0.05, len(ids)), 0, 1)
    fit = fit_context(X0[ids], y, ages=ages, ids=ids,
                      settings=FitSettings(halflife=8.0, drift=True))
    assert fit.history_form == "offset" and fit.label().endswith("off")
    now = np.clip(0.7 + offset, 0, 1)
    p = predict_fitted(fit, X0, ids=np.arange(n_prompts))
    face_value = predict_fitted(fit.__class__(**{**fit.__dict__, "history_form": "level"}), X0,
                                ids=np.arange(n_prompts))
    assert np.abs(p - now).mean() < 0.5 * np.abs(face_value - now).mean()
    assert abs(np.mean(p - now)) < 0.03 and np.mean(face_value - now) < -0.05


def test_surface_features_read_the_last_numbers_their_count_and_the_length():
    from actors.priors.embedded import surface_features

    f = surface_features(["37+8 x5\n", "no digits here", "9-4+2=", "x 123456789012345678"])
    assert f.shape == (4, 11)
    # the last number first: 5, then 8, then 37; none absent; 3 numbers; log(1 + 8 chars)
    np.testing.assert_allclose(f[0], [np.log(6), 1, 0, np.log(9), 1, 0, np.log(38), 2, 0, 3,
                                      np.log(9)])
    np.testing.assert_allclose(f[1], [0, 0, 1, 0, 0, 1, 0, 0, 1, 0, np.log(15)])
    np.testing.assert_allclose(f[2, [0, 3, 6]], np.log([3, 5, 10]))
    # one number: the two slots behind it absent; a huge one read from its last 15 digits
    assert list(f[3, [2, 5, 8]]) == [0, 1, 1] and f[3, 1] == 18 and np.isfinite(f[3, 0])


def test_the_surface_view_ranks_a_step_count_it_never_saw_where_ngrams_cannot():
    from actors.priors.base import Context
    from actors.priors.embedded import EmbeddedPrior

    rng = np.random.default_rng(5)
    ks = np.array([k for k in rng.integers(1, 13, size=200) if k != 7][:150])
    prompts = [f"{rng.integers(10, 99)}+{rng.integers(2, 9)} x{k}\n" for k in ks]
    y = np.clip(0.9 ** ks + rng.normal(0, 0.05, size=len(ks)), 0, 1)
    queries = [f"{rng.integers(10, 99)}+{rng.integers(2, 9)} x7\n" for _ in range(20)]

    def fitted(views):
        prior = EmbeddedPrior(encoder=NoiseEncoder(), halflife=None, drift=False, views=views)
        prior.set_context(Context(tuple(prompts), y, np.zeros(len(y))))
        return prior, prior.predict(queries)

    prior, p = fitted(("embedding", "ngram", "both", "surface"))
    assert prior.stats().model.startswith("surface:")
    assert np.abs(p - 0.9 ** 7).mean() < 0.05            # between x6's and x8's, unseen
    _, p_ngram = fitted(("ngram",))
    assert np.abs(p_ngram - 0.9 ** 7).mean() > 2 * np.abs(p - 0.9 ** 7).mean()


def test_a_score_counts_by_the_rollouts_behind_it():
    from actors.priors.embedded.kernel import fit_context, predict_fitted

    scores = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    counts = np.array([16, 16, 16, 16, 1, 1, 1, 1])
    X = np.zeros((8, 1))                           # the text says nothing: the mean answers

    def mean_prediction(counts, weighting="count") -> float:  # "count": the default
        fit = fit_context(X, scores, counts=counts,
                          settings=FitSettings(prior_strength=0.0, weighting=weighting))
        return float(predict_fitted(fit, np.zeros((1, 1)))[0])

    assert mean_prediction(counts) == pytest.approx(64 / 68)
    assert mean_prediction(None) == pytest.approx(0.5)
    # by inverse variance: these prompts differ (tau^2 = 0.25 - 0.133) more than a score of
    # 16 rollouts is noisy, so it outweighs a score of one by 2.8x, not 16x
    tau2 = 0.25 - (0.25 / 16 + 0.25) / 2
    w16, w1 = 1 / (tau2 + 0.25 / 16), 1 / (tau2 + 0.25)
    assert mean_prediction(counts, "variance") == pytest.approx(w16 / (w16 + w1))
    with pytest.raises(ValueError, match="counts must be 8 rollout counts >= 1"):
        fit_context(X, scores, counts=np.zeros(8))


def test_the_embedded_prior_weighs_a_score_by_its_inverse_variance_by_default():
    """The backend's default (``weigh_rollouts: variance``): where the text says nothing, its
    answer is the window's mean with each score weighed by 1 / (tau^2 + p (1 - p) / k), not
    by its count (True or "count") nor alike (False)."""
    from actors.priors.base import Context
    from actors.priors.embedded import EmbeddedPrior

    prompts = tuple(f"q{c}" for c in "abcdefgh")      # alike but for one letter
    scores = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    counts = np.array([16, 16, 16, 16, 1, 1, 1, 1])
    tau2 = 0.25 - (0.25 / 16 + 0.25) / 2
    w16, w1 = 1 / (tau2 + 0.25 / 16), 1 / (tau2 + 0.25)

    def answer(**weighing) -> float:
        prior = EmbeddedPrior(encoder=NoiseEncoder(), views=("surface",), same_prompt=False,
                              halflife=None, drift=False, link="identity", prior_strength=0.0,
                              use_length=False, **weighing)
        prior.set_context(Context(prompts, scores, np.zeros(8), counts))
        return float(prior.predict(["qz"])[0])

    assert answer() == pytest.approx(w16 / (w16 + w1))
    assert answer(weigh_rollouts="count") == pytest.approx(64 / 68)
    assert answer(weigh_rollouts=True) == pytest.approx(64 / 68)
    assert answer(weigh_rollouts=False) == pytest.approx(0.5)


def test_scores_weigh_by_their_inverse_variance_about_the_window():
    """score_weights: 1 / (tau^2 + p (1 - p) / k): the counts' own ratio when the scores vary
    no more than their sampling does, flatter the more the prompts themselves differ."""
    from actors.priors.embedded.weights import score_weights

    counts = np.array([4.0, 16.0] * 50)
    rng = np.random.default_rng(0)
    same = rng.binomial(counts.astype(int), 0.5) / counts    # one rate: only sampling noise
    w = score_weights(counts, same)
    assert w[1] / w[0] == pytest.approx(4.0, rel=0.35)
    apart = np.clip(rng.binomial(counts.astype(int), rng.uniform(0, 1, 100)) / counts, 0, 1)
    w = score_weights(counts, apart)                          # rates all over [0, 1]
    assert 1.0 < w[1] / w[0] < 2.0 and w.mean() == pytest.approx(1.0)
    assert np.all(score_weights(counts, np.ones(100)) == 1.0)  # all solved: nothing to weigh


def test_sampling_noise_is_the_scores_binomial_variance_less_their_prompts_spread():
    """weights.sampling_noise: rates of k rollouts about prompts whose own rates p spread
    (Beta(2, 2): E p(1-p) = 0.2) have noise E p(1-p) / k, told from the window alone; count
    weights make it the same for every score; unknown counts or one rollout each: None."""
    from actors.priors.embedded.weights import rollout_weights, sampling_noise

    rng = np.random.default_rng(3)
    n = 20_000
    rates = rng.beta(2.0, 2.0, n)
    counts = rng.choice([4.0, 16.0], n)
    y = rng.binomial(counts.astype(int), rates) / counts
    assert sampling_noise(y, counts, np.ones(n)) == pytest.approx(
        0.2 * np.mean(1 / counts), rel=0.05)
    fw = rollout_weights(counts, n)                     # count weights: 0.2 / mean k each
    assert sampling_noise(y, counts, fw) == pytest.approx(0.2 / counts.mean(), rel=0.05)
    assert sampling_noise(y, None, np.ones(n)) is None
    assert sampling_noise(y, np.ones(n), np.ones(n)) is None


def test_the_evidence_is_the_gaussian_process_likelihood_of_the_scores():
    """loo_candidates' last field against -log N(yt; 0, s^2 (K + g^2 u u') + sigma2 I) / N
    computed directly, s^2 = sigma2 / lam, and the constant model's at K = 0."""
    from actors.priors.embedded.kernel import neg_log_evidence

    rng = np.random.default_rng(4)
    n, sigma2 = 12, 0.03
    A = rng.normal(size=(n, 3))
    K, u, yt = A @ A.T / 3, rng.normal(size=n), rng.normal(0, 0.3, n)

    def direct(C):
        sign, logdet = np.linalg.slogdet(C)
        return 0.5 * (yt @ np.linalg.solve(C, yt) + logdet) / n

    eig = np.linalg.eigh(K)
    for mse, lam, g, _, m_y, loo, nll in loo_candidates(eig, yt, u, float(n), (0.0, 1.0), sigma2):
        C = sigma2 / lam * (K + g * g * np.outer(u, u)) + sigma2 * np.eye(n)
        assert nll == pytest.approx(direct(C), rel=1e-9, abs=1e-9)
    assert neg_log_evidence(float(yt @ yt), 0.0, 1.0, sigma2, n) == pytest.approx(
        direct(sigma2 * np.eye(n)))
    assert all(np.isnan(c[-1]) for c in loo_candidates(eig, yt, u, float(n), (0.0,)))


def test_the_age_and_length_terms_cost_no_eigendecomposition_of_their_own():
    """With the age term, every candidate from one eigh of Kt is the model of the whole
    kernel K + g^2 u u' + g_a^2 a a': its leave-one-out residuals (exact, by refitting), its
    evidence, and lam relative to the mean eigenvalue of K + g_a^2 a a' (as before the age
    term shared K's eigh: the kernel the ridge is scaled to does not include the length)."""
    rng = np.random.default_rng(7)
    n, sigma2 = 14, 0.02
    A = rng.normal(size=(n, 4))
    K, u, a, yt = A @ A.T / 4, rng.normal(size=n), rng.normal(size=n), rng.normal(0, 0.3, n)
    cands = loo_candidates(np.linalg.eigh(K), yt, u, float(n), (0.0, 0.3, 1.0), sigma2, a,
                           (0.0, 1.0, 3.0))
    assert len(cands) == 3 * len(LAMBDA_GRID) * 3
    assert [c[3] for c in cands[::len(LAMBDA_GRID) * 3]] == [0.0, 1.0, 3.0]
    for mse, lam, g, ga, m_y, loo, nll in cands[::5]:
        aged = K + ga * ga * np.outer(a, a)
        full = aged + g * g * np.outer(u, u)
        assert min(abs(lam * n / np.trace(aged) - c) for c in LAMBDA_GRID) < 1e-9
        M = np.linalg.inv(full + lam * np.eye(n))
        assert np.allclose(m_y, M @ yt, atol=1e-9)
        for i in (0, n // 2, n - 1):  # leave i out, refit, predict it
            keep = np.arange(n) != i
            alpha = np.linalg.solve(full[np.ix_(keep, keep)] + lam * np.eye(n - 1), yt[keep])
            assert loo[i] == pytest.approx(yt[i] - full[i, keep] @ alpha, rel=1e-7, abs=1e-9)
        C = sigma2 / lam * full + sigma2 * np.eye(n)
        assert nll == pytest.approx(0.5 * (yt @ np.linalg.solve(C, yt)
                                           + np.linalg.slogdet(C)[1]) / n, rel=1e-9)


def test_choosing_by_evidence_keeps_the_mean_for_noise_and_the_kernel_for_a_signal():
    """Scores of 4 rollouts: where every prompt has one rate (their spread is all sampling
    noise) the evidence answers with the window's mean; where the rate follows a feature
    (0.1 or 0.9 by its sign), it keeps a kernel model that ranks new prompts by it."""
    rng = np.random.default_rng(11)
    n = 64
    X = rng.normal(size=(n, 8))
    counts = np.full(n, 4.0)
    same = rng.binomial(4, 0.3, n) / 4.0
    evidence = FitSettings(select="evidence")
    assert fit_context(X, same, counts=counts, settings=evidence).kernel is None
    assert fit_context(X, same, counts=counts).kernel is not None  # LOO chases this noise
    strong = rng.binomial(4, np.where(X[:, 0] > 0, 0.9, 0.1)) / 4
    fit = fit_context(X, strong, counts=counts, settings=evidence)
    assert fit.kernel is not None
    p = predict_fitted(fit, np.array([[2.0] + [0] * 7, [-2.0] + [0] * 7]))
    assert p[0] > 0.6 > 0.4 > p[1]


def test_the_surface_view_shares_its_coefficients_over_the_window_not_decayed_by_age():
    from actors.priors.embedded.kernel import fit_context, predict_fitted

    rng = np.random.default_rng(2)
    k = np.r_[rng.integers(1, 5, 60), rng.integers(5, 9, 60)].astype(float)
    ages = np.r_[np.full(60, 24.0), np.zeros(60)]    # the small counts seen long ago only
    y = 1.0 - 0.1 * k + rng.normal(0, 0.02, 120)
    X = {"surface": k[:, None]}
    shared = fit_context(X, y, ages,
                         settings=FitSettings(halflife=8.0, undecayed=("surface",)))
    decayed = fit_context(X, y, ages, settings=FitSettings(halflife=8.0))
    assert not shared.timed and decayed.timed
    q = {"surface": np.array([[2.0]])}   # a query now, of a kind seen only 24 versions ago
    assert abs(predict_fitted(shared, q)[0] - 0.8) < 0.05
    assert abs(predict_fitted(decayed, q)[0] - 0.8) > 2 * abs(predict_fitted(shared, q)[0] - 0.8)


def test_observe_takes_the_rollouts_behind_a_score_and_names_a_bad_count():
    from actors.priors.server import PriorServer

    server = PriorServer("constant", {}, window=8)
    server.observe([PriorObservation("a", 0.5, 0), PriorObservation("b", 0.25, 1, rollouts=4)])
    ctx = server._context()
    assert list(ctx.counts) == [1, 4] and list(ctx.scores) == [0.5, 0.25]
    for bad in (0, 2.5, True, -3, "4", None):
        with pytest.raises(ValueError, match="item 1: rollouts must be an int >= 1"):
            server.observe([PriorObservation("c", 0.5, 1), PriorObservation("c", 0.5, 1, bad)])
    with pytest.raises(ValueError, match="item 0: expected a PriorObservation"):
        server.observe([("c", 0.5, 1, 4)])                   # the old tuple form is refused
    assert server.stats().n_context == 2 and server.stats().n_observed == 2
    # NumPy numbers from a caller's arithmetic are kept as plain float and int.
    server.observe([PriorObservation("d", np.float32(0.75), np.int64(2), np.int32(8))])
    kept = server._items[-1]
    assert kept == PriorObservation("d", 0.75, 2, 8)
    assert [type(v) for v in (kept.score, kept.version, kept.rollouts)] == [float, int, int]
    assert server.stats().latest_version == 2


def test_a_window_with_too_few_repeats_to_choose_kappa_uses_no_history():
    from actors.priors.embedded.history import MIN_REPEATED

    rng = np.random.default_rng(6)
    X = rng.normal(size=(60, 3))
    y = rng.uniform(0, 1, size=60)
    few = np.arange(60)
    few[1] = few[0]                                       # one prompt seen twice
    assert fit_context(X, y, ids=few).kappa is None
    many = np.arange(60) % (60 - MIN_REPEATED // 2)       # MIN_REPEATED observations repeat
    y_many = np.clip(0.5 + 0.4 * np.sin(many) + rng.normal(0, 0.02, 60), 0, 1)
    assert fit_context(X, y_many, ids=many).kappa is not None
