"""When a run stops and when it evaluates (cluster.run.trainer.last_and_eval_due), and the
summary's held-out figures (both metrics, both ends) and the launcher's accuracy lines."""
from __future__ import annotations

import pytest

from cluster.config.schema import RunConfig
from cluster.launch import accuracy_lines
from cluster.records.summary import RunSummary
from cluster.records.metrics import pair_auc
from cluster.run.trainer import last_and_eval_due


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


def test_a_rollout_budget_ends_the_run_and_rollouts_space_the_evaluations():
    run = RunConfig(max_steps=100000, max_rollouts=3072, eval_every=0, eval_every_rollouts=512)
    assert run.evaluates
    assert last_and_eval_due(run, 7, 1.0, 0.0, 448, 0) == (False, False)
    assert last_and_eval_due(run, 8, 1.0, 0.0, 520, 0) == (False, True)   # 512 since the last
    assert last_and_eval_due(run, 9, 1.0, 0.0, 900, 520) == (False, False)
    assert last_and_eval_due(run, 30, 1.0, 0.0, 3100, 2900) == (True, True)  # spent: the last
    assert not RunConfig(eval_every=0).evaluates


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
    head, other = accuracy_lines(RunSummary.from_json(s))
    assert head == ("held-out sampled accuracy (the headline), 500 prompts: 0.570 +- 0.014 -> "
                    "0.920 +- 0.007 (+50.0 SE)")
    assert other.startswith("held-out greedy accuracy, 500 prompts: 0.998 +- 0.002 -> 0.996")
    assert accuracy_lines(RunSummary.from_json({"eval_metric": "greedy"})) == []


def test_pair_auc_counts_ordered_pairs_and_ties():
    assert pair_auc([0.1, 0.5, 0.9], [0.0, 0.5, 1.0]) == 1.0
    assert pair_auc([0.9, 0.5, 0.1], [0.0, 0.5, 1.0]) == 0.0
    assert pair_auc([0.5, 0.5], [0.0, 1.0]) == 0.5
    assert pair_auc([0.2, 0.3], [1.0, 1.0]) != pair_auc([0.2, 0.3], [1.0, 1.0])  # NaN: no pair


def test_every_kind_of_failed_weight_update_is_counted_by_generator():
    from cluster.nodes.waits import failed_updates

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


def test_training_time_is_cumulative_over_resumes_and_excludes_evaluations():
    from cluster.records.metrics import Tally, rates

    tally = Tally({"train_s": 100.0, "prompts_trained": 300, "rollouts": 1200,
                   "tokens_generated": 24000}, now=5000.0)  # restored; this process starts
    assert tally.tick(5010.0) == 110.0  # a step
    tally.skip(5040.0)                  # then a 30 s evaluation
    assert tally.tick(5050.0) == 120.0 and tally.totals.train_s == 120.0
    assert rates(tally.totals) == {"prompts_per_s": 2.5, "rollouts_per_s": 10.0,
                                   "tokens_per_s": 200.0}
    assert Tally(now=0.0).totals.train_s == 0.0  # a fresh run


def test_the_summary_rates_a_resumed_run_over_its_whole_training_time():
    """A run resumed at 100 s of training, 60 s more here (50 s of it training, 10 s an
    evaluation); the cumulative totals are divided by the cumulative training time, not by
    this process's wall-clock minus the run's whole evaluation time."""
    from cluster.config.schema import build_config
    from cluster.records.metrics import run_summary
    from cluster.records.summary import Totals
    from common.records import Accounting, SchedulerCounts

    totals = Totals(prompts_trained=300, prompts_skipped_nan=0, rollouts=1500,
                    tokens_generated=30000, learner_wait_s=15.0, eval_time_s=70.0, train_s=150.0)
    acct = Accounting(scheduler=SchedulerCounts(prompts_admitted=320))
    s = run_summary(build_config({}), acct, totals, 30, 30, 60.0, None, None, {})
    assert s.train_wall_time_s == 150.0 and s.wall_time_s == 60.0
    assert s.prompts_per_s == 2.0 and s.rollouts_per_s == 10.0
    assert s.learner_idle_fraction == 0.1
    written = s.to_json()
    assert written["prompts_admitted"] == 320 and "inflight_uids" not in written  # uids: files


def test_the_scorers_counts_are_summary_jsons_scoring_object_and_read_back():
    """``Accounting.scoring`` is a ``ScoringCounts``; summary.json's ``scoring`` an object of
    its counters' names, as the Counter it replaced wrote them (that one left out a zero: an
    older summary.json reads back as well)."""
    import json

    from cluster.records.summary import RunSummary, Totals
    from common.records import Accounting, ScoringCounts

    acct = Accounting(scoring=ScoringCounts(scored=466, faults_injected=66, score_error=66))
    written = json.loads(json.dumps(RunSummary(1, 1, Totals(), accounting=acct).to_json()))
    assert written["scoring"] == {"scored": 466, "faults_injected": 66, "overlong_shaped": 0,
                                  "score_error": 66, "score_timeout": 0}
    assert RunSummary.from_json(written).accounting.scoring == acct.scoring
    older = {"prompts_admitted": 3, "scoring": {"scored": 339, "score_timeout": 19}}
    assert RunSummary.from_json(older).accounting.scoring == ScoringCounts(scored=339,
                                                                           score_timeout=19)


def test_the_last_step_is_checkpointed_once_by_the_end_of_the_run():
    from cluster.run.trainer import checkpoint_due

    run = RunConfig(max_steps=10, checkpoint_every=5)
    assert [s for s in range(1, 11) if checkpoint_due(run, s, last=s == 10)] == [5]
    assert not checkpoint_due(RunConfig(checkpoint_every=0), 5, last=False)


def _with_prior(prior_p: float, rewards: list[float]):
    from common.types import PromptRecord

    k = len(rewards)
    return PromptRecord(
        prompt_id="p", uid="s0", prompt="1+1=", k=k, rewards=rewards, baseline=0.0,
        prior_p=prior_p, prior_accepted=False, fallback=False, unparsed=0, admitted_version=0,
        deadline=0, versions=[0], generators=[0], rounds=1, cancelled_rollouts=0,
        cancelled_tokens=0, regenerations=0, tokens=k, lengths=[1] * k, prompt_tokens=1,
        t_admit=0.0, t_done=0.0, spans=[])


def test_the_priors_error_uses_the_tasks_reward_range_not_the_batchs():
    """A batch where every prompt succeeded (no r_lo in it) and one whose rewards were
    shaped below r_lo (overlong): observed rates are the task-range rates the prior learns
    from, 1.0 and 0.0, not the batch's own min-max rescaling."""
    from cluster.records.metrics import batch_metrics

    wins = [_with_prior(0.9, [1.0, 1.0]), _with_prior(0.7, [1.0, 1.0])]
    m = batch_metrics(wins, 2, (-1.0, 1.0))
    assert m["prior_abs_error"] == pytest.approx(0.2) and m["prior_prompts"] == 2
    shaped = [_with_prior(0.1, [-1.5, -1.0]), _with_prior(0.8, [1.0, 1.0])]
    m = batch_metrics(shaped, 2, (-1.0, 1.0))
    assert m["prior_abs_error"] == pytest.approx(0.15) and m["prior_auc"] == 1.0
    m = batch_metrics([_with_prior(0.5, [0.0, 1.0])], 2, (0.0, 1.0))  # a {0, 1} task
    assert m["prior_abs_error"] == pytest.approx(0.0)
