"""``python -m bench.chaos`` end to end on two faults injected into real runs of the default
task on real actors: a generator crashed while it holds rollouts (its work re-issued, Ray's
restart re-synced and used again; the admission race that once lost prompts here) and a NaN
loss (the step skipped, its prompts dropped with a reason, admission reopened). Each run is
judged on its own files, by prompt uid. The other scenarios run in `python -m bench.chaos`
(bench/results/chaos.json); the suite covers them elsewhere: crash and resume, a corrupt
checkpoint and a stalled run in test_pipeline.py, a raising and a hung verifier in
tests/unit/test_scoring.py. Short traces (task.difficulties=[1]) keep it to minutes.

Run as a subprocess: the bench starts (and stops) its own local Ray cluster.
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


SCENARIOS = ["generator_killed_mid_generation", "nan_loss"]


def test_chaos_scenarios_survive_without_loss(tmp_path):
    out, log = tmp_path / "chaos.json", tmp_path / "chaos.log"
    with open(log, "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.chaos", "--scenarios", ",".join(SCENARIOS),
             "--steps", "4", "--batch", "4", "--out", str(out),
             "--workdir", str(tmp_path / "runs"), "task.difficulties=[1]",
             "task.n_train=2000", "task.n_heldout=100"],
            cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=1200)
    tail = log.read_text(errors="replace")[-4000:]
    assert out.is_file(), f"no result written (exit {proc.returncode}):\n{tail}"
    res = json.loads(out.read_text())
    assert {"command", "date", "scenarios", "wall_s", "config"} <= set(res)
    assert res["command"].startswith("python -m bench.chaos --scenarios")
    rows = {r["name"]: r for r in res["scenarios"]}
    assert set(rows) == set(SCENARIOS)
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
    assert rows["nan_loss"]["detail"]["nan_skipped_steps"] == 1
    assert rows["nan_loss"]["detail"]["drop_reasons"]["learner_nan_skip"] >= 1
    assert proc.returncode == 0, tail
