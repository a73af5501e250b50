"""A real pretrained model through the whole system, measured: ``python -m bench.real_model``.

SmolLM2-135M-Instruct on plain-English arithmetic (``configs/smollm2-135m.yaml``), run the way
a user runs it (``python -m cluster.launch CONFIG``, a subprocess), with what the run's own
records cannot say measured beside it on the same machine:

- ``measure.matmul_peak``: this machine's float32 matrix-multiply rate at the learner's thread
  count (the learner's achieved FLOP/s is compared with it);
- ``measure.engine_curve``: one generator's engine alone (the generator class, in-process, one
  thread as in the run) at fixed batches of real prompts: the engine's own limit, which the
  generators' rate during the run is compared with, at the batch they actually ran;
- ``bench.throughput.memory.MemorySampler``: each role's peak resident memory during the run.

``analysis`` turns the run directory and those measurements into the result (pure: tested on
a recorded run); ``plot`` draws it.
"""
