"""The stepwise reasoning task: problems, traces, slips, split and verifier (pure Python)."""
from __future__ import annotations

import random
import re
import statistics
from collections import Counter

import pytest

from tasks.base import Problem, Verdict
from tasks.stepwise import (LEVELS, MAX_TRACE_CHARS, MODULUS, SLIPS, Spec, StepwiseTask,
                            is_heldout, make_problem, parse_prompt, reference_trace,
                            sample_spec, sample_trace, train_stream)

LINE = re.compile(r"(\d+): (\d\d)([+-])(\d)=(\d\d)")


@pytest.fixture(scope="module")
def task() -> StepwiseTask:
    return StepwiseTask(seed=3, n_train=800, n_heldout=400)


def parse_trace(trace: str) -> tuple[list[tuple[int, int, str, int, int]], str]:
    """Lines as (count, a, op, d, b) and the answer line."""
    *lines, last = trace.split("\n")
    return [tuple(int(g) if g.isdigit() else g for g in LINE.fullmatch(ln).groups())
            for ln in lines], last


def brute_force(spec: Spec) -> int:
    a = spec.x
    for _ in range(spec.k):
        a = a + spec.d if spec.op == "+" else a - spec.d
    return a % MODULUS


# ---- problems -------------------------------------------------------------------------------

def test_example_from_the_docs():
    p = make_problem(Spec(x=37, op="+", d=8, k=5))
    assert p.prompt == "37+8 x5\n" and p.answer == "77" and p.difficulty == 3
    assert reference_trace(p) == ("5: 37+8=45\n4: 45+8=53\n3: 53+8=61\n2: 61+8=69\n"
                                  "1: 69+8=77\nanswer: 77")
    wrap = make_problem(Spec(x=3, op="-", d=8, k=1))
    assert wrap.prompt == "03-8 x1\n" and reference_trace(wrap) == "1: 03-8=95\nanswer: 95"


def test_prompt_round_trips_and_answer_matches_a_loop():
    rng = random.Random(0)
    for level in LEVELS:
        for _ in range(300):
            spec = sample_spec(rng, level)
            assert parse_prompt(spec.prompt) == spec
            assert spec.answer == brute_force(spec)


@pytest.mark.parametrize("bad", ["37+8 x5", "37*8 x5\n", "7+8 x5\n", "37+18 x5\n", "37+8 5\n"])
def test_parse_prompt_rejects_other_text(bad):
    with pytest.raises(ValueError, match="not a stepwise prompt"):
        parse_prompt(bad)


def test_reference_traces_follow_the_procedure(task):
    for p in task.train() + task.heldout():
        spec = parse_prompt(p.prompt)
        lines, last = parse_trace(reference_trace(p))
        assert [c for c, *_ in lines] == list(range(spec.k, 0, -1))  # the countdown
        a = spec.x
        for _, la, op, d, b in lines:
            assert (la, op, d) == (a, spec.op, spec.d)
            a = (la + d if op == "+" else la - d) % MODULUS
            assert b == a
        assert last == f"answer: {p.answer}" and int(p.answer) == spec.answer
        assert task.score(p, reference_trace(p)).reward == 1.0


def test_difficulty_is_the_number_of_steps(task):
    for p in task.train() + task.heldout():
        lo, hi = LEVELS[p.difficulty].steps
        assert lo <= parse_prompt(p.prompt).k <= hi
    assert Counter(p.difficulty for p in task.train()) == {1: 200, 2: 200, 3: 200, 4: 200}
    assert Counter(p.difficulty for p in task.heldout()) == {1: 100, 2: 100, 3: 100, 4: 100}
    # Every step count, sign and step size shows up.
    specs = [parse_prompt(p.prompt) for p in task.train()]
    assert {s.k for s in specs} == set(range(1, 21))
    assert {s.op for s in specs} == {"+", "-"} and {s.d for s in specs} == set(range(2, 10))


def test_trace_lengths_have_a_long_tail(task):
    # The criterion of issue 9: mean >= 30 tokens, the longest 5% at least 3x the median.
    lengths = sorted(len(reference_trace(p)) + 1 for p in task.heldout())  # + EOS
    median = statistics.median(lengths)
    p95 = lengths[int(0.95 * len(lengths))]
    assert statistics.fmean(lengths) >= 30
    assert p95 >= 3 * median, (median, p95)
    assert lengths[-1] <= MAX_TRACE_CHARS + 1
    longest = make_problem(Spec(x=0, op="+", d=9, k=20))
    assert len(reference_trace(longest)) == MAX_TRACE_CHARS


# ---- split ----------------------------------------------------------------------------------

def test_same_seed_same_problems_other_seed_different():
    a = StepwiseTask(seed=7, n_train=200, n_heldout=40)
    b = StepwiseTask(seed=7, n_train=200, n_heldout=40)
    c = StepwiseTask(seed=8, n_train=200, n_heldout=40)
    assert a.train() == b.train() and a.heldout() == b.heldout()
    assert a.train() != c.train() and a.heldout() != c.heldout()


def test_enough_heldout_problems_and_a_clear_error_beyond():
    held = StepwiseTask(n_heldout=3000).heldout()
    assert len({p.prompt for p in held}) == 3000
    # Levels 1 and 2 (1-2 and 3-4 steps) have fewer than their share; the others make up.
    counts = Counter(p.difficulty for p in held)
    assert counts[1] < 750 and counts[2] < 750 and counts[3] == counts[4] > 750
    with pytest.raises(ValueError, match=r"difficulties \[1\] have only \d+ distinct held-out"):
        StepwiseTask(n_heldout=1000, difficulties=(1,)).heldout()


