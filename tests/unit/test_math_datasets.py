"""The math task's datasets as verl and OpenRLHF users have them, read through Hugging Face
``datasets``: verl's Parquet layout, OpenRLHF-style keys, save_to_disk directories, JSON arrays
and compressed JSON lines; a bad key names the file and its columns, a bad row its file, row
and column. No Ray."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pandas as pd
import pytest

from tasks import TaskConfig, make_task_from_config
from tasks.math_task import MathTask, load_problems


def verl_rows(n: int, source: str = "openai/gsm8k") -> list[dict]:
    """Rows in verl's layout, as its data preprocessing scripts (examples/data_preprocess/
    gsm8k.py) write them."""
    return [{"data_source": source,
             "prompt": [{"role": "user", "content": f"What is {i} + {i + 1}? Answer: X"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * i + 1)},
             "extra_info": {"split": "train", "index": i, "answer": "...", "question": "..."}}
            for i in range(n)]


def parquet(path, rows):
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_verl_parquet_loads(tmp_path):
    f = parquet(tmp_path / "train.parquet", verl_rows(5))
    problems = load_problems(f)
    assert [p.id for p in problems] == ["0", "1", "2", "3", "4"]  # extra_info.index
    assert problems[3].prompt == "What is 3 + 4? Answer: X" and problems[3].answer == "7"
    assert problems[3].messages == ()  # one user turn: the prompt text is that turn


def test_repeated_rows_are_read_once(tmp_path):
    """verl's DAPO-Math-17k parquet holds each prompt ~100 times, with distinct row ids."""
    rows = [dict(r, extra_info={"index": f"{k}-{r['extra_info']['index']}"})
            for k in range(3) for r in verl_rows(4)]
    problems = load_problems(parquet(tmp_path / "dapo.parquet", rows))
    assert [p.id for p in problems] == ["0-0", "0-1", "0-2", "0-3"]
    t = MathTask(tmp_path / "dapo.parquet", n_heldout=1)
    assert len(t.train()) == 3 and len(t.heldout()) == 1


def test_a_conversation_keeps_its_turns_and_numbers_are_answers(tmp_path):
    rows = verl_rows(2)
    rows[1]["prompt"] = [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "What is 2 + 2?"}]
    df = pd.DataFrame(rows)
    df["reward_model"] = [{"style": "rule", "ground_truth": g} for g in (1.5, 4.0)]
    df.to_parquet(tmp_path / "d.parquet")
    a, b = load_problems(tmp_path / "d.parquet")
    assert b.messages == (("system", "Be brief."), ("user", "What is 2 + 2?"))
    assert b.prompt == "Be brief.\n\nWhat is 2 + 2?" and (a.answer, b.answer) == ("1.5", "4.0")


def test_openrlhf_keys_and_default_ids(tmp_path):
    f = parquet(tmp_path / "rlhf.parquet",
                [{"context": {"question": f"q{i}"}, "label": i} for i in range(3)])
    problems = load_problems(f, prompt_key="context.question", answer_key="label")
    assert [(p.id, p.prompt, p.answer) for p in problems] == [
        ("rlhf:0", "q0", "0"), ("rlhf:1", "q1", "1"), ("rlhf:2", "q2", "2")]


def test_flat_answer_column_is_found_without_a_key(tmp_path):
    f = parquet(tmp_path / "flat.parquet", [{"prompt": "1+1?", "answer": "2"}])
    assert load_problems(f)[0].answer == "2"


def test_a_key_that_is_not_a_column_names_the_file_and_its_columns(tmp_path):
    f = parquet(tmp_path / "train.parquet", verl_rows(2))
    cols = ("data_source, prompt, ability, reward_model, reward_model.style, "
            "reward_model.ground_truth, extra_info, extra_info.split, extra_info.index, "
            "extra_info.answer, extra_info.question")
    with pytest.raises(ValueError, match=rf"train\.parquet: task\.prompt_key 'question' is not a "
                                         rf"column; its columns: {cols}$"):
        load_problems(f, prompt_key="question")
    with pytest.raises(ValueError, match=r"train\.parquet: task\.answer_key 'reward_model\.gt' "
                                         r"is not a column; its columns: data_source, prompt"):
        load_problems(f, answer_key="reward_model.gt")
    g = parquet(tmp_path / "noanswer.parquet", [{"prompt": "q", "solution": "1"}])
    with pytest.raises(ValueError, match=r"noanswer\.parquet: no answer column \(tried "
                                         r"reward_model\.ground_truth, answer; set task\.answer_key"
                                         r"\); its columns: prompt, solution"):
        load_problems(g)


