"""``optim.grad_noise``: the learner's gradient noise-to-signal, read from one accumulation
(the first prompt half's gradient copied before the second half's backward), equals the same
figure from two separate backward passes over the halves, on a real DeepSpeed engine (one
rank, gloo, fp32, a tiny random Qwen3). The engine runs in a fresh process (this file run as
a script) so that no torch.distributed state leaks into the test process.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_the_noise_from_one_accumulation_equals_two_separate_halves(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    res = subprocess.run([sys.executable, __file__, str(tmp_path)], cwd=ROOT, timeout=600,
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["halves"] == [True, True]  # both halves hold prompts
    assert got["measured"] == pytest.approx(got["expected"], rel=1e-6)
    assert got["measured"] > 0 and got["applied"]


def _check(tmp: Path) -> dict:
    import numpy as np

    from bench.gpu_learner.core import SHAPES, save_random_shape, synthetic_samples
    from learner.batch import plan_micro_batches, prompt_halves
    from learner.config import LearnerConfig
    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    path, _ = save_random_shape("tiny", tmp / "tiny")
    one = synthetic_samples(12, 6, 9, SHAPES["tiny"]["vocab_size"], 0)
    # 12 prompts with 3 samples each (the same prompt, different responses and advantages)
    samples = [s for i, s in enumerate(one) for s in
               [s] + [s.__class__(s.prompt_token_ids, one[(i + j) % 12].token_ids,
                                  one[(i + j) % 12].logprobs, -s.advantage * j / 2, 0)
                      for j in (1, 2)]]
    cfg = LearnerConfig(lr=1e-3, micro_batch_size=4, grad_noise=True)
    w = LearnerWorker(str(path), cfg, 0, 1, free_port())
    a, b = prompt_halves(samples)
    n_tok = sum(len(s.token_ids) for s in samples)

    def grad_of(half):
        micro = plan_micro_batches(half, cfg.micro_batch_tokens, cfg.micro_batch_size)
        w.engine.zero_grad()
        w._forward_backward(micro, n_tok)
        g = w._flat_grad().numpy()
        w.engine.zero_grad()
        return g

    g_a, g_b = grad_of(a), grad_of(b)
    share = sum(len(s.token_ids) for s in a) / n_tok
    est_a, est_b = g_a / share, g_b / (1 - share)
    expected = float(np.sum((est_a - est_b) ** 2) / np.sum(((est_a + est_b) / 2) ** 2))
    step = w.train_step(samples)
    return {"expected": expected, "measured": step.grad_noise_to_signal,
            "applied": not step.skipped, "halves": [bool(a), bool(b)]}


if __name__ == "__main__":
    print(json.dumps(_check(Path(sys.argv[1]))))
