"""The Grafana dashboard shipped for the v05_ series (cluster/grafana/v05_dashboard.json):
valid JSON, a panel for every series actors/telemetry.py defines, under the name Ray's
Prometheus endpoint exports it (``telemetry.EXPORTED``, checked against a live export in
tests/integration/test_telemetry.py), no query of a series that does not exist, and every
query parsed by Prometheus's own parser (``promtool``, Debian's ``prometheus``, which
``python -m cluster.install`` installs as root; that test skips without it)."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from actors.telemetry import EXPORTED, EXTRA_ROLLOUTS, GAUGES, ROLLOUTS_PER_PROMPT

DASHBOARD = Path(__file__).resolve().parents[2] / "cluster" / "grafana" / "v05_dashboard.json"
SERIES = re.compile(r"\bray_v05_\w+")


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dash: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target and template variable."""
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    out += [(v["name"], v["query"]["query"]) for v in dash["templating"]["list"]
            if v["type"] == "query"]
    return out


def test_the_dashboard_is_grafana_json_with_unique_panels():
    dash = load()
    assert dash["uid"] == "v05rl" and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert {"type", "title", "gridPos"} <= set(p), p.get("title")
        assert p["type"] == "row" or p["targets"], p["title"]
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "SessionName", "run"]


def test_every_series_telemetry_defines_has_a_panel():
    assert set(EXPORTED) == set(GAUGES) | {ROLLOUTS_PER_PROMPT, EXTRA_ROLLOUTS}
    plotted = {m for _, expr in queries(load()) for m in SERIES.findall(expr)}
    unplotted = sorted(s for s, exported in EXPORTED.items() if not plotted & set(exported))
    assert unplotted == []


def test_no_query_names_a_series_that_does_not_exist():
    exported = {name for names in EXPORTED.values() for name in names}
    unknown = sorted({(title, m) for title, expr in queries(load())
                      for m in SERIES.findall(expr) if m not in exported})
    assert unknown == []


def test_every_panel_shows_the_chosen_runs():
    """Telemetry tags every series with ``run`` (run.name): each panel's query selects the
    dashboard's runs and session, and the queries are balanced."""
    for title, expr in queries(load()):
        if title in ("SessionName", "run"):
            continue
        for selector in re.findall(r"ray_v05_\w+(\{[^}]*\})?", expr):
            assert 'run=~"$run"' in selector and 'SessionName=~"$SessionName"' in selector, title
        for a, b in ("()", "{}", "[]"):
            assert expr.count(a) == expr.count(b), (title, expr)


def grafana_to_promql(expr: str) -> str:
    """A panel query as Grafana sends it: its variables and interval macros substituted."""
    for var, value in (("$__rate_interval", "1m"), ("$__range", "1h"),
                       ("$SessionName", ".+"), ("$run", "run-a|run-b")):
        expr = expr.replace(var, value)
    return expr


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="no promtool on PATH: `apt-get install prometheus`, or "
                           "`python -m cluster.install` as root")
def test_every_panel_query_parses_in_promtool(tmp_path):
    """Each panel query as a recording rule: ``promtool check rules`` parses them all."""
    panels = [(t, e) for t, e in queries(load()) if t not in ("SessionName", "run")]
    rules = {"groups": [{"name": "v05", "rules": [
        {"record": f"v05:panel_{i}", "expr": grafana_to_promql(e)}
        for i, (_, e) in enumerate(panels)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(panels)} rules found" in out.stdout


def test_every_gauge_reads_a_field_of_the_step_record():
    """The driver hands the telemetry actor each step's record, not a dict: a gauge whose
    field the record lacks (renamed, say) would fail there, so it fails here first."""
    from dataclasses import fields

    from cluster.records.step import StepMetrics

    names = {f.name for f in fields(StepMetrics)}
    assert {key for _, key in GAUGES.values()} <= names
    assert "extra_rollouts" in names
