"""``python -m bench.chaos --quick`` end to end: a few representative faults (a generator
crash, a hung reward function, a NaN loss, the driver SIGKILLed and resumed) injected into
real runs of the default task on real actors, each judged on the run's own files.

Run as a subprocess: the bench starts (and stops) its own local Ray clusters, and its
subprocess scenarios start more; nothing here shares a cluster with another test.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
ROW_KEYS = {"name", "survived", "prompts_lost", "prompts_trained_twice", "hung",
            "recovery_time_s", "recovery", "wall_s", "injected", "what_happened", "detail"}


def test_quick_chaos_every_scenario_survives_without_loss(tmp_path):
    from bench.chaos.__main__ import QUICK

    out, log = tmp_path / "chaos.json", tmp_path / "chaos.log"
    with open(log, "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.chaos", "--quick", "--out", str(out),
             "--workdir", str(tmp_path / "runs")],
            cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=1800)
    tail = log.read_text(errors="replace")[-4000:]
    assert out.is_file(), f"no result written (exit {proc.returncode}):\n{tail}"
    res = json.loads(out.read_text())
    assert {"command", "date", "scenarios", "wall_s", "config"} <= set(res)
    assert res["command"].startswith("python -m bench.chaos --quick")
    rows = {r["name"]: r for r in res["scenarios"]}
    assert set(rows) == set(QUICK)
    for name, r in rows.items():
        assert ROW_KEYS <= set(r), f"{name}: missing {ROW_KEYS - set(r)}"
        why = f"{name}: {r['what_happened']} ({r['detail'].get('error')})"
        assert r["survived"] is True, why
        assert r["prompts_lost"] == 0, f"{why}; lost {r['detail'].get('lost_uids')}"
        assert r["prompts_trained_twice"] == 0, \
            f"{why}; twice {r['detail'].get('trained_twice_uids')}"
        assert r["hung"] is False, why
        assert r["detail"]["accounting"]["identity_holds"], why
    # The faults really landed, and the system's own counters saw them.
    gen = rows["generator_killed_mid_generation"]["detail"]
    assert gen["generator_restarts"] >= 1 and gen["back_in_service_after_s"] is not None
    assert gen["victim_version_at_end"] == gen["policy_version"]  # re-synced, then trained on
    assert rows["reward_hangs"]["detail"]["scoring"]["score_timeout"] >= 1
    assert rows["nan_loss"]["detail"]["nan_skipped_steps"] == 1
    assert rows["nan_loss"]["detail"]["drop_reasons"]["learner_nan_skip"] >= 1
    kill = rows["driver_sigkill"]["detail"]
    assert kill["fault_landed"] and kill["driver_exit_code"] == -9
    assert kill["resumed_from"] and kill["resume_exit_code"] == 0
    assert proc.returncode == 0, tail
