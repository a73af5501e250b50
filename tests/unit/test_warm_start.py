"""The warm-start loop both embedded policies share (``tasks.warm_start``), on a tiny model
for a few steps, and what each policy hands it; the full builds, bit-identical when rebuilt,
are in tests/integration/test_policy.py."""
from __future__ import annotations

import math

from tasks import arithmetic, arithmetic_policy, stepwise_policy
from tasks.policy_model import EOS, vocab
from tasks.warm_start import collate, train

TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=64)


def test_arithmetic_examples_mask_the_prompt_and_batches_are_seeded():
    v = vocab()
    problems = [next(arithmetic.train_stream(0)) for _ in range(1)]
    [(ids, labels)] = arithmetic_policy.examples(problems)
    p = problems[0]
    assert ids == [v[c] for c in p.prompt + p.answer] + [v[EOS]]
    assert labels == [-100] * len(p.prompt) + ids[len(p.prompt):]
    r = {**arithmetic_policy.RECIPE, "batch_size": 5}
    a, b = arithmetic_policy.batches(r), arithmetic_policy.batches(r)
    first = next(a)
    assert len(first) == 5 and first == next(b) and next(a) != first
    assert next(arithmetic_policy.batches({**r, "seed": 2})) != first


def tiny_run(recipe, lrs, logs):
    import torch
    from transformers import LlamaForCausalLM

    from tasks.policy_model import build_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(build_config(**TINY))
    source = arithmetic_policy.batches(recipe)

    def lr_at(step, rec):
        lrs.append(step)
        return rec["lr"] * (step + 1) / rec["steps"]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as build_policy does: bitwise-reproducible
    try:
        loss = train(model, recipe, source, lr_at, logs.append, loss_weight=0.1,
                     betas=(0.9, 0.98))
    finally:
        torch.set_num_threads(threads)
    return model, loss


def test_train_runs_the_recipes_steps_deterministically_and_ends_in_eval_mode():
    recipe = {**arithmetic_policy.RECIPE, "steps": 3, "batch_size": 4, "lr": 1e-2}
    lrs, logs = [], []
    model, loss = tiny_run(recipe, lrs, logs)
    assert lrs == [0, 1, 2] and math.isfinite(loss) and not model.training
    assert [line.split(" loss")[0] for line in logs] == ["step 1/3", "step 3/3"]
    again, loss2 = tiny_run(recipe, [], [])
    assert loss2 == loss
    a, b = model.state_dict(), again.state_dict()
    assert all((a[k] == b[k]).all() for k in a)  # one thread, same seed: the same weights


def test_each_policy_hands_the_loop_its_own_data_schedule_and_constants(monkeypatch):
    seen = {}

    def fake_train(model, recipe, batches, lr_at, log, **kw):
        seen[lr_at] = (next(batches), kw)
        return 0.5

    for mod in (arithmetic_policy, stepwise_policy):
        monkeypatch.setattr(mod, "train", fake_train)
    small = {**stepwise_policy.RECIPE, "pool": 64}
    assert stepwise_policy.warm_start(None, small, print) == 0.5
    batch, kw = seen[stepwise_policy.lr_at]
    assert kw == {"loss_weight": 0.05, "betas": (0.9, 0.98)}
    assert batch == next(stepwise_policy.batches(small))
    rec = arithmetic_policy.RECIPE
    assert arithmetic_policy.warm_start(None, rec, print) == 0.5
    batch, kw = seen[arithmetic_policy._lr_at]
    assert kw == {"loss_weight": 0.1}  # torch's default betas, as the recipe was built with
    assert batch == next(arithmetic_policy.batches(rec))
    assert stepwise_policy.collate is collate


def test_collate_of_arithmetic_examples_pads_right():
    batch = arithmetic_policy.examples([next(arithmetic.train_stream(1)) for _ in range(3)])
    ids, mask, labels = collate(batch)
    n = [len(i) for i, _ in batch]
    assert ids.shape == (3, max(n)) and mask.sum(1).tolist() == n
    assert labels[mask == 0].tolist() == [-100] * int((mask == 0).sum())


def test_the_policy_modules_import_no_torch():
    import subprocess
    import sys

    probe = ("import sys, tasks.warm_start, tasks.arithmetic_policy, tasks.stepwise_policy; "
             "print('torch' in sys.modules)")
    assert subprocess.check_output([sys.executable, "-c", probe], text=True).strip() == "False"
