"""`ray job submit -- python -m cluster.launch v05.yaml` against a `ray start --head` cluster:
the job's outputs land where it says and survive the cluster, and while it runs every role's
actor is named by run and role, in Ray's state API and on the dashboard's Actors page as
headless Chromium renders it (one cluster for the whole module: the suite's time is tight).

A second job runs beside it on the same cluster, under the same run.name in another
run.output_dir (the harder case: anything keyed by the run's name alone, an actor name, a
metric, a cache, would collide; tests.acceptance.chaos's ``second_job_killed`` runs two differently
named jobs), and is stopped mid-run with `ray job stop`: the first trains to its end with
exact accounting, each job writes only its own run directory, neither job's actors are the
other's, and the stopped one is preempted as `ray job stop` preempts a job: SIGTERM, a
whole checkpoint of its last step with the prompts in flight, one line saying so, and
nothing it admitted lost.

The job trains on a verl-layout Parquet dataset (``task.name=math task.path=train.parquet``),
so the same launch shows that a verl user's files train end to end: prompts from the file,
its ground truths reaching the verifier, its held-out file evaluated. The files are written
as verl's data preprocessing scripts write them (``data_source``, ``prompt`` = chat messages,
``ability``, ``reward_model`` = {style, ground_truth}, ``extra_info``). The model is the
embedded stepwise policy: it reads only its own problem format ("37+8 x2": add 8 to 37
twice, modulo 100) and writes ``answer: N`` last, which the math task's verifier extracts as
DAPO's "Answer:" line, so the questions are written in that format with numeric ground
truths, and most rollouts are right."""
import contextlib
import json
import os
import random
import re
import signal
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import pytest

from chromium import NO_CHROMIUM, Browser, chromium_binary, evaluate, open_page, screenshot
from cluster.records.checkpoints import RUN_STATE, Checkpoints
from cluster.records.files import prompt_fates, read_lines
from learner.ranks import free_port
from tests.acceptance.chaos.faults import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RUN = "job"
ROLES = {"generator-0": "Generator", "learner-rank-0": "LearnerWorker", "prior": "PriorServer",
         "coordinator": "Coordinator", "telemetry": "Telemetry"}  # role -> actor class
NAMES = {f"{RUN}/{role}": cls for role, cls in ROLES.items()}
# The run trains this long (run.max_train_s; a step takes about a second here), so that its
# coordinator is alive long enough for a browser to open the dashboard and read it.
TRAIN_S = 15  # the page was read 1.3-1.7 s after the roles were up
# The second job, stopped mid-run: the default task, as small as a run gets.
TWIN = ["generators.count=1", "rollout.batch_prompts=2", "algo.k_init=2", "algo.k_max=2",
        "run.eval_every=0", "run.save_final=false", "run.progress=false",
        "generators.measure_peak=false", f"run.name={RUN}", "run.max_steps=500",
        "run.checkpoint_every=2"]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A head node we started ourselves (--block keeps its CLI alive; we stop it by pgid),
    with the dashboard on a free port of 127.0.0.1."""
    tmp = tmp_path_factory.mktemp("head")
    gcs, dash = free_port(), free_port()
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # AF_UNIX socket paths must stay short
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"  # a loopback-only test cluster; no token to hand around
    # `ray job stop` sends SIGTERM, then SIGKILL this long after (Ray's default 3 s, read by
    # the job supervisor, so set before the head starts): time for a stopped run to write its
    # preemption checkpoint (the second job).
    env["RAY_JOB_STOP_WAIT_TIME_S"] = "90"
    proc = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs}",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--num-cpus=4",
         # Ports Ray would otherwise fix (52365, 10001): another cluster on this machine
         # (a test running beside this one) may hold them, and this head's job submission
         # needs its own agent's.
         f"--dashboard-agent-listen-port={free_port()}",
         f"--ray-client-server-port={free_port()}",
         f"--temp-dir={ray_tmp}"],
        env=env, stdout=open(tmp / "head.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    deadline = time.time() + 120
    while time.time() < deadline:
        # Ready when a trivial job runs: the job agent can lag the dashboard by seconds
        # ("No available agent to submit job"), and Ray answers at once rather than waiting.
        ok = subprocess.run(["ray", "job", "submit", "--address", url, "--", "true"],
                            capture_output=True, env=env).returncode == 0
        if ok:
            break
        time.sleep(2)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail("ray head did not come up: " + (tmp / "head.log").read_text()[-2000:])

    def stop():
        """Stop the cluster we started (its process group), once."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:  # the head's processes linger ~30 s after SIGTERM; all are in its group
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
        shutil.rmtree(ray_tmp, ignore_errors=True)  # Ray's session files go with it

    yield url, env, stop
    stop()


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def all_actors(url: str) -> list[dict]:
    """Every actor of the cluster, from Ray's state API (the REST endpoint behind
    ``ray list actors``)."""
    return get_json(f"{url}/api/v0/actors?detail=1&limit=1000")["data"]["result"]["result"]


