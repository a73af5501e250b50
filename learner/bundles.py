"""Which placement-group bundle each of several actors goes to: the arithmetic that both
``cluster.nodes.placement`` (reserving) and ``learner.ranks`` (placing its ranks) need. Pure Python."""
from __future__ import annotations

import math

EPS = 1e-9  # resource sums are floats (0.1 CPU x 3)


def holds(capacity: dict[str, float], need: dict[str, float]) -> int:
    """How many copies of ``need`` fit in ``capacity`` (every resource it asks for)."""
    counts = [math.floor((capacity.get(k, 0.0) + EPS) / v) for k, v in need.items() if v > 0]
    return min(counts) if counts else 0


def fill_bundles(bundles, per_actor: dict[str, float], count: int, start: int = 0) -> list[int]:
    """Bundle index of each of ``count`` actors: they fill the bundles from ``start`` in
    order, each bundle taking as many as it holds (one per bundle for per-actor bundles)."""
    slots = []
    for i, b in enumerate(list(bundles)[start:], start):
        slots += [i] * min(holds(b, per_actor), count - len(slots))
        if len(slots) == count:
            return slots
    raise ValueError(f"{count} actor(s) of {per_actor} do not fit in bundles "
                     f"{list(bundles)[start:]}")
