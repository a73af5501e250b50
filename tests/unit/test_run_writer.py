"""Run outputs: metrics.jsonl lines parse (NaN -> null), the progress line, TensorBoard scalars."""
import json

from cluster.records.files import RunFiles, progress_line, read_lines
from cluster.records.step import HeldOut, StepMetrics
from cluster.records.summary import RunSummary, Totals


def test_metrics_lines_progress_and_tensorboard(tmp_path, capsys):
    w = RunFiles(tmp_path / "run", "a: 1\n", tensorboard=True)
    w.step(StepMetrics(step=1, policy_version=1, reward_mean=0.25, k_mean=4.5,
                       generator_busy_fraction=0.9, step_time_s=1.0, loss=float("nan"),
                       held_out=HeldOut(accuracy=0.5, accuracy_se=0.1)))
    w.summary(RunSummary(1, 1, Totals()))
    (row,) = read_lines(tmp_path / "run" / "metrics.jsonl")
    assert {k: v for k, v in row.items() if v is not None} == {
        "step": 1, "policy_version": 1, "reward_mean": 0.25, "k_mean": 4.5,
        "generator_busy_fraction": 0.9, "step_time_s": 1.0, "eval_accuracy": 0.5,
        "eval_accuracy_se": 0.1, "eval_sampled_by_difficulty": {},
        "eval_greedy_by_difficulty": {}, "eval_score_timeouts": 0, "eval_score_errors": 0,
        "eval_prompts": 0, "eval_samples": 0, "eval_failed_requests": 0,
        "eval_generators_lost": [], "eval_duration_s": 0.0}
    assert "loss" in row and row["loss"] is None  # NaN -> null
    err = capsys.readouterr().err
    assert "step    1" in err and "acc 0.500" in err and "k  4.5" in err and "busy  90%" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["steps"], summary["status"], summary["run_file_failures"]) == (1, "finished", 0)
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_resume_drops_lines_written_after_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    w = RunFiles(run, "a: 1\n", progress=False)
    for step in (1, 2, 3, 4):
        w.step(StepMetrics(step=step, policy_version=step))
    (run / "prompts.jsonl").write_text("".join(json.dumps({"uid": f"p{i}", "step": i}) + "\n"
                                               for i in (1, 2, 3, 4)))
    # The crashed run had written steps 3 and 4 after its checkpoint at step 2.
    RunFiles(run, "a: 1\n", resume_step=2, progress=False)
    assert [r["step"] for r in read_lines(run / "metrics.jsonl")] == [1, 2]
    assert [json.loads(x)["uid"] for x in (run / "prompts.jsonl").read_text().splitlines()] == \
        ["p1", "p2"]
    RunFiles(run, "a: 1\n", progress=False)  # a fresh run replaces both
    assert not (run / "metrics.jsonl").exists() and not (run / "prompts.jsonl").exists()


def test_resume_drops_rollouts_recorded_after_the_checkpoint(tmp_path):
    from common.types import TrainSample
    from learner.replay import RolloutRecorder, keep_records, read_records

    path = tmp_path / "run" / "rollouts.msgpack"
    sample = TrainSample(prompt_token_ids=[1], token_ids=[2], logprobs=[-0.5], advantage=0.0,
                         version=0)
    with RolloutRecorder(path) as rec:
        rec.append("old", "p", [1.0], 0.0, 0, [sample])  # a file without steps: kept
        for step in (1, 2, 3, 4):
            rec.append(f"p{step}", "p", [1.0], 0.0, step, [sample], step=step)
    with open(path, "ab") as f:
        f.write(b"\x87\xa9prompt")  # a record cut short by the crash
    assert keep_records(path, 2) == 2
    assert [r["prompt_id"] for r in read_records(path)] == ["old", "p1", "p2"]
    assert keep_records(tmp_path / "missing.msgpack", 2) == 0


def test_a_step_with_no_drops_still_leaves_an_empty_dropped_file(tmp_path):
    """dropped.jsonl is a promised run output (the README, test_job_submit): a run that
    dropped nothing leaves it empty, not absent."""
    w = RunFiles(tmp_path / "run", "a: 1\n", progress=False)
    w.dropped([], step=1)
    assert (tmp_path / "run" / "dropped.jsonl").read_text() == ""
    w.dropped([("p1", "learner_nan_skip")], step=2)
    assert [json.loads(x)["uid"] for x in
            (tmp_path / "run" / "dropped.jsonl").read_text().splitlines()] == ["p1"]


def test_the_progress_line_prints_a_zero_reward_as_zero():
    """A step whose mean reward is exactly 0 (as many right as wrong) printed `reward +nan`:
    0.0 is a reward, not a missing one. A missing one still prints nan."""
    line = progress_line(StepMetrics(step=5, policy_version=5, reward_mean=0.0, k_mean=4.0), 12.0)
    assert "reward +0.000" in line, line
    assert "reward +nan" in progress_line(StepMetrics(step=6, policy_version=6, k_mean=4.0), 13.0)


def test_a_name_the_learners_result_and_the_step_record_share_means_one_fact():
    """Where StepResult and StepMetrics hold a field of the same name, it is the learner's
    figure carried under that name: no name means the learner's count in one record and the
    trainer's in the other (``step`` and ``step_time_s`` did, until the learner's became
    ``updates_applied`` and ``learner_step_s``)."""
    from dataclasses import fields

    from cluster.records.metrics import LEARNER_FIELDS
    from cluster.records.step import StepMetrics
    from common.records import StepResult

    shared = {f.name for f in fields(StepResult)} & {f.name for f in fields(StepMetrics)}
    assert shared and {n: LEARNER_FIELDS[n] for n in shared} == {n: n for n in shared}


def test_every_field_of_the_learners_result_reaches_the_step_record_and_its_line(tmp_path):
    """Each StepResult field, given a distinct value by the learner, reaches metrics.jsonl
    under the name LEARNER_FIELDS gives it (the corrections the 32-GPU config turns on: kl,
    is_weight, truncated_fraction, dual_clip_fraction, and micro_batches, the token and sample
    counts, ...). A field added to StepResult and carried nowhere fails here."""
    from dataclasses import fields

    from cluster.records.metrics import (LEARNER_FIELDS, GeneratorActivity, StepTimes, Tally,
                                         step_metrics)
    from cluster.records.step import StepMetrics
    from common.records import StepResult
    from common.types import TrainBatch

    names = [f.name for f in fields(StepResult)]
    assert sorted(LEARNER_FIELDS) == sorted(names)
    assert set(LEARNER_FIELDS.values()) <= {f.name for f in fields(StepMetrics)}
    values = {}
    for i, f in enumerate(fields(StepResult)):
        values[f.name] = (f"reason-{i}" if f.type in ("str", str) else
                          (i % 2 == 0) if f.type in ("bool", bool) else
                          i + 1 if f.type in ("int", int) else i + 0.25)
    result = StepResult(**values)
    batch = TrainBatch(records=[], samples=[], version=0, inflight_prompts=0)
    m = step_metrics(1, 1, batch, result, StepTimes(0.0, 1.0, 2.0, 3.0, 4.0),
                     GeneratorActivity(), 4, (-1.0, 1.0), Tally(), None)
    line = m.to_json()
    for theirs, ours in LEARNER_FIELDS.items():
        assert line[ours] == values[theirs], (theirs, ours)
