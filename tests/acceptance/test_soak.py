"""The acceptance tier (``python -m pytest -m acceptance``; the default suite leaves it out):
``python -m tests.acceptance.soak`` in a short form, as its command runs it (a local cluster of
its own, v05.yaml with short traces): two minutes and at least six steps, sampled every 10 s,
a checkpoint every 3 steps.

What a short run can judge: no prompt lost or trained twice (by uid, from the run's files),
the accounting identity, every role's process found and sampled, and the result file with its
command. The growth aims (< 5 %/h memory and run state, step time within 10 %/h) need the
full form's hour (``python -m tests.acceptance.soak``, bench/results/soak.json): a two-minute
slope is noise, so they are not asserted here.
"""
import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

pytest.importorskip("ray")


def test_a_short_soak_loses_nothing_and_samples_every_role(tmp_path):
    from tests.acceptance.soak.__main__ import main

    out = tmp_path / "soak.json"
    code = main(["--minutes", "2", "--steps", "6", "--every-s", "10", "--checkpoint-every", "3",
                 "--eval-every-s", "60", "--out", str(out), "--workdir", str(tmp_path / "run"),
                 "task.difficulties=[1]", "task.n_train=2000", "task.n_heldout=100"])
    assert out.is_file(), f"no result written (exit {code})"
    res = json.loads(out.read_text())
    assert res["command"].startswith("python -m tests.acceptance.soak --minutes 2")
    assert res["steps"] >= 6
    assert res["prompts_lost"] == 0 and res["prompts_trained_twice"] == 0
    assert res["accounting"]["identity_holds"], res["accounting"]
    rss = {k: v for k, v in res["series"].items() if k.startswith("rss_mb/") and k != "rss_mb/total"}
    assert any("generator" in k for k in rss) and any("learner" in k for k in rss), sorted(rss)
    assert len(res["series"]["t_s"]) >= 3  # sampled through the run, not once
    assert all(any(x is not None for x in v) for v in rss.values())
    assert set(res["aims"]) >= {"rss_under_5pct_per_hour", "run_state_under_5pct_per_hour",
                                "step_time_within_10pct_per_hour", "met"}
    assert code == 0
