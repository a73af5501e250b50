"""``optim.lora``: a real DeepSpeed learner (one rank, gloo, fp32, a tiny random Qwen3) trains
only its adapters; what it publishes is the merged policy under the base model's names, the
same function as the adapted model; its checkpoints hold the adapters alone and restore them;
its HF copy loads as a plain model. The engine runs in a fresh process (this file run as a
script) so that no torch.distributed state leaks into the test process.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def got(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    res = subprocess.run([sys.executable, __file__, str(tmp)], cwd=ROOT, timeout=600,
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_only_the_adapted_layers_move(got):
    assert got["published_names_equal_base"]
    assert got["steps_applied"] == 3
    moved = set(got["moved"])
    assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved)
    assert len(moved) == 2 * 2  # q_proj and v_proj of each of the 2 layers
    assert got["optimiser_params"] == got["trainable"] < got["total"] / 10


def test_published_weights_are_the_adapted_policy(got):
    # log-probs of the model rebuilt from the published weights vs the adapted model's own
    assert got["logprob_gap"] < 1e-5
    assert got["hf_copy_max_diff"] == 0.0


def test_the_checkpoint_holds_the_adapters_and_restores_them(got):
    assert got["ckpt_module_keys"] and all(".lora_" in k for k in got["ckpt_module_keys"])
    assert got["restored_max_diff"] == 0.0
    assert got["diverged_before_restore"] > 0.0


def _check(tmp: Path) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from bench.gpu_learner.core import SHAPES, save_random_shape, synthetic_samples
    from learner.config import LearnerConfig, LoraSpec
    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    path, _ = save_random_shape("tiny", tmp / "tiny")
    samples = synthetic_samples(12, 6, 9, SHAPES["tiny"]["vocab_size"], 0)
    cfg = LearnerConfig(lr=1e-2, micro_batch_size=4,
                        lora=LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj")))
    w = LearnerWorker(str(path), cfg, 0, 1, free_port())
    base = w.get_weights()
    with torch.no_grad():  # B starts at zero: give it a value so the merge is not trivial
        for name, p in w.model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.05)
    applied = sum(not w.train_step(samples).skipped for _ in range(3))
    after = w.get_weights()
    moved = sorted(k for k in after if not np.array_equal(after[k], base[k]))

    # The merged weights in a plain model give the adapted model's log-probs.
    plain = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    plain.load_state_dict({k: torch.from_numpy(v) for k, v in after.items()})
    ids = torch.tensor([s.prompt_token_ids + s.token_ids for s in samples[:4]])
    with torch.no_grad():
        gap = float((w.model(input_ids=ids).logits.log_softmax(-1)
                     - plain(input_ids=ids).logits.log_softmax(-1)).abs().max())
    hf = AutoModelForCausalLM.from_pretrained(w.save_hf(str(tmp / "hf")), dtype=torch.float32)
    hf_diff = max(float((hf.state_dict()[k] - torch.from_numpy(v)).abs().max())
                  for k, v in after.items())

    w.save_checkpoint(str(tmp / "ckpt"), {"step": 3})
    module = torch.load(next((tmp / "ckpt" / "step3").glob("*model_states.pt")),
                        weights_only=False)["module"]
    w.train_step(samples)
    diverged = max(float(np.abs(v - after[k]).max()) for k, v in w.get_weights().items())
    w.load_checkpoint(str(tmp / "ckpt"))
    restored = max(float(np.abs(v - after[k]).max()) for k, v in w.get_weights().items())
    trainable = sum(p.numel() for p in w.model.parameters() if p.requires_grad)
    in_opt = sum(p.numel() for g in w._opt.param_groups for p in g["params"])
    return {"published_names_equal_base": sorted(after) == sorted(base),
            "steps_applied": applied, "moved": moved, "trainable": trainable,
            "total": sum(p.numel() for p in w.model.parameters()), "optimiser_params": in_opt,
            "logprob_gap": gap, "hf_copy_max_diff": hf_diff, "ckpt_module_keys": list(module),
            "diverged_before_restore": diverged, "restored_max_diff": restored}


if __name__ == "__main__":
    print(json.dumps(_check(Path(sys.argv[1]))))
