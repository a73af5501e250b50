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
from dataclasses import dataclass
from pathlib import Path

from cluster.checkpoints import Checkpoints, resumable

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
               "checkpoints", "final", "snapshots", "tb", "wandb")
LOGS = "logs"
# A previous run's results: what only ``run.overwrite=true`` deletes (a config is rewritten by
# every launch, it is not a result).
RESULTS = tuple(n for n in RUN_OUTPUTS if n != "config.yaml")
AGAIN = "run.overwrite=true deletes it and starts over; or choose another run.name"


class RunDirError(ValueError):
    """A launch that would lose a previous run's results (exit 2, before any actor)."""


@dataclass(frozen=True)
class Start:
    """How a run starts in its directory (``plan_start``): ``action`` is "fresh" (nothing of
    a previous run there), "overwrite" (``found`` deleted first), "resume" (from checkpoint
    ``tag``) or "done" (``tag`` is at ``run.max_steps`` already: nothing to train)."""

    action: str
    run_dir: Path
    found: tuple[str, ...] = ()
    tag: str | None = None

    @property
    def step(self) -> int:
        return int(self.tag[4:]) if self.tag else 0

    def line(self) -> str:
        """The one line the launcher prints about it ('' for a fresh start)."""
        return {
            "fresh": "",
            "overwrite": f"run.overwrite=true: deleted the previous run in {self.run_dir} "
                         f"({', '.join(self.found)})",
            "resume": f"resuming {self.run_dir} from its checkpoint {self.tag} (step "
                      f"{self.step}); run.overwrite=true would delete it and start over",
            "done": f"{self.run_dir} holds a finished run (checkpoint {self.tag}, at "
                    f"run.max_steps or past it): nothing to train; run.max_steps above "
                    f"{self.step} continues it, {AGAIN}",
        }[self.action]


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


def previous_results(run_dir: Path) -> tuple[str, ...]:
    """The ``RESULTS`` a previous run left in ``run_dir``."""
    return tuple(n for n in RESULTS if (Path(run_dir) / n).exists())


def plan_start(run_dir: Path, resume: bool | str = "auto", overwrite: bool = False,
               max_steps: int | None = None) -> Start:
    """How a launch into ``run_dir`` starts; decided from the directory alone, before any
    actor starts. Only ``overwrite`` deletes. ``resume``: "auto" continues the newest whole
    checkpoint when there is one (a rerun of the command, a requeued job), starts fresh in an
    empty directory and refuses (``RunDirError``) where a previous run left results but no
    whole checkpoint; True continues or fails (``cluster.checkpoints.resumable``'s
    FileNotFoundError); False starts fresh and refuses where a previous run left results.
    A checkpoint at ``max_steps`` or later is "done"."""
    run_dir = Path(run_dir)
    found = previous_results(run_dir)
    if overwrite:
        if resume is True:
            raise RunDirError("run.resume=true and run.overwrite=true contradict each other: "
                              "continue the run or delete it, not both")
        return Start("overwrite" if found else "fresh", run_dir, found)
    tags = resumable(run_dir).tags() if resume is True else Checkpoints(run_dir / "checkpoints").tags()
    if tags and resume is not False:
        done = max_steps is not None and int(tags[0][4:]) >= max_steps
        return Start("done" if done else "resume", run_dir, found, tags[0])
    if not found:
        return Start("fresh", run_dir)
    what = ", ".join(found) + (f", checkpoint {tags[0]}" if tags else "")
    if resume is False:
        raise RunDirError(f"run.resume=false but {run_dir} holds a previous run ({what}): "
                          f"run.resume=true continues it, {AGAIN}")
    raise RunDirError(f"{run_dir} holds a previous run's results ({what}) but no whole "
                      f"checkpoint to continue (run.resume=true needs one): {AGAIN}")


def fresh_run_dir(run_dir: Path, logs: bool = True) -> list[str]:
    """Remove what a previous run wrote into ``run_dir`` (``RUN_OUTPUTS``, their temporary
    files, and ``logs/`` when ``logs``), so that a fresh run starts from an empty directory:
    none of its outputs, checkpoints or logs mixes with an older run's. Anything else in the
    directory is left alone. Called only where ``plan_start`` said "fresh" (nothing but logs
    and temporary files to remove) or "overwrite" (``run.overwrite=true``), before this run
    writes anything: by the launcher before the roles start (they open ``logs/``), and by the
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
