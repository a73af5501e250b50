"""The text views the embedded prior may fit on besides the sentence embedding: hashed
character n-grams (a prompt's literal tokens) and a few surface magnitudes (its numbers, its
length). Task-agnostic, pure NumPy; ``prior.EmbeddedPrior`` caches and combines them
(``VIEWS``: "embedding", "ngram", "both" (the two concatenated), "surface").
"""
from __future__ import annotations

import re

import numpy as np

NGRAM_DIM = 2048       # hashed buckets of the character n-gram view
NGRAM_ORDERS = (1, 2, 3)
VIEWS = ("embedding", "ngram", "both", "surface")
SURFACE_NUMBERS = 3    # the surface view reads the last this many numbers of a prompt


def hashed_ngrams(texts: list[str], dim: int = NGRAM_DIM,
                  orders: tuple[int, ...] = NGRAM_ORDERS) -> np.ndarray:
    """Character n-grams of each text hashed into ``dim`` buckets (crc32), counts damped to
    1 + log(count), rows unit-norm: a view that sees a prompt's literal tokens (its numbers,
    operators, step counts), which a sentence embedding smooths over. Task-agnostic. (n, dim)"""
    import zlib

    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, t in enumerate(texts):
        counts: dict[int, int] = {}
        for n in orders:
            for j in range(len(t) - n + 1):
                b = zlib.crc32(t[j:j + n].encode()) % dim
                counts[b] = counts.get(b, 0) + 1
        if counts:
            idx = np.fromiter(counts, dtype=np.int64)
            out[i, idx] = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float32))
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


_NUMBER = re.compile(r"\d+")


def surface_features(texts: list[str], last: int = SURFACE_NUMBERS) -> np.ndarray:
    """What any prompt's surface says about its size, in a few numbers: for each of its last
    ``last`` numbers (runs of digits, the last first) log(1 + value), its digit count and
    whether it is absent; how many numbers it holds; log(1 + characters). A count, a step
    number, an operand's size: the magnitudes a linear model can rank by, which hashed n-grams
    (one bucket per literal) and a sentence embedding cannot. Reads digits, not a format:
    the same for any task. (n, 3 * last + 2)"""
    out = np.zeros((len(texts), 3 * last + 2))
    for i, t in enumerate(texts):
        nums = _NUMBER.findall(t)
        for j, d in enumerate(reversed(nums[-last:])):
            out[i, 3 * j:3 * j + 2] = np.log1p(float(d[-15:])), len(d)
        out[i, 3 * len(nums[-last:]) + 2:3 * last:3] = 1.0   # the absent ones' flags
        out[i, 3 * last:] = len(nums), np.log1p(len(t))
    return out
