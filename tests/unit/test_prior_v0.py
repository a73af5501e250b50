"""The v0 prior backend, loaded and run on a CPU from a tiny random V0-shaped file set.

No published weight exists on this machine: ``actors.priors.v0_tiny`` builds, from configs, a
1-layer Qwen3 encoder with a BPE tokenizer trained here, a dynamic-query adapter checkpoint in
V0's layout and a head file; the real loader (``v0.py``, ``v0_model.py``) loads and runs them.
The head is ``SimilarityHead`` (TabPFN's interface, no tabpfn needed) except in the test that
builds a random 1-layer TabPFN, which runs only where the ``tabpfn`` package is installed.
"""
import json

import numpy as np
import pytest

from actors.priors.server import FallbackCounts, PriorOutputError, PriorServer, make_prior
from actors.priors.v0 import (EMBEDDING_MODEL, V0FilesMissing, V0Prior, default_dtype,
                              placement_device, register_v0_head)
from actors.priors.v0_tiny import SIMILARITY_HEAD, write_tiny_v0
from common.types import PriorObservation

CONTEXT = [PriorObservation(*o) for o in [
    ("What is 2 plus 3?", 1.0, 0), ("What is 10 plus 7?", 0.875, 0),
    ("What is 4 plus 4?", 0.75, 1),
    ("Prove that every planar graph is four-colourable.", 0.0, 0),
    ("Prove the Riemann hypothesis for function fields.", 0.125, 1),
    ("Classify all finite simple groups and prove the list complete.", 0.25, 1)]]
QUERIES = ["What is 7 plus 1?", "Prove that 2 is prime.", "hello", "What is 9 plus 9?",
           "Prove Fermat's last theorem for n = 4."]


