"""Run outputs land in an absolute, durable directory (not Ray's temporary working dir)."""
from pathlib import Path

from cluster.config import build_config
from cluster.paths import RAY_JOB_ENV, output_root


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
