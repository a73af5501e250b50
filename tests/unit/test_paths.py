"""Run outputs land in an absolute, durable directory (not Ray's temporary working dir)."""
from pathlib import Path

import pytest

from cluster.config.schema import build_config, load_config
from cluster.config.paths import RAY_JOB_ENV, RunDirError, output_root

ROOT = Path(__file__).resolve().parents[2]


def test_relative_output_dir_resolves_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("V05_OUTPUT_ROOT", raising=False)
    monkeypatch.delenv(RAY_JOB_ENV, raising=False)
    assert output_root("runs", cwd=tmp_path) == tmp_path / "runs"
    assert output_root(str(tmp_path / "abs")) == tmp_path / "abs"


def test_inside_a_ray_job_working_dir_it_goes_home_not_to_rays_temp_copy(tmp_path, monkeypatch):
    monkeypatch.delenv("V05_OUTPUT_ROOT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    job_cwd = tmp_path / "session" / "runtime_resources" / "working_dir_files" / "_ray_pkg_x"
    assert output_root("runs", cwd=job_cwd) == tmp_path / "home" / "v05rl-runs" / "runs"
    monkeypatch.setenv(RAY_JOB_ENV, "{}")
    assert output_root("runs", cwd=tmp_path) == tmp_path / "home" / "v05rl-runs" / "runs"


def test_env_root_wins_for_relative_dirs_and_run_dir_is_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("V05_OUTPUT_ROOT", str(tmp_path / "shared"))
    cfg = build_config({"run": {"name": "r1"}})
    assert cfg.run_dir == tmp_path / "shared" / "runs" / "r1" and cfg.run_dir.is_absolute()
    assert Path(output_root("/data/x")) == Path("/data/x")


def test_a_fresh_run_removes_every_output_of_the_previous_one(tmp_path):
    from cluster.run.directory import LOGS, RUN_OUTPUTS, fresh_run_dir

    run = tmp_path / "r1"
    for name in RUN_OUTPUTS:
        if "." in name:
            (run / name).parent.mkdir(parents=True, exist_ok=True)
            (run / name).write_text("old")
        else:
            (run / name / "step40").mkdir(parents=True)
    (run / ".metrics.jsonl.tmp").write_text("half")
    (run / LOGS).mkdir()
    (run / LOGS / "generator-0.log").write_text("old run's log\n")
    (run / "notes.txt").write_text("the user's")  # not a run output: left alone
    removed = fresh_run_dir(run, logs=False)  # the trainer's call: roles may outlive a run
    assert set(removed) == set(RUN_OUTPUTS) | {".metrics.jsonl.tmp"}
    assert sorted(p.name for p in run.iterdir()) == [LOGS, "notes.txt"]
    assert fresh_run_dir(run) == [LOGS]  # the launcher's, before the roles start
    assert [p.name for p in run.iterdir()] == ["notes.txt"]
    assert fresh_run_dir(run) == [] and fresh_run_dir(tmp_path / "none") == []


def test_a_run_directory_that_links_out_of_the_output_folder_is_refused(tmp_path):
    """run.name names a link (or a folder under a link) to somewhere else: refused before
    anything is written or deleted, even with run.overwrite=true, and the target is intact."""
    from cluster import launch

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "summary.json").write_text("{}")  # someone's file: must survive
    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(elsewhere)
    for name in ("link", "link/inner"):
        cfg = load_config(ROOT / "v05.yaml", [f"run.output_dir={out}", f"run.name={name}"])
        with pytest.raises(RunDirError, match=r"leads to .*elsewhere.*, outside run\.output_dir"):
            cfg.run_dir
    rc = launch.main([str(ROOT / "v05.yaml"), f"run.output_dir={out}", "run.name=link",
                      "run.overwrite=true", "--dry-run"])
    assert rc == 2 and (elsewhere / "summary.json").read_text() == "{}"
    # an ordinary nested name is fine
    cfg = load_config(ROOT / "v05.yaml", [f"run.output_dir={out}", "run.name=exp1/seed0"])
    assert cfg.run_dir == out / "exp1" / "seed0"
