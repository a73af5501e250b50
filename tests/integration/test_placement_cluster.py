"""The 32-GPU plan placed on a simulated cluster: 4 Ray nodes of 8 logical GPUs on 127.0.0.1
(ray.cluster_utils.Cluster, through cluster.nodes.check_placement.simulated_cluster). Roles are
stood in for by probe actors with the roles' bundles (no vLLM, no DeepSpeed, no CUDA), except
one test that starts real DeepSpeed ranks (CPU, gloo) in a learner group spanning two nodes.
The role split is read from configs/qwen3-4b-dapo-32gpu.yaml, so re-tuning it keeps these
tests meaningful."""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from cluster.nodes.check_placement import Shape, probe, problems, simulated_cluster
from cluster.config.schema import load_config
from cluster.nodes.placement import PlacementError, layout, live_nodes, plan, reserve

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "configs" / "qwen3-4b-dapo-32gpu.yaml"
SHAPE = ["cluster.nodes=4", "cluster.gpus_per_node=8"]  # the paper's cluster, 4 x 8 GPUs


def paper(*overrides):
    cfg = load_config(PAPER)
    # The config's own shape when it states one, else the paper's 4 x 8.
    return load_config(PAPER, ([] if cfg.cluster.gpus_per_node else SHAPE) + list(overrides))


@pytest.fixture(scope="module")
def cluster():
    cfg = paper()
    c = cfg.cluster
    with simulated_cluster(Shape(c.nodes, c.gpus_per_node, math.ceil(2 * plan(cfg).total_cpus))):
        yield c


def place(cfg):
    """Reserve like a launch, probe every actor; returns (reservations, landings, rendezvous)."""
    from ray.util.placement_group import remove_placement_group

    p = plan(cfg)
    reservations = layout(p, [n["Resources"] for n in live_nodes()])
    groups = reserve(p, timeout_s=30)
    try:
        landings, meet = probe(p, groups, reservations)
    finally:
        for pg in groups.values():
            remove_placement_group(pg)
    assert problems(p, reservations, landings, meet) == []
    return reservations, landings, meet


def role(landings, name):
    return sorted((x for x in landings if x.role == name), key=lambda x: x.index)


def test_the_32_gpu_plan_lands_where_it_must(cluster):
    cfg = paper()
    _, landings, meet = place(cfg)
    ranks = role(landings, "learner")
    assert len(ranks) == cfg.learner.ranks
    # The fewest nodes that hold the ranks (one node when they fit), split evenly over them.
    nodes = math.ceil(cfg.learner.ranks / cluster.gpus_per_node)
    ranks_on = Counter(x.node_id for x in ranks)
    assert len(ranks_on) == nodes, f"learner ranks on {len(ranks_on)} nodes, not {nodes}"
    assert max(ranks_on.values()) - min(ranks_on.values()) <= 1, ranks_on
    assert all(len(x.gpu_ids) == 1 for x in ranks)
    assert len({(x.node_id, x.gpu_ids) for x in ranks}) == cfg.learner.ranks, \
        "one GPU each, none shared"
    assert (meet.node_id, meet.addr) == (ranks[0].node_id, ranks[0].node_ip)
    gens = role(landings, "generator")
    assert len(gens) == cfg.generators.count and all(len(x.gpu_ids) == 1 for x in gens)
    [prior] = role(landings, "prior")
    assert len(prior.gpu_ids) == 1
    [coord] = role(landings, "coordinator")
    assert coord.gpu_ids == ()
    used = [(x.node_id, g) for x in landings for g in x.gpu_ids]
    assert len(used) == len(set(used)) == 32 == plan(cfg).total_gpus
    assert len({x.node_id for x in landings}) == cluster.nodes
    # Every node holds no more than its GPUs.
    assert max(Counter(n for n, _ in used).values()) <= cluster.gpus_per_node


def test_a_learner_that_fits_one_node_is_packed_on_it(cluster):
    ranks = cluster.gpus_per_node            # 8 ranks on 8-GPU nodes: one whole node
    cfg = paper(f"learner.ranks={ranks}", f"generators.count={32 - ranks - 1}")
    reservations, landings, meet = place(cfg)
    assert reservations[0].strategy == "STRICT_PACK"
    ranks_at = role(landings, "learner")
    assert len({x.node_id for x in ranks_at}) == 1
    assert sorted(int(x.gpu_ids[0]) for x in ranks_at) == list(range(ranks))
    assert meet.node_id == ranks_at[0].node_id
    # the node is the learner's alone: no generator or prior GPU on it
    assert not [x for x in landings if x.role != "learner" and x.gpu_ids
                and x.node_id == ranks_at[0].node_id]
    assert len({(x.node_id, g) for x in landings for g in x.gpu_ids}) == 32


