"""W&B logging (cluster/records/wandb_log.py) through ``RunFiles``, offline, read back from the
``.wandb`` file: every number of every metrics.jsonl line at its step, the config, the
summary, the attached report; offline without credentials; a failing W&B never stops the
run. The same with a real run (Ray, vLLM, DeepSpeed):
tests/integration/test_pipeline.py::test_two_launches_of_one_name_never_lose_the_first_run."""
import json

import pytest

wandb = pytest.importorskip("wandb")

from cluster.config.schema import build_config, dump_config  # noqa: E402
from cluster.records.files import RunFiles, read_lines  # noqa: E402
from cluster.records.step import HeldOut, StepMetrics, numeric  # noqa: E402
from cluster.records.summary import RunSummary, Totals  # noqa: E402
from cluster.records.wandb_log import WandbLog, read_offline, wandb_mode  # noqa: E402
from cluster.report.page import write_report  # noqa: E402


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # never the network, whatever is set up here
    monkeypatch.setenv("WANDB_SILENT", "true")


def cfg_in(tmp_path, **logging):
    return build_config({"run": {"name": "wb", "output_dir": str(tmp_path)},
                         "logging": {"wandb": True, **logging}})


def lines(n):
    return [StepMetrics(step=s, policy_version=s, reward_mean=0.1 * s, rollouts=16 * s,
                        k_hist=[1, 2], held_out=None if s < n else HeldOut(accuracy=0.5),
                        skipped=False, loss=float("nan"))
            for s in range(1, n + 1)]


def test_every_metric_the_config_summary_and_report_reach_the_offline_run(tmp_path, offline):
    cfg = cfg_in(tmp_path, wandb_project="proj", wandb_name="named")
    files = RunFiles(cfg.run_dir, dump_config(cfg), progress=False,
                     wandb=WandbLog.open(cfg, resumed=False))
    for m in lines(3):
        files.step(m)
    files.close()
    files.summary(RunSummary(3, 3, Totals(), status="done", generators=[{"id": 0}]))
    files.report(write_report)  # the report (or its failure) then the W&B run's end

    got = read_offline(cfg.run_dir)
    rows = read_lines(cfg.run_dir / "metrics.jsonl")
    assert [h["_step"] for h in got["history"]] == [r["step"] for r in rows] == [1, 2, 3]
    for h, r in zip(got["history"], rows):
        want = {k: v for k, v in r.items() if isinstance(v, (int, float))
                and not isinstance(v, bool)}
        assert want and all(h[k] == pytest.approx(v) for k, v in want.items()), (h, r)
    assert got["history"][-1]["eval_accuracy"] == 0.5 and "k_hist" not in got["history"][0]
    assert got["summary"]["steps"] == 3 and got["summary"]["status"] == "done"
    assert got["config"]["run"]["name"] == "wb"
    assert "summary.json" in got["files"]
    assert ("report.html" in got["files"]) == (cfg.run_dir / "report.html").is_file()
    (run_file,) = cfg.run_dir.glob("wandb/offline-run-*/run-*.wandb")
    assert run_file.stem.endswith((cfg.run_dir / "wandb" / "v05-run-id").read_text().strip())


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, offline):
    cfg = cfg_in(tmp_path)
    first = WandbLog.open(cfg, resumed=False)
    first.log(StepMetrics(step=1, policy_version=1, loss=1.0))
    first.finish({"steps": 1})
    again = WandbLog.open(cfg, resumed=True)
    again.log(StepMetrics(step=2, policy_version=2, loss=2.0))
    again.finish({"steps": 2})
    runs = sorted(cfg.run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and len({p.name for p in runs}) == 1  # one id, two offline parts
    assert [h["_step"] for h in read_offline(cfg.run_dir)["history"]] == [1, 2]
    fresh = WandbLog.open(cfg_in(tmp_path / "other"), resumed=False)
    assert fresh.run.id != again_id(cfg)
    fresh.finish(None)


def again_id(cfg):
    return (cfg.run_dir / "wandb" / "v05-run-id").read_text().strip()


def test_offline_unless_wandb_could_log_in(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert wandb_mode({}, home) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}, home) is None
    assert wandb_mode({"WANDB_MODE": "online"}, home) is None  # the user's choice stands
    (home / ".netrc").write_text("machine example.org login u password p\n")
    assert wandb_mode({}, home) == "offline"
    (home / ".netrc").write_text("machine api.wandb.ai login user password k\n")
    assert wandb_mode({}, home) is None
    assert wandb_mode({"WANDB_BASE_URL": "https://wandb.example.org"}, home) == "offline"
    (home / ".netrc").write_text("machine \n garbage")
    assert wandb_mode({}, home) == "offline"


