"""bench.eval_seeds without an engine: the two seed schemes, and outcomes laid out as
(evaluation seed, prompt, sample) from a fake sampler that answers by seed."""
from __future__ import annotations

import pytest

from bench.eval_seeds.__main__ import outcomes, scheme_seeds
from common.seeds import eval_seeds
from tasks import ArithmeticTask
from tasks.base import Problem

PROBLEMS = [Problem(id=f"arith/{i}", prompt=f"{i}+1=", answer=str(i + 1)) for i in range(3)]


def test_the_schemes_seeds():
    ids = [p.id for p in PROBLEMS]
    assert scheme_seeds("per_prompt", 5, ids, 2) == eval_seeds(5, ids, 2)
    assert scheme_seeds("shared", 5, ids, 2) == [[5, 6]] * 3  # the old: seed + i everywhere
    with pytest.raises(ValueError, match="unknown scheme"):
        scheme_seeds("none", 0, ids, 2)


def test_outcomes_are_seed_by_prompt_by_sample():
    """The fake sampler answers right exactly when the sample's seed is even: under the shared
    scheme that is sample 0 under seed 0, sample 1 under seed 1, for every prompt."""
    def sampler(prompts, *, n, temperature, max_tokens, seeds):
        assert len(prompts) == len(seeds) == 2 * len(PROBLEMS) and n == 2
        return ([[str(int(prompt.split("+")[0]) + 1) if s % 2 == 0 else "x" for s in row]
                 for prompt, row in zip(prompts, seeds)], None)

    x = outcomes(sampler, ArithmeticTask(), PROBLEMS, "shared", seeds=2, n=2, temperature=1.0,
                 max_tokens=4)
    assert x.shape == (2, 3, 2)
    assert x[0].tolist() == [[1.0, 0.0]] * 3 and x[1].tolist() == [[0.0, 1.0]] * 3
