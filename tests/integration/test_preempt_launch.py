"""Graceful preemption end to end: ``python -m cluster.launch`` (its own local Ray cluster, real
vLLM generators, a real DeepSpeed rank) gets SIGTERM from the test after its second step, with
no periodic checkpoint; it must write a whole checkpoint of its last step with the prompts in
flight, say so in one line and exit 4; ``run.resume=true`` then trains to the end, and by
prompt uid nothing admitted is lost or trained twice, and every prompt the checkpoint held in
flight is trained (or dropped with a reason) after it. Short traces keep it to minutes.

The synchronous mode is the one tested here: the signal lands in the driver's wait for the
next batch, the path that only a preemption between steps takes. The asynchronous one
is covered in pieces, each once: its preemption checkpoint and exit under `ray job stop` in
test_two_jobs.py, the resume of the prompts a checkpoint held in flight in test_pipeline.py
(``test_crash_and_resume_train_every_admitted_prompt_exactly_once``), and the two together
by ``python -m bench.chaos --scenarios sigterm_then_resume`` (bench/results/chaos.json); a
second launch-and-resume pair here cost the suite 5 minutes of a worker for no new path.

The checkpoint's write time and the time from the signal to the exit are printed, not
asserted (timing is bench.chaos's: ``sigterm_then_resume``); exit 4 itself says the
checkpoint was whole within ``run.preempt_grace_s`` (past it the driver exits 143). The same
under ``ray job stop`` is checked on the job it stops in test_two_jobs.py.
"""
import json
import os
import re
import signal
import time

import pytest

pytestmark = pytest.mark.integration

pytest.importorskip("ray")

# One generator: the batch wait the signal lands in is the driver's, whatever the count (a
# second engine cost each of the two launches a vLLM start on the suite's 2 cores).
SHORT = ["generators.count=1", "run.eval_every=0", "cluster.address=local",
         "generators.measure_peak=false", "run.save_final=false", "run.stall_timeout_s=600",
         "task.difficulties=[1]", "task.n_train=2000", "task.n_heldout=100"]
STEPS, SIGNAL_AFTER, GRACE_S = 5, 2, 120


def _steps_done(run_dir) -> int:
    from cluster.run_files import read_lines

    return max((r["step"] for r in read_lines(run_dir / "metrics.jsonl")), default=0)


def test_sigterm_checkpoints_the_prompts_in_flight_and_the_resume_loses_nothing(tmp_path):
    """Synchronous: the next batch is generated after the publish, so a signal right after a
    step lands in the driver's wait for it: that wait is cancelled (the cancelled
    ``next_batch`` hands nothing over) and the checkpoint holds that batch's prompts in
    flight."""
    import msgpack

    from bench.chaos.procs import launch
    from cluster.checkpoints import RUN_STATE, Checkpoints
    from cluster.run_files import prompt_fates, read_lines

    run_dir = tmp_path / "pre"
    args = [*SHORT, "mode=sync", f"run.output_dir={tmp_path}", "run.name=pre",
            f"run.max_steps={STEPS}", "run.checkpoint_every=0", f"run.preempt_grace_s={GRACE_S}",
            # a batch that takes seconds to generate, so that the signal lands in its wait
            # (level-3 traces, 65-131 tokens: at level 1's 21-32 a batch came back within a
            # second, and under load the signal once landed after it, in the step)
            "algo.k_init=8", "algo.k_max=8", "rollout.batch_prompts=8", "task.difficulties=[3]"]
    first = launch(args, tmp_path / "first.log")
    try:
        assert first.wait_until(lambda: _steps_done(run_dir) >= SIGNAL_AFTER, 900), \
            first.log.read_text(errors="replace")[-3000:]
        t_sig = time.time()
        os.kill(first.proc.pid, signal.SIGTERM)
        rc = first.wait_exit(GRACE_S + 60)
        to_exit_s = time.time() - t_sig
    finally:
        first.tree.kill_leftovers(grace_s=5)
    log = first.log.read_text(errors="replace")
    assert rc == 4, log[-3000:]
    assert "preempting: SIGTERM received" in log
    said = re.search(r"^preempted: checkpoint step (\d+) written in ([\d.]+) s; resume with "
                     r"run.resume=true$", log, re.M)
    assert said, log[-3000:]
    step = int(said.group(1))
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"preempted at step {step}: checkpoint written in {said.group(2)} s, "
          f"{to_exit_s:.1f} s from SIGTERM to exit; batch wait cancelled: "
          f"{summary['batch_wait_cancelled']}")
    assert summary["batch_wait_cancelled"] is True
    assert step >= SIGNAL_AFTER and step == _steps_done(run_dir)
    ck = Checkpoints(run_dir / "checkpoints")
    assert ck.latest() == f"step{step}" and ck.tags() == [f"step{step}"]
    assert not (ck.root / ".staging").exists()
    assert summary["status"] == "preempted" and summary["steps"] == step
    snap = msgpack.unpackb((ck.root / f"step{step}" / RUN_STATE).read_bytes(), raw=False,
                           strict_map_key=False)
    held = {p["uid"] for p in snap["scheduler"]["inflight"]}
    assert held, "the next batch's prompts, in flight in the cancelled wait"

    second = launch([*args, "run.resume=true"], tmp_path / "resume.log")
    try:
        rc2 = second.wait_exit(900)
    finally:
        second.tree.kill_leftovers(grace_s=5)
    assert rc2 == 0, second.log.read_text(errors="replace")[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == f"step{step}" and summary["steps"] == STEPS
    fates = prompt_fates(run_dir)
    assert fates["lost"] == [] and fates["trained_twice"] == []
    assert fates["trained_and_dropped"] == [] and fates["unknown"] == []
    assert fates["admitted"] == fates["trained"] + fates["dropped"] + fates["in_flight"]
    after = {r["uid"] for r in read_lines(run_dir / "prompts.jsonl") if r["step"] > step} | \
        {r["uid"] for r in read_lines(run_dir / "dropped.jsonl") if r["step"] > step} | \
        set(json.loads((run_dir / "inflight_at_end.json").read_text())["uids"])
    assert held <= after  # every prompt the checkpoint held: trained, dropped or still going
