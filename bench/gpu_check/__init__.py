"""The memory-safe learner on one device, in one unattended run (``python -m bench.gpu_check``).

Needs torch, transformers and DeepSpeed only (no Ray, no vLLM, no download). On a CUDA
device (one H200: under 10 minutes) it measures the learner on the Qwen3-4B shape at 16k- and
20k-token responses, the chunked log-prob step against the full-logits one, and checks the
decoupled loss; without CUDA (or with ``--tiny``) it runs the same code on tiny shapes.
``--memory-cpu`` measures the CPU figures the memory plan is projected from. See
``docs/learner.md``.

- ``checks``: the three device checks (each in its own process);
- ``memory_cpu``: peak-memory measurements on the CPU (resident set, fresh processes);
- ``plan``: the per-GPU memory projection (arithmetic on those measurements);
- ``cli``: the command (``main``).
"""
from bench.gpu_check.cli import main

__all__ = ["main"]
