"""The math task: loading JSON lines (verl's DAPO shape and the flat one), answer extraction,
math_verify scoring. Parquet, keys and bad rows: test_math_datasets.py."""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from tasks.base import Problem, Verdict
from tasks.grading import answers_match, extract_default as extract_answer
from tasks.math_task import MathTask, load_problems

FIXTURE = Path(__file__).parents[1] / "fixtures" / "math_small.jsonl"


@pytest.fixture(scope="module")
def task() -> MathTask:
    return MathTask(FIXTURE, n_heldout=3, seed=0)


def by_id(task: MathTask) -> dict[str, Problem]:
    return {p.id: p for p in task.train() + task.heldout()}


def test_fixture_loads_in_dapo_shape():
    problems = load_problems(FIXTURE)
    assert len(problems) == 11
    p = problems[1]
    assert p.id == "fx-01" and p.answer == "\\frac{1}{2}" and p.difficulty == 0
    assert "fair coin" in p.prompt and 'Answer: X' in p.prompt


def test_flat_shape_and_numeric_answers(tmp_path):
    f = tmp_path / "flat.jsonl"
    f.write_text('{"prompt": "1+1?", "answer": "2"}\n\n{"prompt": "2*3?", "answer": 6, '
                 '"difficulty": 2}\n')
    a, b = load_problems(f)
    assert a == Problem(id="flat:1", prompt="1+1?", answer="2")
    assert b == Problem(id="flat:3", prompt="2*3?", answer="6", difficulty=2)


def test_splits_are_disjoint_deterministic_and_deduplicated(tmp_path, task):
    assert len(task.heldout()) == 3 and len(task.train()) == 8
    assert not {p.prompt for p in task.train()} & {p.prompt for p in task.heldout()}
    again = MathTask(FIXTURE, n_heldout=3, seed=0)
    assert again.heldout() == task.heldout() and again.train() == task.train()
    assert MathTask(FIXTURE, n_heldout=3, seed=1).heldout() != task.heldout()
    # A prompt duplicated in the file lands on one side only, once.
    f = tmp_path / "dup.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"q{i % 3}", "answer": "1"}) + "\n"
                         for i in range(9)))
    t = MathTask(f, n_heldout=1)
    assert len(t.train()) == 2 and len(t.heldout()) == 1


def test_heldout_file_and_train_cap(tmp_path):
    held = tmp_path / "held.jsonl"
    held.write_text(FIXTURE.read_text().splitlines()[0] + "\n")
    t = MathTask(FIXTURE, heldout_path=held, n_train=4)
    assert [p.id for p in t.heldout()] == ["fx-00"]
    assert len(t.train()) == 4 and "fx-00" not in {p.id for p in t.train()}


@pytest.mark.parametrize("line,msg", [
    ("{not json", "Expecting property name"),
    ("[1, 2]", "expected a JSON object, got an array"),
    ("null", "expected a JSON object, got null"),
    ("{}", "column 'prompt': missing or null"),
    ('{"answer": "3"}', "column 'prompt': missing or null"),
    ('{"prompt": "q"}', "column 'answer': missing or null"),
    ('{"prompt": "q", "reward_model": {"style": "rule"}}', "column 'answer': missing or null"),
    ('{"prompt": [{"role": "user"}], "answer": "1"}',
     "column 'prompt': message 1 of 1 needs a string 'role' and a string 'content'"),
    ('{"prompt": [{"content": "hi"}], "answer": "1"}',
     "column 'prompt': message 1 of 1 needs a string 'role'"),
    ('{"prompt": [], "answer": "1"}', "column 'prompt': an empty list of messages"),
    ('{"prompt": "   ", "answer": "1"}', "column 'prompt': a blank string"),
    ('{"prompt": 7, "answer": "1"}', "column 'prompt': must be a string or a list of chat "
     "messages, got a number"),
    ('{"prompt": [{"role": "user", "content": " "}], "answer": "1"}',
     "column 'prompt': blank: every message's 'content' is empty"),
    ('{"prompt": "q", "answer": "  "}', "column 'answer': a blank string"),
    ('{"prompt": "q", "answer": ["1"]}', "column 'answer': must be a string or a number, got an "
     "array"),
    ('{"prompt": "q", "answer": "1", "difficulty": "hard"}', "column 'difficulty': must be an "
     "integer"),
])
def test_bad_line_names_file_and_line(tmp_path, line, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "ok", "answer": "1"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"bad\.jsonl:2: {re.escape(msg)}"):
        load_problems(f)


