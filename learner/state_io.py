"""What goes in and out of a learner rank besides training: its weights (to the generators,
or as a state dict), DeepSpeed checkpoints and a Hugging Face copy. ``StateIO`` does it for
one rank; ``LearnerWorker`` (learner/worker.py) owns one, built from exactly what it needs
(the engine, the policy, the rank, the model's files, two facts of the config), and keeps
the training state itself: a checkpoint's update count is passed in to a save and handed
back by a load. Every method that gathers under ZeRO-3 must be called on every rank."""
from __future__ import annotations

import contextlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

# Files of an HF checkpoint directory that are not weights: copied next to saved weights.
_AUX_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json", "vocab.json", "merges.txt", "chat_template.jinja")
_CLIENT_KEY = "v05_client_state"
_STEP_KEY = "learner_step"  # the update count: where the lr schedule resumes


class UnsafeCheckpointFile(ValueError):
    """A checkpoint file holds more than tensors, containers, plain values and DeepSpeed's own
    data classes: ``torch.load(weights_only=True)`` refused it, so nothing of it ran."""


def safe_globals() -> list:
    """DeepSpeed's plain-data classes that its checkpoints pickle, found by loading ZeRO stages
    0-3 in fp32 and bf16 with ``torch.load(weights_only=True)``: allowed by name, nothing else
    is (a class is built from its saved fields; none of these runs code on it)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def weights_only_load(path, map_location=None):
    """What DeepSpeed's checkpoint engine loads with (``torch.load(weights_only=False)``, a
    pickle that may run code), loaded weights-only instead: a file holding anything else
    raises ``UnsafeCheckpointFile`` naming it, unrun."""
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        text = " ".join(str(err).split())  # torch's advice trimmed off: only what it refused
        why = re.search(r"WeightsUnpickler error: (.*?)(?: Please use| Check the doc|$)", text)
        why = why.group(1).rstrip(". ") if why else text
        raise UnsafeCheckpointFile(f"{path}: refused by a weights-only load ({why[:300]}); "
                                   "nothing of it ran") from None


def load_weights_only(engine) -> None:
    """Every load of ``engine``'s checkpoints (model states, optimiser shards) goes through
    ``weights_only_load``: a checkpoint's files cannot run code, so they need no signature
    to be trusted (cluster/records/checkpoints.py keeps their digests for integrity)."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
        TorchCheckpointEngine)

    ckpt = engine.checkpoint_engine
    if type(ckpt) is not TorchCheckpointEngine:
        raise RuntimeError(f"DeepSpeed chose the {type(ckpt).__name__} checkpoint engine; "
                           "the learner loads checkpoints weights-only through "
                           "TorchCheckpointEngine's load only")
    ckpt.load = weights_only_load  # this engine's loads only: not a global patch


@dataclass(frozen=True)
class Restored:
    """What a checkpoint load hands back to the rank's owner."""

    client_state: dict  # the caller's state, as given to the save
    step: int | None    # the learner's update count at the save; None: the checkpoint has none


