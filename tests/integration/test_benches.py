"""``python -m bench.learning --quick`` end to end, on v05.yaml's real actors (vLLM
generators, the DeepSpeed learner, the embedded prior) that the module starts once and lends
to the bench (``bench.harness.lend_roles``): its ``main`` runs as ``python -m bench.learning
ARGS`` would, in this process, and its ``shared_roles`` gets these roles instead of starting
its own cluster (the start dominates on a CPU). Two modes, each for a short training budget,
every run evaluated at its start and its end; the result file has every pinned key.

The chaos and soak runs are the acceptance tier (tests/acceptance/, ``pytest -m acceptance``).
"""
import json

import pytest

pytestmark = pytest.mark.integration

pytest.importorskip("ray")

# -- python -m bench.learning --quick -------------------------------------------------------
BUDGET_S = 6  # seconds of training per run: a few steps of each mode


def test_quick_learning_bench_writes_curves_and_the_pinned_summary(lent_roles, tmp_path):
    from bench.learning.__main__ import main

    out = tmp_path / "learning.json"
    # optim.grad_noise off: the lent roles are v05.yaml's, whose learner does not measure it
    # (bench.learning turns it on for its own roles; tests/integration/test_grad_noise.py)
    assert main(["--quick", "--budget-s", str(BUDGET_S), "--eval-prompts", "8",
                 "--out", str(out), "optim.grad_noise=false"]) == 0
    res = json.loads(out.read_text())
    assert res["command"].startswith("python -m bench.learning --quick")
    assert set(res["runs"]) == {"async_v05", "sync_grpo16"}
    for mode, runs in res["runs"].items():
        [run] = runs  # one seed
        pts = run["points"]
        assert len(pts) >= 2 and pts[0]["train_s"] == 0 and pts[0]["rollouts"] == 0
        # The budget (run.max_train_s) reads the run's training clock (train_wall_s); the
        # curve's train_s sums the steps' times, without the bookkeeping between steps, which
        # a loaded machine stretches (5.08 s of a 6 s budget once): the run's clock says
        # whether its budget stopped it.
        assert run["train_wall_s"] >= BUDGET_S, f"{mode} stopped before its budget"
        assert 0 < pts[-1]["train_s"] <= run["train_wall_s"]
        for a, b in zip(pts, pts[1:]):
            assert b["train_s"] > a["train_s"] and b["rollouts"] > a["rollouts"]
            assert b["trained_tokens"] > a["trained_tokens"]
        assert all(0.0 <= p["accuracy"] <= 1.0 for p in pts)
        assert run["steps"] >= 1 and run["prompts_trained"] >= 4
        # Every update trains --batch-samples (64) samples: sync GRPO-16 64 rollouts of 4
        # prompts; V0.5 trains 64 too (the scheduler trims its batch) from at least as many
        # rollouts (a prompt's baseline uses all of them, rollouts_not_trained).
        assert pts[-1]["rollouts"] >= 64 * run["steps"]
        if mode == "sync_grpo16":
            assert pts[-1]["rollouts"] == 64 * run["steps"]
    assert run["k_mean"] == 16.0  # sync GRPO-16 (the last one read)
    # The starting weights were evaluated once, by the seed's first run, and shared.
    first, second = (res["runs"][m][0] for m in ("async_v05", "sync_grpo16"))
    assert (first["initial_eval_reused"], second["initial_eval_reused"]) == (False, True)
    assert first["points"][0] == second["points"][0]
    s = res["summary"]
    for key in ("final_accuracy", "v05_rollouts_to_reach_grpo16_final",
                "v05_wallclock_to_reach_grpo16_final", "grad_norm_var_over_steps",
                "zero_advantage_share", "command", "date"):
        assert key in s, key
    assert set(s["final_accuracy"]) == {"async_v05", "sync_grpo16"}
    v05 = res["runs"]["async_v05"][0]
    assert 4.0 <= v05["k_mean"] <= 16.0 and v05["prior"]["prompts"] >= 4
    assert (tmp_path / "learning.png").is_file() and (tmp_path / "learning_stats.png").is_file()
