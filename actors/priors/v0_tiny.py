"""A tiny, randomly initialised V0 file set, built from configs, in the layout ``v0.py`` loads.

Nothing is downloaded and no published weight is used: every component is a small stand-in of
the same kind, so that the real loading and prediction code (``v0.py``, ``v0_model.py``) runs
on a CPU in seconds, in the unit tests and as a smoke check:

- ``Qwen3-Embedding-0.6B/``: a 1-layer ``Qwen3Model`` (hidden 32) saved by ``save_pretrained``
  (config.json + model.safetensors) with a byte-level BPE tokenizer trained here on a few
  sentences (tokenizer.json), which appends ``<|endoftext|>`` to every text and pads with it,
  as Qwen3-Embedding's does;
- ``v_0_for_grpo_training.pt``: a dynamic-query adapter's ``model_state_dict`` under the DDP
  ``module.`` prefix, with the ``args`` V0's training script saves;
- ``pretrained/tabpfn-v2.5-classifier-v2.5_default.ckpt``: either a 1-layer TabPFN v2.5
  architecture with random weights (needs the ``tabpfn`` package, ``head="tabpfn"``), or the
  parameters of ``SimilarityHead``, a deterministic in-context classifier with TabPFN's
  ``fit`` / ``predict_proba`` interface (``head=SIMILARITY_HEAD``), for machines without tabpfn.

Predictions of such a model carry no meaning; shapes, ranges, determinism and error paths do.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from actors.priors.v0 import CHECKPOINT, EMBEDDING_MODEL, TABPFN_HEAD

SIMILARITY_HEAD = "actors.priors.v0_tiny:load_similarity_head"
HIDDEN = 32
EOS = "<|endoftext|>"
_CORPUS = [
    "What is 12 plus 30? Answer with a number.",
    "Prove that there are infinitely many primes.",
    "Let f be a continuous function with f(x + y) = f(x) f(y). Find all such f.",
    "A train travels 60 km in 45 minutes. What is its average speed in km/h?",
    "Compute the sum of the digits of 2^10.",
    "Three builders build a house in 60 days; how many are needed for 10 days?",
]


def write_tokenizer(out_dir: Path, vocab_size: int = 384) -> int:
    """A byte-level BPE tokenizer (any text encodes) trained on a few sentences; returns the
    vocabulary size. Saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    eos_id = tok.token_to_id(EOS)
    # Qwen3-Embedding appends EOS to each text: its last-token pooling reads that position.
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}",
                                                       special_tokens=[(EOS, eos_id)])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                            padding_side="left").save_pretrained(str(out_dir))
    return tok.get_vocab_size()


def write_backbone(out_dir: Path, vocab_size: int, seed: int = 0) -> None:
    """A 1-layer Qwen3 encoder (hidden 32) with random weights, as a local HF directory."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, max_position_embeddings=512, pad_token_id=0)
    Qwen3Model(config).save_pretrained(str(out_dir))


def write_checkpoint(path: Path, num_queries: int = 5, embed_dim: int = 6, num_heads: int = 3,
                     target_dim: int = 24, seed: int = 0, corrupt: bool = False) -> None:
    """V0's training checkpoint: a dynamic-query adapter (num_queries * embed_dim features,
    avg-pooled down to target_dim) under DDP's ``module.`` prefix. ``corrupt`` puts a NaN in
    the adapter's weights (garbage in: the server must reject what comes out)."""
    import torch

    from actors.priors.v0_model import QueryAdapter

    torch.manual_seed(seed)
    adapter = QueryAdapter(HIDDEN, num_queries, embed_dim, num_heads, bottleneck=16)
    with torch.no_grad():
        torch.nn.init.normal_(adapter.static_queries)
        if corrupt:
            adapter.proj_kv.weight[0, 0] = float("nan")
    state = {f"module.adapter_layer.{k}": v for k, v in adapter.state_dict().items()}
    torch.save({"model_state_dict": state,
                "args": {"pooling_strategy": "dynamic_query", "num_heads": num_heads,
                         "target_dim": target_dim}}, str(path))


