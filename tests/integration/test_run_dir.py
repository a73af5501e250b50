"""Never lose a run, and W&B logging, with real Ray, vLLM (CPU) and DeepSpeed: two launches
of one run name on the long-lived roles of tests/integration/test_pipeline.py (its fixtures).

The first run (async v05 with the prior, as the default run, 2 steps, W&B on, offline)
finishes; the same run again is refused as done,
``run.resume=false`` is refused, a copy of its results without checkpoints is refused, and
none of them changes a byte of its checkpoints or final model; a longer run of the same name
resumes it (auto) and keeps its checkpoint; only ``run.overwrite=true`` deletes. The W&B
offline run, read back from its ``.wandb`` files, holds every number of every
metrics.jsonl line at its step. The launcher's exit statuses for the same cases:
tests/unit/test_bad_input.py; the decision itself: tests/unit/test_plan_start.py.
"""
import hashlib
import shutil

import pytest

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")
pytest.importorskip("wandb")

from test_pipeline import assert_accounted, fresh, make_cfg, run, system  # noqa: E402,F401

from cluster.paths import RunDirError  # noqa: E402
from cluster.run_files import prompt_fates, read_metrics  # noqa: E402
from cluster.wandb_log import read_offline  # noqa: E402


def digests(run_dir, *parts):
    """Every file under ``parts`` of ``run_dir``, by path: its sha256."""
    out = {}
    for part in parts:
        for p in sorted((run_dir / part).rglob("*")):
            if p.is_file():
                out[str(p.relative_to(run_dir))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def short(tmp, name, steps, **run_kw):
    """The default run's shape (async, v05 with the embedded prior: every metric it logs),
    short, logging to W&B."""
    return make_cfg(tmp, name, mode="async", algo={"name": "v05", "k_init": 4, "k_max": 8},
                    logging={"wandb": True},
                    run={"max_steps": steps, "eval_every": steps, "eval_prompts": 8,
                         "eval_samples": 1, **run_kw})


def assert_wandb_has_every_metric(run_dir, steps):
    rows = read_metrics(run_dir)
    got = read_offline(run_dir)
    assert [h["_step"] for h in got["history"]] == [r["step"] for r in rows] == steps
    for h, r in zip(got["history"], rows):
        numbers = {k: v for k, v in r.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert len(numbers) > 20, sorted(r)
        missing = sorted(set(numbers) - set(h))
        assert not missing, missing
        assert all(h[k] == pytest.approx(v) for k, v in numbers.items())
    return got


def test_two_launches_of_one_name_never_lose_the_first_run(fresh, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_MODE", "offline")  # never the network in a test
    tmp = fresh["tmp"]
    cfg = short(tmp, "twice", 2)
    first = run(fresh, cfg)
    assert first["steps"] == 2 and first["resumed_from"] is None
    assert_accounted(first)
    kept = digests(cfg.run_dir, "checkpoints", "final")
    assert any(k.startswith("checkpoints/step2/") for k in kept)
    assert any(k.startswith("final/") and k.endswith(".safetensors") for k in kept)

    # W&B, offline: every metric at its step, the config, the summary, the report attached.
    got = assert_wandb_has_every_metric(cfg.run_dir, [1, 2])
    assert got["summary"]["steps"] == 2 and got["summary"]["prompts_trained"] == \
        first["prompts_trained"]
    assert got["config"]["run"]["name"] == "twice"
    assert {"summary.json", "report.html"} <= set(got["files"])

    # The same run again, run.resume=false, and the results without checkpoints: refused,
    # before the run starts anything, and nothing of the first run changes.
    with pytest.raises(RunDirError, match="holds a finished run"):
        run(fresh, cfg)
    with pytest.raises(RunDirError, match=r"run.resume=false but .* run.resume=true continues "
                                          r"it, run.overwrite=true deletes it"):
        run(fresh, short(tmp, "twice", 2, resume=False))
    shutil.copytree(cfg.run_dir, tmp / "nockpt", ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(RunDirError, match=r"no whole checkpoint .*run.resume=true.*"
                                          r"run.overwrite=true"):
        run(fresh, short(tmp, "nockpt", 2))
    assert (tmp / "nockpt" / "final").is_dir() and (tmp / "nockpt" / "metrics.jsonl").is_file()
    assert digests(cfg.run_dir, "checkpoints", "final") == kept
    assert [r["step"] for r in read_metrics(cfg.run_dir)] == [1, 2]

    # A longer run of the same name continues it (run.resume=auto): the first run's
    # checkpoint is still there, byte for byte, and W&B's run goes on under the same id.
    longer = short(tmp, "twice", 3)
    capfd.readouterr()
    second = run(fresh, longer)
    said = capfd.readouterr().err
    assert f"resuming {cfg.run_dir} from its checkpoint step2 (step 2); run.overwrite=true" \
        in said, said[-2000:]
    assert second["resumed_from"] == "step2" and second["steps"] == 3
    assert_accounted(second)
    fates = prompt_fates(cfg.run_dir)
    assert not fates["lost"] and not fates["trained_twice"]
    now = digests(cfg.run_dir, "checkpoints")
    assert {k: v for k, v in now.items() if k.startswith("checkpoints/step2/")} == \
        {k: v for k, v in kept.items() if k.startswith("checkpoints/step2/")}
    assert any(k.startswith("checkpoints/step3/") for k in now)
    assert_wandb_has_every_metric(cfg.run_dir, [1, 2, 3])

    # Only run.overwrite=true deletes: a fresh run in its place.
    third = run(fresh, short(tmp, "twice", 1, overwrite=True, eval_every=0))
    assert third["steps"] == 1 and third["resumed_from"] is None
    assert [r["step"] for r in read_metrics(cfg.run_dir)] == [1]
    assert not (cfg.run_dir / "checkpoints" / "step2").exists()
    assert_wandb_has_every_metric(cfg.run_dir, [1])
