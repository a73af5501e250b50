"""A verl-layout Parquet dataset trains end to end: ``python -m cluster.launch v05.yaml
task.name=math task.path=train.parquet ...`` with real Ray, vLLM (CPU), DeepSpeed and the
embedded prior, for two steps, every admitted prompt accounted for.

The files are written as verl's data preprocessing scripts write them (``data_source``,
``prompt`` = chat messages, ``ability``, ``reward_model`` = {style, ground_truth},
``extra_info``). The model is the embedded stepwise policy: it reads only its own problem
format ("37+8 x2": add 8 to 37 twice, modulo 100) and writes ``answer: N`` last, which the math
task's verifier extracts as DAPO's "Answer:" line, so the questions are written in that format
with numeric ground truths, and most rollouts are right."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def verl_rows(specs, split: str) -> list[dict]:
    rows = []
    for i, (x, op, d, k) in enumerate(specs):
        truth = (x + (k * d if op == "+" else -k * d)) % 100
        rows.append({"data_source": "v05rl/stepwise-as-verl",
                     "prompt": [{"role": "user", "content": f"{x:02d}{op}{d} x{k}\n"}],
                     "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(truth)},
                     "extra_info": {"split": split, "index": f"{split}-{i}"}})
    return rows


@pytest.fixture(scope="module")
def verl_files(tmp_path_factory):
    import pandas as pd

    rng = random.Random(0)
    # sorted: a set's order of tuples with strings changes with each process's hash seed, and
    # with it which prompts were held out
    specs = sorted({(rng.randrange(100), rng.choice("+-"), rng.randint(1, 9), rng.randint(1, 2))
                    for _ in range(60)})
    tmp = tmp_path_factory.mktemp("verl")
    pd.DataFrame(verl_rows(specs[:40], "train")).to_parquet(tmp / "train.parquet")
    pd.DataFrame(verl_rows(specs[40:44], "test")).to_parquet(tmp / "test.parquet")
    return tmp


def test_a_verl_parquet_trains_end_to_end(verl_files, tmp_path):
    from tasks.policy import ensure_default_policy

    model = ensure_default_policy(task="stepwise")  # cached: built by the install
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "cluster.launch", "v05.yaml",
           "task.name=math", f"task.path={verl_files / 'train.parquet'}",
           f"task.heldout_path={verl_files / 'test.parquet'}", "task.n_heldout=4",
           f"model.path={model}", "run.name=verl", f"run.output_dir={tmp_path}",
           "run.max_steps=2", "run.eval_every=2", "run.eval_prompts=4", "run.eval_samples=1",
           "generators.count=1", "rollout.batch_prompts=4", "rollout.max_tokens=48",
           "algo.k_init=2", "algo.k_max=4", "cluster.address=local"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    run_dir = tmp_path / "verl"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["prompts_trained"] == 2 * 4
    assert summary["prompts_admitted"] == (summary["prompts_trained"] + summary["prompts_dropped"]
                                           + summary["prompts_in_flight_at_end"])
    # The prompts came from the file (verl's extra_info.index is the id), and its ground
    # truths reached the verifier: with numeric answers in the policy's own format, rollouts
    # are scored right (+1) where they match the file's answer and wrong (-1) elsewhere. How
    # many are right varies (the two-operation prompts are hard for the policy: a step's
    # reward_mean of 0.0 came up, and a held-out sampled accuracy of 0 on 4 prompts); a right
    # one among 8 prompts' rollouts needs the file's answers. The held-out file is evaluated.
    trained = [json.loads(x) for x in (run_dir / "prompts.jsonl").read_text().splitlines()]
    assert len(trained) == 8 and all(p["prompt_id"].startswith("train-") for p in trained)
    rewards = [r for p in trained for r in p["rewards"]]
    assert set(rewards) <= {-1.0, 1.0} and 1.0 in rewards, rewards
    assert summary["eval_prompts"] == 4 and 0 <= summary["eval_accuracy_final"] <= 1
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    print(f"verl parquet: {summary['steps']} steps, {summary['prompts_trained']} prompts "
          f"trained of {summary['prompts_admitted']} admitted ({summary['prompts_dropped']} "
          f"dropped, {summary['prompts_in_flight_at_end']} in flight), reward_mean per step "
          f"{[m['reward_mean'] for m in metrics]}, held-out sampled accuracy "
          f"{summary['eval_accuracy_initial']} -> {summary['eval_accuracy_final']}, "
          f"{summary['wall_time_s']:.0f}s")
    # The held-out file was the evaluation set, at the start and at the end.
    assert summary["eval_prompts"] == 4
    assert summary["eval_accuracy_initial"] is not None and summary["eval_accuracy_final"] > 0
