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
    from cluster.records.checkpoints import DIGESTS, KEY_ENV, CheckpointAltered, Checkpoints

    monkeypatch.setenv(KEY_ENV, str(tmp_path / "checkpoint.key"))
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
    # The control: DeepSpeed's own load of that file runs what it holds.
    with pytest.raises(Exception):
        learner.load_checkpoint(str(ck.root), "step1")
    assert marker.exists()