class StateIO:
    """One rank's weights and checkpoints, in and out. ``engine``: the rank's DeepSpeed
    engine (its checkpoint loads are made weights-only here); ``model``: the HF policy
    inside it; ``zero3``: parameters are partitioned (gather before reading them);
    ``lora``: the policy carries LoRA adapters (merged on the way out, saved alone).
    Holds rank 0's weight sender, once ``connect_weight_sync`` ran."""

    def __init__(self, engine, model, rank: int, model_path: str, zero3: bool, lora: bool):
        load_weights_only(engine)
        self.engine, self.model, self.rank = engine, model, rank
        self.model_path = str(model_path)
        self.zero3, self.lora = zero3, lora
        self.sender = None  # rank 0's WeightSender, once connect_weight_sync ran

    @contextlib.contextmanager
    def _gathered(self):
        """Under ZeRO-3, materialise full parameters on every rank (a collective)."""
        if self.zero3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()),
                                                   modifier_rank=None):
                yield
        else:
            yield

    def _policy_state(self) -> dict:
        """The policy's weights under the HF model's names: its state dict, or under LoRA the
        merged weights (``learner.lora.merged_state_dict``). Call inside ``_gathered``."""
        if not self.lora:
            return self.model.state_dict()
        from learner.lora import merged_state_dict

        return merged_state_dict(self.model)

    def get_weights(self, all_ranks: bool = False) -> dict:
        """Full fp32 state dict {HF parameter name: np.ndarray}; {} on ranks > 0 unless all_ranks.
        Every rank must be called (ZeRO-3 gathers)."""
        with self._gathered():
            if self.rank != 0 and not all_ranks:
                return {}
            return {k: v.detach().float().cpu().numpy().copy()
                    for k, v in self._policy_state().items()}

    def connect_weight_sync(self, transport: str | dict, generators: list) -> None:
        """Rank 0 hosts the weight sender, next to the weights: with ``nccl``/``gloo`` it
        builds the broadcast group with ``generators`` and broadcasts from this rank (the
        driver needs no GPU), with ``object_store`` this rank puts the state dict into its
        node's object store. ``transport``: a transport name or a ``WeightSyncConfig``
        mapping. Other ranks do nothing."""
        if self.rank != 0:
            return
        from common.weight_sync import make_sender

        if self.sender is not None:
            self.sender.close()
        self.sender = make_sender(transport)
        self.sender.connect(generators)

    def publish_weights(self, generators: list, version: int) -> tuple:
        """Send this learner's weights to ``generators`` as ``version``. Every rank must be
        called (ZeRO-3 gathers). Returns, on rank 0, (payload, one ref per generator of its
        ``update_weights``: seconds taken, or ``RayActorError``/pending for a generator
        that was dead or hung and did not get them); on other ranks (None, [])."""
        with self._gathered():
            if self.rank != 0:
                return None, []
            if self.sender is None:
                raise RuntimeError("publish_weights before connect_weight_sync")
            # The live tensors: the object store makes its NumPy copies (bf16 widened), a
            # broadcast sends them in the training dtype from this rank's device.
            return self.sender.send(generators, self._policy_state(), version)

    def save_checkpoint(self, ckpt_dir: str, client_state: dict, step: int) -> str:
        """DeepSpeed checkpoint (model, optimiser, engine) + ``client_state`` + the learner's
        update count ``step`` (the tag: ``step<step>``); all ranks call. Under LoRA the model
        part is the adapters only (the frozen base is the model's files)."""
        tag = f"step{step}"
        # Under one key: DeepSpeed's load returns its own entries (optimizer, ds_config...) too.
        state = {_CLIENT_KEY: dict(client_state), _STEP_KEY: int(step)}
        self.engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=state,
                                    exclude_frozen_parameters=self.lora)
        return str(Path(ckpt_dir) / tag)

    def load_checkpoint(self, ckpt_dir: str, tag: str | None = None) -> Restored:
        """Restore the engine from the latest (or ``tag``) checkpoint; all ranks call. Returns
        the saved client_state and update count, for the caller to take back."""
        # Under LoRA the checkpoint holds the adapters alone: the base stays as loaded.
        path, state = self.engine.load_checkpoint(str(ckpt_dir), tag=tag,
                                                  load_module_strict=not self.lora)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint found in {ckpt_dir} (tag={tag})")
        state = state or {}
        step = state.get(_STEP_KEY)
        return Restored(dict(state.get(_CLIENT_KEY, {})), None if step is None else int(step))

    def save_hf(self, out_dir: str) -> str:
        """Write the current weights as an HF checkpoint (rank 0), with the tokenizer files."""
        import torch

        with self._gathered():
            if self.rank != 0:
                return ""
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            sd = {k: v.detach().to("cpu", torch.float32).contiguous()
                  for k, v in self._policy_state().items()}
            self.model.save_pretrained(out, state_dict=sd, safe_serialization=True)
        for name in _AUX_FILES:
            src = Path(self.model_path) / name
            if src.exists():
                shutil.copy(src, out / name)
        return str(out)

    def close(self) -> None:
        """Close rank 0's weight sender, if any."""
        if self.sender is not None:
            self.sender.close()
            self.sender = None
