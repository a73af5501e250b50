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


def links_out(run_dir: Path, names, shallow=()) -> list[str]:
    """The links under ``run_dir/<name>`` (each of ``names``, and what lies under a folder of
    them but those in ``shallow``, links not followed) that lead out of ``run_dir``: a run
    writing through one would write, and append to, a file outside its folder. ``shallow``:
    folders whose insides another program owns (W&B links its own debug logs there)."""
    run_dir = Path(run_dir)
    real_root, out = run_dir.resolve(), []

    def leads_out(p: Path) -> bool:
        return p.is_symlink() and real_root not in p.resolve().parents

    for name in names:
        top = run_dir / name
        if leads_out(top):
            out.append(str(top))
        elif top.is_dir() and name not in shallow:
            for folder, dirs, files in os.walk(top):  # followlinks=False: links are leaves
                out += [str(Path(folder) / n) for n in dirs + files
                        if leads_out(Path(folder) / n)]
    return out


def check_links(run_dir: Path, names, shallow=()) -> None:
    """RunDirError naming the links of ``links_out`` (up to three), if any."""
    bad = links_out(run_dir, names, shallow)
    if bad:
        shown = ", ".join(f"{b} -> {Path(b).resolve()}" for b in bad[:3])
        raise RunDirError(f"{len(bad)} link(s) in the run directory lead out of it ({shown}"
                          f"{', ...' if len(bad) > 3 else ''}): the run would write there; "
                          "remove them (an absolute run.output_dir puts the whole run on "
                          "another disk)")
