"""Bad input through the launcher: each gets exit status 2 and one line naming the problem,
before any actor starts (``cluster.launch.run``, which connects to Ray, is replaced by a
tripwire). And garbage model output: the low reward, counted. The table in
docs/reliability.md ("Bad input") lists these with their messages.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cluster import launch

ROOT = Path(__file__).resolve().parents[2]


class ActorWouldStart(Exception):
    pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tasks.policy_model import save_random_policy

    return str(save_random_policy(tmp_path_factory.mktemp("m"), hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2))


@pytest.fixture
def launcher(monkeypatch, capsys, tmp_path_factory):
    """``launcher(*overrides)`` -> (exit status, stderr) of ``python -m cluster.launch
    v05.yaml *overrides``, in-process; raises ActorWouldStart where a real launch would go
    on to start the cluster and the actors.

    Every launch goes to a fresh, empty output directory of its own, never to the user's
    (``runs/`` in the checkout, ``$V05_OUTPUT_ROOT``, ``~/v05rl-runs``): after the README's
    first command ``runs/v05-cpu`` holds a finished run, and preflight would answer "holds
    a finished run" (exit 0) before the check under test. An absolute ``run.output_dir``,
    first so that a test's own comes after it and wins, is used as it is whatever the
    config, the environment or the current directory (cluster/config/paths.py); V05_OUTPUT_ROOT
    catches a relative one a test might give."""
    import common.rayproc

    def tripwire(*a, **k):
        raise ActorWouldStart
    monkeypatch.setattr(launch, "run", tripwire)
    monkeypatch.setattr(common.rayproc, "prefer_loopback", lambda *a: None)
    monkeypatch.chdir(ROOT)
    out = tmp_path_factory.mktemp("runs")
    monkeypatch.setenv("V05_OUTPUT_ROOT", str(out))

    def go(*overrides, config="v05.yaml"):
        rc = launch.main([config, f"run.output_dir={out}", *overrides])
        return rc, capsys.readouterr().err
    return go


def lines(n: int) -> str:
    return "".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                   for i in range(n))


def math_task(path, model_dir) -> list[str]:
    return ["task.name=math_jsonl", f"task.path={path}", "task.n_heldout=1",
            f"model.path={model_dir}"]


def test_a_good_request_gets_past_every_check(launcher, model_dir, tmp_path):
    """The control: the tripwire is reached, so the cases below stop before it on their own."""
    (tmp_path / "ok.jsonl").write_text(lines(6))
    with pytest.raises(ActorWouldStart):
        launcher(*math_task(tmp_path / "ok.jsonl", model_dir))


def test_lora_targets_are_checked_against_the_model(launcher, model_dir):
    """A LoRA target the model lacks is named with the model's linear layers; real ones pass."""
    lora = '{"rank":4,"alpha":8,"target_modules":%s}'
    rc, err = launcher(f"model.path={model_dir}", "optim.lora=" + lora % '["qkv_proj"]')
    assert rc == 2 and re.search(r"optim\.lora\.target_modules \['qkv_proj'\]: \w+ has no such "
                                 r"linear layer \(it has .*q_proj", err), err
    for targets in ('["q_proj","v_proj"]', '"all-linear"'):
        with pytest.raises(ActorWouldStart):
            launcher(f"model.path={model_dir}", "optim.lora=" + lora % targets)


BAD_DATASETS = {  # file name: (its content, what the error must say)
    "math_small.jsonl": (lines(2) + "{not json\n", r"math_small\.jsonl:3: Expecting property name"),
    "latin1.jsonl": (lines(2).encode() + b'{"prompt": "caf\xe9", "answer": "1"}\n',
                     r"latin1\.jsonl:3: not UTF-8 text \(byte 0xe9"),
    "nulls.jsonl": (lines(4) + "null\n", r"nulls\.jsonl:5: expected a JSON object, got null"),
    "blank.jsonl": (lines(3) + '{"prompt": [{"role": "user", "content": ""}], "answer": "1"}\n',
                    r"blank\.jsonl:4: column 'prompt': blank"),
    "empty.jsonl": ("\n\n", r"empty\.jsonl: no problems in file"),
    "one.jsonl": ('{"prompt": "q", "answer": "1"}\n' * 6,
                  r"task\.n_heldout\) must be in \[1, 1\): .*one\.jsonl holds 1 distinct prompts"),
    "unicode.jsonl": (lines(4) + json.dumps({"prompt": "Löse x² = 4", "answer": "2", "id": "de"})
                      + "\n", r"tokenizer cannot encode (train|held-out) prompt 'de' .*'ö', '²' "
                               r"map to the unknown token"),
}