def test_a_line_that_is_not_utf8_is_named_by_line(tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(b'{"prompt": "ok", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl:2: not UTF-8 text \(byte 0xe9 at col"):
        load_problems(f)
    f.write_bytes(b'\xef\xbb\xbf{"prompt": "ok", "answer": "1"}\n')  # a UTF-8 byte-order mark
    assert [p.prompt for p in load_problems(f)] == ["ok"]


@pytest.mark.parametrize("text", ["", "\n  \n\n"], ids=["empty", "blank-lines"])
def test_a_file_without_a_problem_is_named(tmp_path, text):
    f = tmp_path / "none.jsonl"
    f.write_text(text)
    with pytest.raises(ValueError, match=r"none\.jsonl: no problems in file"):
        load_problems(f)


def test_too_few_distinct_prompts_to_split_are_named(tmp_path):
    f = tmp_path / "same.jsonl"
    f.write_text('{"prompt": "q", "answer": "1"}\n' * 5)  # five lines, one distinct prompt
    with pytest.raises(ValueError, match=r"task\.n_heldout.*same\.jsonl holds 1 distinct"):
        MathTask(f, n_heldout=1).train()
    with pytest.raises(ValueError, match=r"no train problems left.*also in .*same\.jsonl"):
        MathTask(f, heldout_path=f).heldout()


def test_missing_file_duplicate_ids_and_too_large_heldout(tmp_path):
    with pytest.raises(ValueError, match="dataset file .*absent.jsonl does not exist"):
        load_problems(tmp_path / "absent.jsonl")
    f = tmp_path / "ids.jsonl"
    f.write_text('{"prompt": "a", "answer": "1", "id": "k"}\n{"prompt": "b", "answer": "2", "id": "k"}\n')
    with pytest.raises(ValueError, match=r"ids\.jsonl:2: duplicate id 'k' with another prompt "
                                         r"\(first at .*ids\.jsonl:1\)"):
        load_problems(f)
    with pytest.raises(ValueError, match="n_heldout=11"):
        MathTask(FIXTURE, n_heldout=11).train()


@pytest.mark.parametrize("completion,extracted", [
    ("so 2+2 = 4.\nAnswer: 4", "4"),
    ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}"),
    ("**Answer:** 12.", "12"),
    ("answer: 3\nwait, Answer: 5", "5"),
    ("We get \\boxed{\\frac{a}{b+1}} here", "\\frac{a}{b+1}"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{7} ... Answer: 8", "8"),     # the last marker written wins (tasks/grading.py)
    ("the answer is 4", "4"),
    ("\\boxed{unclosed", None),
    ("Answer:   ", None),
    ("", None),
])
def test_extract_answer(completion, extracted):
    assert extract_answer(completion) == extracted


@pytest.mark.parametrize("pid,completion,reward", [
    ("fx-00", "3 + 5 = 8\nAnswer: 8", 1.0),
    ("fx-00", "Answer: 9", -1.0),
    ("fx-01", "Answer: 0.5", 1.0),            # 1/2 vs 0.5 vs \frac{1}{2}
    ("fx-01", "Answer: 1/2", 1.0),
    ("fx-01", "\\boxed{\\frac{1}{2}}", 1.0),
    ("fx-01", "\\boxed{\\frac{2}{4}}", 1.0),
    ("fx-01", "Answer: 1/3", -1.0),
    ("fx-03", "Answer: $\\sqrt{50}$", 1.0),   # 5\sqrt{2}
    ("fx-03", "Answer: $5\\sqrt{3}$", -1.0),
    ("fx-04", "Answer: -7", 1.0),
    ("fx-04", "Answer: 7", -1.0),
    ("fx-05", "Answer: 10.0", 1.0),
    ("fx-06", "Answer: \\frac{3}{4}", 1.0),   # ground truth 0.75
    ("fx-09", "Answer: 3 + x", 1.0),          # ground truth x+3
    ("fx-09", "Answer: x - 3", -1.0),
])
def test_math_verify_scoring(task, pid, completion, reward):
    v = task.score(by_id(task)[pid], completion)
    assert v.parsed and v.reward == reward


@pytest.mark.parametrize("completion", ["I am not sure.", "Answer: ???", "\\boxed{}"])
def test_unparseable_scores_r_lo_unparsed(task, completion):
    v = task.score(by_id(task)["fx-00"], completion)
    assert v.reward == -1.0 and not v.parsed


def test_zero_one_rewards():
    t = MathTask(FIXTURE, n_heldout=3, reward_low=0.0, reward_high=1.0)
    p = by_id(t)["fx-01"]
    assert t.score(p, "Answer: 0.5") == Verdict(1.0, True, "0.5")
    assert t.score(p, "Answer: 2").reward == 0.0
    assert t.score(p, "nothing") == Verdict(0.0, False, None)


def test_scoring_works_off_the_main_thread():
    # math_verify's SIGALRM timeout cannot be installed off the main thread (Ray actors
    # score in worker threads); the task must still verify there.
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", answers_match("\\frac{1}{4}", "0.25")))
    t.start()
    t.join()
    assert out["v"] is True
