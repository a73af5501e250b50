"""W&B logging (``logging.wandb``): the config when the run starts, every numeric value of
every ``metrics.jsonl`` line at its step, and at the end ``summary.json``'s values as the
run's summary with ``summary.json`` and ``report.html`` attached (the run's files).

Offline when this machine has no W&B credentials (no ``WANDB_API_KEY``, no ``wandb login``
entry in ``~/.netrc``) and ``WANDB_MODE`` does not choose: the run is written under
``<run dir>/wandb/offline-run-*/``, to upload later with ``wandb sync <that dir>``.
The W&B run's id is kept in ``<run dir>/wandb/v05-run-id``, so a resumed run continues the
same W&B run. W&B never stops training: its first failure is said in one line, and logging
to W&B stops there. ``wandb`` is imported only when the run logs to it.
"""
from __future__ import annotations

import netrc
import os
import secrets
import shutil
import sys
from pathlib import Path
from urllib.parse import urlparse

from cluster.records.step import StepMetrics

ID_FILE = "v05-run-id"
FINISH_WAIT_S = 15.0  # the longest wait for W&B's writer after ``finish`` (``ended``)
ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"  # as W&B's own run ids


def wandb_mode(env: dict | None = None, home: Path | None = None) -> str | None:
    """"offline" when W&B could not log in here; None (W&B decides: ``WANDB_MODE``, else
    online) when ``WANDB_MODE`` is set, or there is an API key or a netrc login for the
    W&B host (``WANDB_BASE_URL``, default api.wandb.ai)."""
    env = os.environ if env is None else env
    if env.get("WANDB_MODE") or env.get("WANDB_API_KEY"):
        return None
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = Path(env.get("NETRC") or Path(home or Path.home()) / ".netrc")
    try:
        if path.is_file() and netrc.netrc(str(path)).authenticators(host):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


def scalars(summary: dict) -> dict:
    """The summary's values that W&B shows as its run summary (numbers, text, booleans)."""
    return {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))}


class WandbLog:
    """One run's W&B run (``open``), or none after a failure."""

    def __init__(self, run, run_dir: Path):
        self.run, self.run_dir = run, Path(run_dir)

    @classmethod
    def open(cls, cfg, resumed: bool) -> "WandbLog":
        """Start (or, ``resumed``, continue) the W&B run of ``cfg``'s run directory."""
        log = cls(None, cfg.run_dir)
        try:
            import wandb

            folder = cfg.run_dir / "wandb"
            folder.mkdir(parents=True, exist_ok=True)
            id_file = folder / ID_FILE
            run_id = id_file.read_text().strip() if resumed and id_file.is_file() else None
            run_id = run_id or "".join(secrets.choice(ID_CHARS) for _ in range(8))
            id_file.write_text(run_id + "\n")
            lg, mode = cfg.logging, wandb_mode()
            log.run = wandb.init(
                project=lg.wandb_project, entity=lg.wandb_entity,
                name=lg.wandb_name or cfg.run.name, id=run_id, resume="allow",
                dir=str(cfg.run_dir), mode=mode, config=cfg.model_dump(mode="json"),
                settings=wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                        disable_git=True, save_code=False))
            where = Path(log.run.dir).parent
            said = (f"offline run {where} (upload it with: wandb sync {where})"
                    if log.run.settings.mode == "offline" else log.run.url)
            print(f"W&B: {said}", file=sys.stderr, flush=True)
        except Exception as err:  # noqa: BLE001 - W&B never stops a run
            log.failed("start", err)
        return log

    def log(self, m: StepMetrics) -> None:
        """A step's numbers (``StepMetrics.scalars``) at its ``step``."""
        if self.run is not None:
            try:
                self.run.log(m.scalars(), step=m.step)
            except Exception as err:  # noqa: BLE001
                self.failed("log", err)

    def finish(self, summary: dict | None, attach=()) -> None:
        """The run's summary, its files ``attach`` copied into the W&B run, the end."""
        if self.run is None:
            return
        try:
            self.run.summary.update(scalars(summary or {}))
            for path in attach:
                if Path(path).is_file():
                    shutil.copy(path, Path(self.run.dir) / Path(path).name)
            run_file = Path(self.run.dir).parent / f"run-{self.run.id}.wandb"
            self.run.finish()
            ended(run_file, FINISH_WAIT_S)
        except Exception as err:  # noqa: BLE001
            self.failed("finish", err)
        self.run = None

    def failed(self, what: str, err: Exception) -> None:
        """Said once; W&B logging stops, training goes on."""
        print(f"warning: W&B logging stopped ({what}: {type(err).__name__}: {err}); the run "
              "goes on, metrics.jsonl has every step", file=sys.stderr, flush=True)
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001 - already said
                pass


