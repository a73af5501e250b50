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


# Everything a run writes into its directory (docs/pipeline.md, "Run outputs"). ``logs/`` is
# apart: the roles write it, and they may outlive one run (benchmarks run many on one set).
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "prompts.jsonl", "dropped.jsonl",
               "rollouts.msgpack", "inflight_at_end.json", "summary.json", "report.html",
               "checkpoints", "final", "snapshots", "tb")
LOGS = "logs"
REPLACED = ("run directory had a previous run's outputs: replaced (use run.resume=true to "
            "continue it)")


def fresh_run_dir(run_dir: Path, logs: bool = True) -> list[str]:
    """Remove what a previous run wrote into ``run_dir`` (``RUN_OUTPUTS``, their temporary
    files, and ``logs/`` when ``logs``), so that a fresh run (``run.resume=false``) starts
    from an empty directory: none of its outputs, checkpoints or logs mixes with an older
    run's. Anything else in the directory is left alone. Called before this run writes
    anything: by the launcher before the roles start (they open ``logs/``), and by the
    trainer, without ``logs``, for roles that outlive a run. Returns the names removed."""
    import shutil

    run_dir = Path(run_dir)
    removed = []
    for name in RUN_OUTPUTS + ((LOGS,) if logs else ()):
        for p in (run_dir / name, run_dir / f".{name}.tmp"):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            else:
                continue
            removed.append(p.name)
    return removed
