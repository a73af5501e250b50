"""bench.harness, the part bench.learning, bench.throughput and tests.acceptance.chaos share: the
round-robin order, a run's config from the bench's base, the result stamp, and the shared
roles' start-once / shut-down-always contract (on stand-ins for the project's own functions:
no Ray here; the real start is tests/integration/test_benches.py's)."""
from __future__ import annotations

import json
import sys
from collections import Counter
from types import SimpleNamespace

import pytest

from bench import harness
from bench.harness import config_for, round_robin, shared_roles, stamp, write_json
from cluster.nodes.roles import Startup


def test_round_robin_rotates_the_start_so_each_mode_takes_each_place():
    got = list(round_robin(["a", "b", "c"], 4))
    assert got == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
                   (2, "c"), (2, "a"), (2, "b"), (3, "a"), (3, "b"), (3, "c")]
    places = Counter((i % 3, m) for i, (_, m) in enumerate(got[:9]))
    assert set(places.values()) == {1} and len(places) == 9  # 3 rounds: every place once
    assert list(round_robin([], 3)) == [] and list(round_robin(["a"], 0)) == []


def test_the_benches_keep_their_order():
    """bench.learning rotates per seed and bench.throughput per repeat, as before the
    harness: round r starts at mode r mod n."""
    for r in range(5):
        modes = ["m0", "m1", "m2"]
        k = r % len(modes)
        assert [m for rr, m in round_robin(modes, r + 1) if rr == r] == modes[k:] + modes[:k]


def base_config() -> dict:
    from cluster.config.schema import load_config

    from bench.learning.__main__ import REPO

    return load_config(REPO / "v05.yaml", ["run.progress=false"]).model_dump(mode="json")


def test_config_for_merges_sections_names_the_run_and_leaves_the_base_alone(tmp_path):
    base = base_config()
    before = json.dumps(base, sort_keys=True)
    cfg = config_for(base, "x-seed3", tmp_path, mode="sync",
                     algo={"name": "grpo", "k_init": 16, "k_max": 16}, run={"seed": 3})
    assert json.dumps(base, sort_keys=True) == before
    assert cfg.mode == "sync" and (cfg.algo.name, cfg.algo.k_init, cfg.algo.k_max) == ("grpo", 16, 16)
    assert cfg.run.name == "x-seed3" and cfg.run.seed == 3 and cfg.run.output_dir == str(tmp_path)
    # What a section does not name stays the base's.
    assert cfg.algo.cost == base["algo"]["cost"] and cfg.run.max_steps == base["run"]["max_steps"]


def test_each_bench_builds_its_mode_as_before(tmp_path):
    from bench.modes import MODES as LEARNING
    from bench.learning.__main__ import run_config
    from bench.throughput.__main__ import mode_config

    base = base_config()
    c = run_config(base, "async_v05_kmax8", 2, tmp_path)
    assert (c.mode, c.algo.k_init, c.algo.k_max) == ("async", 4, 8) == (
        LEARNING["async_v05_kmax8"]["mode"], 4, LEARNING["async_v05_kmax8"]["algo"]["k_max"])
    assert (c.run.name, c.run.seed) == ("async_v05_kmax8-seed2", 2)
    t = mode_config(base, "async_grpo_equal_mse", tmp_path, group=6)
    assert (t.mode, t.algo.name, t.algo.k_init, t.algo.k_max) == ("async", "grpo", 6, 6)
    assert t.run.name == "async_grpo_equal_mse" and t.run.seed == base["run"]["seed"]
    assert mode_config(base, "sync_v05", tmp_path).algo.k_max == 16


def test_stamp_and_write_json(tmp_path):
    s = stamp("tests.acceptance.chaos", ["--quick", "a=1"])
    assert s["command"] == "python -m tests.acceptance.chaos --quick a=1"
    assert s["date"].endswith("+00:00") and s["machine"]["cpus"] >= 1
    path = write_json(tmp_path / "deep" / "out.json", {**s, "x": 1})
    assert path.read_text().endswith("}\n") and json.loads(path.read_text())["x"] == 1
    write_json(path, {"p": tmp_path}, indent=2, default=str)
    assert json.loads(path.read_text()) == {"p": str(tmp_path)}


class FakeRoles:
    def __init__(self, calls, clock):
        self.calls = calls
        self.learner = SimpleNamespace(  # saving the initial state takes 3 s
            save_checkpoint=lambda d, meta: calls.append(("save", d, meta)) or clock.tick(3.0))
        self.startup = Startup(total_s=1.0)

    def shutdown(self):
        self.calls.append("roles.shutdown")


