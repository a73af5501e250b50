"""Both built-in tasks' train/held-out splits: disjoint, of distinct prompts, and a function of
the prompt, not of the seed (a prompt held out under one seed is in no seed's train split)."""
from __future__ import annotations

import pytest

from tasks import arithmetic, stepwise

# (task class, its module's is_heldout, train size, held-out size, held-out size across
# seeds, train size across seeds)
CASES = {"stepwise": (stepwise.StepwiseTask, stepwise.is_heldout, 800, 400, 300, 2000),
         "arithmetic": (arithmetic.ArithmeticTask, arithmetic.is_heldout, 400, 120, 200, 800)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_splits_disjoint_and_distinct(name):
    cls, _, n_train, n_held, _, _ = CASES[name]
    task = cls(seed=3, n_train=n_train, n_heldout=n_held)
    train, held = task.train(), task.heldout()
    assert len(train) == n_train and len(held) == n_held
    assert len({p.prompt for p in train}) == n_train and len({p.id for p in train}) == n_train
    assert len({p.prompt for p in held}) == n_held
    assert not {p.prompt for p in train} & {p.prompt for p in held}


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_is_a_function_of_the_prompt_not_the_seed(name):
    cls, is_heldout, _, _, n_held, n_train = CASES[name]
    held = {p.prompt for s in range(3) for p in cls(seed=s, n_heldout=n_held).heldout()}
    for s in range(3):
        assert not held & {p.prompt for p in cls(seed=s, n_train=n_train).train()}
    assert all(is_heldout(p) for p in held)
