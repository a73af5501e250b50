"""The one owner of a run's files (docs/pipeline.md, "Run outputs"): ``config.yaml``,
``metrics.jsonl``, ``prompts.jsonl``, ``dropped.jsonl``, ``deferred.jsonl`` (admission by
selection), ``inflight_at_end.json``,
``summary.json``, ``report.html``, ``rollouts.msgpack`` (``run.record_rollouts``), TensorBoard's
``tb/``, W&B's ``wandb/`` (through ``cluster.records.wandb_log``), and the progress lines on stderr;
with ``prompt_fates``, the accounting check that reads them back (every prompt drawn
trained, dropped, deferred, in flight or waiting at the end, exactly once).

A write that fails (a full disk, an unwritable directory, an I/O error) never stops the run:
its one-line warning names the path and the error, a line cut short is cut off again (every
line of a .jsonl file parses), and ``summary.json`` counts the failures
(``run_file_failures``). ``fault`` is where tests inject one.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from cluster.records.step import StepMetrics
from cluster.records.summary import RunSummary
from common.atomic import write_atomic
from common.records import DropReason

# Every line of dropped.jsonl: {"uid", "reason", "step"} (``reason``: ``DropReason.line``); a
# NaN-skipped step's prompts are dropped as ``learner_nan_skip`` (the summary counts them among
# ``prompts_dropped``).


def fault(path: Path) -> None:
    """Called before every write of a run file with its path; tests replace it to raise the
    OSError a full disk would."""


class RunFiles:
    def __init__(self, run_dir: Path, config_yaml: str, resume_step: int | None = None,
                 tensorboard: bool = False, progress: bool = True, record_rollouts: bool = False,
                 wandb=None, fetch=None):
        """``resume_step``: continuing from the checkpoint of that step: lines of later steps
        (written after it by a run that then crashed) are dropped, so that every step and every
        prompt appears once. None: a fresh run, earlier outputs are replaced. ``wandb``: a
        started ``cluster.records.wandb_log.WandbLog`` that gets every step's metrics, and the summary
        and report at the end (``report``). ``fetch``: what turns a batch's shard references
        into their samples when recording rollouts (default ``ray.get``)."""
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(config_yaml)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.prompts_path = self.dir / "prompts.jsonl"
        self.dropped_path = self.dir / "dropped.jsonl"
        self.deferred_path = self.dir / "deferred.jsonl"
        for path in (self.metrics_path, self.prompts_path, self.dropped_path,
                     self.deferred_path):
            if resume_step is None:
                path.unlink(missing_ok=True)
            else:
                keep_steps(path, resume_step)
        self.progress = progress
        self.t0 = time.time()
        self.write_failures = 0
        self._recorder = self._rollouts(resume_step, record_rollouts)
        self._fetch = fetch
        self._tb, self._wandb, self._summary = None, wandb, None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tb"))

    def _rollouts(self, resume_step: int | None, record: bool):
        from learner.replay import RolloutRecorder, keep_records

        path = self.dir / "rollouts.msgpack"
        if resume_step is not None:  # what was recorded after the checkpoint is trained again
            keep_records(path, resume_step)
        return RolloutRecorder(path) if record else None

    def step(self, m: StepMetrics) -> None:
        """metrics.jsonl's line for a step, TensorBoard's and W&B's scalars, the progress
        line: all from the one record."""
        self.append(self.metrics_path, [m.to_json()])
        if self._tb is not None:
            try:
                for k, v in m.scalars().items():
                    self._tb.add_scalar(k, v, m.step)
                self._tb.flush()
            except OSError as err:
                self.failed(self.dir / "tb", err)
        if self._wandb is not None:
            self._wandb.log(m)
        if self.progress:
            print(progress_line(m, time.time() - self.t0), file=sys.stderr, flush=True)

    def note(self, msg: str) -> None:
        """A line for the person watching (stderr), when progress lines are on."""
        if self.progress:
            print(msg, file=sys.stderr, flush=True)

    def warn(self, msg: str) -> None:
        """A line that is always said (stderr): something went wrong and the run goes on."""
        print(f"warning: {msg}", file=sys.stderr, flush=True)

    def prompts(self, batch, step: int, version: int, t_trained: float, skipped: bool) -> None:
        """prompts.jsonl: one line per trained prompt; dropped.jsonl: one per prompt the
        coordinator dropped since the last batch, and every prompt of a NaN-skipped step;
        rollouts.msgpack: every prompt's samples, when recording; deferred.jsonl: one per
        prompt the selection deferred since the last batch."""
        self.dropped(batch.dropped, step)
        self.deferred(batch.deferred, step)
        if self._recorder is not None:
            it = iter(ordered_samples(batch, self._fetch))
            for r in batch.records:  # its trained samples: its first n, fewer than k when
                n = r.k if r.trained_samples is None else r.trained_samples  # trimmed
                self._recorder.append(r.prompt_id, r.prompt, r.rewards[:n], r.baseline, version,
                                      [next(it) for _ in range(n)], step=step)
        if skipped:
            self.dropped([(r.uid, DropReason.LEARNER_NAN_SKIP.line()) for r in batch.records], step)
            return
        self.append(self.prompts_path, [{**r.to_dict(), "step": step, "t_trained": t_trained}
                                        for r in batch.records])

    def dropped(self, drops, step: int) -> None:
        """dropped.jsonl: one line per (uid, reason)."""
        self.append(self.dropped_path, [{"uid": uid, "reason": why, "step": step}
                                        for uid, why in drops])

    def deferred(self, deferred, step: int) -> None:
        """deferred.jsonl: one line per prompt the selection deferred: its uid, the prior's p
        (null: none), the admission probability it had (algo.select; written only then)."""
        if deferred or self.deferred_path.exists():
            self.append(self.deferred_path, [{"uid": uid, "p": p, "admit_probability": a,
                                              "step": step} for uid, p, a in deferred])

    def append(self, path: Path, rows: list[dict]) -> bool:
        """JSON lines appended whole or not at all (a failed write is cut off again, warned
        about and counted); whether they were written. No rows still creates the file: every
        promised run file exists at the end, empty when nothing happened (dropped.jsonl)."""
        if not rows:
            try:
                path.touch()
            except OSError as err:
                self.failed(path, err)
                return False
            return True
        text = "".join(json.dumps(r) + "\n" for r in rows)
        try:
            with path.open("a") as f:
                start = f.tell()
                try:
                    fault(path)
                    f.write(text)
                    f.flush()
                except OSError:
                    f.truncate(start)  # what reached the file of these lines: needs no space
                    raise
        except OSError as err:
            self.failed(path, err)
            return False
        return True

    def write(self, path: Path, text: str) -> bool:
        """A whole file, atomically (``common.atomic``); a failure is warned about and
        counted, the previous file kept."""
        try:
            fault(path)
            write_atomic(path, text)
        except OSError as err:
            self.failed(path, err)
            return False
        return True

    def failed(self, path: Path, err: OSError) -> None:
        """One line on stderr (always: a full disk is never silent), and the count."""
        self.write_failures += 1
        print(f"warning: could not write {path}: {type(err).__name__}: {err.strerror or err} "
              f"(run file write failure {self.write_failures}; training goes on)",
              file=sys.stderr, flush=True)

    def end(self, acct, step: int) -> None:
        """After the coordinator stopped: the drops after the last hand-over to dropped.jsonl,
        the uids still in flight to inflight_at_end.json (with prompts.jsonl: every admitted
        prompt's fate, by uid)."""
        self.dropped(acct.dropped_since_last_batch, step)
        self.deferred(acct.deferred_since_last_batch, step)
        self.write(self.dir / "inflight_at_end.json",
                   json.dumps({"step": step, "uids": list(acct.inflight_uids),
                               "waiting": list(acct.waiting_uids)}) + "\n")

    def summary(self, s: RunSummary) -> RunSummary:
        """summary.json, with ``run_file_failures``: the writes of run files that failed;
        returns the record it holds."""
        written = replace(s, run_file_failures=self.write_failures)
        self._summary = written.to_json()
        self.write(self.dir / "summary.json", json.dumps(self._summary, indent=2) + "\n")
        return written

    def report(self, write_report) -> None:
        """report.html from the run's files (``write_report(run_dir)``: the report's writer,
        ``cluster.report.page.write_report``), the run's last; a failed report never fails
        the run. Then the W&B run ends with the summary, summary.json and report.html."""
        try:
            self.note(f"report: {write_report(self.dir)}")
        except Exception as err:  # noqa: BLE001 - the run's outputs are already written
            self.note(f"report: not written ({type(err).__name__}: {err})")
        if self._wandb is not None:
            self._wandb.finish(self._summary, [self.dir / "summary.json", self.dir / "report.html"])

    def close(self) -> None:
        if self._recorder is not None:
            self._recorder.close()
        if self._tb is not None:
            self._tb.close()


def ordered_samples(batch, fetch=None) -> list:
    """A batch's samples in order: inline, or fetched (``fetch``, default ``ray.get``) from
    its shards' references: the one place the driver reads them (rollouts.msgpack, when
    ``run.record_rollouts``)."""
    if batch.shards is None:
        return batch.samples
    if fetch is None:
        import ray

        fetch = ray.get
    return batch.shards.ordered(fetch(batch.shards.refs))


def progress_line(m: StepMetrics, elapsed_s: float) -> str:
    """The console's line for a step (a figure the step has not: NaN or a dash)."""
    def num(v):  # 0.0 is a figure, not a missing one
        return float("nan") if v is None else v

    acc = m.held_out.accuracy if m.held_out is not None else None
    return " | ".join([f"step {m.step:>4}", f"reward {num(m.reward_mean):+.3f}",
                       f"acc {acc:.3f}" if acc is not None else "acc   -  ",
                       f"k {num(m.k_mean):4.1f}",
                       f"busy {100 * num(m.generator_busy_fraction):3.0f}%",
                       f"{num(m.step_time_s):5.1f}s/step", f"[{elapsed_s:6.0f}s]"])


def keep_steps(path: Path, max_step: int) -> int:
    """Keep only the lines of ``path`` (JSON lines with a "step") up to ``max_step``;
    returns how many were dropped. Rewritten atomically."""
    if not path.exists():
        return 0
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    kept = [ln for ln in lines if (_parse(ln) or {"step": math.inf}).get("step", 0) <= max_step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(ln + "\n" for ln in kept))
    tmp.replace(path)
    return len(lines) - len(kept)


def _parse(line: str) -> dict | None:
    """A JSON line, or None for one cut short (a crash mid-write)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def read_lines(path: Path) -> list[dict]:
    """The lines of a .jsonl file that parse (a line cut short by a crash is not one)."""
    path = Path(path)
    rows = [_parse(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []
    return [r for r in rows if r is not None]


def prompt_fates(run_dir: Path) -> dict:
    """Every drawn prompt's fate, by uid, from a run's files (the evidence that nothing was
    lost or trained twice, across crashes and resumes): uids are ``s<position>`` in the
    sampler's stream, so the drawn ones are s0 .. s<data_pos - 1>; each was trained, dropped,
    deferred by the selection, or was in flight or waiting at the end. ``admitted``: those
    drawn less the deferred and the waiting."""
    from collections import Counter

    run_dir = Path(run_dir)
    summary = RunSummary.from_json(json.loads((run_dir / "summary.json").read_text()))
    trained = Counter(r["uid"] for r in read_lines(run_dir / "prompts.jsonl"))
    dropped = Counter(r["uid"] for r in read_lines(run_dir / "dropped.jsonl"))
    deferred = Counter(r["uid"] for r in read_lines(run_dir / "deferred.jsonl"))
    end = run_dir / "inflight_at_end.json"
    at_end = json.loads(end.read_text()) if end.exists() else {}
    inflight, waiting = set(at_end.get("uids", [])), set(at_end.get("waiting", []))
    drawn = {f"s{i}" for i in range(summary.accounting.data_pos)}
    seen = set(trained) | set(dropped) | inflight | set(deferred) | waiting
    return {"drawn": len(drawn), "admitted": len(drawn) - sum(deferred.values()) - len(waiting),
            "trained": sum(trained.values()), "dropped": sum(dropped.values()),
            "in_flight": len(inflight), "deferred": sum(deferred.values()),
            "waiting": len(waiting),
            "lost": sorted(drawn - seen, key=lambda u: int(u[1:])),
            "trained_twice": sorted(u for u, n in trained.items() if n > 1),
            "trained_and_dropped": sorted(set(trained) & set(dropped)),
            # a deferred uid is not admitted: deferred twice, or also trained, dropped or
            # in flight, is a second fate
            "deferred_twice": sorted(u for u, n in deferred.items() if n > 1
                                     or u in trained or u in dropped or u in inflight),
            "unknown": sorted(seen - drawn)}
