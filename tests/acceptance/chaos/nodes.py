"""The scenarios of nodes coming and going: ``node_lost_generators``, ``node_added`` (both in
one run) and ``node_lost_learner``.

The cluster is a local Ray cluster of several nodes on 127.0.0.1 (``Nodes``:
``ray.cluster_utils.Cluster``, its files in a private temporary folder so that no other driver
on this machine finds it), one node per role kind, each labelled with a custom resource that
the run's ``cluster.resources`` asks for: the head holds the coordinator and the prior
(``v05_head``), one node the learner (``v05_learner``), one node each generator
(``v05_gen``). The run is ``python -m cluster.launch v05.yaml`` in a subprocess joined to the
head (``cluster.address``). A node is lost whole, as a reclaimed host is: its raylet and every
worker on it killed (``Cluster.remove_node(allow_graceful=False)``); a node is added as a new
host joining.
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.acceptance.chaos.outcome import Outcome, judge, read_jsonl, summary_of
from tests.acceptance.chaos.procs import error_line, launch

LABEL = {"head": "v05_head", "learner": "v05_learner", "generator": "v05_gen"}
# The run's side: each role on the nodes of its kind (one generator per generator node).
PLACE = [f"cluster.resources.coordinator.{LABEL['head']}=0.5",
         f"cluster.resources.prior.{LABEL['head']}=0.5",
         f"cluster.resources.learner.{LABEL['learner']}=1",
         f"cluster.resources.generator.{LABEL['generator']}=1"]
OBJECT_STORE = 200 * 1024 * 1024
# Steps trained on the one generator left before a node joins: the window its throughput is
# measured in (at ~2 s a step, about 16 s).
STEPS_ONE_LEFT = 8
SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "enable_worker_prestart": False,
                 "worker_maximum_startup_concurrency": 2}


@dataclass
class Nodes:
    """A local multi-node cluster this bench started; nodes by kind, in the order added."""

    cluster: object
    tmp: str
    kinds: dict = field(default_factory=dict)   # node -> "head", "learner" or "generator"

    @property
    def address(self) -> str:
        return self.cluster.address

    @property
    def dashboard(self) -> str | None:
        url = self.cluster.head_node.address_info.get("webui_url")
        return f"http://{url}" if url else None

    def add(self, kind: str):
        node = self.cluster.add_node(num_cpus=1, resources={LABEL[kind]: 1},
                                     node_ip_address="127.0.0.1",
                                     object_store_memory=OBJECT_STORE)
        self.kinds[node] = kind
        return node

    def gcs_cpu_percent(self, seconds: float = 5.0) -> float:
        """The head's GCS server's CPU use over ``seconds`` (% of one core)."""
        import psutil

        gcs = psutil.Process(self.cluster.head_node.all_processes["gcs_server"][0].process.pid)
        gcs.cpu_percent()
        time.sleep(seconds)
        return round(gcs.cpu_percent(), 1)

    def lose(self, kind: str) -> str:
        """The newest node of ``kind``, killed whole as a reclaimed host is: its raylet and
        every process the raylet started (the role actors' workers and what they started:
        left running, an orphaned engine would keep this machine's cores busy, which a lost
        host's would not); its node id."""
        import psutil

        node = [n for n, k in self.kinds.items() if k == kind][-1]
        node_id = node.node_id
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        workers = raylet.children(recursive=True)
        self.cluster.remove_node(node, allow_graceful=False)
        for p in workers:
            try:
                p.kill()
            except psutil.Error:
                pass
        del self.kinds[node]
        return node_id


@contextmanager
def nodes(generators: int = 2, learner_node: bool = True, dashboard: bool = False):
    """``Nodes``: the head, a learner node (else the learner's label is on the head too),
    ``generators`` generator nodes; stopped and removed on exit."""
    from ray.cluster_utils import Cluster

    from cluster.nodes.check_placement import private_ray_tmpdir
    from learner.ranks import free_port

    head_labels = {LABEL["head"]: 1, **({} if learner_node else {LABEL["learner"]: 1})}
    cluster = None
    with private_ray_tmpdir("v05n-") as tmp:
        try:
            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "resources": head_labels, "node_ip_address": "127.0.0.1",
                "object_store_memory": OBJECT_STORE, "include_dashboard": dashboard,
                **({"dashboard_host": "127.0.0.1"} if dashboard else {}),
                # Not Ray's default 52365: every local Ray cluster binds it (its dashboard
                # agent, dashboard or not), and a head whose agent lost that race to another
                # cluster on this machine takes no job ("No available agent to submit job").
                "dashboard_agent_listen_port": free_port(),
                "_system_config": SYSTEM_CONFIG})
            got = Nodes(cluster, tmp, {cluster.head_node: "head"})
            for kind in ["learner"] * learner_node + ["generator"] * generators:
                got.add(kind)
            cluster.wait_for_nodes()
            yield got
        finally:
            if cluster is not None:
                cluster.shutdown()


