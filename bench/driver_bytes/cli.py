"""Measure, write ``bench/results/driver_bytes.json`` (the package docstring says how)."""
from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
from pathlib import Path

from common.sharding import make_shards, shard_samples
from common.types import PromptRecord, TrainBatch, TrainSample

# The configs measured and the prompt length each one's batch is built with (tokens): the
# default task's prompts are a dozen characters; DAPO-Math's chat-templated ones a few hundred.
CONFIGS = {"v05.yaml": 12, "configs/qwen3-4b-dapo-32gpu.yaml": 256}
MAX_SLICE_TOKENS = 4_000_000  # build at most this many tokens at once (memory), scale the rest


def synthetic(prompts: int, k: int, prompt_tokens: int, max_tokens: int, seed: int,
              version: int = 10):
    """(records, samples) of a batch: ``k`` samples per prompt, lengths uniform in
    [1, max_tokens], behaviour log-probs and versions as a run has them."""
    rng = random.Random(seed)
    records, samples = [], []
    for j in range(prompts):
        lengths = [rng.randint(1, max_tokens) for _ in range(k)]
        prompt = [rng.randrange(32000) for _ in range(prompt_tokens)]
        for n in lengths:
            samples.append(TrainSample(prompt, [rng.randrange(32000) for _ in range(n)],
                                       [-rng.random() for _ in range(n)], rng.gauss(0, 1),
                                       version - rng.randint(0, 2)))
        records.append(PromptRecord(
            prompt_id=f"p{j}", uid=f"s{j}", prompt="x" * (4 * prompt_tokens), k=k,
            rewards=[rng.choice((-1.0, 1.0)) for _ in range(k)], baseline=0.0, prior_p=0.5,
            prior_accepted=False, fallback=False, unparsed=0, admitted_version=version - 2,
            deadline=version + 4, versions=[version - 1], generators=[0], rounds=1,
            cancelled_rollouts=0, cancelled_tokens=0, regenerations=0, tokens=sum(lengths),
            lengths=lengths, prompt_tokens=prompt_tokens, t_admit=0.0, t_done=1.0,
            spans=[(0, 0.0, 1.0)] * k))
    return records, samples


def serialized_bytes(obj) -> int:
    """What Ray's serializer makes of ``obj`` (the bytes a call's argument or result is)."""
    import ray

    ctx = ray._private.worker.global_worker.get_serialization_context()
    return ctx.serialize(obj).total_bytes


def measure(config: str, prompt_tokens: int, seed: int = 0) -> dict:
    """Bytes through the driver per step, inline and by reference, for ``config``'s batch."""
    import ray

    from cluster.config.schema import load_config

    cfg = load_config(config)
    B, k, T = cfg.scheduler_batch_prompts(), cfg.algo.k_init, cfg.rollout.max_tokens
    ranks = cfg.learner.ranks
    per_prompt = k * (prompt_tokens + (T + 1) / 2)
    slice_prompts = max(ranks, min(B, int(MAX_SLICE_TOKENS // per_prompt)))
    factor = B / slice_prompts
    records, samples = synthetic(slice_prompts, k, prompt_tokens, T, seed)
    inline = TrainBatch(records=records, samples=samples, version=10, inflight_prompts=0)
    received = serialized_bytes(inline)
    sent = sum(serialized_bytes(s) for s in shard_samples(samples, ranks))
    by_ref = TrainBatch(records=records, samples=[], version=10, inflight_prompts=0,
                        shards=make_shards(samples, ranks, ray.put))
    meta = serialized_bytes(by_ref)
    refs_out = sum(serialized_bytes(r) for r in by_ref.shards.refs)
    records_only = serialized_bytes(TrainBatch(records=records, samples=[], version=10,
                                               inflight_prompts=0))
    scale = lambda x: int(round(x * factor))  # noqa: E731
    return {
        "config": config, "batch_prompts": B, "samples_per_prompt": k,
        "samples": B * k, "learner_ranks": ranks, "prompt_tokens": prompt_tokens,
        "max_tokens": T, "response_tokens": scale(sum(len(s.token_ids) for s in samples)),
        "measured_on_prompts": slice_prompts, "scaled_by": round(factor, 4),
        "before_bytes_per_step": scale(received + sent),
        "before_received_bytes": scale(received), "before_sent_bytes": scale(sent),
        "after_bytes_per_step": scale(meta + refs_out),
        "after_received_bytes": scale(meta), "after_sent_bytes": scale(refs_out),
        "records_bytes": scale(records_only),
        "sample_payload_after_bytes": max(0, scale(meta - records_only)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.driver_bytes",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated configs (default: %(default)s)")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = ap.parse_args(argv)
    import ray

    import bench.driver_bytes as package

    rows = []
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        for config in a.configs.split(","):
            row = measure(config, CONFIGS.get(config, 128))
            rows.append(row)
            print(f"{config}: {row['before_bytes_per_step'] / 2**20:,.1f} MiB through the driver "
                  f"per step before, {row['after_bytes_per_step'] / 2**10:,.1f} KiB after "
                  f"({row['samples']} samples, {row['learner_ranks']} ranks)", file=sys.stderr)
    finally:
        ray.shutdown()
    out = {"command": "python -m bench.driver_bytes" + (" " + " ".join(argv) if argv else ""),
           "date": datetime.date.today().isoformat(), "unit": "bytes per learner step",
           "method": " ".join(package.__doc__.split()),
           "configs": rows}
    path = Path(a.out) / "driver_bytes.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0
