"""The commands take dotted overrides before, between or after their options, as users type
them (``python -m cluster.evaluate MODEL --prompts 16 cluster.address=local``)."""
import pytest


@pytest.mark.parametrize("argv", [
    ["m", "--config", "c.yaml", "--prompts", "16", "a.b=1", "c.d=2"],
    ["m", "a.b=1", "--prompts", "16", "c.d=2", "--config", "c.yaml"],
    ["m", "a.b=1", "c.d=2", "--config", "c.yaml", "--prompts", "16"],
])
def test_evaluate_takes_overrides_anywhere(argv):
    from cluster.evaluate import parse_args

    args = parse_args(argv)
    assert (args.model_or_run, args.overrides, args.config, args.prompts) == (
        "m", ["a.b=1", "c.d=2"], "c.yaml", 16)


@pytest.mark.parametrize("argv", [
    ["v05.yaml", "--dry-run", "run.max_steps=3", "cluster.address=local"],
    ["v05.yaml", "run.max_steps=3", "--dry-run", "cluster.address=local"],
])
def test_launch_takes_overrides_anywhere(argv):
    from cluster.launch import parse_args

    args = parse_args(argv)
    assert args.dry_run and args.overrides == ["run.max_steps=3", "cluster.address=local"]


def test_an_unknown_option_is_still_refused(capsys):
    from cluster.evaluate import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["m", "--promts", "16"])
    assert e.value.code == 2 and "--promts" in capsys.readouterr().err