def ray_job_id(url: str, submission_id: str) -> str | None:
    """The Ray job id (what each actor records) of a submitted job, once it has one."""
    return next((j.get("job_id") for j in get_json(f"{url}/api/jobs/")
                 if j.get("submission_id") == submission_id), None)


def named_actors(url: str, job_id: str | None) -> dict[str, tuple[str, str]]:
    """The actors of one Ray job: name (or "" for none) -> (class, state)."""
    return {a.get("name") or f"<anonymous {a['actor_id'][:8]}>": (a["class_name"], a["state"])
            for a in all_actors(url) if a.get("job_id") == job_id}


def job_status(url: str, submission_id: str) -> str:
    """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
    return next(j["status"] for j in get_json(f"{url}/api/jobs/")
                if j.get("submission_id") == submission_id)


def steps_done(run_dir: Path) -> int:
    f = run_dir / "metrics.jsonl"
    return len(f.read_text().splitlines()) if f.exists() else 0


def launch_running(url: str, submission_id: str) -> bool:
    """Whether that cluster.launch job is RUNNING now (Ray's job API)."""
    return job_status(url, submission_id) == "RUNNING"


# The Actors page's table rows (Material UI) that name a role of the run, as rendered text.
ROWS = """JSON.stringify({
  rows: Array.from(document.querySelectorAll('tbody tr')).map(r => r.innerText)
          .filter(t => t.includes(%s)),
  header: Array.from(document.querySelectorAll('thead th')).map(h => h.innerText.trim()),
  height: document.documentElement.scrollHeight})""" % json.dumps(f"{RUN}/")


@dataclass
class Twin:
    """The second job: same run.name, another output folder, stopped mid-run."""
    out: Path                      # its run.output_dir
    job_ids: dict = field(default_factory=dict)  # submission id -> Ray job id, both jobs
    actors: list = field(default_factory=list)   # every actor alive while both jobs ran
    steps_at_stop: int = 0
    main_running_at_stop: bool = False
    status: str = ""               # after the stop
    logs: str = ""

    @property
    def run_dir(self) -> Path:
        return self.out / RUN


@dataclass
class Job:
    root: Path                     # the durable output root the job was given
    twin: Twin
    job_id: str | None = None      # its Ray job id
    logs: str = ""
    returncode: int | None = None
    actors: dict = field(default_factory=dict)   # state API while every role was alive
    running_at_open: bool = False  # the job was running when the browser opened the page
    page: dict = field(default_factory=dict)     # what the Actors page showed
    screenshot: Path | None = None


def watch_until_named(url: str, proc, submission_id: str, timeout_s: float = 900) -> dict:
    """One job's actors (state API) once every role's name is ALIVE (or the job ended)."""
    deadline, actors = time.time() + timeout_s, {}
    while time.time() < deadline and proc.poll() is None:
        actors = named_actors(url, ray_job_id(url, submission_id))
        if all(actors.get(n, ("", ""))[1] == "ALIVE" for n in NAMES):
            break
        time.sleep(1)
    return actors


def submit_twin(url: str, env: dict, twin: Twin) -> None:
    cmd = ["ray", "job", "submit", "--address", url, "--no-wait", "--submission-id", "twin",
           "--working-dir", str(ROOT), "--", sys.executable, "-m", "cluster.launch",
           "v05.yaml", *TWIN, f"run.output_dir={twin.out}"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def stop_twin(url: str, env: dict, twin: Twin, main_proc) -> None:
    """While the first job runs: both jobs' actors, then `ray job stop` of the second once it
    has a step behind it, and its end (its log's lines, its status)."""
    both = lambda: all(named_actors(url, ray_job_id(url, j)).get(n, ("", ""))[1] == "ALIVE"  # noqa: E731
                       for j in ("main", "twin") for n in NAMES)
    if wait_for(lambda: main_proc.poll() is not None or both(), 300, 1.0, ()) \
            and main_proc.poll() is None:
        twin.actors = [a for a in all_actors(url) if a["state"] == "ALIVE"]
        twin.job_ids = {j: ray_job_id(url, j) for j in ("main", "twin")}
    wait_for(lambda: steps_done(twin.run_dir) >= 1, 300, 1.0, ())
    twin.main_running_at_stop = main_proc.poll() is None
    subprocess.run(["ray", "job", "stop", "--address", url, "twin"], env=env,
                   capture_output=True, timeout=120)
    twin.steps_at_stop = steps_done(twin.run_dir)
    wait_for(lambda: job_status(url, "twin") in ("STOPPED", "FAILED", "SUCCEEDED"), 120, 1.0, ())
    twin.status = job_status(url, "twin")
    twin.logs = subprocess.run(["ray", "job", "logs", "--address", url, "twin"], env=env,
                               capture_output=True, text=True, timeout=60).stdout


def read_actors_page(browser: Browser, url: str, shot: Path, timeout_s: float = 60) -> dict:
    """Open the dashboard's Actors page and read its table until a row names every role
    (the page polls /logical/actors every 10 s); keep a screenshot."""
    t0 = time.time()
    session = open_page(browser, f"{url}/#/actors", 1600, 1000)
    while True:
        page = json.loads(evaluate(browser, session, ROWS))
        if all(any(n in row.split() for row in page["rows"]) for n in NAMES):
            break
        if time.time() - t0 > timeout_s:
            break
        time.sleep(0.5)
    page["read_s"] = time.time() - t0
    screenshot(browser, session, shot, 1600, min(max(page["height"], 1000), 4000))
    return page


def say(request, line: str) -> None:
    """A line on pytest's terminal even while output is captured."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print(f"\n{line}", flush=True)


def verl_rows(specs, split: str) -> list[dict]:
    rows = []
    for i, (x, op, d, k) in enumerate(specs):
        truth = (x + (k * d if op == "+" else -k * d)) % 100
        rows.append({"data_source": "v05rl/stepwise-as-verl",
                     "prompt": [{"role": "user", "content": f"{x:02d}{op}{d} x{k}\n"}],
                     "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(truth)},
                     "extra_info": {"split": split, "index": f"{split}-{i}"}})
    return rows


@pytest.fixture(scope="module")
def verl_files(tmp_path_factory):
    import pandas as pd

    rng = random.Random(0)
    # sorted: a set's order of tuples with strings changes with each process's hash seed, and
    # with it which prompts were held out
    specs = sorted({(rng.randrange(100), rng.choice("+-"), rng.randint(1, 9), rng.randint(1, 2))
                    for _ in range(60)})
    tmp = tmp_path_factory.mktemp("verl")
    pd.DataFrame(verl_rows(specs[:40], "train")).to_parquet(tmp / "train.parquet")
    pd.DataFrame(verl_rows(specs[40:44], "test")).to_parquet(tmp / "test.parquet")
    (tmp / "my_rewards.py").write_text(REWARD_FILE)
    return tmp


# The user's reward function in verl's signature, outside the package (task.reward_function):
# the last line's last integer against the ground truth, +1/-1, with numbers of its own.
REWARD_FILE = """
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    lines = solution_str.strip().splitlines()
    found = re.findall(r"-?\\d+", lines[-1]) if lines else []
    right = bool(found) and found[-1] == ground_truth
    return {"score": 1.0 if right else -1.0, "acc": float(right),
            "from_train_split": float((extra_info or {}).get("split") == "train")}
"""


@pytest.fixture(scope="module")
def job(head, verl_files, tmp_path_factory, request):
    """One tiny run on the verl files submitted as a job, beside a second job of the same
    run.name that is stopped mid-run; while the first runs, its actors as the state API
    lists them and (with Chromium) as the dashboard's Actors page shows them."""
    from tasks.policy import ensure_default_policy

    url, env, stop = head
    tmp = tmp_path_factory.mktemp("job")
    root = tmp / "outputs"
    runtime_env = json.dumps({"env_vars": {"V05_OUTPUT_ROOT": str(root)}})
    model = ensure_default_policy(task="stepwise")  # cached: built by the install
    cmd = ["ray", "job", "submit", "--address", url, "--submission-id", "main",
           "--working-dir", str(ROOT), "--runtime-env-json", runtime_env, "--",
           sys.executable, "-m", "cluster.launch", "v05.yaml", "run.max_steps=100000",
           f"run.max_train_s={TRAIN_S}", f"run.name={RUN}",
           "task.name=math", f"task.path={verl_files / 'train.parquet'}",
           f"task.heldout_path={verl_files / 'test.parquet'}", "task.n_heldout=4",
           f"task.reward_function={verl_files / 'my_rewards.py'}:compute_score",
           f"model.path={model}", "rollout.max_tokens=48",
           # evaluated at the start and after the last step only, 4 prompts
           "run.eval_every=100000", "run.eval_prompts=4", "run.eval_samples=1",
           "generators.count=1", "rollout.batch_prompts=4", "algo.k_init=2", "algo.k_max=4"]
    out, log = Job(root, Twin(tmp / "twin-out")), tmp / "submit.log"
    submit_twin(url, env, out.twin)  # first: it is surely still training when the other is
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    # Chromium starts while the roles do, ready to open the page the moment they are up.
    browser = None if chromium_binary() is None else Browser(
        chromium_binary(), tmp / "chromium-profile", tmp / "chromium.log")
    try:
        out.actors = watch_until_named(url, proc, "main")
        out.job_id = ray_job_id(url, "main")
        if browser is not None and proc.poll() is None:
            out.running_at_open = launch_running(url, "main")
            out.screenshot = Path(os.environ.get("V05RL_DASHBOARD_SCREENSHOT")
                                  or tmp / "ray-dashboard-actors.png")
            out.page = read_actors_page(browser, url, out.screenshot)
            say(request, f"Ray dashboard Actors page read in {out.page['read_s']:.1f}s, "
                         f"screenshot: {out.screenshot}")
        stop_twin(url, env, out.twin, proc)
        out.returncode = proc.wait(timeout=900)
    finally:
        if browser is not None:
            browser.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the submit CLI we started, and only it
            proc.wait(timeout=60)
        out.logs = log.read_text()
    yield out


PROMISED = ("config.yaml", "metrics.jsonl", "prompts.jsonl", "dropped.jsonl", "summary.json",
            "inflight_at_end.json", "report.html", "checkpoints/latest", "final/config.json",
            "logs/coordinator.log", "logs/generator-0.log", "logs/learner-0.log")


def test_a_job_keeps_its_outputs_at_the_printed_path_after_the_cluster_stops(head, job):
    """The user's own path: a relative run.output_dir under `ray job submit --working-dir`
    must not land in Ray's temporary copy of the working directory but under the durable
    output root (here V05_OUTPUT_ROOT, a test directory; without it ~/v05rl-runs, unit-tested
    in test_paths). The cluster is then stopped and every promised output is found where the
    job said it would be."""
    _, _, stop = head
    logs = job.logs
    assert job.returncode == 0, logs[-3000:]
    assert "succeeded" in logs.lower()
    printed = {line.split("run directory: ", 1)[1].strip() for line in logs.splitlines()
               if "run directory: " in line}
    assert len(printed) == 1, printed  # printed at the start and at the end, the same path
    run_dir = Path(printed.pop())
    assert run_dir == job.root / "runs" / RUN
    assert "working_dir_files" not in str(run_dir)
    # The console stayed quiet: engine start-up went to the log files.
    assert "Loading safetensors checkpoint shards" not in logs
    # No warning the user can do nothing about: the job's own console (the launcher's output
    # and every role's forwarded lines, which the CLI tails to its stdout) has no line that
    # says "warning". Ray's CLI says its own things before that (e.g. that it leaves .git out
    # of the uploaded --working-dir): the user's command, not the run.
    job_console = logs.split("Tailing logs until the job exits", 1)[1]
    warned = [line for line in job_console.splitlines() if "warning" in line.lower()]
    assert warned == [], "\n".join(warned)
    stop()  # the cluster and its session files are gone; the outputs must not be
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] >= 1 and summary["policy_version"] == summary["steps"]
    missing = [name for name in PROMISED if not (run_dir / name).exists()]
    assert missing == [], missing


def test_every_role_of_the_job_is_named_by_run_and_role(job):
    """Ray's state API, while the run's roles were all alive: each role's actor under
    ``<run>/<role>`` with its class, and no role's actor left anonymous."""
    seen = {name: job.actors.get(name) for name in NAMES}
    assert seen == {name: (cls, "ALIVE") for name, cls in NAMES.items()}, job.actors
    anonymous = sorted(name for name, (cls, _) in job.actors.items()
                       if cls in ROLES.values() and not name.startswith(f"{RUN}/"))
    assert anonymous == []


@pytest.mark.skipif(chromium_binary() is None, reason=NO_CHROMIUM)
def test_the_dashboard_actors_page_shows_each_role_by_run_and_name(job):
    """Headless Chromium opens the Ray dashboard's Actors page while the job runs and finds
    one row for each role with its name, its class and ALIVE; the screenshot is kept (its
    path is printed)."""
    assert job.running_at_open, "the job had ended before the page was opened"
    assert "Name" in job.page["header"] and "Class" in job.page["header"], job.page["header"]
    assert job.job_id, "no Ray job id for the job"
    for name, cls in NAMES.items():
        # the second job's role of the same name may be listed too, under its own job id
        rows = [row.split() for row in job.page["rows"]
                if name in row.split() and job.job_id in row.split()]
        assert len(rows) == 1, (name, job.job_id, job.page["rows"])
        assert cls in rows[0] and "ALIVE" in rows[0], (name, rows[0])
    assert job.screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert job.screenshot.stat().st_size > 20_000


def test_a_verl_parquet_dataset_trains_through_the_job(job):
    """The prompts came from the file (verl's extra_info.index is the id), and its ground
    truths reached the user's reward function (a file outside the package, verl's signature,
    ``task.reward_function``), which scored every rollout: right (+1) where the answer line
    matches the file's answer and wrong (-1) elsewhere, its other numbers logged per step. How
    many are right varies (the two-operation prompts are hard for the policy: a step's
    reward_mean of 0.0 came up, and a held-out sampled accuracy of 0 on 4 prompts); a right
    one among a run's rollouts needs the file's answers. The held-out file is evaluated, at
    the start and at the end."""
    assert job.returncode == 0, job.logs[-3000:]
    run_dir = job.root / "runs" / RUN
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] >= 2
    assert summary["prompts_admitted"] == (summary["prompts_trained"] + summary["prompts_dropped"]
                                           + summary["prompts_in_flight_at_end"])
    trained = [json.loads(x) for x in (run_dir / "prompts.jsonl").read_text().splitlines()]
    assert len(trained) == summary["prompts_trained"] >= 8
    assert all(p["prompt_id"].startswith("train-") for p in trained)
    rewards = [r for p in trained for r in p["rewards"]]
    assert set(rewards) <= {-1.0, 1.0} and 1.0 in rewards, rewards
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == summary["steps"]
    # the function's own numbers, each step's mean over its rollouts: from its extra_info too
    assert all(m["reward_extras"]["from_train_split"] == 1.0 for m in metrics)
    assert all(m["reward_extras"]["acc"] == pytest.approx((m["reward_mean"] + 1) / 2)
               for m in metrics)
    print(f"verl parquet: {summary['steps']} steps, {summary['prompts_trained']} prompts "
          f"trained of {summary['prompts_admitted']} admitted, held-out sampled accuracy "
          f"{summary['eval_accuracy_initial']} -> {summary['eval_accuracy_final']}")
    assert summary["eval_prompts"] == 4
    assert summary["eval_accuracy_initial"] is not None
    assert summary["eval_accuracy_final"] is not None and 0 <= summary["eval_accuracy_final"] <= 1