@pytest.fixture
def fake_cluster(monkeypatch):
    """cluster.nodes.roles's start and the harness's cluster stop with stand-ins that record
    what the harness called, on a clock (the harness's ``time``) that moves only when a
    stand-in says it took time: connecting 2 s, saving the initial state 3 s, a reset 10 s."""
    import cluster.nodes.connect
    import cluster.nodes.placement
    import cluster.nodes.roles
    import tasks

    calls = []
    monkeypatch.setattr(harness, "stop_cluster", lambda: calls.append("ray.shutdown"))
    clock = SimpleNamespace(now=100.0)
    clock.tick = lambda s: setattr(clock, "now", clock.now + s)
    monkeypatch.setattr(harness, "time", SimpleNamespace(time=lambda: clock.now))
    monkeypatch.setattr(cluster.nodes.placement, "plan", lambda cfg: "plan")
    monkeypatch.setattr(cluster.nodes.connect, "connect",
                        lambda cfg, p: calls.append("connect") or clock.tick(2.0) or True)
    monkeypatch.setattr(cluster.nodes.placement, "reserve",
                        lambda p: calls.append(("reserve", p)) or "groups")
    monkeypatch.setattr(cluster.nodes.roles, "start_roles",
                        lambda cfg, groups, path: calls.append(("start", groups, path))
                        or FakeRoles(calls, clock))
    monkeypatch.setattr(harness, "reset_roles",
                        lambda cfg, roles, init: calls.append(("reset", cfg, init))
                        or clock.tick(10.0))
    monkeypatch.setattr(tasks, "make_task_from_config", lambda t: ("task", t))
    cfg = SimpleNamespace(task="T", model_path=lambda: "/model")
    return calls, cfg


def test_shared_roles_start_once_reset_each_run_and_shut_down(fake_cluster, tmp_path):
    calls, cfg = fake_cluster
    with shared_roles(cfg, tmp_path) as shared:
        assert shared.task == ("task", "T") and shared.init_dir == str(tmp_path / "init")
        assert shared.setup_s == 5.0  # from the placement to the initial state saved
        for run in ("r1", "r2"):
            shared.reset(run)
    assert calls == ["connect", ("reserve", "plan"), ("start", "groups", "/model"),
                     ("save", str(tmp_path / "init"), {"step": 0}),
                     ("reset", "r1", str(tmp_path / "init")),
                     ("reset", "r2", str(tmp_path / "init")),
                     "roles.shutdown", "ray.shutdown"]


def test_shared_roles_shut_down_when_a_run_raises_and_keep_a_joined_cluster(
        fake_cluster, tmp_path, monkeypatch):
    calls, cfg = fake_cluster
    with pytest.raises(RuntimeError, match="boom"), shared_roles(cfg, tmp_path):
        raise RuntimeError("boom")
    assert calls[-2:] == ["roles.shutdown", "ray.shutdown"]
    import cluster.nodes.connect

    calls.clear()
    monkeypatch.setattr(cluster.nodes.connect, "connect", lambda cfg, p: False)  # joined, not started
    with shared_roles(cfg, tmp_path):
        pass
    assert calls[-1] == "roles.shutdown" and "ray.shutdown" not in calls


def test_shared_roles_stop_the_cluster_they_started_when_the_roles_fail(fake_cluster, tmp_path,
                                                                        monkeypatch):
    calls, cfg = fake_cluster
    import cluster.nodes.roles

    def fail(*a):
        raise RuntimeError("no engine")

    monkeypatch.setattr(cluster.nodes.roles, "start_roles", fail)
    with pytest.raises(RuntimeError, match="no engine"), shared_roles(cfg, tmp_path):
        pass
    assert calls == ["connect", ("reserve", "plan"), "ray.shutdown"]


def test_lent_roles_serve_every_bench_of_the_same_shape_and_stay_up(fake_cluster, tmp_path):
    """lend_roles: a second bench (here two) runs on roles already started, with its own
    task, neither starting nor stopping anything; another shape is refused."""
    from bench.harness import lend_roles, role_shape

    calls, _ = fake_cluster

    def cfg(task="T", lr=1e-4, **engine):
        dump = lambda d: SimpleNamespace(model_dump=lambda: dict(d))  # noqa: E731
        return SimpleNamespace(task=task, model_path=lambda: "/model",
                               generators=SimpleNamespace(count=2, engine=dump(engine)),
                               learner=dump({"ranks": 1}), prior=dump({"backend": "e"}),
                               optim=dump({"lr": lr}))

    assert role_shape(cfg()) == role_shape(cfg(task="other"))  # the task is the run's
    assert role_shape(cfg()) != role_shape(cfg(lr=1e-3))
    with shared_roles(cfg(), tmp_path) as shared, lend_roles(shared, cfg()):
        started = list(calls)
        for task in ("A", "B"):
            with shared_roles(cfg(task), tmp_path / task) as lent:
                assert lent.roles is shared.roles and lent.init_dir == shared.init_dir
                assert lent.task == ("task", task) and lent.setup_s == 0.0
                lent.reset("r")
        with pytest.raises(ValueError, match="another shape"), \
                shared_roles(cfg(max_num_seqs=8), tmp_path):
            pass
        assert calls == started + [("reset", "r", shared.init_dir)] * 2  # nothing started
    assert calls[-2:] == ["roles.shutdown", "ray.shutdown"]  # the lender's own exit
    with shared_roles(cfg(), tmp_path):  # lending ended: a bench starts its own again
        pass
    assert calls.count("connect") == 2


def test_the_harness_and_the_benches_import_nothing_heavy():
    import subprocess

    mods = ("bench.harness", "bench.learning.__main__", "bench.throughput.__main__",
            "tests.acceptance.chaos.__main__", "tests.acceptance.chaos.inproc")
    heavy = ("ray", "vllm", "torch", "deepspeed")
    probe = f"import sys, {', '.join(mods)}; print(*[m for m in {heavy!r} if m in sys.modules])"
    assert subprocess.check_output([sys.executable, "-c", probe], text=True).strip() == ""
    assert harness.__doc__ and "round_robin" in harness.__doc__