def tiny_server(root, **options) -> PriorServer:
    opts = {"path": str(root), "head": SIMILARITY_HEAD, **options}
    return PriorServer("v0", opts, fallback=None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_v0(tmp_path_factory.mktemp("v0"), head="similarity")


# -- where it runs ----------------------------------------------------------------------------
def test_device_follows_the_placement_and_an_explicit_option_wins():
    assert placement_device(None, gpu_ids=[3], cuda_available=True) == "cuda"   # actor given a GPU
    assert placement_device("auto", gpu_ids=[], cuda_available=False) == "cpu"  # num_gpus=0 actor
    assert placement_device(None, gpu_ids=[], cuda_available=True) == "cuda"    # outside Ray
    assert placement_device("cpu", gpu_ids=[0], cuda_available=True) == "cpu"   # explicit wins
    assert placement_device("cuda:1", gpu_ids=[], cuda_available=False) == "cuda:1"
    with pytest.raises(RuntimeError, match="given GPU.*no CUDA.*device: cpu"):
        placement_device(None, gpu_ids=[0], cuda_available=False)
    assert placement_device() == "cpu"                       # this machine: no Ray, no CUDA
    assert (default_dtype("cuda"), default_dtype("cuda:1"), default_dtype("cpu")) == \
        ("bfloat16", "bfloat16", "float32")


# -- files ------------------------------------------------------------------------------------
def test_v0_names_every_missing_file(tmp_path):
    with pytest.raises(V0FilesMissing) as e:
        make_prior("v0", path=str(tmp_path))
    missing = e.value.missing
    assert str(tmp_path / "v_0_for_grpo_training.pt") in missing
    assert str(tmp_path / "pretrained/tabpfn-v2.5-classifier-v2.5_default.ckpt") in missing
    assert str(tmp_path / "Qwen3-Embedding-0.6B/model.safetensors") in missing
    (tmp_path / "v_0_for_grpo_training.pt").write_bytes(b"x")
    (tmp_path / "Qwen3-Embedding-0.6B").mkdir()
    (tmp_path / "Qwen3-Embedding-0.6B/config.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as e:
        PriorServer("v0", {"path": str(tmp_path)})
    assert "v_0_for_grpo_training.pt" not in str(e.value).split("expected layout")[0]
    assert "tokenizer.json" in str(e.value) and "tabpfn" in str(e.value)
    with pytest.raises(ValueError, match="needs option 'path'"):
        V0Prior()


def test_a_tiny_v0_missing_one_file_names_it(tmp_path):
    root = write_tiny_v0(tmp_path, head="similarity")
    (root / EMBEDDING_MODEL / "tokenizer.json").unlink()
    with pytest.raises(V0FilesMissing, match="Qwen3-Embedding-0.6B/tokenizer.json") as e:
        tiny_server(root)
    assert e.value.missing == [str(root / EMBEDDING_MODEL / "tokenizer.json")]


def test_bad_head_or_dtype_options_are_named(tiny):
    with pytest.raises(ValueError, match="unknown v0 head 'nope'; valid: tabpfn"):
        tiny_server(tiny, head="nope")
    with pytest.raises(ValueError, match="dtype must be one of"):
        tiny_server(tiny, dtype="float8")
    with pytest.raises(ValueError, match="already registered"):
        register_v0_head("tabpfn", SIMILARITY_HEAD)
    register_v0_head("test-similarity", SIMILARITY_HEAD)         # by name, as from a config
    assert tiny_server(tiny, head="test-similarity").stats().backend_stats.head == \
        "test-similarity"


# -- load and predict -------------------------------------------------------------------------
def test_tiny_v0_loads_through_the_real_loader_and_predicts(tiny):
    import torch
    s = tiny_server(tiny)
    b = s.backend
    st = s.stats()
    own = st.backend_stats                                   # the backend's own counters
    assert (own.device, own.dtype, own.head) == ("cpu", "float32", SIMILARITY_HEAD)
    # The adapter is the checkpoint's (DDP prefix stripped, shape read from it).
    saved = torch.load(tiny / "v_0_for_grpo_training.pt", weights_only=False)["model_state_dict"]
    assert torch.equal(b.embedder.adapter_layer.static_queries,
                       saved["module.adapter_layer.static_queries"])
    assert b.embedder.adapter_layer.num_queries == 5 and b.embedder.tokenizer.padding_side == "left"
    # Features: 5 queries x 6 dims, avg-pooled to the checkpoint's target_dim 24.
    X = b.embedder.encode(QUERIES[:3])
    assert X.shape == (3, 24) and X.dtype == np.float32 and np.isfinite(X).all()
    assert not np.allclose(X[0], X[1])

    assert s.predict(QUERIES[:2]) == [0.5, 0.5]              # empty context: prior_mean
    s.observe(CONTEXT)
    p = np.array(s.predict(QUERIES))
    assert p.shape == (5,) and np.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()
    assert len(set(p.round(9).tolist())) > 1                 # not a constant
    own = s.stats().backend_stats
    assert own.n_fits == 1 and own.cache.misses == len(CONTEXT) + len(QUERIES)
    # Deterministic: again on this server (cached), and on a second one loaded from the files.
    assert s.predict(QUERIES) == p.tolist()
    again = tiny_server(tiny)
    again.observe(CONTEXT)
    assert again.predict(QUERIES) == p.tolist()
    # A one-class context (all solved): its mean, as TabPFN cannot fit one class.
    one = tiny_server(tiny)
    one.observe([PriorObservation(q, 0.75, 0) for q in QUERIES])
    assert one.predict(["x"]) == [pytest.approx(0.75)]


def test_the_gpu_dtype_runs_on_the_cpu_too(tiny):
    """bfloat16 is the GPU's default (no GPU here): the backbone loads in it and its features
    stay close to float32's."""
    import torch
    bf = tiny_server(tiny, dtype="bfloat16").backend
    assert next(bf.embedder.backbone.parameters()).dtype == torch.bfloat16
    assert next(bf.embedder.adapter_layer.parameters()).dtype == torch.float32
    x16, x32 = bf.embedder.encode(QUERIES), tiny_server(tiny).backend.embedder.encode(QUERIES)
    assert np.isfinite(x16).all() and np.corrcoef(x16.ravel(), x32.ravel())[0, 1] > 0.95


def test_garbage_from_corrupt_weights_is_rejected_or_answered_by_the_fallback(tmp_path):
    root = write_tiny_v0(tmp_path, head="similarity", corrupt=True)    # a NaN in the adapter
    s = tiny_server(root)
    s.observe(CONTEXT)
    with pytest.raises(PriorOutputError, match=r"'v0' returned non-finite values at positions "
                                               r"\[0, 1, 2\]"):
        s.predict(QUERIES[:3])
    f = PriorServer("v0", {"path": str(root), "head": SIMILARITY_HEAD}, fallback="constant",
                    budget_s=60.0)
    f.observe(CONTEXT)
    assert f.predict(QUERIES[:3]) == [pytest.approx(np.mean([o.score for o in CONTEXT]))] * 3
    assert f.stats().fallbacks == FallbackCounts(timeout=0, error=1)


def test_tiny_v0_with_a_random_tabpfn_head(tmp_path):
    """The real TabPFN head (tabpfn's own loader, fit and predict_proba) on a random 1-layer
    v2.5 checkpoint; only where the 'v0' extra is installed."""
    pytest.importorskip("tabpfn")
    root = write_tiny_v0(tmp_path, head="tabpfn")
    s = PriorServer("v0", {"path": str(root), "n_estimators": 1}, fallback=None)
    assert s.stats().backend_stats.head == "tabpfn"
    s.observe(CONTEXT)
    p = s.predict(QUERIES)
    assert len(p) == 5 and all(0.0 <= x <= 1.0 for x in p)
    again = PriorServer("v0", {"path": str(root), "n_estimators": 1}, fallback=None)
    again.observe(CONTEXT)
    assert again.predict(QUERIES) == pytest.approx(p, abs=1e-6)


def test_cli_predicts_with_the_tiny_v0(tiny, tmp_path, capsys):
    """The CLI's v0 path, in this process (``python -m actors.priors predict`` itself runs as
    a command in test_prior.py; a second interpreter here would only reload torch)."""
    from actors.priors.cli import main

    ctx = tmp_path / "c.jsonl"
    ctx.write_text("".join(json.dumps({"prompt": o.prompt, "score": o.score}) + "\n"
                           for o in CONTEXT))
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in QUERIES))
    capsys.readouterr()
    rc = main(["predict", "--context", str(ctx), "--queries", str(q), "--backend", "v0",
               "--option", f"path={tiny}", "--option", f"head={SIMILARITY_HEAD}"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert [r["prompt"] for r in rows] == QUERIES and all(0 <= r["p"] <= 1 for r in rows)