def test_a_failing_wandb_is_said_once_and_the_run_goes_on(tmp_path, offline, capsys):
    cfg = cfg_in(tmp_path)
    log = WandbLog.open(cfg, resumed=False)

    def broken(*a, **k):
        raise ConnectionError("W&B is down")
    log.run.log = broken
    files = RunFiles(cfg.run_dir, dump_config(cfg), progress=False, wandb=log)
    for m in lines(3):
        files.step(m)  # no exception: metrics.jsonl has every step
    files.summary(RunSummary(3, 3, Totals()))
    files.report(write_report)
    assert [r["step"] for r in read_lines(cfg.run_dir / "metrics.jsonl")] == [1, 2, 3]
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "W&B logging stopped" in ln]
    assert len(warned) == 1 and "ConnectionError: W&B is down" in warned[0]
    assert json.loads((cfg.run_dir / "summary.json").read_text())["steps"] == 3


def test_the_numbers_of_a_line_are_what_tensorboard_gets():
    assert numeric({"step": 1, "a": 0.5, "b": True, "c": None, "d": [1], "e": "x"}) == \
        {"step": 1, "a": 0.5}
    by_level = {"step": 20, "eval_sampled_by_difficulty": {"1": 0.9, "4": 0.5, "note": "x"}}
    assert numeric(by_level) == {"step": 20, "eval_sampled_by_difficulty/1": 0.9,
                                 "eval_sampled_by_difficulty/4": 0.5}


def test_the_console_the_report_wandb_and_tensorboard_read_the_same_record(tmp_path, offline,
                                                                           capsys):
    """One ``StepMetrics`` per step, written once through ``RunFiles``: the console line,
    metrics.jsonl, the report's columns, W&B's history and TensorBoard's scalars all carry
    its values (a reward of exactly 0 included)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from cluster.report.data import held_out, load_run

    cfg = cfg_in(tmp_path)
    files = RunFiles(cfg.run_dir, dump_config(cfg), tensorboard=True,
                     wandb=WandbLog.open(cfg, resumed=False))
    steps = [StepMetrics(step=s, policy_version=s, reward_mean=[0.0, 0.25, -0.5][s - 1],
                         k_mean=4.0 + s, generator_busy_fraction=0.1 * s, step_time_s=2.0 * s,
                         held_out=HeldOut(accuracy=0.3 + 0.1 * s, accuracy_se=0.01)
                         if s % 2 else None) for s in (1, 2, 3)]
    for m in steps:
        files.step(m)
    files.close()
    files.summary(RunSummary(3, 3, Totals()))
    files.report(write_report)

    console = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("step ")]
    report = load_run(cfg.run_dir)
    history = {h["_step"]: h for h in read_offline(cfg.run_dir)["history"]}
    tb = EventAccumulator(str(cfg.run_dir / "tb"))
    tb.Reload()
    for i, m in enumerate(steps):
        assert f"reward {m.reward_mean:+.3f}" in console[i] and f"k {m.k_mean:4.1f}" in console[i]
        assert StepMetrics.from_json(read_lines(cfg.run_dir / "metrics.jsonl")[i]) == m
        assert report.metrics[i] == m
        assert report.col(lambda r: r.reward_mean)[i] == m.reward_mean
        for name, value in m.scalars().items():
            assert history[m.step][name] == pytest.approx(value), name
            tb_value = {e.step: e.value for e in tb.Scalars(name)}[m.step]
            assert tb_value == pytest.approx(value, rel=1e-6), name
        acc = m.held_out.accuracy if m.held_out else None
        assert (f"acc {acc:.3f}" if acc is not None else "acc   -") in console[i]
        got = report.col(held_out("accuracy"))[i]
        assert (got == pytest.approx(acc)) if acc is not None else got != got  # NaN
        assert ("eval_accuracy" in history[m.step]) == (acc is not None)
