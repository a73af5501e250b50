"""The memory-safe learner on one device, in one unattended run (``python -m bench.gpu_check``).

Needs torch, transformers and DeepSpeed only (no Ray, no vLLM, no download). On a CUDA
device (one H200: under 10 minutes) it measures the learner on the Qwen3-4B shape at 16k- and
20k-token responses, the chunked log-prob step against the full-logits one, and checks the
decoupled loss; without CUDA (or with ``--tiny``) it runs the same code on tiny shapes.
``--memory-cpu`` measures the CPU figures the memory plan is projected from. ``--real-model``
trains SmolLM2-135M's architecture (random weights from the config carried in
``smollm2_135m/``) with the learner settings of ``configs/smollm2-135m.yaml``: step time,
tokens/s, model FLOP/s against the device's matmul peak, memory, the weight-sync payload. On a
lent GPU machine: ``bash bench/gpu_check/run_on_device.sh`` (installs the carried wheels,
``wheels``). See ``docs/learner.md``.

- ``checks``: the three device checks (each in its own process);
- ``real_model``: the ``--real-model`` measurements (one process);
- ``wheels``: installs the carried wheels a GPU machine lacks, checks the imports;
- ``memory_cpu``: peak-memory measurements on the CPU (resident set, fresh processes);
- ``plan``: the per-GPU memory projection (arithmetic on those measurements);
- ``cli``: the command (``main``).
"""
from bench.gpu_check.cli import main

__all__ = ["main"]
