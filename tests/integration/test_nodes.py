"""The default job across a local cluster of three Ray nodes on 127.0.0.1
(``tests.acceptance.chaos.nodes``: ray.cluster_utils.Cluster, custom resources as node labels): the head
holds the coordinator, the prior and the learner, each other node one generator, as the run's
``cluster.resources`` asks. Submitted as a Ray job to the head, as a user would;
where each role ran is read back from summary.json (``role_nodes``). Losing and adding nodes
under a real run is ``python -m tests.acceptance.chaos --scenarios node_lost_generators,node_added,
node_lost_learner`` (docs/reliability.md)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.acceptance.chaos.nodes import LABEL, PLACE, nodes
from cluster.records.files import prompt_fates

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FAST = ["run.max_steps=3", "run.eval_every=0", "generators.measure_peak=false",
        "run.save_final=false", "rollout.batch_prompts=4", "run.checkpoint_every=0"]


def submit(client, timeout_s: float = 300, **job) -> str:
    """``client.submit_job(**job)`` once the head's job agent is up: a fresh head answers "No
    available agent to submit job" for a while (as test_job_submit.py waits for too); in a
    loaded suite (shuffled, beside another cluster's test) 120 s was once not enough."""
    deadline = time.time() + timeout_s
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as err:
            if "No available agent" not in str(err) or time.time() > deadline:
                raise
            time.sleep(2)


def test_the_dry_run_shows_each_roles_node_labels():
    out = subprocess.run([sys.executable, "-m", "cluster.launch", "v05.yaml", *PLACE,
                          "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    placement = next(ln for ln in out.stdout.splitlines() if ln.startswith("# placement:"))
    assert f"generator 2x{{'CPU': 0.5, '{LABEL['generator']}': 1.0}}" in placement
    assert f"learner 1x{{'CPU': 0.5, '{LABEL['learner']}': 1.0}}" in placement


def test_the_default_job_trains_with_its_roles_on_three_nodes(tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    with nodes(generators=2, learner_node=False, dashboard=True) as cl:
        client = JobSubmissionClient(cl.dashboard)
        # The nodes share this machine's files: the job runs the checkout in place (the
        # --working-dir upload is test_job_submit.py's).
        job = submit(client, entrypoint=" ".join([
            "cd", str(REPO), "&&", sys.executable, "-m", "cluster.launch", "v05.yaml", *PLACE,
            *FAST, "run.name=three-nodes", f"run.output_dir={tmp_path}"]))
        deadline = time.time() + 600
        while client.get_job_status(job) not in (JobStatus.SUCCEEDED, JobStatus.FAILED,
                                                 JobStatus.STOPPED) and time.time() < deadline:
            time.sleep(2)
        status, logs = client.get_job_status(job), client.get_job_logs(job)
        node_ids = {n.node_id for n in cl.cluster.list_all_nodes()}
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    run = tmp_path / "three-nodes"
    summary = json.loads((run / "summary.json").read_text())
    where = {role: at.split()[0] for role, at in summary["role_nodes"].items()}
    assert set(where) == {"generator-0", "generator-1", "learner-0", "prior", "coordinator"}
    assert len({where["generator-0"], where["generator-1"], where["learner-0"]}) == 3
    assert where["coordinator"] == where["prior"] == where["learner-0"]
    assert {w for w in where.values()} <= {n[:8] for n in node_ids} and len(node_ids) == 3
    assert summary["steps"] == 3 and summary["node_events"] == []
    fates = prompt_fates(run)
    assert fates["lost"] == [] and fates["trained_twice"] == [] and fates["trained"] > 0


def until(cond, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while not cond():
        assert time.time() < deadline, f"no {what} after {timeout_s:g} s"
        time.sleep(0.5)


def test_a_generator_whose_node_is_lost_is_replaced_on_a_node_that_joins():
    """The default job's placement groups reserved on 1 head + 2 generator nodes; a generator
    node lost whole: the Replacer removes that generator's group (its actor ends, and the
    group no longer waits in Ray's RESCHEDULING loop) and asks for a new one; a generator
    node joins: a new generator starts there, the driver's handle is swapped, the
    coordinator is told; the other generator is left alone."""
    import ray
    from ray.util.placement_group import placement_group_table
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy)

    from cluster.config.schema import load_config
    from cluster.nodes.placement import group_key, plan, reserve
    from cluster.nodes.replace import Replacer
    from cluster.nodes.roles import Roles

    # Defined here so that Ray ships them by value (the workers cannot import a test module).
    class StandIn:
        """A generator's stand-in in the real placement group (no vLLM): says where it runs."""

        def where(self) -> str:
            import ray

            return ray.get_runtime_context().get_node_id()

    class Told:
        """The coordinator's side of a replacement, as a real actor: which generator it was
        told about, and the new handle's answer."""

        def __init__(self):
            self.told = []

        def replace_generator(self, i: int, handle) -> None:
            self.told.append((i, handle))

        def log(self) -> list:
            import ray

            return [(i, ray.get(h.where.remote())) for i, h in self.told]

    def new_generator(i, pg):
        return ray.remote(StandIn).options(num_cpus=0.5, scheduling_strategy=(
            PlacementGroupSchedulingStrategy(placement_group=pg,
                                             placement_group_bundle_index=0))).remote()

    stops = []
    with nodes(generators=2, learner_node=False) as cl:
        ray.init(address=cl.address, include_dashboard=False, logging_level="ERROR")
        try:
            groups = reserve(plan(load_config(REPO / "v05.yaml", PLACE)))
            roles = Roles([new_generator(i, groups[group_key("generator", i)])
                           for i in range(2)], None, placement_groups=groups,
                          new_generator=new_generator)
            first = ray.get([g.where.remote() for g in roles.generators])
            told = ray.remote(Told).options(num_cpus=0, scheduling_strategy=(  # on the head
                NodeAffinitySchedulingStrategy(cl.cluster.head_node.node_id, soft=False))).remote()
            rep = Replacer(roles, told, poll_s=0.5)
            stops.append(rep.stop)
            rep.start()
            lost_node = cl.lose("generator")
            lost = first.index(lost_node)
            old_handle, old_group = roles.generators[lost], groups[group_key("generator", lost)]
            until(lambda: any(e["event"] == "regrouped" for e in rep.events), 90, "regroup")
            assert [(e["generator"], e["event"]) for e in rep.events] == [(lost, "regrouped")]
            assert placement_group_table(old_group)["state"] == "REMOVED"
            new_group = groups[group_key("generator", lost)]
            assert placement_group_table(new_group)["state"] == "PENDING"
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(old_handle.where.remote(), timeout=60)
            joined = cl.add("generator").node_id
            until(lambda: len(rep.events) >= 2, 90, "new generator")
            rep.stop()
            said = rep.said()
            assert rep.events[1]["event"] == "started", said
            assert rep.events[1]["node"] == joined
            assert ray.get(roles.generators[lost].where.remote(), timeout=60) == joined
            assert ray.get(told.log.remote()) == [(lost, joined)]
            kept = 1 - lost
            assert ray.get(roles.generators[kept].where.remote()) == first[kept]
            assert [ln.split(":")[0] for ln in said] == [f"generator-{lost}"] * 2
            roles.shutdown()
        finally:
            for stop in stops:  # its thread makes Ray calls: none after the shutdown
                stop()
            ray.shutdown()
