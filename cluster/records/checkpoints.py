"""Lossless, atomic checkpoints: a checkpoint is whole or absent.

``<run>/checkpoints/step<N>/`` holds the learner's DeepSpeed state (every rank's shard, with
the trainer's counters as client state) and ``run_state.msgpack``: the coordinator's every
admitted, untrained prompt (estimator state, finished rollouts) and the sampler position.
It is written under ``.staging/`` and renamed into place only when every part is on disk;
``latest`` (the tag of the newest whole checkpoint) is replaced atomically last. A crash at
any point leaves the previous checkpoint as ``latest``. On resume a checkpoint that fails to
load (truncated, corrupt) is skipped for the previous one, and counted.

A save that fails (a full disk, an unwritable directory, an I/O error: ENOSPC, EACCES, EIO,
or a learner rank's torch.save failing) removes what it wrote and raises ``CheckpointWriteError``
naming the checkpoint, the stage, the path, the error and the free space; ``latest`` and the
previous checkpoint are untouched, so the run stops (the launcher's exit status 5) resumable
from it. ``fault_hook`` is where tests inject such a fault at each stage.

No file of a checkpoint can run code when it is read: the coordinator's state is msgpack, and
the learner loads DeepSpeed's files (pickles, which DeepSpeed itself loads with
``torch.load(weights_only=False)``) weights-only, allowing DeepSpeed's three plain-data classes
by name (``learner/state_io.weights_only_load``); a file holding anything else is refused,
naming it (``CheckpointAltered``, exit 2), and nothing of it runs. So a checkpoint needs no
signature to be trusted, and a run directory moves: another node, another account of the
cluster, a copy elsewhere resume it with nothing to do by hand.

Integrity is checked before anything is read: the save records the SHA-256 and length of
every file in ``digests.json`` before the checkpoint is renamed into place, and a resume
checks every file against it first (``check_digests``): a file missing or cut short (a torn
write, a full disk) makes the checkpoint *damaged*, skipped for the previous one as a corrupt
checkpoint always was; any other difference (another content at its recorded length or
longer, a file the record does not list, no record) makes it *altered*: ``CheckpointAltered``
names the file, and the launcher refuses the run (exit 2). Before 2026-12-06 the record was
signed with a per-account key (so a moved run needed ``trust``); a signature in an older
record is ignored.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common.atomic import write_atomic

RUN_STATE = "run_state.msgpack"
DIGESTS = "digests.json"  # {"sha256": {relative path: [hex digest, bytes]}}


CHECKPOINT_FAILED = 5  # the launcher's exit status when a checkpoint could not be written
STAGES = ("learner", "run_state", "rename", "latest")  # a save's steps, in order
FAULT_ENV = "V05_CHECKPOINT_FAULT"  # "<stage>@<step>[:errno name]": a fault injected there


class CheckpointError(RuntimeError):
    pass


class CheckpointWriteError(CheckpointError):
    """A checkpoint was not written; nothing of it is left and ``latest`` still names the
    previous whole checkpoint (if any)."""


class CheckpointAltered(ValueError):
    """A checkpoint file differs from the digest its save recorded (or no digest was
    recorded): nothing of the checkpoint is read. A ValueError: a bad request, exit 2."""


def fault_hook(stage: str, path: Path, step: int) -> None:
    """Called before each stage of a save (``STAGES``) with the path that stage writes. Does
    nothing unless ``$V05_CHECKPOINT_FAULT`` names this stage and step (then it raises the
    OSError a full disk would: ENOSPC, or the errno named after a colon); tests replace it."""
    spec = os.environ.get(FAULT_ENV, "")
    where, _, name = spec.partition(":")
    if spec and where == f"{stage}@{step}":
        import errno

        code = getattr(errno, name or "ENOSPC")
        raise OSError(code, os.strerror(code) + f" (injected: {FAULT_ENV}={spec})", str(path))


def refused_file(err: BaseException) -> str | None:
    """The learner's ``UnsafeCheckpointFile`` message (a file its weights-only load refused),
    however Ray wrapped it; None for any other error."""
    for e in (err, getattr(err, "cause", None)):
        if e is not None and any(c.__name__ == "UnsafeCheckpointFile" for c in type(e).__mro__):
            return str(e.args[0] if e.args else e)
    return None


def is_actor_death(err: BaseException) -> bool:
    """A role died during the save (Ray's ``RayActorError`` family): not a write fault, the
    run's own failure handling applies."""
    return any(c.__name__ in ("RayActorError", "ActorDiedError", "ActorUnavailableError")
               for c in type(err).__mro__)


def describe_error(err: BaseException) -> str:
    """``Type: first line of the message`` of what went wrong (a Ray task error: its cause)."""
    cause = getattr(err, "cause", None) or err
    text = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), "")
    return f"{type(cause).__name__}: {text[:300]}"


