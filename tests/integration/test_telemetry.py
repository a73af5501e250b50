"""The v05_ metrics reach Ray's Prometheus export under the names the Grafana dashboard
queries (``telemetry.EXPORTED``, cluster/grafana/v05_dashboard.json), and every panel of that
dashboard draws data from a real Prometheus scraping the export (Debian's ``prometheus``; that
test skips without it); a role's actor name still held in the job's namespace gets the first
free ``~N`` (common/names.py)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from actors.telemetry import EXPORTED, GAUGES, Telemetry  # noqa: E402
from cluster.records.step import StepMetrics  # noqa: E402
from common.names import actor_name  # noqa: E402
from learner.ranks import free_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_grafana_dashboard import grafana_to_promql, load, queries  # noqa: E402

RUN = "telemetry-test"


def exported_names(text: str) -> set[str]:
    """The metric names of a Prometheus text export (sample lines, not comments)."""
    return {m.group(1) for m in re.finditer(r"^([A-Za-z_:][\w:]*)[{ ]", text, re.M)}


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def telemetry():
    """A local cluster exporting metrics on a free port, and a Telemetry actor of run RUN
    reporting a step every second (in a thread) until the module is done."""
    port = free_port()
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
             _metrics_export_port=port, _system_config={"metrics_report_interval_ms": 500})
    stop = threading.Event()
    try:
        name = actor_name(RUN, "telemetry")
        t = ray.remote(Telemetry).options(name=name, num_cpus=0).remote(RUN)
        ray.get(t.ready.remote())
        step = StepMetrics(**{"step": 1, "policy_version": 1, "extra_rollouts": 13,
                              **{key: 0.5 for _, key in GAUGES.values()}})

        def report():
            while not stop.is_set():
                ray.get(t.report.remote(step, [4, 5, 16]))
                stop.wait(1.0)

        thread = threading.Thread(target=report, daemon=True)
        thread.start()
        yield name, port
        stop.set()
        thread.join(timeout=30)
    finally:
        stop.set()
        ray.shutdown()


def test_a_held_role_name_gets_the_next_free_one(telemetry):
    """While the first telemetry actor lives, a second one of the same run and role gets
    ``~2``, and the first is found under its own name."""
    name, _ = telemetry
    assert (name, actor_name(RUN, "telemetry")) == (f"{RUN}/telemetry", f"{RUN}/telemetry~2")
    assert ray.get(ray.get_actor(name).ready.remote())


def test_v05_metrics_in_prometheus_output(telemetry):
    _, port = telemetry
    wanted = {n for names in EXPORTED.values() for n in names}
    found, text = set(), ""
    deadline = time.time() + 90
    while time.time() < deadline and found != wanted:
        time.sleep(2)
        try:
            text = get(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            continue
        found = wanted & exported_names(text)
    assert found == wanted, f"missing: {sorted(wanted - found)}"
    assert f'run="{RUN}"' in text


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="no prometheus on PATH: `apt-get install prometheus`, or "
                           "`python -m cluster.install` as root")
def test_every_dashboard_panel_draws_data_from_prometheus(telemetry, tmp_path):
    """A real Prometheus scrapes the export every second; each panel's query, as Grafana
    sends it for this run and any session, returns at least one series."""
    _, port = telemetry
    web = free_port()
    (tmp_path / "prometheus.yml").write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "ray",
                            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
    with open(tmp_path / "prometheus.log", "w") as log:
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{web}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        panels = [(title, grafana_to_promql(expr).replace("run-a|run-b", RUN))
                  for title, expr in queries(load()) if title not in ("SessionName", "run")]
        assert len(dict(panels)) == len(panels)  # titles name the panels
        empty, deadline = dict(panels), time.time() + 90
        while empty and time.time() < deadline:
            time.sleep(2)
            for title, expr in list(empty.items()):
                try:
                    answer = json.loads(get(f"http://127.0.0.1:{web}/api/v1/query?"
                                            + urllib.parse.urlencode({"query": expr})))
                except OSError:
                    break  # not up yet
                assert answer["status"] == "success", (title, answer)
                if answer["data"]["result"]:
                    del empty[title]
        assert empty == {}, (tmp_path / "prometheus.log").read_text()[-2000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the Prometheus this test started
        proc.wait(timeout=30)
