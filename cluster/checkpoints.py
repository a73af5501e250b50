"""Lossless, atomic checkpoints: a checkpoint is whole or absent.

``<run>/checkpoints/step<N>/`` holds the learner's DeepSpeed state (every rank's shard, with
the trainer's counters as client state) and ``run_state.msgpack``: the coordinator's every
admitted, untrained prompt (estimator state, finished rollouts) and the sampler position.
It is written under ``.staging/`` and renamed into place only when every part is on disk;
``latest`` (the tag of the newest whole checkpoint) is replaced atomically last. A crash at
any point leaves the previous checkpoint as ``latest``. On resume a checkpoint that fails to
load (truncated, corrupt) is skipped for the previous one, and counted.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from common.atomic import write_atomic

RUN_STATE = "run_state.msgpack"


class CheckpointError(RuntimeError):
    pass


def resumable(run_dir: Path, keep: int = 2) -> "Checkpoints":
    """The checkpoints ``run.resume=true`` continues from, or FileNotFoundError saying where
    none was found. The run directory is absolute (``cluster.paths``): on a cluster, shared
    storage mounted at the same path on the driver's node and on the learner ranks' nodes,
    which wrote the checkpoints."""
    ckpts = Checkpoints(Path(run_dir) / "checkpoints", keep)
    if not ckpts.tags():
        why = ("the run directory does not exist" if not Path(run_dir).is_dir() else
               "no whole checkpoint in it" + (" (only an interrupted save)"
                                              if (ckpts.root / ".staging").is_dir() else ""))
        raise FileNotFoundError(f"run.resume=true but {why}: {ckpts.root} (run.output_dir and "
                                "run.name must name the stopped run's directory)")
    return ckpts


def stale_tags(tags: list[str], saved: int, keep: int) -> list[str]:
    """The checkpoints to remove once ``step<saved>`` is written: those of later steps (left
    by a run that was resumed from an older checkpoint: not this run's past, and a resume
    must never fall back to them) and all but the ``keep`` newest of the others. The one just
    saved is always kept: pruning by step number alone would remove it next to a later one."""
    steps = {t: int(t[4:]) for t in tags}
    past = sorted((t for t in tags if steps[t] <= saved), key=steps.get, reverse=True)
    return [t for t in tags if steps[t] > saved] + past[keep:]


class Checkpoints:
    def __init__(self, root: Path, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root, self.keep = Path(root), keep

    def tags(self) -> list[str]:
        """Whole checkpoints, newest first (the ``.staging`` of an interrupted save is not)."""
        if not self.root.is_dir():
            return []
        tags = [p.name for p in self.root.iterdir()
                if p.is_dir() and p.name.startswith("step") and p.name[4:].isdigit()
                and (p / RUN_STATE).is_file()]
        return sorted(tags, key=lambda t: int(t[4:]), reverse=True)

    def latest(self) -> str | None:
        f = self.root / "latest"
        return f.read_text().strip() if f.is_file() else None

    def save(self, step: int, learner, coordinator, client_state: dict) -> Path:
        """Learner shards, then the coordinator's prompts, then the rename, then ``latest``."""
        import ray

        staging = self.root / ".staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        learner.save_checkpoint(str(staging), client_state)  # -> staging/step<N>/ (all ranks)
        (tag_dir,) = [p for p in staging.iterdir() if p.is_dir()]
        ray.get(coordinator.snapshot_to.remote(str(tag_dir / RUN_STATE)))
        return self.commit(tag_dir, step)

    def commit(self, tag_dir: Path, step: int) -> Path:
        """A checkpoint written whole under ``.staging/`` goes into place as ``step<N>``,
        ``latest`` names it, and older ones are pruned (``stale_tags``)."""
        final = self.root / f"step{step}"
        shutil.rmtree(final, ignore_errors=True)  # a re-save of this step after a resume
        os.replace(tag_dir, final)
        write_atomic(self.root / "latest", final.name)
        shutil.rmtree(self.root / ".staging", ignore_errors=True)
        for old in stale_tags(self.tags(), step, self.keep):
            shutil.rmtree(self.root / old, ignore_errors=True)
        return final

    def load(self, learner) -> tuple[str, dict, Path, list[str]]:
        """Restore the newest checkpoint that loads into ``learner``. Returns (tag, the
        trainer's client state, the coordinator's run-state file, tags skipped as corrupt)."""
        import msgpack

        candidates = self.tags()
        latest = self.latest()
        if latest in candidates:  # the pointer first; older whole ones as fallbacks
            candidates.remove(latest)
            candidates.insert(0, latest)
        skipped = []
        for tag in candidates:
            state_file = self.root / tag / RUN_STATE
            try:
                with open(state_file, "rb") as f:
                    msgpack.unpackb(f.read(), raw=False, strict_map_key=False)
                client = learner.load_checkpoint(str(self.root), tag)
            except Exception as err:  # noqa: BLE001 - a broken checkpoint: try an older one
                skipped.append(f"{tag}: {type(err).__name__}: {str(err)[:200]}")
                continue
            return tag, client, state_file, skipped
        raise CheckpointError(f"no loadable checkpoint under {self.root}"
                              + (f" (skipped: {'; '.join(skipped)})" if skipped else ""))