def free_space(path: Path) -> str:
    """'<n> MB free on <path>' for the nearest existing folder of ``path``."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return f"{shutil.disk_usage(p).free / 2**20:.1f} MB free on {p}"
    except OSError as err:
        return f"free space of {p} unknown ({err.strerror})"


_SEEN: dict[tuple, str] = {}  # (dev, inode, size, mtime, ctime) -> SHA-256


def file_digest(path: Path) -> str:
    """SHA-256 of ``path``; a file is hashed once per process (a change of its content changes
    its ctime, which no user can set back)."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _SEEN:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        _SEEN[key] = h.hexdigest()
    return _SEEN[key]


def _digests(tag_dir: Path) -> dict[str, list]:
    """{relative path: [SHA-256, bytes]} of every file under ``tag_dir`` but the record itself,
    hashed on a few threads (hashlib lets go of the GIL)."""
    names = sorted(p.relative_to(tag_dir).as_posix() for p in tag_dir.rglob("*")
                   if p.is_file() and p.relative_to(tag_dir).as_posix() != DIGESTS)
    with ThreadPoolExecutor(max(1, min(8, len(names)))) as pool:
        sums = list(pool.map(lambda n: file_digest(tag_dir / n), names))
    return {n: [d, (tag_dir / n).stat().st_size] for n, d in zip(names, sums)}


def write_digests(tag_dir: Path) -> dict:
    """Record the SHA-256 and length of every file of the checkpoint ``tag_dir``."""
    record = _digests(Path(tag_dir))
    write_atomic(Path(tag_dir) / DIGESTS, json.dumps({"sha256": record}, indent=1))
    return record


