"""The learner's bf16 on a CPU (``optim.dtype: bf16``, or ``auto`` where this machine's probe
chooses it): a real DeepSpeed step under bf16 autocast over float32 weights and optimiser
state, on a tiny random Qwen3 (one rank, gloo), against the same step in float32 from the
same weights. Its weights stay float32, its update agrees with float32's to bf16's precision,
and the off-policy figures see the mismatch (float32 behaviour log-probs: none in float32,
a small one in bf16). Each dtype in a fresh process (this file run as a script): no
torch.distributed state leaks into the test process, nor from one dtype into the other.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def step_in(dtype: str, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    res = subprocess.run([sys.executable, __file__, dtype, str(tmp)], cwd=ROOT, timeout=600,
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_bf16_on_a_cpu_trains_float32_weights_under_autocast_as_float32_does(tmp_path):
    fp32, bf16 = step_in("fp32", tmp_path), step_in("bf16", tmp_path)
    assert (fp32["autocast"], bf16["autocast"]) == (False, True)
    assert fp32["weights"] == bf16["weights"] == ["torch.float32"]
    assert not fp32["skipped"] and not bf16["skipped"]
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=0.05, abs=1e-3)
    assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.05)
    import torch  # the update: float32's direction, bf16's rounding only

    a, b = (torch.load(tmp_path / f"update-{d}.pt") for d in ("fp32", "bf16"))
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.95
    assert fp32["approx_kl"] < 1e-9 < bf16["approx_kl"] < 1e-2
    assert abs(bf16["is_weight"] - 1) < 0.05


def _step(dtype: str, tmp: Path) -> dict:
    import torch

    from bench.gpu_learner.core import SHAPES, fp32_logprobs, save_random_shape, synthetic_samples
    from learner.config import LearnerConfig
    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    path = tmp / "tiny"  # the first dtype's process makes it; both start from its weights
    if not (path / "config.json").exists():
        save_random_shape("tiny", path)
    samples = synthetic_samples(8, 6, 12, SHAPES["tiny"]["vocab_size"], 0,
                                fp32_logprobs(str(path)))
    w = LearnerWorker(str(path), LearnerConfig(dtype=dtype, lr=1e-3, micro_batch_size=4),
                      0, 1, free_port())
    before = torch.cat([p.detach().flatten().clone() for p in w.model.parameters()])
    r = w.train_step(samples)
    after = torch.cat([p.detach().flatten() for p in w.model.parameters()])
    torch.save(after - before, tmp / f"update-{dtype}.pt")
    out = {"autocast": w.autocast, "weights": sorted({str(p.dtype) for p in w.model.parameters()}),
           "loss": r.loss, "grad_norm": r.grad_norm, "approx_kl": r.approx_kl,
           "is_weight": r.is_weight, "skipped": r.skipped}
    w.close()
    return out


if __name__ == "__main__":
    print(json.dumps(_step(sys.argv[1], Path(sys.argv[2]))))
