"""When a run stops and when it evaluates (cluster.trainer.last_and_eval_due), and the
summary's held-out figures (both metrics, both ends) and the launcher's accuracy lines."""
from __future__ import annotations

import pytest

from cluster.config import RunConfig
from cluster.launch import accuracy_lines
from cluster.metrics import pair_auc
from cluster.trainer import last_and_eval_due


def test_max_steps_alone():
    run = RunConfig(max_steps=10, eval_every=5)
    assert last_and_eval_due(run, 4, 1e6, 0.0) == (False, False)  # no time budget
    assert last_and_eval_due(run, 5, 1.0, 0.0) == (False, True)
    assert last_and_eval_due(run, 10, 1.0, 0.0) == (True, True)


def test_the_last_step_is_always_evaluated_when_evaluating():
    assert last_and_eval_due(RunConfig(max_steps=7, eval_every=5), 7, 1.0, 0.0) == (True, True)
    assert last_and_eval_due(RunConfig(max_steps=7, eval_every=0), 7, 1.0, 0.0) == (True, False)


def test_a_time_budget_ends_the_run_at_the_step_that_spends_it():
    run = RunConfig(max_steps=1000, max_train_s=60.0, eval_every=0, eval_every_s=20.0)
    assert last_and_eval_due(run, 3, 59.9, 40.0) == (False, False)
    assert last_and_eval_due(run, 4, 60.1, 40.0) == (True, True)
    assert last_and_eval_due(run, 1000, 1.0, 0.0) == (True, True)  # max_steps still counts


def test_evaluations_by_training_time_since_the_last_one():
    run = RunConfig(max_steps=1000, eval_every=0, eval_every_s=20.0)
    assert last_and_eval_due(run, 2, 19.0, 0.0) == (False, False)
    assert last_and_eval_due(run, 3, 21.0, 0.0) == (False, True)
    assert last_and_eval_due(run, 4, 30.0, 21.0) == (False, False)
    assert last_and_eval_due(run, 6, 41.5, 21.0) == (False, True)


def test_config_bounds():
    with pytest.raises(ValueError, match="max_train_s"):
        RunConfig(max_train_s=0)
    with pytest.raises(ValueError, match="eval_every_s"):
        RunConfig(eval_every_s=-1)


def test_accuracy_lines_headline_first_with_gain_in_standard_errors():
    s = {"eval_metric": "sampled", "eval_prompts": 500,
         "eval_sampled_initial": 0.57, "eval_sampled_initial_se": 0.014,
         "eval_sampled_final": 0.92, "eval_sampled_final_se": 0.007,
         "eval_greedy_initial": 0.998, "eval_greedy_initial_se": 0.002,
         "eval_greedy_final": 0.996, "eval_greedy_final_se": 0.003}
    head, other = accuracy_lines(s)
    assert head == ("held-out sampled accuracy (the headline), 500 prompts: 0.570 +- 0.014 -> "
                    "0.920 +- 0.007 (+50.0 SE)")
    assert other.startswith("held-out greedy accuracy, 500 prompts: 0.998 +- 0.002 -> 0.996")
    assert accuracy_lines({"eval_metric": "greedy"}) == []


def test_pair_auc_counts_ordered_pairs_and_ties():
    assert pair_auc([0.1, 0.5, 0.9], [0.0, 0.5, 1.0]) == 1.0
    assert pair_auc([0.9, 0.5, 0.1], [0.0, 0.5, 1.0]) == 0.0
    assert pair_auc([0.5, 0.5], [0.0, 1.0]) == 0.5
    assert pair_auc([0.2, 0.3], [1.0, 1.0]) != pair_auc([0.2, 0.3], [1.0, 1.0])  # NaN: no pair


def test_every_kind_of_failed_weight_update_is_counted_by_generator():
    from cluster.trainer import failed_updates

    class ActorDied(Exception):   # what ray.get raises for a dead generator's ref
        pass

    class TaskRaised(Exception):  # ... and for one whose update_weights raised
        pass

    results = {"r0": 1.5, "r1": ActorDied("dead"), "r2": TaskRaised("NotInGroupError"),
               "r3": 0.5}

    def get(ref):
        if isinstance(results[ref], Exception):
            raise results[ref]
        return results[ref]

    refs = ["r0", "r1", "r2", "r3", "r4"]  # r4 never answered: still pending after the wait
    assert failed_updates(refs, ["r3", "r1", "r0", "r2"], get) == {
        1: "ActorDied", 2: "TaskRaised", 4: "timeout"}
    assert failed_updates([], [], get) == {}
