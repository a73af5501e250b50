"""Every shipped config parses; bad keys fail naming the key and the choices; placement plans."""
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.config.schema import ConfigError, build_config, load_config
from cluster.nodes.placement import PlacementError, check_fits, plan

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [ROOT / "v05.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_parse(path):
    cfg = load_config(path)
    assert cfg.run.max_steps >= 1
    assert plan(cfg).total_cpus > 0


def test_paper_config_uses_32_gpus():
    cfg = load_config(ROOT / "configs" / "qwen3-4b-dapo-32gpu.yaml")
    p = plan(cfg)
    assert p.total_gpus == 32
    assert cfg.cluster.weight_sync == "nccl"
    check_fits(p, {"GPU": 32, "CPU": 4 * 8 * 16})
    with pytest.raises(PlacementError, match="asks for 32 GPU"):
        check_fits(p, {"GPU": 16, "CPU": 512})


def test_dotted_overrides_are_typed(monkeypatch):
    monkeypatch.delenv("V05_OUTPUT_ROOT", raising=False)  # a user's own would move run_dir
    cfg = load_config(ROOT / "v05.yaml", ["run.max_steps=3", "run.name=try1",
                                          "optim.lr=1e-3", "run.resume=true"])
    assert cfg.run.max_steps == 3 and cfg.run.name == "try1"
    assert cfg.optim.lr == pytest.approx(1e-3) and cfg.run.resume is True
    assert cfg.run.output_dir == "runs" and cfg.run_dir == Path("runs/try1").resolve()


@pytest.mark.parametrize("override, message", [
    ("run.max_stepz=3", r"unknown config key 'run.max_stepz'.*max_steps"),
    ("runn.name=x", r"unknown config key 'runn'.*'run'"),
    ("run.max_steps=many", r"run.max_steps"),
    ("run.max_steps=0", r"run.max_steps"),
    ("algo.name=ppo", r"algo.name.*grpo"),
    ("mode=turbo", r"mode.*sync"),
    ("algo.k_init=32", r"k_init"),
    ("optim.zero_stage=5", r"optim.zero_stage"),
    ("run", r"key.sub=value"),
    ("generators=3", r"config key 'generators' must be a mapping of \['count'"),
    ("generators.engine.bogus=1", r"unknown config key 'generators.engine.bogus'.*max_model_len"),
    ("rollout.top_p=1.5", r"rollout.top_p: Input should be less than or equal to 1; got 1.5"),
    ("cluster.num_cpus=-1", r"cluster.num_cpus: Input should be greater than 0; got -1"),
    ("optim.lr=.inf", r"optim.lr: must be a finite number; got inf"),
    ("run.stall_timeout_s=.inf", r"run.stall_timeout_s: must be a finite number"),
    ("rollout.temperature=.nan", r"rollout.temperature: Input should be greater than 0; got nan"),
    ("run.max_steps=true", r"run.max_steps: expected a number, got the boolean true"),
    ("optim.zero_stage=false", r"optim.zero_stage: expected a number, got the boolean false"),
    ("run.name=", r"run.name: must name a folder under run.output_dir"),
    ("run.name=..", r"run.name: must name a folder"),
    ("run.name=/tmp/elsewhere", r"run.name: must name a folder under run.output_dir .*not "
                                r"absolute, no '\.\.'\); got '/tmp/elsewhere'$"),
    ("run.name=../../elsewhere", r"run.name: must name a folder under run.output_dir"),
    ("run.name=exp/../../up", r"run.name: must name a folder under run.output_dir"),
    ("run.name=~/mine", r"run.name: must name a folder under run.output_dir"),
    # A validator's own message, without pydantic's "Value error," or the section twice.
    ("algo.k_init=32", r"^invalid config: algo: k_init \(32\) must be <= k_max \(16\)$"),
    ("prior.budget_s=20", r"^invalid config: prior.budget_s \(20.0\) must be smaller"),
])
def test_bad_overrides_fail_with_the_key_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "v05.yaml", [override])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_missing_model_path_is_a_clear_error(tmp_path):
    cfg = build_config({"model": {"path": str(tmp_path / "no-model")}})
    with pytest.raises(ConfigError, match=r"no-model' does not exist"):
        cfg.model.resolve()
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match=r"weights.bin' is a file, not a checkpoint directory"):
        build_config({"model": {"path": str(tmp_path / "weights.bin")}}).model.resolve()
    with pytest.raises(ConfigError, match=r"no Hugging Face checkpoint there \(config.json missing"):
        build_config({"model": {"path": str(tmp_path)}}).model.resolve()


def test_embedded_model_for_a_task_without_an_embedded_policy(tmp_path):
    cfg = build_config({"task": {"name": "math_jsonl", "path": str(tmp_path / "d.jsonl")}})
    with pytest.raises(ConfigError, match=r"model.path 'embedded': no embedded policy for task "
                                          r"'math_jsonl'; tasks with one: \['arithmetic'"):
        cfg.model_path()


def test_nccl_needs_gpus():
    with pytest.raises(PlacementError, match="nccl"):
        plan(build_config({"cluster": {"weight_sync": "nccl"}}))
    with pytest.raises(PlacementError, match="nccl"):
        plan(build_config({"cluster": {"weight_sync": {"type": "nccl"}}}))


