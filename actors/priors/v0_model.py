"""The V0 network (torch): Qwen3-Embedding backbone, residual query adapter, TabPFN head.

Imported only by ``actors/priors/v0.py`` once every file is known to be present. Module and
parameter names mirror the published checkpoint's ``model_state_dict`` (``backbone.*``,
``adapter_layer.*``) so it loads as saved; the adapter's shape is read from the checkpoint
(``args`` when saved, else the parameter shapes).

Precision: the backbone runs in ``dtype`` (bfloat16 on a GPU, float32 on the CPU: see
``v0.default_dtype``); its hidden states are cast to float32 before the adapter, which stays in
float32 as it was trained. The unit tests run all of this on a tiny random V0-shaped model
(``actors/priors/v0_tiny.py``); the real weights never ran here.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def last_token_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, H), (B, T) -> (B, H): the hidden state of each row's last real token."""
    if bool(mask[:, -1].all()):                        # left padding: the last column is real
        return hidden[:, -1]
    last = mask.sum(dim=1) - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class QueryAdapter(nn.Module):
    """Cross-attention pooling: ``num_queries`` learned queries (plus, when ``dynamic``, a
    per-prompt offset generated from the last-token state) attend over all token states.
    Output (B, num_queries * embed_dim)."""

    def __init__(self, hidden: int, num_queries: int, embed_dim: int, num_heads: int,
                 bottleneck: int = 128, dynamic: bool = True):
        super().__init__()
        self.dynamic, self.num_queries, self.embed_dim = dynamic, num_queries, embed_dim
        q = torch.zeros(1, num_queries, embed_dim)
        if dynamic:
            self.static_queries = nn.Parameter(q)
            self.generator = nn.Sequential(
                nn.Linear(hidden, bottleneck), nn.LayerNorm(bottleneck), nn.GELU(),
                nn.Dropout(0.0), nn.Linear(bottleneck, num_queries * embed_dim))
        else:
            self.queries = nn.Parameter(q)
        self.proj_kv = nn.Linear(hidden, embed_dim)
        self.mha = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.ln_q = nn.LayerNorm(embed_dim)
        self.ln_kv = nn.LayerNorm(embed_dim)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b = hidden.shape[0]
        if self.dynamic:
            delta = self.generator(last_token_pool(hidden, mask))
            q = self.static_queries.expand(b, -1, -1) + delta.view(b, self.num_queries, self.embed_dim)
        else:
            q = self.queries.expand(b, -1, -1)
        kv = self.proj_kv(hidden)                                        # (B, T, E)
        out, _ = self.mha(self.ln_q(q), self.ln_kv(kv), kv, key_padding_mask=~mask.bool())
        return out.reshape(b, -1)


class V0Embedder(nn.Module):
    """Prompts -> V0 features (n, F) as float32 numpy, F <= target_dim (avg-pooled down)."""

    def __init__(self, model_dir: Path, adapter: nn.Module | None, device: str,
                 batch_size: int, max_length: int, target_dim: int,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()          # no "Loading weights" bar on the CLI's stderr
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left",
                                                       local_files_only=True)
        # An explicit dtype: transformers 5 otherwise loads the config's (bfloat16 for
        # Qwen3-Embedding), which is slow on a CPU.
        self.backbone = AutoModel.from_pretrained(str(model_dir), local_files_only=True,
                                                  dtype=dtype)
        self.adapter_layer = adapter
        self.device, self.batch_size, self.max_length = device, batch_size, max_length
        self.target_dim = target_dim

    @torch.inference_mode()
    def encode(self, prompts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(prompts), self.batch_size):
            batch = self.tokenizer(prompts[i:i + self.batch_size], max_length=self.max_length,
                                   padding=True, truncation=True, return_tensors="pt").to(self.device)
            hidden = self.backbone(**batch).last_hidden_state.float()    # (B, T, H)
            mask = batch["attention_mask"]
            emb = (self.adapter_layer(hidden, mask) if self.adapter_layer is not None
                   else last_token_pool(hidden, mask))
            if emb.shape[1] > self.target_dim:
                emb = F.adaptive_avg_pool1d(emb.unsqueeze(1), self.target_dim).squeeze(1)
            out.append(emb.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.target_dim), np.float32)