def test_a_second_job_of_the_same_name_is_stopped_and_the_first_ends_with_exact_accounting(
        job):
    """Two jobs of one run.name at once, in different output folders; `ray job stop` of the
    second while the first runs: the first trains to its end with exact accounting, the
    second is preempted (its checkpoint, its line, nothing it admitted lost or repeated), no
    process serves both, and each writes only its own run directory."""
    twin = job.twin
    assert job.returncode == 0, job.logs[-3000:]
    # Both ran at once: each role of each job alive in its own process.
    assert twin.actors, "the two jobs' roles were never alive at once"
    roles = set(ROLES.values())
    jobs = {c: {a["job_id"] for a in twin.actors if a["class_name"] == c} for c in roles}
    assert all(j == set(twin.job_ids.values()) and len(j) == 2 for j in jobs.values()), jobs
    pids = [a["pid"] for a in twin.actors if a["class_name"] in roles]
    assert len(pids) == len(set(pids))  # no process serves both jobs
    assert twin.main_running_at_stop and twin.steps_at_stop >= 1

    # The first: every step its own, every admitted prompt trained, dropped or in flight.
    main_dir = job.root / "runs" / RUN
    s = json.loads((main_dir / "summary.json").read_text())
    assert s.get("status") not in ("stalled", "preempted")
    fates = prompt_fates(main_dir)
    assert fates["lost"] == [] and fates["trained_twice"] == [] and fates["unknown"] == []
    rows = [json.loads(x) for x in (main_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, s["steps"] + 1))  # none of the other's

    # The second stopped: no step after the stop. `ray job stop` is a preemption: the driver
    # got SIGTERM, checkpointed its last step with the prompts in flight and said so, within
    # the supervisor's wait (else Ray's SIGKILL would have left no such line); by uid,
    # nothing it admitted is lost or trained twice.
    assert twin.status in ("STOPPED", "FAILED"), twin.status
    assert steps_done(twin.run_dir) <= twin.steps_at_stop + 1
    assert "preempting: SIGTERM received" in twin.logs, twin.logs[-3000:]
    said = re.search(r"^preempted: checkpoint step (\d+) written in ([\d.]+) s", twin.logs,
                     re.M)
    assert said, twin.logs[-3000:]
    step = int(said.group(1))
    assert Checkpoints(twin.run_dir / "checkpoints").latest() == f"step{step}"
    st = json.loads((twin.run_dir / "summary.json").read_text())
    assert st["status"] == "preempted" and st["steps"] == step == steps_done(twin.run_dir)
    snap = msgpack.unpackb((twin.run_dir / "checkpoints" / f"step{step}" / RUN_STATE
                            ).read_bytes(), raw=False, strict_map_key=False)
    held = [p["uid"] for p in snap["scheduler"]["inflight"]]  # a resume would train these
    trained = [r["uid"] for r in read_lines(twin.run_dir / "prompts.jsonl")]
    dropped = [r["uid"] for r in read_lines(twin.run_dir / "dropped.jsonl")]
    # drops since the last hand-over reach dropped.jsonl with the next batch: the checkpoint
    # keeps them (a prompt dropped as too stale while the twin crawls under load, say)
    pending = [uid for uid, _ in snap["scheduler"]["dropped"]]
    every = trained + dropped + pending + held
    assert len(every) == len(set(every)) == snap["data_pos"]  # each admitted prompt once
    assert set(every) == {f"s{i}" for i in range(snap["data_pos"])}

    # Each wrote only its own run directory, under its own output folder.
    assert sorted(p.name for p in twin.out.iterdir()) == [RUN]
    assert sorted(p.name for p in (job.root / "runs").iterdir()) == [RUN]
    cfg = (twin.run_dir / "config.yaml").read_text()
    assert str(twin.out) in cfg and str(job.root) not in cfg
    assert str(twin.out) not in (main_dir / "config.yaml").read_text()
    assert (twin.run_dir / "logs" / "coordinator.log").exists()
