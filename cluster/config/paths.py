"""Where a run's outputs go: an absolute, durable directory the user can find.

A relative ``run.output_dir`` resolves against ``$V05_OUTPUT_ROOT`` when set; else against the
current directory, except inside a Ray job (``ray job submit --working-dir``), whose current
directory is Ray's temporary copy of the working directory, deleted with Ray's session
files: there it resolves against ``~/v05rl-runs`` (on a multi-node cluster, give an absolute
``run.output_dir`` on shared storage). The launcher prints the resolved run directory when it
starts and when it ends, so ``ray job logs`` shows it.
"""
from __future__ import annotations

import os
from pathlib import Path


RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for a job's driver
JOB_DEFAULT_ROOT = Path("~/v05rl-runs")


def in_ray_job_working_dir(cwd: Path | None = None) -> bool:
    cwd = Path.cwd() if cwd is None else cwd
    return bool(os.environ.get(RAY_JOB_ENV)) or "working_dir_files" in cwd.parts


def output_root(output_dir: str, cwd: Path | None = None) -> Path:
    """The absolute directory that holds ``<run.name>/`` (see the module docstring)."""
    p = Path(output_dir).expanduser()
    if p.is_absolute():
        return p
    if os.environ.get("V05_OUTPUT_ROOT"):
        return (Path(os.environ["V05_OUTPUT_ROOT"]).expanduser() / p).resolve()
    if in_ray_job_working_dir(cwd):
        return (JOB_DEFAULT_ROOT.expanduser() / p).resolve()
    return ((Path.cwd() if cwd is None else cwd) / p).resolve()


class RunDirError(ValueError):
    """A launch that would lose a previous run's results (exit 2, before any actor)."""


def inside(run_dir: Path, root: Path) -> Path:
    """``run_dir`` when, its links followed, it is a folder under ``root`` (followed too);
    else RunDirError naming both. A run directory that is a link out of the output folder
    (or lies under one) would have the run write there, and ``run.overwrite`` delete there."""
    real, real_root = Path(run_dir).resolve(), Path(root).resolve()
    if real_root not in real.parents:
        raise RunDirError(f"the run directory {run_dir} leads to {real}, outside "
                          f"run.output_dir ({real_root}): a link out of the output folder "
                          "is refused before anything is written or deleted")
    return Path(run_dir)