def test_train_stream_never_yields_heldout_and_is_deterministic():
    s1, s2 = train_stream(5), train_stream(5)
    drawn = [next(s1) for _ in range(500)]
    assert drawn == [next(s2) for _ in range(500)]
    assert not any(is_heldout(p.prompt) for p in drawn)
    assert set(Counter(p.difficulty for p in drawn)) == set(LEVELS)


@pytest.mark.parametrize("bad", [(), (0,), (5,), (1, 1)])
def test_bad_difficulties(bad):
    with pytest.raises(ValueError, match="difficulties"):
        StepwiseTask(difficulties=bad)


# ---- slipped traces (the warm-start data) ---------------------------------------------------

def test_slips_need_an_rng():
    with pytest.raises(ValueError, match="rng"):
        sample_trace(Spec(1, "+", 2, 3), slip_rate=0.5)


def test_a_slipped_trace_stays_consistent_and_one_slip_spoils_the_answer():
    rng = random.Random(1)
    stream = train_stream(2)
    kinds = Counter()
    for _ in range(2000):
        p = next(stream)
        spec = parse_prompt(p.prompt)
        trace, slips = sample_trace(spec, rng, slip_rate=0.1)
        lines, last = parse_trace(trace)
        # Every line starts from what the previous one wrote; the answer is the last value.
        assert all(nxt[1] == prev[4] for prev, nxt in zip(lines, lines[1:]))
        assert last == f"answer: {lines[-1][4]:02d}" and lines[0][0] == spec.k
        counts = [c for c, *_ in lines]
        wrong_values = sum(b != (a + d if op == "+" else a - d) % MODULUS
                           for _, a, op, d, b in lines)
        count_slips = sum(c2 != c1 - 1 for c1, c2 in zip(counts, counts[1:])) + (counts[-1] != 1)
        assert wrong_values + count_slips == slips
        kinds["value"] += wrong_values
        kinds["count"] += count_slips
        correct = StepwiseTask().score(p, trace).reward == 1.0
        if slips == 0:
            assert correct
        if slips == 1:  # a single slip cannot cancel out
            assert not correct
    assert kinds["value"] > 50 and kinds["count"] > 50


def test_slip_rate_per_step_and_every_kind_occurs():
    rng = random.Random(2)
    stream = train_stream(3)
    steps = slips = 0
    for _ in range(3000):
        spec = parse_prompt(next(stream).prompt)
        _, n = sample_trace(spec, rng, slip_rate=0.1)
        steps += spec.k
        slips += n
    assert slips / steps == pytest.approx(0.1, abs=0.01)
    assert SLIPS == ("carry", "units", "skip", "repeat")
    # Every slip that applies to the one step of 54+8 (= 62): a dropped carry, the units off
    # by one either way, the count repeated (a second step follows, which slips too here).
    traces = [sample_trace(Spec(54, "+", 8, 1), random.Random(s), 1.0)[0] for s in range(50)]
    first = {t.split("\n")[0] for t in traces}
    assert first == {"1: 54+8=52", "1: 54+8=61", "1: 54+8=63", "1: 54+8=62"}
    assert all(t.startswith("1: 54+8=62\n1: 62+8=") for t in traces if t.startswith("1: 54+8=62"))


def test_slip_mixture_success_falls_with_steps_and_stays_inside_zero_one():
    rng = random.Random(4)
    t = StepwiseTask(n_train=800)
    by = {}
    for p in t.train():
        trace, _ = sample_trace(parse_prompt(p.prompt), rng, slip_rate=0.1)
        by.setdefault(p.difficulty, []).append(t.score(p, trace).reward == 1.0)
    rates = [statistics.fmean(by[lv]) for lv in sorted(by)]
    assert rates == sorted(rates, reverse=True) and 0.05 < rates[-1] and rates[0] < 0.95


# ---- verifier -------------------------------------------------------------------------------

P = make_problem(Spec(x=37, op="+", d=8, k=5))  # answer 77


@pytest.mark.parametrize("completion,reward,parsed,extracted", [
    (reference_trace(P), 1.0, True, "77"),
    ("answer: 77", 1.0, True, "77"),
    ("1: 69+8=77\nanswer: 77\n", 1.0, True, "77"),
    ("answer: 77  \n\n", 1.0, True, "77"),
    ("  answer: 77", 1.0, True, "77"),
    ("answer: 077", 1.0, True, "077"),
    ("answer: 76", -1.0, True, "76"),
    ("answer: -23", -1.0, True, "-23"),
    ("1: 69+8=77\n", -1.0, False, None),                 # cut off before the answer
    ("answer: 77\n1: 77+8=85", -1.0, False, None),       # goes on after its answer
    ("answer: 77 then", -1.0, False, None),
    ("Answer: 77", -1.0, False, None),
    ("answer:77", -1.0, False, None),
    ("answer: ", -1.0, False, None),
    ("", -1.0, False, None),
])
def test_verifier_edge_cases(completion, reward, parsed, extracted):
    assert StepwiseTask().score(P, completion) == Verdict(reward, parsed, extracted)


def test_zero_one_rewards():
    t = StepwiseTask(reward_low=0.0, reward_high=1.0)
    assert t.score(P, "answer: 77").reward == 1.0 and t.score(P, "answer: 1").reward == 0.0
    assert t.score(P, "77") == Verdict(0.0, False, None)


def test_problem_is_a_plain_problem():
    assert isinstance(P, Problem) and P.id == "stepwise/37+8 x5"
