"""A learner rank's weights and checkpoints (``learner.state_io.StateIO``), owned by the rank
(``LearnerWorker``) rather than mixed into it (issue 44): the rank's update count goes into a
checkpoint as an argument and comes back through the rank's ``load_checkpoint`` alone. Here
the engine is a stand-in that keeps what DeepSpeed would save in a dict (its checkpoint
engine is DeepSpeed's own, so the weights-only load is installed on the real class); the
same with real DeepSpeed ranks: tests/integration/test_learner.py, test_lora.py,
test_deepspeed_digests.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


class StandInEngine:
    """What ``StateIO`` calls of a DeepSpeed engine, saving into ``self.saved``."""

    def __init__(self, checkpoint_engine=None):
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
            TorchCheckpointEngine)

        self.checkpoint_engine = checkpoint_engine or TorchCheckpointEngine()
        self.saved: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, dict]] = []

    def save_checkpoint(self, ckpt_dir, tag, client_state, exclude_frozen_parameters):
        self.calls.append(("save", {"tag": tag, "exclude_frozen": exclude_frozen_parameters}))
        self.saved[(ckpt_dir, tag)] = dict(client_state)

    def load_checkpoint(self, ckpt_dir, tag, load_module_strict):
        self.calls.append(("load", {"tag": tag, "strict": load_module_strict}))
        if tag is None:  # DeepSpeed's "latest": the last save here
            tag = next((t for d, t in reversed(self.saved) if d == ckpt_dir), None)
        if (ckpt_dir, tag) not in self.saved:
            return None, None
        return f"{ckpt_dir}/{tag}", {"optimizer": "DeepSpeed's own", **self.saved[(ckpt_dir, tag)]}


def state_io(rank: int = 0, lora: bool = False, engine=None):
    import torch

    from learner.state_io import StateIO

    torch.manual_seed(0)
    return StateIO(engine or StandInEngine(), torch.nn.Linear(3, 2), rank, "/no/model",
                   zero3=False, lora=lora)


def rank_with(io):
    """A ``LearnerWorker`` with no engine of its own: only its counters and ``io``."""
    from learner.worker import LearnerWorker

    w = LearnerWorker.__new__(LearnerWorker)
    w.state_io, w.step, w.consecutive_nan = io, 0, 0
    return w


def test_the_rank_composes_its_state_io_instead_of_inheriting_it():
    from learner.worker import LearnerWorker

    assert LearnerWorker.__bases__ == (object,)
    for method in ("get_weights", "connect_weight_sync", "publish_weights", "save_checkpoint",
                   "load_checkpoint", "save_hf"):
        assert method in vars(LearnerWorker), method  # Ray exposes the actor class's methods


def test_the_engines_checkpoint_loads_become_weights_only():
    from learner.state_io import weights_only_load

    io = state_io()
    assert io.engine.checkpoint_engine.load is weights_only_load

    class OtherCheckpointEngine:
        pass

    with pytest.raises(RuntimeError, match="OtherCheckpointEngine checkpoint engine"):
        state_io(engine=StandInEngine(OtherCheckpointEngine()))


def test_a_checkpoint_gives_the_rank_back_its_update_count(tmp_path):
    w = rank_with(state_io())
    w.step, w.consecutive_nan = 5, 2
    client = {"step": 5, "data_position": 42}
    assert w.save_checkpoint(str(tmp_path), client) == str(Path(tmp_path) / "step5")
    w.step, w.consecutive_nan = 7, 1  # trained on, then a skipped step
    assert w.load_checkpoint(str(tmp_path)) == client
    assert (w.step, w.consecutive_nan) == (5, 0)
    assert w.state_io.engine.calls == [("save", {"tag": "step5", "exclude_frozen": False}),
                                       ("load", {"tag": None, "strict": True})]


def test_a_checkpoint_without_an_update_count_keeps_the_ranks(tmp_path):
    io = state_io()
    io.engine.saved[(str(tmp_path), "old")] = {"v05_client_state": {"note": "older"}}
    w = rank_with(io)
    w.step, w.consecutive_nan = 3, 1
    assert w.load_checkpoint(str(tmp_path), "old") == {"note": "older"}
    assert (w.step, w.consecutive_nan) == (3, 0)


def test_a_missing_checkpoint_is_an_error_and_changes_nothing(tmp_path):
    w = rank_with(state_io())
    w.step, w.consecutive_nan = 4, 1
    with pytest.raises(FileNotFoundError, match="no DeepSpeed checkpoint found"):
        w.load_checkpoint(str(tmp_path), "step9")
    assert (w.step, w.consecutive_nan) == (4, 1)


def test_under_lora_a_checkpoint_holds_the_adapters_alone(tmp_path):
    w = rank_with(state_io(lora=True))
    w.save_checkpoint(str(tmp_path), {})
    w.load_checkpoint(str(tmp_path))
    assert w.state_io.engine.calls == [("save", {"tag": "step0", "exclude_frozen": True}),
                                       ("load", {"tag": None, "strict": False})]


def test_weights_leave_from_rank_0():
    zero, one = rank_with(state_io(0)), rank_with(state_io(1))
    want = {k: v.detach().numpy() for k, v in zero.state_io.model.state_dict().items()}
    got = zero.get_weights()
    assert sorted(got) == sorted(want) == ["bias", "weight"]
    assert all(np.array_equal(got[k], want[k]) and got[k].dtype == np.float32 for k in want)
    assert one.get_weights() == {}
    assert sorted(one.get_weights(all_ranks=True)) == ["bias", "weight"]
    assert one.publish_weights([], 1) == (None, [])
    with pytest.raises(RuntimeError, match="publish_weights before connect_weight_sync"):
        zero.publish_weights([], 1)
    one.connect_weight_sync("object_store", [])  # other ranks host no sender
    assert one.state_io.sender is None
