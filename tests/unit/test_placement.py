"""Placement rules without Ray: each role's bundles, strategy and actor slots for a cluster
shape (cluster.nodes.placement.layout), the ranks' bundles, the shape --check-placement simulates,
and the checker that judges where probes landed. The numbers come from the shipped 32-GPU
config, so re-tuning its split keeps these tests meaningful."""
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.nodes.check_placement import Landing, problems, simulated_shape
from cluster.config.schema import load_config
from cluster.nodes.placement import PlacementError, layout, plan
from estimator.registry import ESTIMATORS
from learner.bundles import fill_bundles
from learner.ranks import Rendezvous

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "configs" / "qwen3-4b-dapo-32gpu.yaml"


def paper(*overrides):
    return load_config(PAPER, list(overrides))


def node_list(cfg, nodes=4, gpus=8, cpus=128.0):
    """The paper's cluster (4 x 8 GPUs) unless the config states its own shape."""
    c = cfg.cluster
    return [{"CPU": c.cpus_per_node or cpus, "GPU": float(c.gpus_per_node or gpus)}] * (
        c.nodes or nodes)


def by_role(reservations):
    return {r.role: r for r in reservations}


@pytest.mark.parametrize("overrides", [(), ("learner.ranks=8", "generators.count=23")])
def test_paper_plan_learner_on_fewest_nodes_generators_one_gpu_each(overrides):
    """The shipped split (14 learner ranks: two nodes of 7) and an 8-rank one (one node)."""
    cfg = paper(*overrides)
    p = plan(cfg)
    res = by_role(layout(p, node_list(cfg)))
    assert list(res) == ["learner", "prior", "generator", "coordinator"]  # most constrained first
    lrn = res["learner"]
    if cfg.learner.ranks * cfg.learner.gpus <= 8:  # fits one 8-GPU node
        assert lrn.strategy == "STRICT_PACK"
        assert lrn.bundles == ({"CPU": cfg.learner.cpus, "GPU": cfg.learner.gpus},) * cfg.learner.ranks
        assert lrn.slots == tuple(range(cfg.learner.ranks))
    else:
        assert lrn.strategy == "STRICT_SPREAD" and len(lrn.bundles) == 2
        assert sum(b["GPU"] for b in lrn.bundles) == cfg.learner.ranks * cfg.learner.gpus
    gen = res["generator"]
    assert gen.strategy == "PACK" and len(gen.bundles) == cfg.generators.count
    # A group per engine, so that a lost node's engine is replaced alone (cluster.nodes.replace).
    assert gen.groups() == [(f"generator-{i}", (b,)) for i, b in enumerate(gen.bundles)]
    assert gen.where(3) == ("generator-3", 0) and "a group each" in gen.describe()
    assert lrn.groups() == [("learner", lrn.bundles)]
    assert [lrn.where(j) for j in range(cfg.learner.ranks)] == [("learner", s) for s in lrn.slots]
    assert all(b == {"CPU": cfg.generators.cpus, "GPU": 1} for b in gen.bundles)
    assert res["prior"].bundles == ({"CPU": cfg.prior.cpus, "GPU": cfg.prior.gpus},)
    assert "GPU" not in res["coordinator"].bundles[0]
    gpus = sum(b.get("GPU", 0) for r in res.values() for b in r.bundles)
    assert gpus == p.total_gpus == 32


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_a_prior_server_exactly_for_an_estimator_that_reads_a_prior(name):
    needs = {"oracle": ["algo.k_init=16", "algo.train_k=4"]}  # its own required settings
    p = plan(paper(f"algo.name={name}", *needs.get(name, [])))
    assert ("prior" in {r.role for r in p.roles}) == ESTIMATORS[name].needs_prior
    assert ESTIMATORS["v05"].needs_prior and not ESTIMATORS["grpo"].needs_prior


@pytest.mark.parametrize("ranks, sizes", [(14, [7, 7]), (9, [5, 4]), (17, [6, 6, 5])])
def test_learner_over_one_node_splits_evenly_over_fewest_nodes(ranks, sizes):
    cfg = paper(f"learner.ranks={ranks}")
    lrn = layout(plan(cfg), node_list(cfg))[0]
    assert lrn.strategy == "STRICT_SPREAD"
    assert [b["GPU"] for b in lrn.bundles] == sizes
    assert [b["CPU"] for b in lrn.bundles] == [k * cfg.learner.cpus for k in sizes]
    assert lrn.slots == tuple(i for i, k in enumerate(sizes) for _ in range(k))
    assert str(sizes) in lrn.describe()


@pytest.mark.parametrize("overrides, message", [
    (["learner.ranks=16", "learner.gpus=3"], r"learner: 16 ranks .* need 8 nodes"),
    (["generators.gpus=9"], r"generator: one actor asks for .*'GPU': 9"),
    (["prior.cpus=500"], r"prior: one actor asks for"),
])
def test_impossible_shapes_fail_naming_the_role(overrides, message):
    cfg = paper(*overrides)
    with pytest.raises(PlacementError, match=message):
        layout(plan(cfg), node_list(cfg))


def test_unknown_shape_keeps_the_learner_on_one_node():
    cfg = paper("learner.ranks=16")
    assert layout(plan(cfg))[0].strategy == "STRICT_PACK"


def test_cpu_default_places_on_one_laptop_node():
    cfg = load_config(ROOT / "v05.yaml")
    res = by_role(layout(plan(cfg), [{"CPU": 2.0}]))
    assert res["learner"].strategy == "STRICT_PACK"
    assert all("GPU" not in b for r in res.values() for b in r.bundles)