def ended(run_file: Path, wait_s: float) -> bool:
    """Whether ``run_file`` holds the run's exit record, waiting for it at most ``wait_s``:
    wandb 0.31's ``finish`` can return before its writer process has flushed the file (seen
    here: only the 7-byte header half a second after ``finish``)."""
    import time

    t_end = time.time() + wait_s
    while True:
        try:
            if any(r.WhichOneof("record_type") == "exit" for r in records(run_file)):
                return True
        except (OSError, ValueError):  # not there yet, or not even its header
            pass
        if time.time() >= t_end:
            return False
        time.sleep(0.1)


# The ``.wandb`` file of an offline run is a LevelDB-style log of ``wandb_internal_pb2.Record``s
# after a 7-byte header: 32 KiB blocks of (crc32, length, type) + data chunks, a record in one
# chunk (FULL) or split over FIRST, MIDDLE..., LAST (wandb 0.31 has no Python reader of it).
_HEADER, _BLOCK, _CHUNK = 7, 32768, 7
_FULL, _FIRST, _LAST = 1, 2, 4


def records(path: Path):
    """The records of a ``.wandb`` file, in order; a chunk whose checksum fails ends it."""
    import struct
    import zlib

    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    i, buf = _HEADER, b""
    while i + _CHUNK <= len(data):
        if _BLOCK - i % _BLOCK < _CHUNK:  # a block's tail too short for a chunk header: padding
            i += _BLOCK - i % _BLOCK
            continue
        crc, n, kind = struct.unpack("<IHB", data[i:i + _CHUNK])
        chunk, i = data[i + _CHUNK:i + _CHUNK + n], i + _CHUNK + n
        if kind == 0 or crc != zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF:
            return
        buf = chunk if kind in (_FULL, _FIRST) else buf + chunk
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec


def read_offline(run_dir: Path) -> dict:
    """What the offline W&B runs under ``<run_dir>/wandb/`` hold, oldest first:
    {"history": [{"_step": N, key: value...} per logged step], "summary": {...},
    "config": {...}, "files": [file names attached]}."""
    import json

    out = {"history": [], "summary": {}, "config": {}, "files": []}
    key = lambda item: item.key or "/".join(item.nested_key)  # noqa: E731
    for f in sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")):
        for rec in records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                out["history"].append({key(x): json.loads(x.value_json) for x in rec.history.item})
            elif kind == "summary":
                out["summary"].update({key(x): json.loads(x.value_json) for x in rec.summary.update})
            elif kind in ("config", "run"):  # the run record carries the config at its start
                upd = (rec.config if kind == "config" else rec.run.config).update
                out["config"].update({key(x): json.loads(x.value_json) for x in upd})
        out["files"] += sorted(p.name for p in (f.parent / "files").glob("*"))
    return out


def compare(run_dir: Path) -> dict:
    """Every number of every ``metrics.jsonl`` line (``numeric``) against the offline W&B
    run's history at the same step: {"steps", "values", "missing": [(step, key)...],
    "differing": [(step, key, ours, wandb)...], "steps_without_row": [...]}."""
    import json
    import math

    rows = [StepMetrics.from_json(json.loads(line)) for line in
            (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    history = {h.get("_step"): h for h in read_offline(run_dir)["history"]}
    out: dict = {"steps": 0, "values": 0, "missing": [], "differing": [], "steps_without_row": []}
    for r in rows:
        h = history.get(r.step)
        if h is None:
            out["steps_without_row"].append(r.step)
            continue
        out["steps"] += 1
        for k, v in r.scalars().items():
            if isinstance(v, float) and not math.isfinite(v):
                continue
            out["values"] += 1
            if k not in h:
                out["missing"].append((r.step, k))
            elif not math.isclose(h[k], v, rel_tol=1e-9, abs_tol=1e-12):
                out["differing"].append((r.step, k, v, h[k]))
    return out


if __name__ == "__main__":  # python -m cluster.records.wandb_log RUN_DIR: is every metric in W&B?
    got = compare(Path(sys.argv[1]))
    print(f"{got['steps']} steps, {got['values']} numbers of metrics.jsonl: "
          f"{len(got['missing'])} missing from the W&B run, {len(got['differing'])} differing, "
          f"{len(got['steps_without_row'])} steps without a W&B row")
    for item in (got["missing"] + got["differing"])[:20]:
        print("  ", item)
    sys.exit(0 if not (got["missing"] or got["differing"] or got["steps_without_row"]) else 1)