@pytest.mark.parametrize("name", BAD_DATASETS)
def test_a_bad_dataset_is_named_by_file_and_line(launcher, model_dir, tmp_path, name):
    content, message = BAD_DATASETS[name]
    f = tmp_path / name
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    rc, err = launcher(*math_task(f, model_dir))
    assert rc == 2
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err


def verl_parquet(path, n: int, bad_row: int | None = None):
    """``n`` rows in verl's layout; row ``bad_row`` without a ground truth."""
    import pandas as pd

    pd.DataFrame([{"data_source": "t", "prompt": [{"role": "user", "content": f"{i} + 1 = ?"}],
                   "ability": "math", "extra_info": {"index": i},
                   "reward_model": {"style": "rule",
                                    "ground_truth": None if i == bad_row else str(i + 1)}}
                  for i in range(n)]).to_parquet(path)
    return path


def test_a_verl_parquet_gets_past_every_check_and_a_bad_row_or_key_stops_it(launcher, model_dir,
                                                                             tmp_path):
    with pytest.raises(ActorWouldStart):
        launcher(*math_task(verl_parquet(tmp_path / "ok.parquet", 6), model_dir), "task.name=math")
    bad = verl_parquet(tmp_path / "bad.parquet", 6, bad_row=4)
    rc, err = launcher(*math_task(bad, model_dir), "task.name=math")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert re.fullmatch(r"error: .*bad\.parquet: row 4 \(0-based\): column "
                        r"'reward_model\.ground_truth': missing or null\n", err), err
    rc, err = launcher(*math_task(tmp_path / "ok.parquet", model_dir), "task.name=math",
                       "task.prompt_key=question")
    assert rc == 2 and re.fullmatch(r"error: .*ok\.parquet: task\.prompt_key 'question' is not a "
                                    r"column; its columns: data_source, prompt, .*\n", err), err


def test_a_reward_file_gets_past_every_check_and_a_bad_one_stops_it(launcher, model_dir,
                                                                   tmp_path):
    """A verl-layout parquet with a reward function in verl's signature reaches the launch; a
    missing file, and a 0/1 function on the default -1/+1 range, are said in one line."""
    data = verl_parquet(tmp_path / "ok.parquet", 6)
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text("def compute_score(data_source, solution_str, ground_truth, "
                       "extra_info=None):\n    return float(ground_truth in solution_str)\n")
    spec = f"task.reward_function={rewards}:compute_score"
    with pytest.raises(ActorWouldStart):
        launcher(*math_task(data, model_dir), "task.name=math", spec, "task.reward_low=0",
                 "task.reward_high=1")
    rc, err = launcher(*math_task(data, model_dir), "task.name=math", spec)
    assert rc == 2 and re.fullmatch(
        r"error: task\.reward_function .*my_rewards\.py:compute_score on problem \d+: the "
        r"ground truth written as an answer got 1\.0 at best and an empty answer 0\.0, where "
        r"the task's range is \[-1\.0, 1\.0\]: set task\.reward_low=0 and "
        r"task\.reward_high=1 if those are its rewards\n", err), err
    rc, err = launcher(*math_task(data, model_dir), "task.name=math",
                       "task.reward_function=absent.py:compute_score")
    assert rc == 2 and "task.reward_function: absent.py is not a file" in err, err


DATASET_PATHS = [
    ("missing.jsonl", r"task\.path: dataset file .*missing\.jsonl does not exist"),
    ("a-folder", r"task\.path: .*a-folder is a directory but not one written by save_to_disk"),
    ("data.csv", r"task\.path: .*data\.csv: unknown dataset format '\.csv'"),
]


@pytest.mark.parametrize("where, message", DATASET_PATHS, ids=[c[0] for c in DATASET_PATHS])
def test_a_dataset_path_that_is_not_a_file(launcher, model_dir, tmp_path, where, message):
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "data.csv").write_text("prompt,answer\n1+1,2\n")
    rc, err = launcher(*math_task(tmp_path / where, model_dir), "--dry-run")
    assert rc == 2 and re.search(message, err), err