def test_fill_bundles_one_per_bundle_or_a_nodes_share():
    assert fill_bundles([{"CPU": 4, "GPU": 1}] * 3, {"CPU": 4, "GPU": 1}, 3) == [0, 1, 2]
    node = [{"CPU": 28.0, "GPU": 7.0}, {"CPU": 24.0, "GPU": 6.0}]
    assert fill_bundles(node, {"CPU": 4, "GPU": 1}, 13) == [0] * 7 + [1] * 6
    assert fill_bundles([{"CPU": 0.5}, {"CPU": 0.25}] * 2, {"CPU": 0.25, "GPU": 0}, 3,
                        start=1) == [1, 2, 2]  # CPU-only ranks; an offset into the group
    with pytest.raises(ValueError, match="do not fit"):
        fill_bundles([{"CPU": 4, "GPU": 1}], {"CPU": 4, "GPU": 1}, 2)


def test_simulated_shape_from_the_config():
    cfg = paper("cluster.nodes=4", "cluster.gpus_per_node=8")
    shape = simulated_shape(cfg, plan(cfg))
    assert (shape.nodes, shape.gpus_per_node) == (4, 8)
    assert shape.cpus_per_node >= plan(cfg).total_cpus  # default: CPUs never limit
    cpu = load_config(ROOT / "v05.yaml")
    assert simulated_shape(cpu, plan(cpu)).nodes == 1
    bare = paper("cluster.gpus_per_node=null")
    with pytest.raises(PlacementError, match="cluster.gpus_per_node"):
        simulated_shape(bare, plan(bare))


def _landings(cfg, res):
    """Probes where a correct placement puts them: learner on node A, the rest after."""
    out, free = [], [(n, g) for n in "ABCD" for g in range(8)]
    for r in res:
        for i in range(len(r.slots)):
            gpus = int(r.bundles[0].get("GPU", 0)) if r.role != "learner" else 1
            got = [free.pop(0) for _ in range(gpus)]
            node = got[0][0] if got else "A"
            out.append(Landing(r.role, i, node, "10.0.0.1", tuple(str(g) for _, g in got)))
    return out


def test_checker_accepts_a_good_placement_and_names_faults():
    cfg = paper("learner.ranks=8", "generators.count=23")  # a learner on one node
    p = plan(cfg)
    res = layout(p, node_list(cfg))
    good = _landings(cfg, res)
    assert problems(p, res, good, Rendezvous("10.0.0.1", 1234, "A")) == []
    assert any("rendezvous" in m for m in problems(p, res, good, Rendezvous("x", 1, "B")))
    last_gen = good[-2]  # its GPU given to learner rank 0 as well
    shared = [*good[:-2], Landing("generator", last_gen.index, good[0].node_id, "",
                                  good[0].gpu_ids), good[-1]]
    assert any("same whole GPU" in m for m in problems(p, res, shared, None))
    moved = [Landing("learner", 1, "D", "", ("7",)) if x.role == "learner" and x.index == 1
             else x for x in good]
    assert any("learner: on 2 nodes, STRICT_PACK" in m for m in problems(p, res, moved, None))


def _launch(out_dir, *args):
    # Like every launch in the tests, pointed away from the user's runs (test_bad_input.py).
    return subprocess.run([sys.executable, "-m", "cluster.launch", str(PAPER),
                           f"run.output_dir={out_dir}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_check_placement_fails_fast_when_the_shape_is_too_small_or_unknown(tmp_path):
    # Both fail on paper, before any Ray node starts (cluster.address=local: never join).
    out = _launch(tmp_path, "cluster.address=local", "cluster.nodes=3",
                  "cluster.gpus_per_node=8", "--check-placement")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "asks for 32 GPU" in out.stderr and "the cluster has 24" in out.stderr
    out = _launch(tmp_path, "cluster.address=local", "cluster.gpus_per_node=null",
                  "--check-placement")
    assert out.returncode == 2 and "set cluster.nodes and cluster.gpus_per_node" in out.stderr


def test_nccl_is_refused_where_generators_and_learner_share_a_gpu():
    """NCCL refuses two ranks on one device: a shared GPU publishes through host memory, and
    its engines start before the learner loads (cluster.nodes.roles.shares_gpus)."""
    from cluster.nodes.roles import shares_gpus

    shared = load_config(ROOT / "configs" / "one-gpu.yaml")
    assert plan(shared) and shares_gpus(shared)
    with pytest.raises(PlacementError, match=r"generators\.gpus=0\.5 and learner\.gpus=0\.5 "
                                             r"share a device \(NCCL refuses two ranks"):
        plan(load_config(ROOT / "configs" / "one-gpu.yaml", ["cluster.weight_sync=nccl"]))
    whole = load_config(ROOT / "configs" / "qwen3-4b-8gpu.yaml")
    assert plan(whole) and not shares_gpus(whole)
    assert not shares_gpus(load_config(ROOT / "v05.yaml"))  # CPUs: nothing to share


def test_start_up_times_are_a_record_read_by_attribute():
    """Issue 44: the start-up split was written under f-string keys and read by literal
    name. ``Startup`` fields: the launcher's line and summary.json's ``startup`` from them."""
    from cluster.nodes.roles import Roles, Startup

    up = Startup(placement_s=0.4, generators_s=20.4, learner_s=12.2, engines_s=[3.5],
                 total_s=20.5)
    assert up.line() == "actors up in 20s (learner 12s, generators 20s)"
    assert up.to_json() == {"placement_s": 0.4, "generators_s": 20.4, "learner_s": 12.2,
                            "engines_s": [3.5], "total_s": 20.5}  # no prior: no prior_s
    up.prior_s = 12.3
    assert up.line().endswith(", prior 12s)") and up.to_json()["prior_s"] == 12.3
    assert isinstance(Roles(generators=[], learner=None).startup, Startup)
