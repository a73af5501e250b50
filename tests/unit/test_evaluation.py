"""Held-out evaluation (cluster.run.evaluation) without Ray: requests spread over fake generators
(one dies, one hangs, all die) and answers scored through the Scorer (a raising verifier,
and a hung one in a worker process, cost one answer, not the evaluation)."""
from __future__ import annotations

import functools

import pytest

from common.types import Rollout
from cluster.run.evaluation import AnswerScorer, eval_requests, score_answers, spread
from tasks import ArithmeticTask
from tasks.base import Problem


def fake_generators(behaviour: dict[int, str]):
    """send/wait/get over generators that answer ("ok"), raise ("dies") or never answer
    ("hangs"); a wait that finds nothing done lets its timeout pass on the fake clock."""
    now, sent = [0.0], []

    def send(g, i):
        sent.append((g, i))
        return (g, i, len(sent))  # a handle

    def wait(handles, timeout):
        done = [h for h in handles if behaviour[h[0]] != "hangs"]
        if not done:
            now[0] += timeout
        return done

    def get(h):
        if behaviour[h[0]] == "dies":
            raise RuntimeError("the actor died")
        return f"request {h[1]} by generator {h[0]}"

    return send, wait, get, (lambda: now[0]), sent


def test_a_generator_that_dies_has_its_requests_sent_to_the_others():
    send, wait, get, clock, sent = fake_generators({0: "ok", 1: "dies", 2: "ok"})
    results, skipped, lost = spread(6, 3, send, wait, get, 600.0, clock)
    assert lost == [1] and skipped == []
    assert sorted(results) == list(range(6))
    assert all("generator 1" not in r for r in results.values())
    assert sorted(i for g, i in sent if g == 1) == [1, 4]  # what it had, each sent once more
    assert len(sent) == 8


def test_a_hung_generator_is_given_up_after_the_timeout():
    send, wait, get, clock, _ = fake_generators({0: "ok", 1: "hangs"})
    results, skipped, lost = spread(4, 2, send, wait, get, 600.0, clock)
    assert lost == [1] and skipped == [] and clock() == 600.0
    assert results == {i: f"request {i} by generator 0" for i in range(4)}


def test_with_every_generator_lost_the_requests_are_skipped_not_raised():
    send, wait, get, clock, _ = fake_generators({0: "dies", 1: "dies"})
    results, skipped, lost = spread(3, 2, send, wait, get, 600.0, clock)
    assert results == {} and skipped == [0, 1, 2] and lost == [0, 1]


class Moody(ArithmeticTask):
    """Arithmetic whose verifier raises on "boom" and never returns on "hang"."""

    def score(self, problem, completion):
        if completion == "hang":
            import threading
            threading.Event().wait()  # forever: only the scorer's deadline ends it
        if completion == "boom":
            raise RuntimeError("verifier bug")
        return super().score(problem, completion)


P1 = Problem(id="arith/1+2", prompt="1+2=", answer="3", difficulty=1)
P2 = Problem(id="arith/2+2", prompt="2+2=", answer="4", difficulty=2)


def answers(*texts: str) -> list[Rollout]:
    return [Rollout("r", "p", [1], [2], [-0.1], t, "stop", 0) for t in texts]


def test_a_raising_verifier_costs_the_answer_and_skipped_requests_are_left_out():
    requests = eval_requests([P1, P2], max_tokens=8, samples=2, temperature=1.0, seed=0)
    assert [(p.id, kind, r.n) for p, kind, r in requests] == [
        ("arith/1+2", "greedy", 1), ("arith/2+2", "greedy", 1),
        ("arith/1+2", "sampled", 2), ("arith/2+2", "sampled", 2)]
    scorer = AnswerScorer(Moody())
    try:  # request 1 (P2's greedy answer) was skipped: every generator was lost
        out = score_answers([P1, P2], requests, {0: answers("3"), 2: answers("3", "boom"),
                                                 3: answers("4", "5")}, scorer)
    finally:
        scorer.close()
    assert out["greedy"] == 1.0 and out["greedy_by_difficulty"] == {"1": 1.0}
    assert out["sampled"] == 0.5 and out["sampled_by_difficulty"] == {"1": 0.5,
                                                                                 "2": 0.5}
    assert out["score_errors"] == 1 and out["score_timeouts"] == 0


def test_a_hung_verifier_times_out_in_its_worker_and_the_evaluation_finishes():
    requests = eval_requests([P1], max_tokens=8, samples=2, temperature=1.0, seed=0)
    scorer = AnswerScorer(Moody(), functools.partial(Moody), workers=1, timeout_s=2.0)
    try:
        out = score_answers([P1], requests, {0: answers("3"), 1: answers("hang", "3")}, scorer)
        again = score_answers([P1], requests, {0: answers("4"), 1: answers("3", "3")}, scorer)
    finally:
        scorer.close()
    assert out["greedy"] == 1.0 and out["sampled"] == 0.5
    assert out["score_timeouts"] == 1
    assert again["greedy"] == 0.0 and again["sampled"] == 1.0  # the same scorer
    assert again["score_timeouts"] == 0


@pytest.mark.parametrize("samples", [0, 3])
def test_requests_per_problem(samples):
    requests = eval_requests([P1, P2], max_tokens=4, samples=samples, temperature=0.7, seed=5)
    assert len(requests) == 2 * (1 + bool(samples))
    assert len({r.request_id for _, _, r in requests}) == len(requests)
    assert all(r.sampling.temperature == 0.0 for _, kind, r in requests if kind == "greedy")


# -- sampling seeds: one per prompt and sample ------------------------------------------------

def test_seeds_are_distinct_across_prompts_and_samples_repeatable_and_move_with_the_run_seed():
    from common.seeds import eval_seeds

    ids = [f"stepwise/{i}" for i in range(500)]
    seeds = eval_seeds(0, ids, 4)
    flat = [s for row in seeds for s in row]
    assert len(set(flat)) == 500 * 4  # no two (prompt, sample) pairs share a seed
    assert all(0 <= s < 2 ** 63 for s in flat)
    assert all(row == list(range(row[0], row[0] + 4)) for row in seeds)  # base + i
    assert eval_seeds(0, ids, 4) == seeds  # a run is repeatable
    other = eval_seeds(1, ids, 4)
    assert not set(flat) & {s for row in other for s in row}  # another run seed: other seeds
    # Wide apart: no prompt's 4096 seeds reach into another's.
    bases = sorted(row[0] for row in seeds)
    assert min(b - a for a, b in zip(bases, bases[1:])) >= 4096
    with pytest.raises(ValueError, match="at most 4096"):
        eval_seeds(0, ids[:1], 4097)


def test_sampled_requests_carry_their_problems_seed():
    from common.seeds import eval_seed_base

    requests = eval_requests([P1, P2], max_tokens=4, samples=3, temperature=1.0, seed=7)
    sampled = {p.id: r.sampling.seed for p, kind, r in requests if kind == "sampled"}
    assert sampled == {P1.id: eval_seed_base(7, P1.id), P2.id: eval_seed_base(7, P2.id)}
    assert sampled[P1.id] != sampled[P2.id]
    again = eval_requests([P1, P2], max_tokens=4, samples=3, temperature=1.0, seed=8)
    assert {r.sampling.seed for p, k, r in again if k == "sampled"}.isdisjoint(sampled.values())