MODEL_PATHS = [
    ("absent", r"model\.path '.*absent' does not exist"),
    ("w.bin", r"w\.bin' is a file, not a checkpoint directory"),
    ("empty", r"empty': no Hugging Face checkpoint there \(config\.json missing\)"),
    ("bare", r"bare: not a usable model \(no weights: none of model\.safetensors"),
]


@pytest.mark.parametrize("what, message", MODEL_PATHS, ids=[c[0] for c in MODEL_PATHS])
def test_a_model_path_that_is_not_a_model(launcher, model_dir, tmp_path, what, message):
    (tmp_path / "w.bin").write_bytes(b"0")
    (tmp_path / "empty").mkdir()
    shutil.copytree(model_dir, tmp_path / "bare", ignore=shutil.ignore_patterns("*.safetensors"))
    rc, err = launcher(f"model.path={tmp_path / what}")
    assert rc == 2 and re.search(message, err), err


def test_a_packaged_model_whose_file_is_damaged_is_named(launcher, tmp_path, monkeypatch):
    """model.path naming a packaged model (tasks/pretrained.py) whose GGUF file is truncated:
    the file is named, exit 2, nothing converted."""
    import hashlib
    from dataclasses import replace

    from tasks import pretrained

    pkg = tmp_path / "site" / "fake_gguf_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    released = b"GGUF" + bytes(60)
    (pkg / "model.gguf").write_bytes(released[:20])  # a download cut short
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    fake = replace(pretrained.SMOLLM2, name="fake-model", package="fake_gguf_pkg",
                   filename="model.gguf", size=len(released),
                   sha256=hashlib.sha256(released).hexdigest())
    monkeypatch.setitem(pretrained.PACKAGED, fake.name, fake)
    monkeypatch.setenv("V05_CACHE", str(tmp_path / "cache"))
    rc, err = launcher("model.path=fake-model")
    assert rc == 2 and re.search(r"model\.path 'fake-model': fake-model: .*fake_gguf_pkg/model\.gguf "
                                 r"is truncated or not the released file \(20 bytes, expected 64\)",
                                 err), err
    assert not (tmp_path / "cache" / "pretrained" / "fake-model").exists()


def test_an_architecture_vllm_cannot_serve_and_a_missing_chat_template(launcher, model_dir,
                                                                      tmp_path):
    odd = tmp_path / "odd"
    shutil.copytree(model_dir, odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "architectures": ["MysteryLM"]}))
    rc, err = launcher(f"model.path={odd}")
    assert rc == 2 and re.search(r"odd: not a usable model \(architecture MysteryLM is not one "
                                 r"the installed vLLM generates with", err), err
    rc, err = launcher(f"model.path={model_dir}", "generators.engine.prompt_format=chat")
    assert rc == 2 and re.search(r"prompt_format 'chat' but the tokenizer has no chat template",
                                 err), err


CONFIG_VALUES = [
    ("run.max_stepz=3", r"unknown config key 'run\.max_stepz'; valid keys under 'run': .*max_st"),
    ("run.max_steps=many", r"run\.max_steps: Input should be a valid integer"),
    ("run.max_steps=true", r"run\.max_steps: expected a number, got the boolean true"),
    ("run.max_steps=0", r"run\.max_steps: Input should be greater than or equal to 1; got 0"),
    ("rollout.top_p=1.5", r"rollout\.top_p: Input should be less than or equal to 1; got 1\.5"),
    ("optim.lr=.nan", r"optim\.lr: Input should be greater than 0; got nan"),
    ("optim.lr=.inf", r"optim\.lr: must be a finite number; got inf"),
    # admission by selection (issue 41): the floor, the window, a prior that can score
    ("algo.select_floor=0", r"algo\.select_floor: Input should be greater than 0; got 0"),
    ("algo.select_floor=1.5", r"algo\.select_floor: Input should be less than or equal to 1"),
    ("algo.select_threshold=0", r"algo\.select_threshold: Input should be greater than 0; got 0"),
    ("algo.select=prior algo.select_window=4",
     r"algo\.select_window \(4\) must hold at least one batch \(16 prompts\)"),
    ("algo.select=prior prior.backend=constant",
     r"algo\.select=prior needs a prior that scores prompts before their rollouts; "
     r"prior\.backend 'constant' does not"),
    ("algo.select=oracle", r"algo\.select: Input should be 'none', 'prior' or 'history'"),
    # checked inside the prior actor, or when the scheduler was built, before 2026-12-06:
    # once the cluster was up, with a traceback and exit 1 (issue 43)
    ("prior.backend=nope", r"prior\.backend 'nope' is not a prior backend; valid: constant, "
                           r"embedded, .*v0"),
    ('prior.options={"halflif":8}', r"prior\.options: backend 'embedded' does not take them "
                                     r"\(got an unexpected keyword argument 'halflif'\)"),
    ("rollout.max_inflight_prompts=2", r"rollout\.max_inflight_prompts \(2\) must be at least "
                                       r"the batch's prompts \(16\)"),
    # LoRA (issue 43): its rank, and ZeRO-3 (its merge is untested there)
    ('optim.lora={"rank":0,"alpha":16}', r"optim\.lora\.rank: Input should be greater than or "
                                          r"equal to 1; got 0"),
    ('optim.lora={"rank":8,"alpha":16} optim.zero_stage=3',
     r"optim\.lora with zero_stage 3 is not supported yet"),
    # the CUDA path (issue 45): refused at load until it is wired
    ("generators.engine.tensor_parallel_size=2",
     r"generators\.engine\.tensor_parallel_size=2: tensor parallelism is not supported yet"),
]


