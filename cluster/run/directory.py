"""How a run starts in its directory (``plan_start``: fresh, overwrite, resume or done),
decided once, before any actor starts, from the directory alone; what a run writes there
(``RUN_OUTPUTS``) and what a fresh start clears (``fresh_run_dir``). Where the directory is:
``cluster.config.paths``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster.config.paths import RunDirError, check_links
from cluster.records.checkpoints import Checkpoints, resumable

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


@dataclass(frozen=True)
class Start:
    """How a run starts in its directory (``plan_start``): ``action`` is "fresh" (nothing of
    a previous run there), "overwrite" (``found`` deleted first), "resume" (from checkpoint
    ``tag``) or "done" (``tag`` is at ``run.max_steps`` already: nothing to train).
    ``checkpoints``: the run's checkpoints, the store it resumes from and saves to."""

    action: str
    run_dir: Path
    found: tuple[str, ...] = ()
    tag: str | None = None
    checkpoints: Checkpoints | None = field(default=None, compare=False, repr=False)

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


def plan_start(run_dir: Path, resume: bool | str = "auto", overwrite: bool = False,
               max_steps: int | None = None, keep: int = 2) -> Start:
    """How a launch into ``run_dir`` starts; decided from the directory alone, before any
    actor starts. Only ``overwrite`` deletes. ``resume``: "auto" continues the newest whole
    checkpoint when there is one (a rerun of the command, a requeued job), starts fresh in an
    empty directory and refuses (``RunDirError``) where a previous run left results but no
    whole checkpoint; True continues or fails (``cluster.records.checkpoints.resumable``'s
    FileNotFoundError); False starts fresh and refuses where a previous run left results.
    A checkpoint at ``max_steps`` or later is "done". The checkpoint to resume is the first
    whose files match their signed digests (``Checkpoints.verified``): a damaged one is
    skipped, an altered one refused (``CheckpointAltered``, exit 2). A link among the run's
    outputs that leads out of ``run_dir`` is refused first (``paths.check_links``). The
    ``Start`` carries the run's ``Checkpoints`` (``keep``: how many it keeps)."""
    run_dir = Path(run_dir)
    # Before anything there is read or deleted. W&B's folder holds W&B's own links out (its
    # debug logs, in ~/.cache/wandb): only the folder and the file we write there are ours.
    check_links(run_dir, RUN_OUTPUTS + (LOGS, "wandb/v05-run-id"), shallow=("wandb",))
    found = tuple(n for n in RESULTS if (run_dir / n).exists())  # a previous run's results
    ckpts = Checkpoints(run_dir / "checkpoints", keep)
    if overwrite:
        if resume is True:
            raise RunDirError("run.resume=true and run.overwrite=true contradict each other: "
                              "continue the run or delete it, not both")
        return Start("overwrite" if found else "fresh", run_dir, found, checkpoints=ckpts)
    if resume is True:
        ckpts = resumable(run_dir, keep)  # FileNotFoundError: nothing there to continue
    tags = ckpts.tags()
    if tags and resume is not False:
        if max_steps is not None and int(tags[0][4:]) >= max_steps:
            return Start("done", run_dir, found, tags[0], ckpts)  # nothing of it is loaded
        tag, damaged = ckpts.verified()  # CheckpointAltered: refused, nothing of it read
        if tag is None:
            raise RunDirError(f"no checkpoint of {run_dir} is whole on disk ({'; '.join(damaged)})"
                              f": {AGAIN}")
        return Start("resume", run_dir, found, tag, ckpts)
    if not found:
        return Start("fresh", run_dir, checkpoints=ckpts)
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


def prepare(start: Start, logs: bool = True) -> None:
    """Act on a decided start before anything of the run is written: a fresh or overwritten
    run's directory cleared (``fresh_run_dir``; ``logs``: its ``logs/`` too), and the start's
    line said (none for a fresh start)."""
    import sys

    if start.action in ("fresh", "overwrite"):
        fresh_run_dir(start.run_dir, logs=logs)
    if start.line():
        print(start.line(), file=sys.stderr, flush=True)


def start_on_running_roles(cfg) -> Start:
    """How an in-process run on roles that are already up (benchmarks, tests) starts: as
    the launcher decides it (``plan_start``), a finished run refused (``RunDirError``), the
    directory prepared but for ``logs/``, which those roles keep writing."""
    start = plan_start(cfg.run_dir, cfg.run.resume, cfg.run.overwrite, cfg.run.max_steps,
                       cfg.run.keep_checkpoints)
    if start.action == "done":
        raise RunDirError(start.line())
    prepare(start, logs=False)
    return start
