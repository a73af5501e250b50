"""Two `ray job submit -- python -m cluster.launch v05.yaml` jobs at once on one cluster, one
stopped mid-run (`ray job stop`): the other trains to its end with exact accounting, each
job writes only its own run directory, and neither job's actors are the other's. The stopped
one is preempted as `ray job stop` preempts a job: SIGTERM, a whole checkpoint of its last
step with the prompts in flight, one line saying so, and nothing it admitted lost.

Both jobs are given the same run.name in different run.output_dir folders (the harder case:
anything keyed by the run's name alone, an actor name, a metric, a cache, would collide);
bench.chaos's ``second_job_killed`` runs two differently named jobs.
"""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from cluster.checkpoints import RUN_STATE, Checkpoints
from cluster.run_files import prompt_fates, read_lines
from test_job_submit import ROOT, head  # noqa: F401 - the fixture (tests/integration on the path)

pytestmark = pytest.mark.integration

TINY = ["generators.count=1", "rollout.batch_prompts=2", "algo.k_init=2", "algo.k_max=2",
        "run.eval_every=0", "run.save_final=false", "run.progress=false",
        "generators.measure_peak=false"]
STEPS = 12  # the survivor's


def submit(url, env, job_id: str, *overrides: str) -> None:
    cmd = ["ray", "job", "submit", "--address", url, "--no-wait", "--submission-id", job_id,
           "--working-dir", str(ROOT), "--", sys.executable, "-m", "cluster.launch",
           "v05.yaml", *TINY, *overrides]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def job_status(url, env, job_id: str) -> str:
    """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED (the CLI words these differently)."""
    from ray.job_submission import JobSubmissionClient

    return str(JobSubmissionClient(url).get_job_status(job_id).value)


def job_logs(url, env, job_id: str) -> str:
    return subprocess.run(["ray", "job", "logs", "--address", url, job_id], env=env,
                          capture_output=True, text=True, timeout=60).stdout


def steps_done(run_dir: Path) -> int:
    f = run_dir / "metrics.jsonl"
    return len(f.read_text().splitlines()) if f.exists() else 0


def alive_actors(url) -> list[dict]:
    from ray.util.state import list_actors

    return [{"class": a.class_name, "job": a.job_id, "pid": a.pid}
            for a in list_actors(address=url, filters=[("state", "=", "ALIVE")], limit=1000)]


def wait_for(pred, timeout_s: float, what: str, on_fail=lambda: "") -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if pred():
            return
        time.sleep(2)
    pytest.fail(f"timed out waiting for {what}: {on_fail()}"[-4000:])


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_two_jobs_at_once_one_stopped_the_other_ends_with_exact_accounting(head, tmp_path):  # noqa: F811
    url, env, _ = head
    out = {"keep": tmp_path / "out-keep", "stop": tmp_path / "out-stop"}
    run = {k: d / "twin" for k, d in out.items()}  # the same run.name in both
    # The one to be stopped first: it is surely still training when the other starts to.
    submit(url, env, "stop", "run.name=twin", f"run.output_dir={out['stop']}",
           "run.max_steps=500", "run.checkpoint_every=2")
    submit(url, env, "keep", "run.name=twin", f"run.output_dir={out['keep']}",
           f"run.max_steps={STEPS}", "run.checkpoint_every=4")
    logs = lambda: {j: job_logs(url, env, j)[-1500:] for j in out}  # noqa: E731
    # Both train at once: each has a step behind it and its own roles alive.
    wait_for(lambda: steps_done(run["stop"]) >= 1 and steps_done(run["keep"]) >= 1,
             420, "both jobs' first steps", logs)
    actors = alive_actors(url)
    assert steps_done(run["keep"]) < STEPS  # the survivor was still training then
    jobs = {c: {a["job"] for a in actors if a["class"] == c}
            for c in ("Coordinator", "Generator", "LearnerWorker", "PriorServer")}
    assert all(len(j) == 2 for j in jobs.values()), (jobs, actors)
    pids = [a["pid"] for a in actors if a["class"] in jobs]
    assert len(pids) == len(set(pids))  # no process serves both jobs

    subprocess.run(["ray", "job", "stop", "--address", url, "stop"], env=env,
                   capture_output=True, timeout=120)
    at_stop = steps_done(run["stop"])
    wait_for(lambda: job_status(url, env, "stop") in ("STOPPED", "FAILED"), 120, "the stop")
    wait_for(lambda: job_status(url, env, "keep") in ("SUCCEEDED", "FAILED", "STOPPED"), 420,
             "the survivor's end", logs)
    assert job_status(url, env, "keep") == "SUCCEEDED", logs()["keep"]

    # The survivor: every step, every admitted prompt trained, dropped or in flight at the end.
    s = json.loads((run["keep"] / "summary.json").read_text())
    assert s["steps"] == STEPS and s.get("status") != "stalled"
    assert s["prompts_admitted"] == (s["prompts_trained"] + s["prompts_dropped"]
                                     + s["prompts_in_flight_at_end"])
    fates = prompt_fates(run["keep"])
    assert fates["lost"] == [] and fates["trained_twice"] == [] and fates["unknown"] == []
    rows = [json.loads(x) for x in (run["keep"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # none of the other's

    # The stopped job stopped: no step after the stop, its actors gone, the survivor's too.
    time.sleep(5)
    assert steps_done(run["stop"]) <= at_stop + 1
    assert [a for a in alive_actors(url) if a["class"] in jobs] == []

    # `ray job stop` is a preemption: the driver got SIGTERM, checkpointed its last step with
    # the prompts in flight and said so, within the supervisor's wait (else Ray's SIGKILL
    # would have left no such line); by uid, nothing it admitted is lost or trained twice.
    stopped_log = job_logs(url, env, "stop")
    assert "preempting: SIGTERM received" in stopped_log, stopped_log[-3000:]
    said = re.search(r"^preempted: checkpoint step (\d+) written in ([\d.]+) s", stopped_log,
                     re.M)
    assert said, stopped_log[-3000:]
    step = int(said.group(1))
    assert Checkpoints(run["stop"] / "checkpoints").latest() == f"step{step}"
    s = json.loads((run["stop"] / "summary.json").read_text())
    assert s["status"] == "preempted" and s["steps"] == step == steps_done(run["stop"])
    snap = msgpack.unpackb((run["stop"] / "checkpoints" / f"step{step}" / RUN_STATE).read_bytes(),
                           raw=False, strict_map_key=False)
    held = [p["uid"] for p in snap["scheduler"]["inflight"]]  # a resume would train these
    trained = [r["uid"] for r in read_lines(run["stop"] / "prompts.jsonl")]
    dropped = [r["uid"] for r in read_lines(run["stop"] / "dropped.jsonl")]
    every = trained + dropped + held
    assert len(every) == len(set(every)) == snap["data_pos"]  # each admitted prompt once
    assert set(every) == {f"s{i}" for i in range(snap["data_pos"])}

    # Each wrote only under its own output folder, and only its own run directory there.
    # (the head's own log lives where the head fixture put it: here, or a directory of its own)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "head.log") == sorted(
        d.name for d in out.values())
    for k, d in out.items():
        assert sorted(p.name for p in d.iterdir()) == ["twin"], (k, files_under(d))
        cfg = (run[k] / "config.yaml").read_text()
        assert str(out[k]) in cfg and str(out["keep" if k == "stop" else "stop"]) not in cfg
        assert (run[k] / "logs" / "coordinator.log").exists()
