"""cluster.nodes.waits.gather_stats: the per-step generator telemetry never holds the step loop up.

A generator that is hung, or that Ray queues calls for while it restarts, must not hold the
learner up: the loop used to wait for each generator in turn, up to 60 s each, twice a step.
Now one wait for all, bounded by a few seconds. Fake ``wait``/``get`` stand in for
ray.wait/ray.get (no Ray). And what the driver makes of two samples of the generators'
``GeneratorStats`` (``cluster.records.metrics``), read by attribute."""
import pytest

from cluster.nodes.waits import gather_stats
from cluster.records.metrics import generator_delta, per_generator
from common.records import GeneratorCounts, GeneratorStats


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


def sample(uptime_s: float, busy_s: float, seq_s: float, tokens: int, cancelled_tokens: int = 0,
           index: int = 0) -> GeneratorStats:
    return GeneratorStats(index=index, version=0, in_flight=0, sequences=0, seq_s=seq_s,
                          max_num_seqs=4,
                          counts=GeneratorCounts(tokens=tokens, cancelled_tokens=cancelled_tokens),
                          busy_s=busy_s, uptime_s=uptime_s, engine_start_s=1.0, env={},
                          engine_core="in_process")


def test_two_samples_give_busy_fraction_occupancy_and_decode_rate_a_restart_counting_from_0():
    before = [sample(10, 5, 8, 100, 20), sample(50, 40, 100, 900, index=1), sample(1, 1, 1, 1)]
    after = [sample(20, 10, 28, 300, 40), sample(5, 2, 10, 50, index=1), None]  # 1 restarted
    d = generator_delta(before, after)
    # spans 10 s + 5 s (the restarted one from its start), busy 5 + 2, sequence-seconds
    # 20 + 10 of 4 slots each, tokens (340 - 120) + 50 over the two live ones' 7.5 s each
    assert d.to_dict() == {"generator_busy_fraction": pytest.approx(7 / 15),
                           "generator_slot_occupancy": pytest.approx(30 / 60),
                           "decode_tokens_per_s": pytest.approx(270 / 7.5)}
    rows = per_generator(before, after, peaks=[72.0, 20.0, 30.0])
    assert rows[2] == {"index": 2, "alive": False}
    assert rows[0]["busy_fraction"] == pytest.approx(0.5)
    assert rows[0]["decode_tokens_per_s"] == pytest.approx(22.0)
    assert rows[0]["fraction_of_peak"] == pytest.approx(22.0 / 72.0)
    assert after[0].busy_fraction == pytest.approx(0.5) and after[0].counts.sampled_tokens == 340