def test_a_learner_over_one_node_splits_over_nodes_with_one_rendezvous(cluster):
    ranks = cluster.gpus_per_node + 1        # 9 on 8-GPU nodes: 5 + 4
    cfg = paper(f"learner.ranks={ranks}", f"generators.count={32 - ranks - 1}")
    reservations, landings, meet = place(cfg)
    assert reservations[0].strategy == "STRICT_SPREAD"
    ranks_at = role(landings, "learner")
    assert sorted(Counter(x.node_id for x in ranks_at).values()) == [ranks // 2, ranks - ranks // 2]
    first = ranks - ranks // 2               # ranks fill the bundles in order: 0-4, then 5-8
    assert {x.node_id for x in ranks_at[:first]} == {ranks_at[0].node_id}
    assert {x.node_id for x in ranks_at[first:]} == {ranks_at[first].node_id}
    assert ranks_at[first].node_id != ranks_at[0].node_id
    assert meet.node_id == ranks_at[0].node_id
    assert len({(x.node_id, g) for x in landings for g in x.gpu_ids}) == 32


def test_a_plan_that_fits_in_total_but_not_in_shape_fails_naming_the_role(cluster):
    # 3-GPU engines: after an 8-rank learner and the prior, each node holds two of them.
    cfg = paper("learner.ranks=8", "generators.gpus=3", "generators.count=7")
    assert plan(cfg).total_gpus <= 32
    with pytest.raises(PlacementError, match=r"generator: 7 actor\(s\).*Free per node"):
        reserve(plan(cfg), timeout_s=5)
    import time

    import ray

    deadline = time.monotonic() + 30  # the groups made so far are removed (asynchronously)
    while ray.available_resources().get("GPU") != 32 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU") == 32


def test_learner_group_spanning_two_nodes_trains(cluster, tmp_path):
    """Real DeepSpeed ranks (CPU, gloo) in a learner placement group over two nodes: the
    ranks meet at rank 0's node and train in lockstep."""
    import numpy as np
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    from common.types import TrainSample
    from learner.config import LearnerConfig
    from learner.ranks import Learner
    from tasks.policy_model import save_random_policy

    cfg = paper("learner.ranks=2", "learner.cpus=0.25", "learner.gpus=1")
    # A 1-GPU node shape puts the 2 ranks on two nodes (a split of more ranks, 2 + 1, is
    # placed by the probes above; here the real ranks meet across nodes).
    [res] = [r for r in layout(plan(cfg), [{"CPU": 100.0, "GPU": 1.0}] * 4) if r.role == "learner"]
    assert res.strategy == "STRICT_SPREAD" and res.slots == (0, 1)
    pg = placement_group(list(res.bundles), strategy=res.strategy)
    ray.get(pg.ready(), timeout=30)
    group = None
    try:
        policy = save_random_policy(tmp_path / "policy", seed=0, hidden_size=32,
                                    intermediate_size=64, num_hidden_layers=1)
        group = Learner(policy, 2, LearnerConfig(lr=1e-3), num_cpus_per_rank=0.25,
                             placement_group=pg, num_gpus_per_rank=1)
        where = placement_group_table(pg)["bundles_to_node_id"]
        assert where[0] != where[1]
        assert group.rendezvous.node_id == where[0]
        samples = [TrainSample(prompt_token_ids=[5, 6, 7], token_ids=[8 + i, 9],
                               logprobs=[-4.6] * 2, advantage=1.0 if i % 2 else -1.0, version=0)
                   for i in range(6)]
        metrics = group.train_step(samples)
        assert np.isfinite(metrics.loss)
        w = group.get_weights_per_rank()
        assert all(max(float(np.abs(w[0][k] - x[k]).max()) for k in x) == 0 for x in w[1:])
    finally:
        if group is not None:
            group.shutdown()
        ray.util.remove_placement_group(pg)
