"""The stepwise policy's recipe pieces (warm-start data, schedule, registry) and the
measurement helpers of ``tasks.policy_eval``; no model is trained here (see
tests/integration/test_policy.py for the builds)."""
from __future__ import annotations

import math
import random

import pytest

from tasks import stepwise
from tasks.policy import POLICIES, STEPWISE, policy_recipe, recipe_hash
from tasks.policy_eval import length_stats, pass_at_k, score
from tasks.policy_model import EOS, PAD, vocab
from tasks.stepwise_policy import MAX_TOKENS, RECIPE, batches, collate, examples, lr_at


def small(**kw) -> dict:
    return {**RECIPE, "pool": 64, **kw}


def test_registry_maps_tasks_to_recipes():
    assert set(POLICIES) == {"stepwise", "arithmetic"}
    assert policy_recipe() is STEPWISE and policy_recipe("stepwise").recipe is RECIPE
    assert POLICIES["arithmetic"].max_tokens == 8
    with pytest.raises(ValueError, match="no embedded policy for task 'math_jsonl'"):
        policy_recipe("math_jsonl")


def test_recipe_hash_keys_every_constant_and_the_task():
    base = recipe_hash()
    assert base == recipe_hash(RECIPE, task="stepwise") and len(base) == 12
    assert recipe_hash({**RECIPE, "slip_rate": 0.2}) != base
    assert recipe_hash(task="arithmetic") != base


def test_max_tokens_covers_the_longest_trace_and_fits_the_context():
    longest = stepwise.MAX_TRACE_CHARS + 12 + 1  # a repeated step, EOS
    assert longest <= MAX_TOKENS
    assert len("99-9 x20\n") + MAX_TOKENS <= STEPWISE.arch["max_position_embeddings"]


def decode(ids: list[int]) -> str:
    inv = {i: c for c, i in vocab().items()}
    return "".join(inv[i] for i in ids)


def test_examples_are_prompt_trace_eos_with_the_prompt_masked():
    v = vocab()
    source = examples(stepwise.train_stream(0), 0.12, random.Random(0))
    for ids, labels in (next(source) for _ in range(50)):
        prompt, completion = decode(ids[:-1]).split("\n", 1)
        assert stepwise.parse_prompt(prompt + "\n")
        assert completion.rsplit("\n", 1)[-1].startswith(stepwise.ANSWER_PREFIX)
        assert ids[-1] == v[EOS]
        n_prompt = len(prompt) + 1
        assert labels[:n_prompt] == [-100] * n_prompt and labels[n_prompt:] == ids[n_prompt:]


def test_batches_respect_the_budget_are_deterministic_and_clean_first():
    r = small(batch_tokens=1024, steps=40, clean_frac=0.5)
    a, b = batches(r), batches(r)
    task = stepwise.StepwiseTask()
    wrong = []
    for step in range(40):
        ba, bb = next(a), next(b)
        assert ba == bb
        longest = max(len(ids) for ids, _ in ba)
        assert len(ba) == 1 or len(ba) * longest <= 1024
        for ids, _ in ba:
            prompt, completion = decode(ids[:-1]).split("\n", 1)
            p = stepwise.make_problem(stepwise.parse_prompt(prompt + "\n"))
            wrong.append((step, task.score(p, completion).reward < 0))
    assert not any(w for step, w in wrong if step < 20)  # correct traces only
    assert 0.2 < sum(w for step, w in wrong if step >= 20) / sum(s >= 20 for s, _ in wrong) < 0.8
    other = batches({**r, "seed": 2})
    assert [next(other) for _ in range(3)] != [next(batches(r)) for _ in range(3)]


def test_collate_pads_right_and_masks():
    source = examples(stepwise.train_stream(0), 0.12, random.Random(0))
    batch = [next(source) for _ in range(4)]
    ids, mask, labels = collate(batch)
    t = max(len(i) for i, _ in batch)
    assert ids.shape == mask.shape == labels.shape == (4, t)
    for row, (i, lab) in enumerate(batch):
        n = len(i)
        assert ids[row, :n].tolist() == i and set(ids[row, n:].tolist()) <= {vocab()[PAD]}
        assert mask[row].tolist() == [1] * n + [0] * (t - n)
        assert labels[row, :n].tolist() == lab and set(labels[row, n:].tolist()) <= {-100}


def test_lr_schedule_warms_up_holds_and_decays():
    r = small(steps=1000, warmup_steps=10, decay_frac=0.25, final_lr_frac=0.05, lr=1e-3)
    assert lr_at(0, r) == pytest.approx(1e-4)
    assert lr_at(9, r) == lr_at(500, r) == lr_at(750, r) == pytest.approx(1e-3)
    assert lr_at(875, r) == pytest.approx(0.5e-3)
    assert lr_at(999, r) == pytest.approx(0.05e-3)


# ---- measurement helpers --------------------------------------------------------------------

def test_pass_at_k_matches_its_definition():
    # Brute force over all k-subsets of n samples, c of them correct.
    n, k = 6, 3
    for c in range(n + 1):
        subsets = math.comb(n, k)
        with_one = subsets - math.comb(n - c, k)
        assert pass_at_k([c], n, k) == pytest.approx(with_one / subsets)
    assert pass_at_k([0, 16], 16, 16) == 0.5 and pass_at_k([4], 16, 1) == 0.25


def test_score_and_length_stats():
    t = stepwise.StepwiseTask(n_heldout=4)
    probs = t.heldout()
    good = [stepwise.reference_trace(p) for p in probs]
    scored = score(t, probs, [[good[0], "x"], [good[1], good[1]], ["answer: 100", "y"], ["z", "z"]])
    assert scored.per_prompt == [0.5, 1.0, 0.0, 0.0] and scored.accuracy == 0.375
    assert scored.unparsed == 4 / 8
    assert scored.se == pytest.approx(0.4787 / 2, abs=1e-3)
    s = length_stats(list(range(1, 101)))
    assert s["median"] == 50.5 and s["p95"] == 95 and s["max"] == 100 and s["mean"] == 50.5


# ---- the command ----------------------------------------------------------------------------

def imported_modules(path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_policy_and_policy_eval_import_one_way_and_both_commands_run():
    import subprocess
    import sys
    from pathlib import Path

    import tasks.policy
    import tasks.policy_eval

    assert "tasks.policy" in imported_modules(Path(tasks.policy_eval.__file__))
    assert not {m for m in imported_modules(Path(tasks.policy.__file__))
                if m.startswith("tasks.policy_eval")}
    helps = [subprocess.run([sys.executable, "-m", mod, "--help"], capture_output=True,
                            text=True, check=True).stdout
             for mod in ("tasks.policy", "tasks.policy_eval")]
    assert helps[0] == helps[1] and "--task" in helps[0] and "--backend" in helps[0]
