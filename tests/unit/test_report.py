"""cluster.report.page on crafted run directories: every section and figure, missing data shown as
"no data", the accounting identity checked, a stalled run, large files, the CLI's exit codes."""
from __future__ import annotations

import base64
import json
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from test_report_data import make_run

from cluster.report import data as report_data
from cluster.report.page import main, write_report
from cluster.report.analysis import accounting_checks, reliability_bins
from cluster.report.data import ReportError, load_run
from cluster.report.sections import PLOTS, SECTIONS

ROOT = Path(__file__).resolve().parents[2]


def images(page: str) -> dict[str, tuple[int, int]]:
    """Each inlined PNG's id -> (width, height) read from its IHDR chunk."""
    out = {}
    for tag in re.findall(r"<img [^>]*>", page):
        pid = re.search(r'id="([^"]+)"', tag).group(1)
        data = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', tag).group(1))
        assert data[:8] == b"\x89PNG\r\n\x1a\n", pid
        out[pid] = struct.unpack(">II", data[16:24])
    return out


def nodata(page: str) -> set[str]:
    return set(re.findall(r'id="(plot-[a-z-]+)-nodata"', page))


# A 1x1 PNG: what a figure is encoded as in the tests that read the page's text only (the
# accounting, the CLI, sampling); drawing ten figures there cost most of this file's time.
# The figure tests draw every figure for real.
def _png_1x1() -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)  # 1 x 1, 8-bit greyscale
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\x00"))
    return base64.b64encode(raw + chunk(b"IEND", b"")).decode("ascii")


_PIXEL = _png_1x1()


@pytest.fixture
def text_only(monkeypatch):
    from cluster.report import plots as report_plots

    monkeypatch.setattr(report_plots, "png", lambda fig: _PIXEL)


def test_every_section_and_figure_of_a_full_run(tmp_path):
    run = make_run(tmp_path / "run")
    out = write_report(run)
    assert out == run / "report.html"
    page = out.read_text()
    for sid, _, _ in SECTIONS:
        assert f'<section id="{sid}">' in page
    imgs = images(page)
    assert set(imgs) == set(PLOTS) and not nodata(page)
    assert all(w > 100 and h > 100 for w, h in imgs.values()), imgs
    for pid, title in PLOTS.items():
        assert f'alt="{title}"' in page
    assert "section failed" not in page and "did not parse" not in page
    # Self-contained: nothing to fetch.
    assert not re.search(r"(src|href)=\"(?!data:|#)", page)
    assert "<script" not in page and "<link" not in page and "http" not in page.lower().replace(
        "http-equiv", "")
    # The accounting holds and says so; the tables carry the numbers.
    assert 'class="banner ok" id="accounting-identity"' in page and "72 = 64 + 3 + 5" in page
    assert all(ok for _, ok, _ in accounting_checks(load_run(run)))
    assert "dropped: filtered" in page and "status: <b id=\"status\">finished" in page
    assert "max_staleness" in page  # the config.yaml block
    # The prior over the run: its corrected error and bias from summary.json, in a table.
    prior_run = re.search(r'<table class="prior-run">.*?</table>', page).group(0)
    assert "prior_error_sd_corrected" in prior_run and "prior_bias" in prior_run
    assert "prior_error_n" in prior_run and ">64<" in prior_run  # every trained prompt


def test_missing_files_and_keys_say_no_data(tmp_path):
    # Only a metrics.jsonl, with steps that carry no known key (or nulls).
    run = tmp_path / "bare"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n" + json.dumps(
        {"step": 2, "reward_mean": None, "k_hist": None, "eval_accuracy": None}) + "\n")
    page = write_report(run).read_text()
    assert nodata(page) == set(PLOTS) and not images(page)
    assert "section failed" not in page and "no summary.json" in page
    assert 'id="accounting-identity">no data' in page
    # An empty run: metrics.jsonl without a line.
    (run / "metrics.jsonl").write_text("")
    page = write_report(run).read_text()
    assert nodata(page) == set(PLOTS) and 'id="metrics-nodata"' in page
    assert "section failed" not in page


def test_partial_run_draws_what_it_has(tmp_path):
    run = make_run(tmp_path / "run")
    for name in ("prompts.jsonl", "summary.json", "dropped.jsonl", "inflight_at_end.json"):
        (run / name).unlink()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 9, "reward_mean": 0.')  # a crash mid-line
    page = write_report(run).read_text()
    assert nodata(page) == {"plot-prior-reliability", "plot-generators-per-gen",
                            "plot-rollout-gantt"}
    assert "1 line(s)" in page and "section failed" not in page


def test_k_heatmap_from_prompts_when_metrics_lack_k_hist(tmp_path):
    run = make_run(tmp_path / "run")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({k: v for k, v in m.items() if k != "k_hist"}) + "\n" for m in lines))
    assert "plot-k-heatmap" in images(write_report(run).read_text())


def test_identity_failure_is_flagged(tmp_path, capsys, text_only):
    run = make_run(tmp_path / "run", broken_by=2)
    assert main([str(run)]) == 0            # written; the warning goes to stderr
    assert "does not add up" in capsys.readouterr().err
    page = (run / "report.html").read_text()
    assert 'class="banner fail" id="accounting-identity"' in page
    assert "identity fails" in page and "74 ≠ 64 + 3 + 5 = 72" in page
    assert main([str(run), "--check"]) == 1
    assert main([str(make_run(tmp_path / "good")), "--check"]) == 0


