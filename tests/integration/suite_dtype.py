"""The dtype the suite's runs compute in on this CPU, and the tolerances that follow it.

``dtype: auto`` on a CPU takes the dtype probe's choice (common/cpu_dtype.py); tests/conftest.py
forces that choice to float32 unless the caller set ``V05_CPU_DTYPE`` (``V05_CPU_DTYPE=bf16
python -m pytest`` runs the suite as a CPU whose probe picks bf16 runs it). Two computations
that round differently (vLLM's kernels and transformers', ZeRO-3's gathers and one rank's) agree
to float32's rounding in float32 and to bf16's in bf16 (8 bits of mantissa against 24): a test
comparing them takes its tolerance from ``by_dtype``, each pair measured (the test says where).
"""
from __future__ import annotations

import os

from common.cpu_dtype import CHOICES, FORCE_ENV

DTYPE = os.environ.get(FORCE_ENV) or "fp32"
assert DTYPE in CHOICES, f"{FORCE_ENV}={DTYPE!r}: must be one of {CHOICES}"


def by_dtype(fp32, bf16):
    """``fp32`` where the suite's runs compute in float32, ``bf16`` where in bf16."""
    return bf16 if DTYPE == "bf16" else fp32