@pytest.mark.parametrize("change,msg", [
    (lambda r: r.update(prompt=[]), "column 'prompt': an empty list of messages"),
    (lambda r: r.update(prompt=None), "column 'prompt': missing or null"),
    (lambda r: r.update(prompt=[{"role": "user", "content": "  "}]),
     "column 'prompt': blank: every message's 'content' is empty"),
    (lambda r: r.update(reward_model={"style": "rule", "ground_truth": None}),
     "column 'reward_model.ground_truth': missing or null"),
    (lambda r: r.update(reward_model={"style": "rule", "ground_truth": " "}),
     "column 'reward_model.ground_truth': a blank string"),
])
def test_a_bad_parquet_row_names_file_row_and_column(tmp_path, change, msg):
    rows = verl_rows(4)
    change(rows[2])
    f = parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ValueError, match=rf"bad\.parquet: row 2 \(0-based\): {msg}$"):
        load_problems(f)


def test_a_parquet_column_of_the_wrong_type_is_named(tmp_path):
    f = parquet(tmp_path / "ints.parquet", [{"prompt": 7, "answer": "1"}])
    with pytest.raises(ValueError, match=r"ints\.parquet: row 0 \(0-based\): column 'prompt': "
                                         r"must be a string or a list of chat messages, got a number"):
        load_problems(f)
    g = parquet(tmp_path / "lists.parquet", [{"prompt": "q", "answer": ["1", "2"]}])
    with pytest.raises(ValueError, match=r"row 0 \(0-based\): column 'answer': must be a string "
                                         r"or a number, got an array"):
        load_problems(g)


def test_duplicate_ids_with_different_prompts_are_named(tmp_path):
    rows = verl_rows(3)
    rows[2]["extra_info"] = dict(rows[2]["extra_info"], index=0)
    with pytest.raises(ValueError, match=r"d\.parquet: row 2 \(0-based\): duplicate id '0' with "
                                         r"another prompt \(first at .*d\.parquet: row 0"):
        load_problems(parquet(tmp_path / "d.parquet", rows))


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file at all")
    with pytest.raises(ValueError, match=r"junk\.parquet: not a readable parquet dataset"):
        load_problems(tmp_path / "junk.parquet")


def test_save_to_disk_directory(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(verl_rows(3))
    ds.save_to_disk(str(tmp_path / "saved"))
    assert [p.answer for p in load_problems(tmp_path / "saved")] == ["1", "3", "5"]
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ValueError, match=r"dict: a DatasetDict with splits \['test', 'train'\]; "
                                         r"give the directory of one split"):
        load_problems(tmp_path / "dict")


def test_json_array_and_compressed_json_lines(tmp_path):
    rows = verl_rows(3)
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=1))
    assert [p.id for p in load_problems(tmp_path / "a.json")] == ["0", "1", "2"]
    rows[1]["prompt"] = ""
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with pytest.raises(ValueError, match=r"b\.jsonl\.gz: row 1 \(0-based\): column 'prompt': a "
                                         r"blank string"):
        load_problems(tmp_path / "b.jsonl.gz")


def test_json_lines_that_mix_types_in_a_column_still_load(tmp_path):
    """Arrow refuses a column holding 2 and "x"; the lines are then read as JSON has them."""
    f = tmp_path / "mixed.jsonl"
    f.write_text('{"prompt": "a", "answer": 2}\n{"prompt": "b", "answer": "x"}\n')
    assert [p.answer for p in load_problems(f)] == ["2", "x"]


def test_the_config_builds_a_verl_parquet_task(tmp_path):
    train = parquet(tmp_path / "train.parquet", verl_rows(6))
    test = parquet(tmp_path / "test.parquet", verl_rows(8)[6:])
    t = make_task_from_config(TaskConfig(name="math", path=str(train), heldout_path=str(test)))
    assert len(t.train()) == 6 and [p.answer for p in t.heldout()] == ["13", "15"]
    assert t.score(t.heldout()[0], "6 + 7 = 13\nAnswer: 13").reward == 1.0


def test_importing_tasks_imports_neither_datasets_nor_pyarrow():
    code = ("import sys, tasks; from tasks import make_task_from_config; "
            "print(sorted(m for m in ('datasets', 'pyarrow', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_conversation_survives_a_checkpoint(tmp_path):
    """The coordinator's checkpoint keeps in-flight problems as msgpack of dataclasses.asdict
    (tuples come back as lists); the problem read back is the same, and hashable."""
    import dataclasses

    import msgpack

    from tasks.base import Problem

    p = Problem("7", "Be brief.\n\n2+2?", "4", messages=(("system", "Be brief."), ("user", "2+2?")))
    back = Problem(**msgpack.unpackb(msgpack.packb(dataclasses.asdict(p)), raw=False))
    assert back == p and hash(back) == hash(p)
