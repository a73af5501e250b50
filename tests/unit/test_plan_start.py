"""Never lose a run: how a launch starts in its run directory (``cluster.run.directory.plan_start``),
decided from the directory alone, and that only ``run.overwrite=true`` deletes. Two real
launches of one name:
tests/integration/test_pipeline.py::test_two_launches_of_one_name_never_lose_the_first_run."""
import pytest

from cluster.records.checkpoints import RUN_STATE, write_digests
from cluster.config.paths import RunDirError
from cluster.run.directory import RESULTS, fresh_run_dir, plan_start


def finished_run(run, steps=(2, 4), final=True):
    """What a run leaves: whole checkpoints (``step<N>/run_state.msgpack``, their signed
    ``digests.json``), final/, files."""
    for s in steps:
        (run / "checkpoints" / f"step{s}").mkdir(parents=True)
        (run / "checkpoints" / f"step{s}" / RUN_STATE).write_bytes(b"\x80")
        write_digests(run / "checkpoints" / f"step{s}")
    if final:
        (run / "final").mkdir(parents=True)
        (run / "final" / "model.safetensors").write_bytes(b"weights")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "config.yaml").write_text("run: {}\n")
    return run


def snapshot(run):
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_an_absent_or_empty_directory_starts_fresh(tmp_path):
    for resume in ("auto", False):
        assert plan_start(tmp_path / "none", resume).action == "fresh"
        (tmp_path / "empty" / "logs").mkdir(parents=True, exist_ok=True)  # logs: not a result
        (tmp_path / "empty" / "config.yaml").write_text("a: 1\n")  # nor a config
        st = plan_start(tmp_path / "empty", resume, max_steps=3)
        assert st.action == "fresh" and st.line() == ""


def test_auto_resumes_the_newest_whole_checkpoint_and_says_how_to_start_over(tmp_path):
    run = finished_run(tmp_path / "r")
    (run / "checkpoints" / "step6").mkdir()  # no run state: an interrupted save, not whole
    st = plan_start(run, "auto", max_steps=10)
    assert (st.action, st.tag, st.step) == ("resume", "step4", 4)
    assert "step 4" in st.line() and "run.overwrite=true" in st.line()
    assert plan_start(run, True, max_steps=10).tag == "step4"  # the explicit resume agrees


def test_the_start_carries_the_run_s_checkpoints_whatever_it_decided(tmp_path):
    """The run resumes from and saves to the store its start was decided on, keeping what
    run.keep_checkpoints says: nothing later looks for the checkpoints again."""
    run = finished_run(tmp_path / "r")
    for resume, overwrite, action in [("auto", False, "resume"), (True, False, "resume"),
                                      (False, True, "overwrite")]:
        st = plan_start(run, resume, overwrite, max_steps=10, keep=3)
        assert st.action == action
        assert st.checkpoints.root == run / "checkpoints" and st.checkpoints.keep == 3
    assert plan_start(run, "auto", max_steps=10, keep=3).checkpoints.tags() == ["step4", "step2"]
    fresh = plan_start(tmp_path / "new", "auto", keep=5)
    assert fresh.action == "fresh" and fresh.checkpoints.keep == 5


def test_a_checkpoint_at_max_steps_is_a_finished_run_with_nothing_to_do(tmp_path):
    run = finished_run(tmp_path / "r")
    for resume in ("auto", True):
        st = plan_start(run, resume, max_steps=4)
        assert st.action == "done", resume
        assert "run.max_steps above 4" in st.line() and "run.overwrite=true" in st.line()
    assert plan_start(run, "auto", max_steps=5).action == "resume"


def test_results_without_a_whole_checkpoint_are_refused_naming_both_ways_out(tmp_path):
    run = finished_run(tmp_path / "r", steps=())
    (run / "checkpoints" / ".staging").mkdir(parents=True)  # a crash in the first save
    before = snapshot(run)
    with pytest.raises(RunDirError) as err:
        plan_start(run, "auto", max_steps=3)
    line = str(err.value)
    assert "\n" not in line and "run.resume=true" in line and "run.overwrite=true" in line
    assert "final" in line and "metrics.jsonl" in line
    with pytest.raises(FileNotFoundError, match="only an interrupted save"):
        plan_start(run, True)
    assert snapshot(run) == before  # deciding touches nothing


def test_resume_false_refuses_a_previous_run_even_a_whole_one(tmp_path):
    run = finished_run(tmp_path / "r")
    with pytest.raises(RunDirError, match=r"run.resume=false but .* checkpoint step4\): "
                                          r"run.resume=true continues it, run.overwrite=true"):
        plan_start(run, False, max_steps=10)
    for name in RESULTS:  # any one result of a previous run is enough to refuse
        one = tmp_path / name / "r"
        (one / name).mkdir(parents=True)
        with pytest.raises(RunDirError):
            plan_start(one, False)


def test_only_overwrite_deletes_and_it_contradicts_an_explicit_resume(tmp_path):
    run = finished_run(tmp_path / "r")
    st = plan_start(run, "auto", overwrite=True, max_steps=4)
    assert st.action == "overwrite" and {"checkpoints", "final", "metrics.jsonl"} <= set(st.found)
    assert "run.overwrite=true: deleted" in st.line()
    assert plan_start(run, False, overwrite=True).action == "overwrite"
    with pytest.raises(RunDirError, match="contradict"):
        plan_start(run, True, overwrite=True)
    assert (run / "final" / "model.safetensors").is_file()  # the plan deletes nothing itself
    fresh_run_dir(run)  # what the launcher does with "overwrite"
    assert plan_start(run, False).action == "fresh"
    assert plan_start(tmp_path / "none", "auto", overwrite=True).action == "fresh"
