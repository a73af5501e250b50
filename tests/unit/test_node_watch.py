"""Roles on chosen nodes (``cluster.resources``: custom Ray resources as node labels) and the
run's look at its nodes after each step (``cluster.nodes.watch.NodeWatch``), without Ray: the
two readings of the cluster (alive nodes, where each placement group's bundles are) are
replaced by a scripted cluster. The same on real nodes: tests/integration/test_nodes.py and
``python -m tests.acceptance.chaos --scenarios node_lost_generators,node_added,node_lost_learner``."""
from __future__ import annotations

import pytest

import cluster.nodes.watch as watch
from cluster.config.schema import build_config
from cluster.nodes.placement import PlacementError, check_fits, layout, plan


def test_a_roles_labels_go_into_its_bundles_and_the_cluster_must_have_them():
    cfg = build_config({"cluster": {"resources": {"generator": {"gen": 1},
                                                  "learner": {"train": 1}}}})
    p = plan(cfg)
    assert p["generator"].bundle == {"CPU": 0.5, "gen": 1.0}
    assert p["learner"].bundle == {"CPU": 0.5, "train": 1.0} and p["prior"].bundle == {"CPU": 0.2}
    assert p.total_custom == {"gen": 2.0, "train": 1.0}
    nodes = [{"CPU": 1, "train": 1}, {"CPU": 1, "gen": 1}, {"CPU": 1, "gen": 1}]
    got = {r.role: r.bundles for r in layout(p, nodes)}
    assert got["generator"] == ({"CPU": 0.5, "gen": 1.0},) * 2
    check_fits(p, {"CPU": 3, "gen": 2, "train": 1})
    with pytest.raises(PlacementError, match=r"asks for 2 gen .* has 1; start nodes with it"):
        check_fits(p, {"CPU": 3, "gen": 1, "train": 1})
    with pytest.raises(PlacementError, match="no node has that much"):
        layout(p, [{"CPU": 4, "gen": 2}])  # no node carries the learner's label


@pytest.mark.parametrize("resources, why", [
    ({"gen": {"x": 1}}, "unknown role 'gen'"),
    ({"generator": {"GPU": 1}}, "set cpus/gpus in the role's section"),
    ({"learner": {"x": 0}}, "learner.x must be > 0"),
])
def test_bad_role_labels_are_named(resources, why):
    with pytest.raises(ValueError, match=why):
        build_config({"cluster": {"resources": resources}})


class Scripted:
    """A cluster whose nodes and bundles the test sets."""

    def __init__(self):
        self.alive = {"aaaaaaaa11": "10.0.0.1", "bbbbbbbb22": "10.0.0.2",
                      "cccccccc33": "10.0.0.3"}
        self.where = {"aaaaaaaa11": ["learner-0", "coordinator"],
                      "bbbbbbbb22": ["generator-0"], "cccccccc33": ["generator-1"]}


def test_a_node_lost_and_one_joined_are_said_with_the_roles_they_held(monkeypatch):
    c = Scripted()
    monkeypatch.setattr(watch, "_alive_nodes", lambda: dict(c.alive))
    monkeypatch.setattr(watch, "role_nodes", lambda groups: {k: list(v) for k, v in c.where.items()})
    w = watch.NodeWatch({}, t0=0.0)
    assert w.at_start["generator-1"] == "cccccccc (10.0.0.3)"
    assert w.look(3) == []
    del c.alive["cccccccc33"]
    c.where.pop("cccccccc33")  # its bundle waits for room: on no node
    assert w.look(4) == ["node cccccccc (10.0.0.3) lost after step 4: it held generator-1"]
    c.alive["dddddddd44"] = "10.0.0.4"
    c.where["dddddddd44"] = ["generator-1"]
    assert w.look(7) == ["node dddddddd (10.0.0.4) joined after step 7"]
    del c.alive["bbbbbbbb22"]
    assert w.look(8) == ["node bbbbbbbb (10.0.0.2) lost after step 8: it held generator-0"]
    assert [(e["event"], e["step"], e["roles"]) for e in w.events] == [
        ("lost", 4, ["generator-1"]), ("joined", 7, []), ("lost", 8, ["generator-0"])]
    assert len(w.alive) == 2 and w.at_start["generator-1"] == "cccccccc (10.0.0.3)"


def test_a_chaos_run_of_some_scenarios_keeps_the_other_rows_with_when_they_were_measured(
        tmp_path):
    """``python -m tests.acceptance.chaos --scenarios a,b`` rewrites those rows of chaos.json and keeps
    every other scenario's, each saying when and by which command it was measured."""
    import json

    from tests.acceptance.chaos.__main__ import merged

    out = tmp_path / "chaos.json"
    out.write_text(json.dumps({"date": "2026-12-02", "command": "python -m tests.acceptance.chaos",
                               "scenarios": [{"name": "baseline", "clean": True},
                                             {"name": "node_added", "clean": False}]}))
    rows = merged(out, [{"name": "node_added", "clean": True},
                        {"name": "node_lost_learner", "clean": True}],
                  {"date": "2026-12-04", "command": "python -m tests.acceptance.chaos --scenarios x"})
    assert [r["name"] for r in rows] == ["baseline", "node_added", "node_lost_learner"]
    assert rows[0]["measured"]["date"] == "2026-12-02" and rows[0]["clean"]
    assert rows[1]["measured"]["date"] == "2026-12-04" and rows[1]["clean"]
    assert merged(tmp_path / "none.json", [{"name": "baseline"}], {"date": "d"}) == [
        {"name": "baseline", "measured": {"date": "d"}}]
