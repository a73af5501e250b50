"""bench.prior's results file: its command, date and commit written by the bench
(bench.harness.stamp), as every bench's are (prior.json's were added by hand in 6c7a7e0). The
measurements themselves (a real MiniLM encoder) are replaced by fixed figures here: this test
reads only what main() writes around them."""
from __future__ import annotations

import json

from bench import harness
from bench.prior import __main__ as prior_bench


def test_main_writes_its_command_date_and_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(prior_bench, "bench_latency", lambda *a, **k: {"warm_ms": 1.0})
    monkeypatch.setattr(prior_bench, "MemoEncoder", lambda threads: None)
    monkeypatch.setattr(prior_bench, "bench_auc", lambda *a, **k: {"arithmetic": {}})
    monkeypatch.setattr(prior_bench, "plot", lambda result, path: None)
    monkeypatch.setattr(harness, "checkout_commit", lambda root: f"commit of {root}")
    argv = ["--quick", "--out", str(tmp_path)]
    assert prior_bench.main(argv) == 0
    got = json.loads((tmp_path / "prior.json").read_text())
    assert got["command"] == "python -m bench.prior " + " ".join(argv)
    assert got["commit"] == f"commit of {harness.REPO}"
    assert got["date"][:2] == "20" and got["date"].endswith("+00:00")
    assert got["machine"]["cpus"] >= 1 and "loadavg_1m" in got["machine"]
    assert got["latency_ms"] == {"warm_ms": 1.0} and got["config"]["steps"] == 8


def test_a_command_without_arguments_has_no_trailing_space():
    assert harness.stamp("bench.prior", [])["command"] == "python -m bench.prior"