@pytest.mark.parametrize("override, message", CONFIG_VALUES, ids=[c[0] for c in CONFIG_VALUES])
def test_a_bad_config_value_names_the_field_and_its_range(launcher, override, message):
    rc, err = launcher(*override.split())
    assert rc == 2 and re.search(message, err), err


@pytest.mark.parametrize("dry_run", [False, True], ids=["launch", "dry-run"])
def test_a_task_that_cannot_build_its_splits_is_named_before_any_actor(launcher, dry_run):
    """Generated splits are built on first use; a size the chosen levels cannot supply was
    once said only by the coordinator actor's constructor, after the cluster was up."""
    rc, err = launcher("task.difficulties=[1]", *(["--dry-run"] if dry_run else []))
    assert rc == 2 and re.search(r"difficulties \[1\] have only \d+ distinct train problems, "
                                 r"4000 requested", err), err


def test_a_missing_config_file(launcher, tmp_path):
    rc, err = launcher(config=str(tmp_path / "nope.yaml"))
    assert rc == 2 and "nope.yaml' not found" in err


@pytest.mark.parametrize("task_name", ["math_jsonl", "stepwise"])
def test_garbage_output_gets_the_low_reward_and_is_counted(task_name):
    """Unparseable completions score r_lo with parsed=False; the prompt's record counts them
    and the step's metrics report the fraction (metrics.jsonl unparsed_fraction)."""
    import asyncio

    from actors.prompts import make_record
    from actors.scheduler import PromptInFlight
    from actors.scoring import Scorer
    from common.types import Rollout
    from cluster.records.metrics import batch_metrics
    from estimator import make_estimator
    from estimator.state import PromptState
    from tasks import make_task

    kw = ({"path": ROOT / "tests" / "fixtures" / "math_small.jsonl", "n_heldout": 3}
          if task_name == "math_jsonl" else {"n_train": 8, "n_heldout": 8})
    task = make_task(task_name, **kw)
    problem = task.train()[0]
    good = f"Answer: {problem.answer}" if task_name == "math_jsonl" else None
    if good is None:
        from tasks.stepwise import reference_trace
        good = reference_trace(problem)
    garbage = ["", "\x00\ufffd\ufffd }}{{ \\boxed{", "Answer: ???", "🙂" * 50]
    scorer = Scorer(task)
    verdicts = [asyncio.run(scorer.score(problem, text, 8)) for text in [good, *garbage]]
    assert verdicts[0].reward == 1.0 and verdicts[0].parsed
    assert all(v.reward == -1.0 and not v.parsed for v in verdicts[1:])

    state = PromptState(make_estimator("grpo", k_init=5, k_max=5))
    assert state.to_request() == 5
    grp = PromptInFlight(uid="u0", problem=problem, state=state, admitted_version=0,
                         deadline=0, home=0, t_admit=0.0)
    for i, v in enumerate(verdicts):
        grp.payloads[i] = Rollout(f"r{i}", problem.id, [1, 2], [3] * 4, [-0.5] * 4, "", "stop",
                                  0, reward=v.reward, parsed=v.parsed)
        grp.start_version[i] = 0
        state.add(v.reward, i)
    record = make_record(grp)
    assert record.unparsed == 4
    assert batch_metrics([record], 5, task.rewards)["unparsed_fraction"] == pytest.approx(4 / 5)


