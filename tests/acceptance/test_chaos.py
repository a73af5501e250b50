"""The acceptance tier (``python -m pytest -m acceptance``; the default suite leaves it out):
``python -m tests.acceptance.chaos`` on two faults injected into real runs of the default
task, on v05.yaml's real actors (vLLM generators, the DeepSpeed learner, the embedded prior)
started once by this module and lent to the chaos run (``bench.harness.lend_roles``): its
``main`` runs as ``python -m tests.acceptance.chaos ARGS`` would, in this process.

- a generator crashed while it holds rollouts (its work re-issued, Ray's restart re-synced and
  used again; the admission race that once lost prompts here);
- a NaN loss (the step skipped, its prompts dropped with a reason, admission reopened).

Each run is judged on its own files, by prompt uid. The other scenarios run in ``python -m
tests.acceptance.chaos`` (bench/results/chaos.json); the default suite covers them elsewhere:
crash and resume, a corrupt checkpoint and a stalled run in test_pipeline.py, a raising and a
hung verifier in tests/unit/test_scoring.py. Short traces (task.difficulties=[1]) keep it to
minutes.
"""
import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

pytest.importorskip("ray")

ROW_KEYS = {"name", "survived", "prompts_lost", "prompts_trained_twice", "hung",
            "recovery_time_s", "recovery", "wall_s", "injected", "what_happened", "detail"}


SCENARIOS = ["generator_killed_mid_generation", "nan_loss"]


def test_chaos_scenarios_survive_without_loss(lent_roles, tmp_path):
    from tests.acceptance.chaos.__main__ import main

    out = tmp_path / "chaos.json"
    code = main(["--scenarios", ",".join(SCENARIOS), "--steps", "4", "--batch", "4",
                 "--out", str(out), "--workdir", str(tmp_path / "runs"),
                 "task.difficulties=[1]", "task.n_train=2000", "task.n_heldout=100"])
    assert out.is_file(), f"no result written (exit {code})"
    res = json.loads(out.read_text())
    assert {"command", "date", "scenarios", "wall_s", "config"} <= set(res)
    assert res["command"].startswith("python -m tests.acceptance.chaos --scenarios")
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
    assert gen["generator_losses"] >= 1 and gen["back_in_service_after_s"] is not None
    assert gen["victim_version_at_end"] == gen["policy_version"]  # re-synced, then trained on
    assert rows["nan_loss"]["detail"]["nan_skipped_steps"] == 1
    assert rows["nan_loss"]["detail"]["drop_reasons"]["learner_nan_skip"] >= 1
    assert code == 0  # every scenario clean