def check_digests(tag_dir: Path) -> str | None:
    """None when every file of the checkpoint ``tag_dir`` is the one its save recorded;
    why it is damaged when a recorded file is missing or shorter (skip it for an older one);
    ``CheckpointAltered`` naming the file for any other difference. Reads no checkpoint file
    but to hash it."""
    tag_dir = Path(tag_dir)
    again = (f"nothing of {tag_dir.name} was read: restore it, remove {tag_dir} to resume from "
             "an older checkpoint, or run.overwrite=true to start over")
    trust = f"(to record its files as they are: python -m cluster.records.checkpoints trust {tag_dir})"
    if not (tag_dir / DIGESTS).is_file():
        raise CheckpointAltered(f"{tag_dir / DIGESTS} is missing: no record of the checkpoint's "
                                f"files (saved before checkpoints recorded one, or not by this "
                                f"program); {again} {trust}")
    try:
        saved = json.loads((tag_dir / DIGESTS).read_text())
        record = {str(n): [str(d), int(b)] for n, (d, b) in saved["sha256"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointAltered(f"{tag_dir / DIGESTS}: not a readable record of the "
                                f"checkpoint's digests ({type(err).__name__}); {again}") from None
    for name, (_, size) in sorted(record.items()):
        p = tag_dir / name
        if not p.is_file() or p.stat().st_size < size:
            return (f"{p} is missing" if not p.is_file() else
                    f"{p} is cut short ({p.stat().st_size} of {size} bytes)")
    for name, (digest, size) in sorted(_digests(tag_dir).items()):
        if record.get(name, [None])[0] != digest:
            what = ("a file its save did not write" if name not in record else
                    f"its SHA-256 {digest[:12]}... is not the {record[name][0][:12]}... "
                    "recorded when the checkpoint was saved")
            raise CheckpointAltered(f"{tag_dir / name}: {what}; {again}")
    return None


def resumable(run_dir: Path, keep: int = 2) -> "Checkpoints":
    """The checkpoints ``run.resume=true`` continues from, or FileNotFoundError saying where
    none was found. The run directory is absolute (``cluster.config.paths``): on a cluster, shared
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


def run_state_writer(coordinator):
    """``write_run_state`` for ``Checkpoints.save``: the coordinator actor writes its prompts
    (``snapshot_to``) to the path."""
    def write(path: str) -> int:
        import ray

        return ray.get(coordinator.snapshot_to.remote(path))

    return write


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
        self.saved_step: int | None = None  # the step this process last saved whole

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

    def save(self, step: int, learner, write_run_state, client_state: dict) -> Path:
        """Learner shards, then the coordinator's prompts (``write_run_state(path)``), then the
        rename, then ``latest``; ``CheckpointWriteError`` when a stage fails to write."""
        staging, at = self.root / ".staging", ["learner", self.root / ".staging"]
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            fault_hook("learner", staging, step)
            learner.save_checkpoint(str(staging), client_state)  # -> staging/step<N>/ (all ranks)
            (tag_dir,) = [p for p in staging.iterdir() if p.is_dir()]
            at[:] = "run_state", tag_dir / RUN_STATE
            fault_hook(*at, step)
            write_run_state(str(tag_dir / RUN_STATE))
            at[1] = tag_dir / DIGESTS
            write_digests(tag_dir)  # every file of it: what a resume checks first
            final = self.commit(tag_dir, step, at)
            self.saved_step = step
            return final
        except Exception as err:  # noqa: BLE001 - a write fault: said, and nothing left of it
            if is_actor_death(err):
                raise
            raise self.failed(step, at, err) from err

    def failed(self, step: int, at: list, err: BaseException) -> CheckpointWriteError:
        """Remove what the failed save of ``step`` wrote; the error that says so (with the
        free space when it failed: torch says only "unexpected pos" of a full disk)."""
        space = free_space(self.root)
        shutil.rmtree(self.root / ".staging", ignore_errors=True)
        final = self.root / f"step{step}"
        if at[0] in ("rename", "latest") and self.latest() != final.name:
            shutil.rmtree(final, ignore_errors=True)  # renamed, but never named by ``latest``
        prev = self.latest()
        return CheckpointWriteError(
            f"checkpoint step{step} not written ({at[0]} stage, {at[1]}): "
            f"{describe_error(err)}; {space} when it failed; "
            + (f"the previous checkpoint {prev} is whole and stays latest: free space, then "
               "run.resume=true" if prev else "no earlier checkpoint to resume from"))

    def commit(self, tag_dir: Path, step: int, at: list | None = None) -> Path:
        """A checkpoint written whole under ``.staging/`` goes into place as ``step<N>``,
        ``latest`` names it, and older ones are pruned (``stale_tags``). ``at``: the stage
        reached, kept up to date for ``failed``."""
        at = at if at is not None else [None, None]
        final = self.root / f"step{step}"
        at[:] = "rename", final
        fault_hook(*at, step)
        shutil.rmtree(final, ignore_errors=True)  # a re-save of this step after a resume
        os.replace(tag_dir, final)
        at[:] = "latest", self.root / "latest"
        fault_hook(*at, step)
        write_atomic(self.root / "latest", final.name)
        try:  # committed: what follows only tidies up
            shutil.rmtree(self.root / ".staging", ignore_errors=True)
            for old in stale_tags(self.tags(), step, self.keep):
                shutil.rmtree(self.root / old, ignore_errors=True)
        except OSError:
            pass
        return final

    def candidates(self) -> list[str]:
        """Whole checkpoints in the order a resume tries them: ``latest`` first, then the
        others newest first."""
        tags, latest = self.tags(), self.latest()
        return ([latest] if latest in tags else []) + [t for t in tags if t != latest]

    def verified(self) -> tuple[str | None, list[str]]:
        """(the checkpoint a resume loads: the first candidate whose files all match their
        recorded digests, and why the ones before it were skipped as damaged); raises
        ``CheckpointAltered`` at the first altered one. Hashes; unpickles nothing."""
        skipped = []
        for tag in self.candidates():
            damaged = check_digests(self.root / tag)
            if not damaged:
                return tag, skipped
            skipped.append(f"{tag}: damaged: {damaged}")
        return None, skipped

    def load(self, learner) -> tuple[str, dict, Path, list[str]]:
        """Restore the newest checkpoint that verifies (``check_digests``) and loads into
        ``learner``. Returns (tag, the trainer's client state, the coordinator's run-state
        file, tags skipped as damaged or corrupt)."""
        import msgpack

        candidates = self.candidates()
        skipped = []
        for tag in candidates:
            state_file = self.root / tag / RUN_STATE
            damaged = check_digests(self.root / tag)  # CheckpointAltered: nothing read
            if damaged:
                skipped.append(f"{tag}: damaged: {damaged}")
                continue
            try:
                with open(state_file, "rb") as f:
                    msgpack.unpackb(f.read(), raw=False, strict_map_key=False)
                client = learner.load_checkpoint(str(self.root), tag)
            except Exception as err:  # noqa: BLE001 - a broken checkpoint: try an older one
                unsafe = refused_file(err)
                if unsafe:  # a file that would run code, matching its record: refused whole
                    raise CheckpointAltered(f"{unsafe}; nothing of {tag} was used: restore it "
                                            f"or remove {self.root / tag}") from None
                skipped.append(f"{tag}: {type(err).__name__}: {str(err)[:200]}")
                continue
            return tag, client, state_file, skipped
        raise CheckpointError(f"no loadable checkpoint under {self.root}"
                              + (f" (skipped: {'; '.join(skipped)})" if skipped else ""))


def main(argv: list[str]) -> int:
    """``python -m cluster.records.checkpoints trust CHECKPOINT_DIR``: record the digests of a
    checkpoint's files as they are now (one saved before checkpoints recorded them, or whose
    record was lost), so that a resume loads it. Loading runs none of them either way; the
    record only vouches that the files are the ones it lists."""
    if len(argv) != 2 or argv[0] != "trust" or not (Path(argv[1]) / RUN_STATE).is_file():
        print("usage: python -m cluster.records.checkpoints trust CHECKPOINT_DIR (a step<N> "
              f"folder holding {RUN_STATE})", file=sys.stderr)
        return 2
    record = write_digests(Path(argv[1]))
    print(f"{Path(argv[1]) / DIGESTS}: {len(record)} files recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
