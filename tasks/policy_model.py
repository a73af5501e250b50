"""The embedded policies' shape: a character tokenizer and a tiny Llama config.

Kept apart from the warm-start code (``tasks/policy.py``) so that tests and actors can build
a random policy of the same shape in a second, without training. Heavy imports are local.
Each task's recipe may override ``DEFAULT_ARCH`` (the stepwise policy needs more positions).
"""
from __future__ import annotations

import json
import string
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
# Printable ASCII plus newline: enough for arithmetic and for the math-prompt fixture.
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]

# Small enough to warm-start on 2 cores in minutes, large enough to learn multi-digit sums.
DEFAULT_ARCH = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)


def vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate(SPECIALS + CHARS)}


def build_tokenizer(max_length: int = DEFAULT_ARCH["max_position_embeddings"]):
    """A ``PreTrainedTokenizerFast`` with one token per character (vLLM and HF both load it);
    ``max_length`` is the model's context (its ``max_position_embeddings``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token=UNK))
    # Split every character into its own piece; keep it (behavior="isolated").
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, pad_token=PAD)
    fast.model_max_length = max_length
    return fast


def build_config(**overrides):
    from transformers import LlamaConfig

    v = vocab()
    arch = {**DEFAULT_ARCH, **overrides}
    return LlamaConfig(vocab_size=len(v), bos_token_id=v[BOS], eos_token_id=v[EOS],
                       pad_token_id=v[PAD], tie_word_embeddings=False, torch_dtype="float32",
                       rope_theta=10000.0, **arch)


def save_random_policy(path: str | Path, seed: int = 0, **arch_overrides) -> Path:
    """Write a randomly initialised policy as a Hugging Face checkpoint directory."""
    import torch
    from transformers import LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(build_config(**arch_overrides))
    save_policy(model, build_tokenizer(), path)
    return path


def save_policy(model, tokenizer, path: str | Path) -> None:
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    # vLLM reads generation_config.json for defaults; keep it neutral (no sampling overrides).
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": vocab()[BOS], "eos_token_id": vocab()[EOS], "pad_token_id": vocab()[PAD]}))