def test_a_resume_with_nothing_to_resume_is_named_before_any_actor(launcher, model_dir, tmp_path):
    (tmp_path / "ok.jsonl").write_text(lines(6))
    rc, err = launcher(*math_task(tmp_path / "ok.jsonl", model_dir), "run.resume=true",
                       f"run.output_dir={tmp_path / 'runs'}", "run.name=gone")
    assert rc == 2 and "run.resume=true but the run directory does not exist" in err, err


def test_a_previous_run_is_never_deleted_by_a_second_launch_of_its_name(launcher, model_dir,
                                                                         tmp_path):
    """The same command twice: a finished run (checkpoint at run.max_steps) is left alone
    (exit 0, nothing to do); results without a whole checkpoint, or run.resume=false, are
    refused (exit 2, one line naming both ways out) before any actor; a run with a whole
    checkpoint before run.max_steps goes on to the actors (it resumes)."""
    from cluster.records.checkpoints import RUN_STATE, write_digests

    (tmp_path / "ok.jsonl").write_text(lines(6))
    args = [*math_task(tmp_path / "ok.jsonl", model_dir), f"run.output_dir={tmp_path / 'runs'}",
            "run.name=twice", "run.max_steps=4"]
    run = tmp_path / "runs" / "twice"
    (run / "final").mkdir(parents=True)
    (run / "final" / "model.safetensors").write_bytes(b"trained")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    for extra in ([], ["run.resume=false"]):
        rc, err = launcher(*args, *extra)
        (line,) = err.strip().splitlines()
        assert rc == 2 and line.startswith("error: ") and str(run) in line, err
        assert "run.resume=true" in line and "run.overwrite=true" in line, line
    (run / "checkpoints" / "step4").mkdir(parents=True)
    (run / "checkpoints" / "step4" / RUN_STATE).write_bytes(b"\x80")
    write_digests(run / "checkpoints" / "step4")
    rc, err = launcher(*args)
    assert rc == 0 and "holds a finished run (checkpoint step4" in err, err
    with pytest.raises(ActorWouldStart):  # a longer run of the same name continues it
        launcher(*args, "run.max_steps=6")
    assert (run / "final" / "model.safetensors").read_bytes() == b"trained"
    assert (run / "checkpoints" / "step4" / RUN_STATE).is_file()
    rc, err = launcher(*args, "run.resume=true", "run.overwrite=true")
    assert rc == 2 and "contradict" in err, err


def previous_run(run: Path) -> dict:
    """A previous run's results in ``run``; returns its files' bytes."""
    (run / "final").mkdir(parents=True)
    (run / "final" / "model.safetensors").write_bytes(b"trained")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.parametrize("ask, message", [
    (["generators.gpus=64"], r"placement asks for 128 GPU \(generator 2x\{'CPU': 0\.5, 'GPU': "
                             r"64\.0\}, .*\) but a local cluster on this machine has \d+; "),
    (["cluster.num_cpus=1"], r"placement asks for 1\.8 CPU \(.*\) but a local cluster on this "
                             r"machine \(cluster\.num_cpus\) has 1; lower the per-role"),
], ids=["gpus", "cpus"])
def test_roles_that_need_more_than_the_machine_has_are_refused_with_the_numbers(
        model_dir, tmp_path, monkeypatch, capsys, ask, message):
    """A local cluster this machine cannot hold (Ray would take num_gpus on trust): refused
    with what the plan asks and what there is, exit 2, before Ray starts, and a previous
    run's results kept even under run.overwrite=true. The launch is real (no tripwire)."""
    import ray

    (tmp_path / "ok.jsonl").write_text(lines(6))
    monkeypatch.chdir(ROOT)
    kept = previous_run(tmp_path / "runs" / "prev")
    rc = launch.main(["v05.yaml", *math_task(tmp_path / "ok.jsonl", model_dir), *ask,
                      f"run.output_dir={tmp_path / 'runs'}", "run.name=prev",
                      "run.overwrite=true", "cluster.address=local"])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(message, err), err
    assert err.strip().splitlines()[-1].startswith("error: "), err
    assert not ray.is_initialized()
    assert {p: p.read_bytes() for p in (tmp_path / "runs" / "prev").rglob("*")
            if p.is_file()} == kept