def _args(pb, nodes: Nodes, name: str, steps: int, *extra: str) -> list[str]:
    over = [o for o in pb.overrides if not o.startswith("cluster.address=")]
    return [*over, *PLACE, f"cluster.address={nodes.address}", f"run.name={name}",
            f"run.output_dir={pb.workdir}", f"run.max_steps={steps}", *extra]


def _rows(run_dir: Path) -> list[dict]:
    return read_jsonl(Path(run_dir) / "metrics.jsonl")


def rollouts_per_s(rows: list[dict], t_from: float, t_to: float) -> float | None:
    """Rollouts trained per second of the steps that ran wholly within [t_from, t_to]."""
    inside = [r for r in rows if r["t_start"] >= t_from and r["t_step_end"] <= t_to]
    if len(inside) < 2:
        return None
    span = max(r["t_step_end"] for r in inside) - min(r["t_start"] for r in inside)
    return round(sum(r["rollouts"] for r in inside) / span, 2) if span > 0 else None


def first_served_by(run_dir: Path, generator: int, after: float) -> float | None:
    """When generator ``generator`` first started a rollout after time ``after`` (the spans
    of prompts.jsonl), or None."""
    starts = [s[1] for p in read_jsonl(Path(run_dir) / "prompts.jsonl")
              for s in p.get("spans", []) if s[0] == generator and s[1] > after]
    return min(starts) if starts else None


def _step_reached(run_dir: Path, step: int):
    return lambda: len(_rows(run_dir)) >= step


def steps_within(rows: list[dict], t_from: float, t_to: float) -> tuple[int, int] | None:
    """The first and last step that ran wholly within [t_from, t_to], or None."""
    inside = [r["step"] for r in rows if r["t_start"] >= t_from and r["t_step_end"] <= t_to]
    return (min(inside), max(inside)) if len(inside) >= 2 else None


def _reference(pb, nodes: Nodes, steps: tuple[int, int] | None, k: int = 0) -> float | None:
    """Rollouts/s of the same run with one generator from the start, over the same steps
    (``steps``: first, last) as the window measured with the generator left: the same
    prompts (same seed) at the same point of training, so that what the policy has learned
    by then (the rollouts a step asks for, their lengths) is not part of the comparison."""
    if steps is None:
        return None
    name, (first, last) = f"node_reference_one_generator{'' if not k else f'_{k + 1}'}", steps
    run = launch(_args(pb, nodes, name, last, "generators.count=1"),
                 pb.workdir / f"{name}.log")
    run.wait_exit(pb.budget_s + 5 * last)
    run.tree.kill_leftovers(grace_s=10)
    rows = [r for r in _rows(pb.workdir / name) if first <= r["step"] <= last]
    return rollouts_per_s(rows, 0.0, float("inf"))


def _said(log: Path, text: str):
    return lambda: text in log.read_text(errors="replace")


def _lost_generator(log: Path) -> int | None:
    """The generator the run said was on the lost node."""
    import re

    m = re.search(r"lost after step \d+: it held generator-(\d+)", log.read_text(errors="replace"))
    return int(m.group(1)) if m else None


def _steps_after(run_dir: Path, t: float, n: int):
    """True once ``n`` steps have started after time ``t``."""
    return lambda: sum(r["t_start"] > t for r in _rows(run_dir)) >= n


def _served(run_dir: Path, generator: int, t: float):
    return lambda: first_served_by(run_dir, generator, t) is not None


