"""The scheduler's checkpoint state, read and written through its public interface:
``snapshot`` (every admitted prompt, to continue it after a crash) and ``restore`` (into a
fresh scheduler, which takes each prompt back with ``Scheduler.resume``)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from actors.scheduler.state import PromptInFlight
from common.records import DropCounts, SchedulerCounts
from estimator.state import PromptState


def snapshot(sched, encode_problem: Callable, encode_payload: Callable) -> dict:
    """Everything needed to continue every admitted prompt after a crash: its estimator
    state, its finished rollouts (``encode_payload``), its deadline; the counters, the
    calendar and the drops not yet handed over (``dropped``). Rollouts in flight are not
    kept: ``restore`` asks for them again."""
    prompts = []
    for g in sched.inflight.values():
        prompts.append({
            "uid": g.uid, "problem": encode_problem(g.problem), "state": g.state.to_dict(),
            "admitted_version": g.admitted_version, "deadline": g.deadline,
            "t_admit": g.t_admit, "t_done": g.t_done, "regenerations": g.regenerations,
            "cancelled_rollouts": g.cancelled_rollouts,
            "cancelled_tokens": g.cancelled_tokens, "ready": g.uid in sched.ready,
            "rollouts": [[i, g.start_version[i], encode_payload(p)]
                         for i, p in sorted(g.payloads.items())]})
    # ``dropped``: drops not yet handed over (they reach dropped.jsonl with the next batch);
    # without them a resumed run would have those uids nowhere.
    # ``selection``: the candidates drawn and not yet decided, the prior's error terms, the
    # prompts' histories and the counters (drawn = admitted + deferred + waiting on resume too)
    sel = {} if sched.selector is None else {"selection": sched.selector.snapshot(encode_problem),
                                             "deferred": [list(d) for d in sched.deferred]}
    return {"version": sched.version, "counts": asdict(sched.counts), "drops": asdict(sched.drops),
            "dropped": [[uid, why] for uid, why in sched.dropped],
            **sched.calendar.snapshot(), "inflight": prompts, **sel}


def restore(sched, snap: dict, decode_problem: Callable, decode_payload: Callable) -> list:
    """Load a ``snapshot`` into the fresh scheduler ``sched``; returns the dispatches that
    ask again for the rollouts that were in flight. Ages keep counting from the versions
    that started the samples, so the staleness bound still holds after a resume: a sample
    too old by the time it would be trained is re-generated (see ``take_batch``).

    The resumed learner trains the snapshot's weights, possibly under a higher number
    (generators that outlived the crashed run serve newer ones: see
    ``cluster.run.start.resume_state``); the scheduler's version is that number. Every
    version in the snapshot (starts, admissions, deadlines) moves by the difference, so an
    age counts weight updates, not renumbering: a sample started on the checkpoint's
    weights is as old after the resume as it was at the checkpoint."""
    if sched.inflight:
        raise ValueError("restore into a scheduler that already has prompts")
    # Absent from checkpoints written before it was kept: no shift, as then.
    shift = sched.version - snap.get("version", sched.version)
    if shift < 0:
        raise ValueError(f"restore at version {sched.version}, older than the snapshot's "
                         f"{snap['version']}")
    # Counters are named as summary.json names them; checkpoints written before that used
    # three short names.
    old = {"admitted": "prompts_admitted", "handed": "prompts_handed",
           "extra_rollouts": "extra_rollouts_requested"}
    sched.counts = SchedulerCounts.of({old.get(k, k): n for k, n in snap["counts"].items()})
    # (checkpoints written before the drops were typed: ``DropCounts.of`` folds their names)
    sched.drops = DropCounts.of(snap["drops"])
    # Absent from checkpoints written before it was kept.
    sched.dropped = [(uid, why) for uid, why in snap.get("dropped", [])]
    sched.calendar.restore(snap, shift)
    if sched.selector is not None and "selection" in snap:
        sched.selector.restore(snap["selection"], decode_problem)
        sched.deferred = [tuple(d) for d in snap.get("deferred", [])]
    actions = []
    # "groups": the key of checkpoints written before the rename to "inflight".
    for d in snap["inflight"] if "inflight" in snap else snap["groups"]:
        pif = PromptInFlight(d["uid"], decode_problem(d["problem"]),
                             PromptState.from_dict(sched.est, d["state"]),
                             d["admitted_version"] + shift, d["deadline"] + shift, -1,
                             d["t_admit"], t_done=d["t_done"], regenerations=d["regenerations"],
                             cancelled_rollouts=d["cancelled_rollouts"],
                             cancelled_tokens=d["cancelled_tokens"])
        for i, v, payload in d["rollouts"]:
            pif.payloads[int(i)] = decode_payload(payload)
            pif.start_version[int(i)] = int(v) + shift
        actions += sched.resume(pif, bool(d["ready"]))
    return actions
