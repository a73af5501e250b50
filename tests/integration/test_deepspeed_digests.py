"""A checkpoint of real DeepSpeed ranks (the default run's policy and optimizer settings, one
rank on a local Ray cluster on 127.0.0.1), saved through ``Checkpoints.save``: its signed
record lists every file DeepSpeed wrote; a model-states file swapped for a pickle that would
create a marker file is refused naming the file and never reaches DeepSpeed's
``torch.load(weights_only=False)`` (which, called directly on it, does run it: the control).
Also says what writing and checking the digests cost on this checkpoint (``-s`` shows it)."""
from __future__ import annotations

import json
import pickle
import random
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


class Marker:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def learner():
    from cluster.config.schema import load_config
    from learner.ranks import Learner

    cfg = load_config(ROOT / "v05.yaml")
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield Learner(cfg.model_path(), 1, cfg.optim, num_cpus_per_rank=0.5)
    finally:
        ray.shutdown()


def samples(n: int = 8):
    from common.types import TrainSample

    r = random.Random(0)
    return [TrainSample(prompt_token_ids=[r.randint(4, 20) for _ in range(5)],
                        token_ids=[r.randint(4, 20) for _ in range(6)],
                        logprobs=[-3.0] * 6, advantage=r.gauss(0, 1), version=0)
            for _ in range(n)]


def test_a_swapped_deepspeed_file_is_refused_and_never_unpickled(learner, tmp_path, monkeypatch):
    import msgpack

    from cluster.records import checkpoints as ck_mod
    from cluster.records.checkpoints import DIGESTS, CheckpointAltered, Checkpoints

    learner.train_step(samples())  # the optimizer's moments exist: a checkpoint's real size
    ck = Checkpoints(tmp_path / "run" / "checkpoints")
    t0 = time.perf_counter()
    final = ck.save(1, learner, lambda p: Path(p).write_bytes(msgpack.packb({"x": 1})), {"s": 1})
    save_s = time.perf_counter() - t0
    files = sorted(p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file())
    record = json.loads((final / DIGESTS).read_text())["sha256"]
    assert sorted(record) == [f for f in files if f != DIGESTS]
    model_states = [f for f in record if f.endswith("model_states.pt")]
    assert model_states, files
    size = sum(n for _, n in record.values())
    ck_mod._SEEN.clear()  # what a resume in a new process pays
    t0 = time.perf_counter()
    assert ck.verified() == ("step1", [])
    check_s = time.perf_counter() - t0
    print(f"\ncheckpoint of the default v05.yaml policy: {len(record)} files, {size / 2**20:.1f} "
          f"MiB; save {save_s:.2f} s in all, digests checked in {check_s:.3f} s "
          f"({size / 2**20 / max(check_s, 1e-9):.0f} MiB/s)")
    assert ck.load(learner)[0] == "step1"  # the untouched checkpoint loads

    victim, marker = final / model_states[0], tmp_path / "pwned"
    data = pickle.dumps(Marker(marker))
    victim.write_bytes(data + b"\0" * (victim.stat().st_size - len(data)))
    with pytest.raises(CheckpointAltered, match=rf"{victim}: its SHA-256 .* recorded when the "
                                                r"checkpoint was saved; nothing of step1 was read"):
        ck.load(learner)
    assert not marker.exists()
    # Its record rewritten to match (whoever can write the folder can): the learner's
    # weights-only load refuses the file, naming it, and runs nothing of it.
    import hashlib
    full = json.loads((final / DIGESTS).read_text())
    full["sha256"][model_states[0]] = [hashlib.sha256(victim.read_bytes()).hexdigest(),
                                       victim.stat().st_size]
    (final / DIGESTS).write_text(json.dumps(full))
    with pytest.raises(CheckpointAltered, match=rf"{victim}: refused by a weights-only load "
                                                r"\(.*\); nothing of it ran; nothing of step1"):
        ck.load(learner)
    assert not marker.exists()
    # The control: DeepSpeed's own load (torch.load(weights_only=False)) runs what it holds.
    import torch
    with pytest.raises(Exception):
        torch.load(victim, weights_only=False)
    assert marker.exists()


def test_every_zero_stage_and_dtype_reloads_weights_only(tmp_path):
    """A real DeepSpeed rank (a tiny random Qwen3, one process of its own) at ZeRO stages 0-3
    in fp32 and bf16 saves a checkpoint after a step and loads it back through the weights-only
    load: DeepSpeed's own classes in it are the three allowed, and the weights come back."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    res = subprocess.run([sys.executable, __file__, str(tmp_path)], cwd=ROOT, timeout=600,
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert sorted(got) == [f"{z}-{d}" for z in range(4) for d in ("bf16", "fp32")]
    for case, (files, moved, diff) in got.items():  # the step after the save moved weights
        assert files >= 1 and moved > 0 and diff == 0.0, (case, files, moved, diff)


def _reload_each(tmp: Path) -> dict:
    """{"<stage>-<dtype>": (.pt files loaded weights-only, max weight change of the step
    after the save, max weight change from the save to the reload)}."""
    import numpy as np

    from bench.gpu_learner.core import SHAPES, save_random_shape, synthetic_samples
    from learner import state_io
    from learner.config import LearnerConfig
    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    path, _ = save_random_shape("tiny", tmp / "tiny")
    batch = synthetic_samples(8, 6, 9, SHAPES["tiny"]["vocab_size"], 0)
    loaded = []
    real = state_io.weights_only_load

    def counted(p, map_location=None):
        loaded.append(str(p))
        return real(p, map_location)

    out = {}
    port = free_port()
    for zero in range(4):
        for dtype in ("bf16", "fp32"):
            w = LearnerWorker(str(path), LearnerConfig(lr=1e-3, zero_stage=zero, dtype=dtype),
                              0, 1, port)
            w.engine.checkpoint_engine.load = counted
            w.train_step(batch)
            saved = w.get_weights()
            w.save_checkpoint(str(tmp / f"{zero}{dtype}"), {})
            w.train_step(batch)
            moved = max(float(np.abs(v - saved[k]).max()) for k, v in w.get_weights().items())
            loaded.clear()
            w.load_checkpoint(str(tmp / f"{zero}{dtype}"))
            back = w.get_weights()
            out[f"{zero}-{dtype}"] = (len(loaded), moved, max(
                float(np.abs(back[k] - saved[k]).max()) for k in saved))
            del w  # one process group for all (DeepSpeed caches its groups)
    return out


if __name__ == "__main__":
    print(json.dumps(_reload_each(Path(sys.argv[1]))))
