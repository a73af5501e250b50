"""The held-out evaluation's sampling seeds: one per problem and sample, derived from the run's
seed (``cluster.run.evaluation`` samples with them, ``tasks.policy_eval`` and the benchmarks
measure with them). Pure: hashlib only."""
from __future__ import annotations

import hashlib

SEEDS_PER_PROMPT = 4096  # samples per prompt whose seeds are distinct by construction


def eval_seed_base(run_seed: int, problem_id: str) -> int:
    """The sampling seed of sample 0 of held-out problem ``problem_id`` in a run seeded
    ``run_seed``; sample i uses ``base + i``, for i < ``SEEDS_PER_PROMPT``. A multiple of
    ``SEEDS_PER_PROMPT`` taken from a blake2b hash of (run seed, problem id), so that the
    seeds of two prompts never overlap (unless 51 bits of their hashes collide: about 1e-10
    for 500 prompts) and base + i < 2**63. Same run seed: same seeds (a run is repeatable);
    another run seed: other seeds."""
    h = hashlib.blake2b(f"{int(run_seed)}\x00{problem_id}".encode(), digest_size=8).digest()
    top = int.from_bytes(h, "big") >> 1  # 63 bits
    return top - top % SEEDS_PER_PROMPT


def eval_seeds(run_seed: int, problem_ids, n: int) -> list[list[int]]:
    """Each problem's ``n`` sampling seeds, ``eval_seed_base(run_seed, id) + i``."""
    if not 0 <= n <= SEEDS_PER_PROMPT:
        raise ValueError(f"{n} samples per prompt: at most {SEEDS_PER_PROMPT} have distinct seeds")
    return [[eval_seed_base(run_seed, pid) + i for i in range(n)] for pid in problem_ids]
