"""Run outputs: metrics.jsonl lines parse (NaN -> null), the progress line, TensorBoard scalars."""
import json

from cluster.metrics import RunWriter, read_metrics


def test_metrics_lines_progress_and_tensorboard(tmp_path, capsys):
    w = RunWriter(tmp_path / "run", "a: 1\n", tensorboard=True)
    w.step({"step": 1, "reward_mean": 0.25, "k_mean": 4.5, "generator_busy_fraction": 0.9,
            "step_time_s": 1.0, "eval_accuracy": 0.5, "loss": float("nan")})
    w.summary({"steps": 1})
    rows = read_metrics(tmp_path / "run")
    assert rows == [{"step": 1, "reward_mean": 0.25, "k_mean": 4.5, "generator_busy_fraction": 0.9,
                     "step_time_s": 1.0, "eval_accuracy": 0.5, "loss": None}]
    err = capsys.readouterr().err
    assert "step    1" in err and "acc 0.500" in err and "k  4.5" in err and "busy  90%" in err
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == {"steps": 1}
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
