"""A run whose answers are nearly all unparsed says so once, in its first steps, naming the
likely causes with their figures (cluster/records/unparsed.py)."""
from __future__ import annotations

from types import SimpleNamespace

from cluster.records.unparsed import MIN_ROLLOUTS, WINDOW_STEPS, UnparsedWatch


def records(n_prompts, k=4, unparsed=4, length=48):
    return [SimpleNamespace(lengths=[length] * k, unparsed=unparsed) for _ in range(n_prompts)]


def test_nearly_all_unparsed_is_said_once_with_the_length_cap_named():
    w = UnparsedWatch(48, "the last \\boxed{...}")
    assert w.step(records(4)) is None                      # 16 rollouts: too few to judge
    line = w.step(records(4))
    assert line is not None and line.startswith("100% of the 32 answers of the first 2 steps")
    assert "100% of the answers stopped at rollout.max_tokens (48)" in line
    assert "the grader reads the last \\boxed{...}" in line
    assert w.step(records(4)) is None                      # once


def test_answers_that_parse_or_a_later_failure_say_nothing():
    w = UnparsedWatch(48, "x")
    for _ in range(WINDOW_STEPS):
        assert w.step(records(8, unparsed=1, length=20)) is None
    assert w.step(records(64)) is None                     # past the first steps: not judged
    quiet = UnparsedWatch(48, "x")
    assert quiet.step(records(MIN_ROLLOUTS // 4, unparsed=3, length=20)) is None  # 75%


def test_short_answers_point_away_from_the_length_cap():
    line = UnparsedWatch(256, "an answer line").step(records(8, length=30))
    assert "rollout.max_tokens (256) cut off 0% of them" in line