def test_files_disagreeing_with_the_summary_are_flagged(tmp_path, text_only):
    run = make_run(tmp_path / "run")
    lines = (run / "prompts.jsonl").read_text().splitlines()
    (run / "prompts.jsonl").write_text("\n".join(lines + [lines[0]]) + "\n")  # trained twice
    checks = {what: ok for what, ok, _ in accounting_checks(load_run(run))}
    assert checks["admitted = trained + dropped + in flight"]
    assert not checks["prompts.jsonl lines = trained"] and not checks["no prompt trained twice"]
    assert main([str(run), "--check"]) == 1


def test_stalled_run(tmp_path):
    run = make_run(tmp_path / "run", stalled=True)
    page = write_report(run).read_text()
    assert 'id="status-stalled"' in page and "generators (evaluation)" in page
    assert 'id="accounting-identity">no data' in page and "stalled run" in page
    assert "plot-learning-steps" in images(page)


def test_reliability_bins_by_hand():
    prompts = [{"prior_p": 0.05, "rewards": [1, -1]}, {"prior_p": 0.07, "rewards": [-1, -1]},
               {"prior_p": 0.95, "rewards": [1, 1, 1, -1]}, {"prior_p": None, "rewards": [1]},
               {"prior_p": 1.0, "rewards": [1, 1]}]
    bins, why = reliability_bins(prompts)
    assert not why and [b["n"] for b in bins] == [2, 0, 0, 0, 0, 0, 0, 0, 0, 2]
    assert bins[0]["p"] == pytest.approx(0.06) and bins[0]["obs"] == pytest.approx(0.25)
    assert bins[9]["p"] == pytest.approx(0.975) and bins[9]["obs"] == pytest.approx(0.875)
    assert bins[0]["se"] == pytest.approx(0.25)  # std([0.5, 0]) / sqrt(2)
    assert reliability_bins([{"prior_p": 0.5, "rewards": [1, 1]}])[1].startswith("every reward")
    # With the task's reward range (config task.reward_low/high), a run that never succeeds
    # is calibrated against 0, and rewards below the range clip to it.
    bins, _ = reliability_bins([{"prior_p": 0.5, "rewards": [-1, -1]},
                                {"prior_p": 0.55, "rewards": [-1.5, -1]}], (-1.0, 1.0))
    assert bins[5]["n"] == 2 and bins[5]["obs"] == 0.0


def test_large_prompts_file_is_sampled_but_counted_whole(tmp_path, monkeypatch, text_only):
    monkeypatch.setattr(report_data, "MAX_PROMPT_LINES", 20)
    monkeypatch.setattr(report_data, "TAIL_PROMPT_LINES", 8)
    run = make_run(tmp_path / "run")
    data = load_run(run)
    assert data.prompt_lines == 64 and data.prompts_stride > 1 and len(data.prompts) < 64
    assert sorted(data.prompt_uids) == sorted(f"s{i}" for i in range(64))
    assert [p["uid"] for p in data.prompts[data.tail_start:]] == [f"s{i}" for i in range(56, 64)]
    assert all(ok for _, ok, _ in accounting_checks(data))
    assert "1 in" in write_report(run).read_text()


def test_cli_exit_codes(tmp_path, capsys, text_only):
    assert main([str(tmp_path / "absent")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    with pytest.raises(ReportError):
        write_report(tmp_path / "empty")
    run = make_run(tmp_path / "run")
    assert main([str(run), "-o", str(tmp_path / "elsewhere.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "elsewhere.html")
    assert not (run / "report.html").exists() and (tmp_path / "elsewhere.html").exists()


def test_module_entry_point_imports_no_ray_or_torch(tmp_path):
    run = make_run(tmp_path / "run")
    code = ("import sys, runpy; sys.argv = ['cluster.report.page', sys.argv[1]]\n"
            "try:\n    runpy.run_module('cluster.report.page', run_name='__main__')\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "heavy = sorted(m for m in ('torch', 'ray', 'vllm', 'deepspeed') if m in sys.modules)\n"
            "print('HEAVY', heavy, 'RC', rc)")
    res = subprocess.run([sys.executable, "-c", code, str(run)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert "HEAVY [] RC 0" in res.stdout, res.stdout + res.stderr
    assert (run / "report.html").exists()
    bad = subprocess.run([sys.executable, "-m", "cluster.report.page", str(tmp_path / "nope")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no such run directory" in bad.stderr


def test_the_staleness_bound_is_the_schedulers():
    """A synchronous run's bound is 0 (its barrier), whatever rollout.max_staleness holds (the
    report drew the raw 2); an async run's is rollout.max_staleness."""
    from cluster.config.schema import build_config, dump_config
    from cluster.report.sections import staleness_bound

    import yaml

    for mode, bound in (("sync", 0.0), ("async", 3.0)):
        data = yaml.safe_load(dump_config(build_config({"mode": mode,
                                                        "rollout": {"max_staleness": 3}})))
        assert data["rollout"]["max_staleness"] == 3 and staleness_bound(data) == bound
    assert staleness_bound({"no_such_section": 1}) is None
