"""The v05_ metrics reach Ray's Prometheus export under the names the Grafana dashboard
queries (``telemetry.EXPORTED``, cluster/grafana/v05_dashboard.json); a role's actor name
still held in the job's namespace gets the first free ``~N`` (common/names.py)."""
import re
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from actors.telemetry import EXPORTED, GAUGES, Telemetry  # noqa: E402
from common.names import actor_name  # noqa: E402
from learner.ranks import free_port  # noqa: E402


def exported_names(text: str) -> set[str]:
    """The metric names of a Prometheus text export (sample lines, not comments)."""
    return {m.group(1) for m in re.finditer(r"^([A-Za-z_:][\w:]*)[{ ]", text, re.M)}


def test_v05_metrics_in_prometheus_output():
    port = free_port()
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
             _metrics_export_port=port, _system_config={"metrics_report_interval_ms": 500})
    try:
        name = actor_name("telemetry-test", "telemetry")
        t = ray.remote(Telemetry).options(name=name, num_cpus=0).remote("telemetry-test")
        ray.get(t.ready.remote())
        # The name is held while the first actor lives: a second one of the same run and
        # role gets the next free name, and the first is found under its own.
        second = actor_name("telemetry-test", "telemetry")
        assert (name, second) == ("telemetry-test/telemetry", "telemetry-test/telemetry~2")
        assert ray.get(ray.get_actor(name).ready.remote())
        step = {key: 0.5 for _, key in GAUGES.values()}
        wanted = {n for names in EXPORTED.values() for n in names}
        found, text = set(), ""
        deadline = time.time() + 90
        while time.time() < deadline and found != wanted:
            ray.get(t.report.remote(step, [4, 5, 16], 13))
            time.sleep(2)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                continue
            found = wanted & exported_names(text)
        assert found == wanted, f"missing: {sorted(wanted - found)}"
        assert 'run="telemetry-test"' in text
    finally:
        ray.shutdown()
