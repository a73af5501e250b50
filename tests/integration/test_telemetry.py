"""The v05_ metrics reach Ray's Prometheus export."""
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray")

from actors.telemetry import GAUGES, Telemetry  # noqa: E402
from learner.ranks import free_port  # noqa: E402


def test_v05_metrics_in_prometheus_output():
    port = free_port()
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
             _metrics_export_port=port, _system_config={"metrics_report_interval_ms": 500})
    try:
        t = ray.remote(Telemetry).options(num_cpus=0).remote("telemetry-test")
        step = {key: 0.5 for _, key in GAUGES.values()}
        wanted = set(GAUGES) | {"v05_rollouts_per_prompt", "v05_extra_rollouts_requested"}
        found, text = set(), ""
        deadline = time.time() + 90
        while time.time() < deadline and found != wanted:
            ray.get(t.report.remote(step, [4, 5, 16], 13))
            time.sleep(2)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                continue
            found = {w for w in wanted if w in text}
        assert found == wanted, f"missing: {sorted(wanted - found)}"
        assert 'run="telemetry-test"' in text
    finally:
        ray.shutdown()