def generator_nodes(pb, repeats: int = 1) -> list[Outcome]:
    """``generator_run`` ``repeats`` times, each on a cluster of its own (the runs' timings
    spread more than the aims' margins: one run cannot tell). The rows are the last run's,
    judged on every run (survived: all did; prompts lost and trained twice: summed), with the
    throughput ratio their mean and each run's figures in ``repeats``."""
    import statistics

    runs = []
    for k in range(repeats):
        if repeats > 1:
            print(f"   run {k + 1} of {repeats}", file=sys.stderr, flush=True)
        runs.append(generator_run(pb, k))
    if repeats == 1:
        return list(runs[0])
    per = [{"one_generator_left": r.detail["rollouts_per_s"]["one_generator_left"],
            "one_generator_alone": r.detail["rollouts_per_s"]["one_generator_alone"],
            "throughput_left_over_alone": r.detail.get("throughput_left_over_alone"),
            "gcs_cpu_percent": r.detail["gcs_cpu_percent"]["lost_bundle_waiting"],
            "added_served_after_s": a.recovery_time_s, "survived": r.survived and a.survived}
           for r, a in runs]
    ratios = [x["throughput_left_over_alone"] for x in per if x["throughput_left_over_alone"]]
    mean = round(statistics.mean(ratios), 3) if ratios else None
    se = round(statistics.stdev(ratios) / len(ratios) ** 0.5, 3) if len(ratios) > 1 else None
    out = []
    for row in runs[-1]:
        both = [r for pair in runs for r in pair if r.name == row.name]
        row.survived = all(r.survived for r in both)
        row.hung = any(r.hung for r in both)
        for field_ in ("prompts_lost", "prompts_trained_twice"):
            got = [getattr(r, field_) for r in both]
            setattr(row, field_, None if None in got else sum(got))
        row.wall_s = sum(r.wall_s for r in both)
        row.budget_s = sum(r.budget_s for r in both)
        row.detail.update(repeats=per, throughput_left_over_alone=mean,
                          throughput_left_over_alone_se=se)
        row.what_happened += (
            f" Over {repeats} runs: the generator left gave {mean} of a one-generator run's "
            f"rollouts/s (SE {se}; each: {[x['throughput_left_over_alone'] for x in per]})."
            if row.name == "node_lost_generators" else
            f" Over {repeats} runs, the added node's generator served after "
            f"{[round(x['added_served_after_s'] or 0, 1) for x in per]} s.")
        out.append(row)
    return out


def generator_run(pb, k: int = 0) -> tuple[Outcome, Outcome]:
    """One run on 1 head + 1 learner node + 2 generator nodes, ``run.max_train_s`` long: the
    second generator's node is lost after step 6; once the run has said so and trained
    ``STEPS_ONE_LEFT`` steps on the generator left, a new generator node joins; the run
    trains to its budget. The head's GCS CPU use is sampled while the lost generator's new
    group waits for a node, and after one joined. Then, on the nodes left, the same run with
    one generator from the start, to the last step of the window with one generator left
    (``_reference``).
    Two rows: ``node_lost_generators`` (throughput with one generator left against a
    one-generator run) and ``node_added`` (how long until the added node's generator
    serves, and the throughput after)."""
    name, t0, budget = f"node_generators{'' if not k else f'_{k + 1}'}", time.time(), 240
    run_dir, log = pb.workdir / name, pb.workdir / f"{name}.log"
    with nodes(generators=2) as cl:
        run = launch(_args(pb, cl, name, 10_000, f"run.max_train_s={budget}"), log)
        at_lose = run.wait_until(_step_reached(run_dir, 6), pb.budget_s)
        t_lose = time.time()
        lost_node = cl.lose("generator") if at_lose else None
        said = run.wait_until(_said(log, "lost after step"), 180)
        t_said, gen = time.time(), _lost_generator(log)
        gcs_busy = cl.gcs_cpu_percent()  # while the lost bundle waits for a node
        at_add = said and run.wait_until(_steps_after(run_dir, t_said, STEPS_ONE_LEFT), pb.budget_s)
        t_add = time.time()
        if at_add:
            cl.add("generator")
        run.wait_until(_served(run_dir, gen, t_add), 180)
        gcs_after = cl.gcs_cpu_percent()
        rc = run.wait_exit(budget + pb.budget_s)
        run.tree.kill_leftovers(grace_s=10)
        rows = _rows(run_dir)
        one_left = steps_within(rows, t_said, t_add) if at_add else None
        reference = _reference(pb, cl, one_left, k)  # then, on the nodes left: one generator
    s = summary_of(run_dir) or {}
    after_loss = next((r for r in rows if r["t_step_end"] > t_lose), None)
    served = first_served_by(run_dir, gen, t_add) if at_add and gen is not None else None
    tp = {"before_loss": rollouts_per_s(rows[2:], 0.0, t_lose),
          "one_generator_left": rollouts_per_s(rows, t_said, t_add),
          "one_generator_left_steps": one_left,
          "one_generator_alone": reference,
          "after_the_added_node_serves": rollouts_per_s(rows, served or float("inf"),
                                                        float("inf"))}
    done = rc == 0 and s.get("status") == "finished"
    events = s.get("node_events", [])
    common = dict(wall_s=time.time() - t0, budget_s=budget + 3 * pb.budget_s + 360,
                  t_fault=t_lose, rollouts_per_s=tp, node_events=events,
                  role_nodes=s.get("role_nodes"), exit_code=rc, steps=s.get("steps"),
                  generators_replaced=s.get("generators_replaced", []),
                  loss_said_after_s=round(t_said - t_lose, 1) if said else None,
                  gcs_cpu_percent={"lost_bundle_waiting": gcs_busy,
                                   "after_the_node_joined": gcs_after},
                  error=error_line(log) if rc else None)
    ratio = (tp["one_generator_left"] / tp["one_generator_alone"]
             if tp["one_generator_left"] and tp["one_generator_alone"] else None)
    lost_row = judge(
        "node_lost_generators", "a generator's node lost whole after step 6 (its raylet and "
        "workers killed)", run_dir, completed=done and said, hung=rc is None,
        recovery_time_s=(after_loss["t_step_end"] - t_lose) if after_loss else None,
        recovery="from the node's loss to the end of the first step after it",
        what_happened=_lost_words(events, tp, ratio, t_said - t_lose, gcs_busy),
        lost_node=lost_node,
        throughput_left_over_alone=ratio and round(ratio, 3), **common)
    added_row = judge(
        "node_added", f"a new generator node joined once the run had trained {STEPS_ONE_LEFT} "
        "steps on the generator left", run_dir, completed=done and served is not None,
        hung=rc is None,
        recovery_time_s=(served - t_add) if served else None,
        recovery="from the node's joining to the lost generator's first rollout there",
        what_happened=_added_words(events, tp, served, t_add, gen), **common)
    return lost_row, added_row