def _adapter_from_state(state: dict, args: dict, hidden: int, num_heads: int) -> nn.Module | None:
    """Rebuild the adapter the checkpoint was trained with (None: last-token pooling)."""
    strategy = args.get("pooling_strategy")
    if strategy is None:
        strategy = ("dynamic_query" if "adapter_layer.static_queries" in state else
                    "fixed_query" if "adapter_layer.queries" in state else "last_token")
    if strategy == "last_token":
        return None
    dynamic = strategy == "dynamic_query"
    q = state["adapter_layer.static_queries" if dynamic else "adapter_layer.queries"]
    bottleneck = state["adapter_layer.generator.0.weight"].shape[0] if dynamic else 128
    return QueryAdapter(hidden, q.shape[1], q.shape[2], int(args.get("num_heads", num_heads)),
                        bottleneck=bottleneck, dynamic=dynamic)


def load_v0_checkpoint(checkpoint: Path) -> dict:
    """V0's training checkpoint, read with ``torch.load(weights_only=True)``: tensors,
    containers and plain values only, so a file that holds code (a pickle's ``__reduce__``)
    is refused instead of run. What V0 saves is that: ``model_state_dict`` (tensors) and
    ``args``, a dict of its training settings, or the ``argparse.Namespace`` a training
    script keeps them in (allowed by name, read back as a dict)."""
    import argparse

    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            ckpt = torch.load(str(checkpoint), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = next((ln for ln in str(err).splitlines() if ln.strip()), "")
        raise ValueError(f"V0 checkpoint {checkpoint} holds more than weights and settings, "
                         f"so it is not loaded (torch.load weights_only=True: {first[:300]})"
                         ) from None
    if not isinstance(ckpt, dict):
        raise ValueError(f"V0 checkpoint {checkpoint} holds a {type(ckpt).__name__}, not the "
                         "dict of model_state_dict and args that V0 saves")
    if isinstance(ckpt.get("args"), argparse.Namespace):
        ckpt["args"] = vars(ckpt["args"])
    return ckpt


def build_embedder(checkpoint: Path, model_dir: Path, device: str, num_heads: int,
                   batch_size: int, max_length: int, dtype: str = "float32") -> V0Embedder:
    """The backbone (in ``dtype``) + the adapter (float32) with the checkpoint's weights, on
    ``device``, in eval mode."""
    ckpt = load_v0_checkpoint(checkpoint)
    state = ckpt.get("model_state_dict", ckpt)
    for prefix in ("module.", "embedding_model."):
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    args = ckpt.get("args") or {}
    import json
    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
    adapter = _adapter_from_state(state, args, hidden, num_heads)
    emb = V0Embedder(model_dir, adapter, device, batch_size, max_length,
                     int(args.get("target_dim", 1024)), dtype=getattr(torch, dtype))
    missing, unexpected = emb.load_state_dict(state, strict=False)
    if adapter is not None and any(k.startswith("adapter_layer.") for k in missing):
        raise ValueError(f"V0 checkpoint {checkpoint} lacks adapter weights: "
                         f"{[k for k in missing if k.startswith('adapter_layer.')]}")
    return emb.to(device).eval()          # .to(device) keeps each part's dtype


def build_tabpfn(head: Path, device: str, n_estimators: int):
    """The TabPFN classifier head, from its local checkpoint (sklearn-style fit/predict_proba).

    float32 inference as V0 ran it; ``random_state`` 0 makes the ensemble's feature and class
    shuffles, hence the predictions, repeatable. Nothing is downloaded: the file is checked
    before this is called, and tabpfn only downloads a checkpoint that is absent."""
    from tabpfn import TabPFNClassifier
    return TabPFNClassifier(model_path=str(head), device=device, n_estimators=int(n_estimators),
                            inference_precision=torch.float32, random_state=0)
