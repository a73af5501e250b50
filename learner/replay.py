"""Record finished prompts to disk and replay them into the learner, with no generator.

File format: a stream of msgpack maps, one per finished prompt (its rollouts and rewards)::

    {"prompt_id": str, "prompt": str, "rewards": [float], "baseline": float,
     "policy_version": int, "samples": [TrainSample.to_dict(), ...], "step": int}

``step`` (the learner step that trained the prompt; absent in files of older versions) lets a
resumed run drop what was recorded after its checkpoint (``keep_records``).

    python -m learner.replay FILE [--model PATH] [--batch-prompts B] [--ranks R] [--steps N]

trains a ``Learner`` on batches of B consecutive prompts (cycling through the file if N
asks for more batches than it holds) and prints one JSON line per step and a summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

from common.types import TrainSample

_KEYS = ("prompt_id", "prompt", "rewards", "baseline", "policy_version", "samples")


class RolloutRecorder:
    """Appends one msgpack record per finished prompt (flushed, so a crash loses none)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "ab")
        self.n_records = 0

    def append(self, prompt_id: str, prompt: str, rewards: Sequence[float], baseline: float,
               policy_version: int, samples: Sequence[TrainSample | dict],
               step: int | None = None) -> None:
        import msgpack

        if len(rewards) != len(samples):
            raise ValueError(f"prompt {prompt_id!r}: {len(rewards)} rewards for "
                             f"{len(samples)} samples")
        record = {
            "prompt_id": str(prompt_id), "prompt": str(prompt),
            "rewards": [float(r) for r in rewards], "baseline": float(baseline),
            "policy_version": int(policy_version),
            "samples": [s.to_dict() if isinstance(s, TrainSample) else dict(s) for s in samples],
        }
        if step is not None:
            record["step"] = int(step)
        self._f.write(msgpack.packb(record, use_bin_type=True))
        self._f.flush()
        self.n_records += 1

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "RolloutRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def unpacked(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(index, record) of each msgpack map in ``path``. msgpack holds data only (maps, lists,
    numbers, strings, bytes; an extension type comes back as bytes): reading a file, even one
    a user swapped, runs nothing. A file that is not such a stream is a ValueError naming the
    file and the record; a record cut short at the end (a crash mid-append) is left out."""
    import msgpack

    with open(path, "rb") as f:
        stream = enumerate(msgpack.Unpacker(f, raw=False))
        while True:
            try:
                i, rec = next(stream)
            except StopIteration:
                return
            except ValueError as err:  # FormatError, StackError, ExtraData: not msgpack
                raise ValueError(f"{path}: not a rollout file written by RolloutRecorder "
                                 f"({type(err).__name__} after the records that read)") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}: record {i} is a {type(rec).__name__}, not a map: "
                                 "not a rollout file written by RolloutRecorder")
            yield i, rec


def read_records(path: str | Path) -> Iterator[dict]:
    """Yield the recorded prompts in order; ``samples`` come back as ``TrainSample``s."""
    for i, rec in unpacked(path):
        missing = [k for k in _KEYS if k not in rec]
        if missing:
            raise ValueError(f"{path}: record {i} lacks {missing}")
        try:
            rec["samples"] = [TrainSample.from_dict(s) for s in rec["samples"]]
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            raise ValueError(f"{path}: record {i}: a sample that is not a TrainSample "
                             f"({type(err).__name__}: {str(err)[:200]})") from None
        yield rec


def keep_records(path: str | Path, max_step: int) -> int:
    """Keep only the records of ``path`` trained at steps up to ``max_step`` (a resumed run:
    what a crashed run recorded after its checkpoint is trained again); records without a
    step are kept. Returns how many were dropped; rewritten atomically."""
    import msgpack

    path = Path(path)
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for _, rec in unpacked(path):
        if rec.get("step", 0) <= max_step:
            kept.append(msgpack.packb(rec, use_bin_type=True))
        else:
            dropped += 1
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(b"".join(kept))
    tmp.replace(path)
    return dropped


def batches(records: list[dict], batch_prompts: int, steps: int) -> Iterator[list[TrainSample]]:
    """``steps`` batches of ``batch_prompts`` consecutive prompts, wrapping around the file."""
    if not records:
        raise ValueError("the rollout file holds no prompts")
    pos = 0
    for _ in range(steps):
        chosen = [records[(pos + j) % len(records)] for j in range(batch_prompts)]
        pos = (pos + batch_prompts) % len(records)
        yield [s for r in chosen for s in r["samples"]]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m learner.replay", description=__doc__.split("\n")[0])
    p.add_argument("file", help="msgpack rollout file written by RolloutRecorder")
    p.add_argument("--model", default=None, help="HF checkpoint dir (default: embedded policy)")
    p.add_argument("--batch-prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--ranks", type=int, default=1, help="learner ranks (Ray actors)")
    p.add_argument("--steps", type=int, default=None,
                   help="optimiser steps (default: one pass over the file)")
    p.add_argument("--cpus-per-rank", type=float, default=1.0)
    p.add_argument("--config", default="{}",
                   help='LearnerConfig fields as JSON, e.g. \'{"lr": 1e-5, "zero_stage": 2}\'')
    args = p.parse_args(argv)
    for name in ("batch_prompts", "ranks"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def run(args: argparse.Namespace, out=None) -> dict:
    """Train from the file; prints per-step JSON lines and returns the summary dict."""
    out = out or sys.stdout  # looked up per call: a default bound at import goes stale
    from common.rayproc import prefer_loopback

    prefer_loopback()  # before ray is imported, for the local cluster started below
    import ray

    from learner.config import LearnerConfig
    from learner.ranks import Learner

    cfg = LearnerConfig(**json.loads(args.config))
    records = list(read_records(args.file))
    steps = args.steps or max(1, len(records) // args.batch_prompts)
    model = args.model
    if model is None:
        from tasks.policy import ensure_default_policy

        model = str(ensure_default_policy())
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(address="local", num_cpus=max(1, int(args.ranks * args.cpus_per_rank + 0.999)),
                 include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    learner = None
    try:
        t_init = time.perf_counter()
        learner = Learner(model, args.ranks, cfg, num_cpus_per_rank=args.cpus_per_rank)
        init_s = time.perf_counter() - t_init
        history, n_samples, t0 = [], 0, time.perf_counter()
        for batch in batches(records, args.batch_prompts, steps):
            m = learner.train_step(batch)
            n_samples += len(batch)
            history.append(m)
            print(json.dumps({"samples": len(batch), **m.to_dict()}), file=out, flush=True)
        wall = time.perf_counter() - t0
    finally:
        if learner is not None:
            learner.shutdown()
        if own_ray:
            ray.shutdown()
    summary = _summary(history, n_samples, wall, init_s)
    print(json.dumps({"summary": summary}), file=out, flush=True)
    return summary


def _summary(history: list, n_samples: int, wall: float, init_s: float) -> dict:
    """``history``: the steps' ``StepResult``s."""
    times = [m.learner_step_s for m in history]
    return {
        "steps": len(history), "samples": n_samples,
        "tokens": sum(m.n_tokens for m in history),
        "skipped_steps": sum(m.skipped for m in history),
        "wall_s": wall, "init_s": init_s, "samples_per_s": n_samples / wall if wall > 0 else 0.0,
        "mean_step_time_s": sum(times) / len(times) if times else 0.0,
        "final_loss": history[-1].loss if history else None,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    from common.rayproc import run_main

    def _cli() -> int:
        main()  # prints its own report
        return 0

    run_main(_cli)  # exits without C++ static destructors: see exit_process
