"""The DeepSpeed learner on one CUDA device: a correctness check and a throughput measurement.

    python -m bench.gpu_learner [--out DIR] [--shapes qwen3-4b,qwen3-0.6b] [--deadline-s S]

Part 1 (check, tiny policy, random init): one ``LearnerWorker`` rank on the GPU must pick
bf16 and NCCL by itself; its bf16 log-probs must agree with an fp32 transformers forward on
the same weights (first step: approx KL and clip fraction near 0 when the behaviour log-probs
come from that fp32 forward); three steps must move the weights and stay finite; a DeepSpeed
checkpoint must restore the weights exactly. Any failure raises AssertionError.

Part 2 (measure): a Qwen3-shaped model (random init, bf16, gradient checkpointing) trained by
the same ``LearnerWorker`` on B responses of prompt+response tokens. It reports trained
tokens/s and seconds per token per GPU: the learner constant ``s_per_token_gpu`` of
``bench.sim.LearnerModel``. Without CUDA, part 2 runs the tiny shape only (smoke).

Writes ``gpu_learner.json`` under --out (default bench/results).
"""
from bench.gpu_learner.cli import main
from bench.gpu_learner.core import (SHAPES, check, fp32_logprobs, measure, save_random_shape,
                                    synthetic_samples, timed_steps)

__all__ = ["SHAPES", "check", "fp32_logprobs", "main", "measure", "save_random_shape",
           "synthetic_samples", "timed_steps"]
