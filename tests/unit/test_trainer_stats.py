"""cluster.nodes.waits.gather_stats: the per-step generator telemetry never holds the step loop up.

A generator that is hung, or that Ray queues calls for while it restarts, must not hold the
learner up: the loop used to wait for each generator in turn, up to 60 s each, twice a step.
Now one wait for all, bounded by a few seconds. Fake ``wait``/``get`` stand in for
ray.wait/ray.get (no Ray)."""
from cluster.nodes.waits import gather_stats


class ActorDied(Exception):
    pass


def fakes(answers: dict):
    """answers: ref -> a value, ActorDied() (the actor died) or None (never answers)."""
    waited = []

    def wait(refs, num_returns, timeout):
        waited.append((list(refs), num_returns, timeout))
        return [r for r in refs if answers[r] is not None], [r for r in refs if answers[r] is None]

    def get(ref):
        if answers[ref] is None:
            raise AssertionError(f"get() on {ref}, which has not answered: it would block")
        if isinstance(answers[ref], Exception):
            raise answers[ref]
        return answers[ref]

    return wait, get, waited


def test_one_bounded_wait_for_all_and_none_for_the_silent_and_the_dead():
    wait, get, waited = fakes({"g0": {"busy_s": 1.0}, "g1": None, "g2": ActorDied()})
    out = gather_stats(["g0", "g1", "g2"], wait, get, 5.0, (ActorDied,))
    assert out == [{"busy_s": 1.0}, None, None]
    assert waited == [(["g0", "g1", "g2"], 3, 5.0)]  # all at once, bounded once


def test_every_answer_in_order_and_no_generator_no_wait():
    wait, get, waited = fakes({"a": 1, "b": 2})
    assert gather_stats(["b", "a"], wait, get, 5.0) == [2, 1]
    assert gather_stats([], wait, get, 5.0) == [] and len(waited) == 1


def test_an_unexpected_error_is_not_swallowed():
    wait, get, _ = fakes({"g0": ValueError("bad stats")})
    try:
        gather_stats(["g0"], wait, get, 5.0, (ActorDied,))
    except ValueError as err:
        assert "bad stats" in str(err)
    else:
        raise AssertionError("a ValueError from stats() must reach the caller")
