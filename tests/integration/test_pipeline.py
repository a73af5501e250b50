"""End to end in a real local Ray cluster: real vLLM (CPU) generators, real DeepSpeed learner.

One set of actors serves the module (engine start dominates the cost): a synchronous GRPO
run, then an asynchronous V0.5 run continuing from its weights, then an async run in which a
generator is killed mid-run.
"""
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")

from cluster.config import build_config  # noqa: E402
from cluster.metrics import read_metrics  # noqa: E402
from cluster.placement import plan  # noqa: E402

METRIC_KEYS = {"step", "policy_version", "reward_mean", "rollouts", "tokens_generated",
               "grad_norm", "entropy", "clip_fraction", "step_time_s", "gen_time_s",
               "train_time_s", "sync_time_s", "generator_busy_fraction"}
ASYNC_KEYS = {"k_mean", "k_hist", "prior_accept_rate", "staleness_mean", "staleness_max",
              "learner_idle_fraction", "prompts_per_s", "rollouts_per_s"}


def assert_accounted(summary):
    """Every admitted prompt ended exactly once: trained, dropped, or still in flight."""
    assert summary["prompts_admitted"] == (summary["prompts_trained"] + summary["prompts_dropped"]
                                           + summary["prompts_in_flight_at_end"])


def make_cfg(tmp, name, **sections):
    base = {
        "run": {"name": name, "output_dir": str(tmp), "max_steps": 3, "eval_every": 3,
                "eval_prompts": 16, "progress": False},
        "algo": {"name": "grpo", "k_init": 4, "k_max": 4},
        "rollout": {"batch_prompts": 4, "max_tokens": 8, "max_inflight_prompts": 12},
        "generators": {"count": 2, "cpus": 0.5, "engine": {"max_num_seqs": 32}},
        "learner": {"ranks": 1, "cpus": 0.5},
        "prior": {"cpus": 0.2},
        "cluster": {"address": "local"},
        "optim": {"lr": 1e-4},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return build_config(base)


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    from cluster.runtime import connect, start_roles
    from tasks import make_task_from_config

    tmp = tmp_path_factory.mktemp("runs")
    # Plan for the async V0.5 shape (prior + coordinator) so every test fits in one set.
    cfg = make_cfg(tmp, "setup", mode="async", algo={"name": "v05"})
    p = plan(cfg)
    model_path = cfg.model.resolve()
    started = connect(cfg, p)
    roles = start_roles(cfg, p, model_path)
    yield {"tmp": tmp, "roles": roles, "task": make_task_from_config(cfg.task),
           "model_path": model_path}
    roles.shutdown()
    if started:
        ray.shutdown()


def run(system, cfg):
    from cluster.trainer import Trainer

    return Trainer(cfg, system["roles"], system["task"]).run()


def learner_weights(system):
    return system["roles"].learner.get_weights()


def test_sync_grpo_trains_and_generators_serve_new_weights(system):
    from safetensors.numpy import load_file

    initial = {}
    for f in Path(system["model_path"]).glob("*.safetensors"):
        initial.update(load_file(f))
    cfg = make_cfg(system["tmp"], "sync-grpo", mode="sync")
    summary = run(system, cfg)

    assert summary["policy_version"] == 3 and summary["steps"] == 3
    after = learner_weights(system)
    changed = [n for n in initial if n in after and not np.allclose(initial[n], after[n])]
    assert len(changed) > len(initial) // 2, "training should move most weights"
    versions = ray.get([g.version.remote() for g in system["roles"].generators])
    assert versions == [3, 3]

    rows = read_metrics(cfg.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert METRIC_KEYS <= set(rows[0])
    assert rows[-1]["eval_accuracy"] is not None
    assert all(r["rollouts"] == 4 * 4 for r in rows)
    assert_accounted(summary)
    assert (cfg.run_dir / "config.yaml").is_file() and (cfg.run_dir / "checkpoints").is_dir()


def test_generators_serve_exactly_the_learner_weights(system, tmp_path):
    """Greedy output of every generator == transformers on the learner's current weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actors.types import RolloutRequest, SamplingConfig

    out = tmp_path / "hf"
    system["roles"].learner.save_hf(str(out))
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    prompts = [p.prompt for p in system["task"].heldout()[:4]]
    greedy = SamplingConfig(temperature=0.0, max_tokens=8)
    for g in system["roles"].generators:
        for i, prompt in enumerate(prompts):
            [r] = ray.get(g.generate.remote(RolloutRequest(f"eq{i}", "p", prompt, 1, greedy)))
            ids = torch.tensor([r.prompt_token_ids])
            ref = model.generate(ids, max_new_tokens=8, do_sample=False,
                                 pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
            assert r.token_ids == ref[: len(r.token_ids)]


def test_async_v05_streams_with_variable_k(system):
    cfg = make_cfg(system["tmp"], "async-v05", mode="async",
                   algo={"name": "v05", "k_init": 4, "k_max": 16},
                   run={"max_steps": 6, "eval_every": 0}, rollout={"max_staleness": 1})
    summary = run(system, cfg)
    rows = read_metrics(cfg.run_dir)
    assert ASYNC_KEYS <= set(rows[0])
    prompts = [json.loads(line) for line in (cfg.run_dir / "prompts.jsonl").read_text().splitlines()]
    ks = [p["k"] for p in prompts]
    assert all(4 <= k <= 16 for k in ks)
    assert len(set(ks)) > 1, f"k should vary across prompts, got {ks}"
    # Extra requests were served by more than one generator.
    extra_served_by = {g for p in prompts if p["k"] > 4 for g in p["generators"]}
    assert len(extra_served_by) > 1
    # Streaming: some prompt was trained before another of its admission wave had finished.
    by_wave = {}
    for p in prompts:
        by_wave.setdefault(p["wave"], []).append(p)
    assert any(a["t_trained"] < b["t_done"] for ps in by_wave.values() for a in ps for b in ps)
    assert_accounted(summary)
    assert summary["prompts_trained"] == 6 * 4


def test_async_run_survives_a_generator_kill(system):
    cfg = make_cfg(system["tmp"], "async-kill", mode="async",
                   algo={"name": "v05", "k_init": 4, "k_max": 16},
                   run={"max_steps": 12, "eval_every": 0})
    victim = system["roles"].generators[1]
    killed = threading.Event()

    def kill_mid_run():
        """Once training has begun, kill the victim while it is serving requests."""
        deadline = time.time() + 300
        while time.time() < deadline:
            metrics = cfg.run_dir / "metrics.jsonl"
            if metrics.exists() and metrics.read_text().strip():
                if ray.get(victim.stats.remote())["in_flight"] > 0:
                    ray.kill(victim, no_restart=False)  # Ray restarts it (max_restarts)
                    killed.set()
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_mid_run)
    killer.start()
    summary = run(system, cfg)
    killer.join()
    assert killed.is_set(), "the run ended before the generator could be killed"
    assert summary["steps"] == 12
    assert_accounted(summary)
    assert summary["generator_restarts"] >= 1 and summary["reissued_requests"] >= 1
    assert ray.get(victim.ready.remote(), timeout=300)  # Ray restarted it


def test_checkpoint_resume_and_rollout_replay(system):
    from learner.replay import main as replay_main

    cfg = make_cfg(system["tmp"], "resume", mode="sync",
                   run={"max_steps": 2, "eval_every": 0, "record_rollouts": True})
    first = run(system, cfg)
    cfg3 = make_cfg(system["tmp"], "resume", mode="sync",
                    run={"max_steps": 3, "eval_every": 0, "resume": True})
    second = run(system, cfg3)
    rows = read_metrics(cfg3.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]  # continued, not restarted
    assert second["policy_version"] > first["policy_version"]
    assert second["steps"] == 3
    assert_accounted(second)
    # The recorded groups drive the learner alone, without generators.
    out = replay_main([str(cfg.run_dir / "rollouts.msgpack"), "--model", system["model_path"],
                       "--batch-prompts", "4", "--steps", "1", "--cpus-per-rank", "0.2"])
    assert out["steps"] == 1


def test_async_run_survives_a_dead_prior(system):
    from cluster.runtime import start_prior

    cfg = make_cfg(system["tmp"], "no-prior", mode="async",
                   algo={"name": "v05", "k_init": 4, "k_max": 16},
                   run={"max_steps": 2, "eval_every": 0}, prior={"timeout_s": 2.0})
    ray.kill(system["roles"].prior, no_restart=True)
    try:
        summary = run(system, cfg)
    finally:
        system["roles"].prior = start_prior(cfg, system["roles"].groups["prior"])
    assert summary["steps"] == 2
    assert summary["prior_fallbacks"] >= 8
    prompts = [json.loads(x) for x in (cfg.run_dir / "prompts.jsonl").read_text().splitlines()]
    assert all(p["fallback"] and p["k"] == 4 for p in prompts)
    assert_accounted(summary)