def test_weight_sync_settings_from_yaml(tmp_path):
    """The settings docs/weight_sync.md recommends: a mapping validated as
    WeightSyncConfig; a bare name still means that transport's defaults."""
    from common.weight_sync import WeightSyncConfig

    path = tmp_path / "gpu.yaml"
    path.write_text("cluster:\n  weight_sync: {type: nccl, restart_fallback: true, "
                    "timeout_s: 300, probe_timeout_s: 5, max_attempts: 2, master_port: 29600}\n")
    ws = load_config(path).cluster.weight_sync_config
    assert ws == WeightSyncConfig(type="nccl", restart_fallback=True, timeout_s=300.0,
                                  probe_timeout_s=5.0, max_attempts=2, master_port=29600)
    cfg = load_config(path, ["cluster.weight_sync.timeout_s=60"])  # dotted, into the mapping
    assert cfg.cluster.weight_sync_config.timeout_s == 60.0
    assert cfg.cluster.weight_sync_config.restart_fallback is True
    named = build_config({"cluster": {"weight_sync": "nccl"}}).cluster
    assert named.weight_sync == "nccl" and named.weight_sync_config == WeightSyncConfig(type="nccl")
    assert build_config({}).cluster.weight_sync_config.type == "object_store"
    dumped = load_config(path).model_dump(mode="json")  # config.yaml parses back the same
    assert build_config(dumped).cluster.weight_sync_config == ws


@pytest.mark.parametrize("override, message", [
    ("cluster.weight_sync.timeout=30", r"^unknown config key 'cluster.weight_sync.timeout'; "
     r"valid keys under 'cluster.weight_sync': \['master_address', 'master_port', "
     r"'max_attempts', 'probe_timeout_s', 'restart_fallback', 'timeout_s', 'type'\]$"),
    ("cluster.weight_sync={type: nccl, timeout_s: 0}",
     r"^invalid config: cluster.weight_sync: timeout_s: Input should be greater than 0; got 0$"),
    ("cluster.weight_sync=ncl", r"cluster.weight_sync: unknown weight-sync type 'ncl'; known: "
     r"\['gloo', 'nccl', 'object_store'\]"),
    ("cluster.weight_sync={type: tcp}", r"cluster.weight_sync: type: unknown weight-sync type"),
    ("cluster.weight_sync=3", r"cluster.weight_sync: must be a transport name"),
])
def test_bad_weight_sync_settings_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        build_config({}, [override])


def test_cost_scales_with_reward_convention():
    cfg = build_config({"algo": {"name": "v05"}})
    # Stated once on the {-1, +1} scale; the estimator rescales it for its reward range.
    assert cfg.algo.estimator_config((-1.0, 1.0)).scaled_cost == pytest.approx(0.0039)
    assert cfg.algo.estimator_config((0.0, 1.0)).cost == pytest.approx(0.0039)
    assert cfg.algo.estimator_config((0.0, 1.0)).scaled_cost == pytest.approx(0.0039 / 4)


def test_launcher_rejects_bad_key_fast_without_ml_imports(tmp_path):
    # Like every launch in the tests, pointed away from the user's runs/ (test_bad_input.py).
    out = subprocess.run([sys.executable, "-m", "cluster.launch", "v05.yaml",
                          f"run.output_dir={tmp_path}", "run.bogus=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "unknown config key 'run.bogus'" in out.stderr
    code = ("import sys, cluster.config.schema, cluster.launch; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'ray', 'vllm', 'deepspeed', 'transformers'}))")
    imported = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, check=True)
    assert imported.stdout.strip() == "[]"


def test_missing_dataset_fails_at_launch_before_any_actor(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cluster.launch", "v05.yaml", "task.name=math_jsonl",
                          f"task.path={tmp_path / 'missing.jsonl'}",
                          f"run.output_dir={tmp_path / 'runs'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "dataset file" in out.stderr and "missing.jsonl" in out.stderr
    assert "Generator" not in out.stderr  # failed before starting actors


@pytest.mark.parametrize("overrides, message", [
    ({"rollout": {"temperature": 0.7}}, "logprobs_mode raw_logprobs"),
    ({"rollout": {"top_p": 0.9}}, "top-p"),
    ({"rollout": {"temperature": 0.7}, "optim": {"temperature": 0.7},
      "generators": {"engine": {"logprobs_mode": "processed_logprobs"}}}, None),
    ({"rollout": {"temperature": 0.7},
      "generators": {"engine": {"logprobs_mode": "processed_logprobs"}}}, "must equal"),
    ({"rollout": {"max_tokens": 300}, "generators": {"engine": {"max_model_len": 256}}},
     "max_model_len"),
])
def test_sampling_settings_must_match_the_learner(overrides, message):
    if message is None:
        build_config(overrides)
        return
    with pytest.raises(ConfigError, match=message):
        build_config(overrides)


def test_model_id_resolves_from_the_local_hf_cache_without_download(tmp_path, monkeypatch):
    # The hub cache layout: models--org--name/{refs/main, snapshots/<rev>/...}
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    assert build_config({"model": {"path": "acme/tiny"}}).model.resolve() == str(snap.resolve())
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
        build_config({"model": {"path": "acme/missing"}}).model.resolve()
    with pytest.raises(ConfigError, match="config.json missing"):
        build_config({"model": {"path": str(tmp_path)}}).model.resolve()


def test_a_nested_run_name_is_a_folder_under_output_dir(tmp_path):
    cfg = load_config(ROOT / "v05.yaml", ["run.name=exp1/seed0", f"run.output_dir={tmp_path}"])
    assert cfg.run_dir == tmp_path / "exp1" / "seed0"
    assert tmp_path in cfg.run_dir.resolve().parents