def _lost_words(events: list, tp: dict, ratio: float | None, said_s: float,
                gcs: float) -> str:
    lost = next((e for e in events if e["event"] == "lost"), None)
    where = (f"The run said node {lost['node'][:8]} lost after step {lost['step']} "
             f"({said_s:.0f} s after the kill: Ray's health checks), holding "
             f"{', '.join(lost['roles']) or 'nothing'}; the steps went on meanwhile; "
             if lost else "No node loss was seen; ")
    return (where + f"it went on with the generator left: {tp['one_generator_left']} "
            f"rollouts/s, {tp['before_loss']} with both, {tp['one_generator_alone']} for a "
            f"one-generator run" + (f" ({ratio:.0%} of it)" if ratio else "") +
            f". While the lost generator's new placement group waited for a node (the old "
            f"one removed: cluster.nodes.replace), Ray's GCS used {gcs:.0f}% of a core (this "
            "machine's 2 cores are every node's).")


def _added_words(events: list, tp: dict, served: float | None, t_add: float,
                 gen: int | None) -> str:
    joined = next((e for e in events if e["event"] == "joined"), None)
    return ((f"The run saw the node join after step {joined['step']}; " if joined else "")
            + (f"the run started a new generator-{gen} there and it served "
               f"{served - t_add:.0f} s "
               f"after the node joined, at the current weights; "
               f"{tp['after_the_added_node_serves']} rollouts/s after ({tp['before_loss']} "
               "before the loss)." if served else f"generator-{gen} never served again."))


def node_lost_learner(pb) -> Outcome:
    """The learner's node lost after step 5 (checkpoint at step 4): the run stops (exit 6,
    the last whole checkpoint named); a new learner node joins and the same command resumes
    from that checkpoint and trains to the end."""
    name, steps, t0 = "node_lost_learner", 8, time.time()
    run_dir = pb.workdir / name
    args = None
    with nodes(generators=2) as cl:
        args = _args(pb, cl, name, steps, "run.checkpoint_every=2")
        first = launch(args, pb.workdir / f"{name}.log")
        reached = first.wait_until(_step_reached(run_dir, 5), pb.budget_s)
        t_kill = time.time()
        lost = cl.lose("learner") if reached else None
        rc1 = first.wait_exit(pb.budget_s)
        first.tree.kill_leftovers(grace_s=10)
        said = [ln for ln in (pb.workdir / f"{name}.log").read_text(errors="replace")
                .splitlines() if ln.startswith(("error:", "warning: node"))]
        cl.add("learner")
        second = launch(args, pb.workdir / f"{name}.resume.log")  # the same command
        rc2 = second.wait_exit(pb.budget_s)
        second.tree.kill_leftovers(grace_s=10)
    s = summary_of(run_dir) or {}
    nxt = next((r for r in _rows(run_dir) if r["t_step_end"] > second.t_start), None)
    done = rc1 == 6 and rc2 == 0 and s.get("steps") == steps and bool(s.get("resumed_from"))
    what = (f"The driver stopped with exit {rc1}: {' / '.join(said)[:400]}. A new learner "
            f"node joined; the same command resumed from {s.get('resumed_from')} and trained "
            f"to step {s.get('steps')} (exit {rc2}).")
    return judge(name, "the learner's node lost whole after step 5 (checkpoint at step 4); a "
                 "new learner node, then the same command", run_dir, completed=done,
                 hung=rc1 is None or rc2 is None, wall_s=time.time() - t0,
                 budget_s=2 * pb.budget_s + 120,
                 recovery_time_s=(nxt["t_step_end"] - t_kill) if nxt else None,
                 recovery="from the node's loss to the resumed run's first step end",
                 what_happened=what, t_fault=t_kill, lost_node=lost, exit_codes=[rc1, rc2],
                 said=said, command=json.dumps(args))