def write_tabpfn_head(path: Path, seed: int = 0) -> None:
    """A 1-layer TabPFN v2.5 classifier with random weights, saved as tabpfn saves one (the
    file name's "v2.5" selects the architecture's defaults on load). Needs ``tabpfn``."""
    import dataclasses

    import torch
    from tabpfn.architectures import ARCHITECTURES

    arch = ARCHITECTURES["tabpfn_v2_5"]
    config, _ = arch.parse_config({"emsize": 16, "nlayers": 1, "nhead": 2,
                                   "features_per_group": 3, "num_thinking_rows": 2,
                                   "encoder_mlp_hidden_dim": 16, "max_num_classes": 10})
    torch.manual_seed(seed)
    model = arch.get_architecture(config)
    with torch.no_grad():                  # break the symmetric init: outputs that vary
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    torch.save({"state_dict": model.state_dict(), "config": dataclasses.asdict(config),
                "architecture_name": "tabpfn_v2_5"}, str(path))


class SimilarityHead:
    """In-context classifier with TabPFN's interface: P(class 1 | x) is the label mean of the
    context, weighted by softmax(cosine similarity of standardized features / temperature),
    shrunk toward the context's base rate by ``prior_weight`` pseudo-observations. Pure NumPy,
    deterministic; NaN features give NaN probabilities (nothing hides garbage)."""

    def __init__(self, temperature: float = 0.2, prior_weight: float = 1.0):
        self.temperature, self.prior_weight = float(temperature), float(prior_weight)
        self._X = self._y = self._mu = self._sd = None

    def _unit(self, X: np.ndarray) -> np.ndarray:
        Z = (np.asarray(X, np.float64) - self._mu) / self._sd
        return Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)

    def fit(self, X: np.ndarray, y: np.ndarray) -> "SimilarityHead":
        X = np.asarray(X, np.float64)                                     # (N, F)
        self._mu, self._sd = X.mean(0), X.std(0) + 1e-6
        self._X, self._y = self._unit(X), np.asarray(y, np.float64)       # (N, F), (N,)
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        S = self._unit(X) @ self._X.T / self.temperature                  # (M, N)
        W = np.exp(S - S.max(axis=1, keepdims=True))
        base = self._y.mean()
        p1 = (W @ self._y + self.prior_weight * base) / (W.sum(1) + self.prior_weight)
        return np.stack([1.0 - p1, p1], axis=1)                           # (M, 2)


def load_similarity_head(path: Path, device: str, n_estimators: int) -> SimilarityHead:
    """The ``head`` factory for SimilarityHead: its parameters from the head file."""
    import torch
    params = torch.load(str(path), map_location="cpu", weights_only=True)
    return SimilarityHead(**params)


def write_tiny_v0(root: str | Path, head: str = "similarity", seed: int = 0,
                  corrupt: bool = False) -> Path:
    """Write the whole tiny V0 under ``root`` (the ``path`` option); returns ``root``.
    ``head``: "similarity" (no tabpfn needed) or "tabpfn"."""
    import torch

    root = Path(root)
    emb_dir = root / EMBEDDING_MODEL
    emb_dir.mkdir(parents=True, exist_ok=True)
    write_backbone(emb_dir, write_tokenizer(emb_dir), seed=seed)
    write_checkpoint(root / CHECKPOINT, seed=seed, corrupt=corrupt)
    head_path = root / TABPFN_HEAD
    head_path.parent.mkdir(parents=True, exist_ok=True)
    if head == "tabpfn":
        write_tabpfn_head(head_path, seed=seed)
    elif head == "similarity":
        torch.save({"temperature": 0.2, "prior_weight": 1.0}, str(head_path))
    else:
        raise ValueError(f"head must be 'similarity' or 'tabpfn', got {head!r}")
    return root
