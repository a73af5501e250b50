"""The scheduler's checkpoint state: ``snapshot`` (every admitted prompt, to continue it after
a crash) and ``restore``; a mixin of ``Scheduler``, whose state it reads and fills."""
from __future__ import annotations

from typing import Callable

from actors.scheduler.messages import priority
from actors.scheduler.state import PromptInFlight
from estimator.state import PromptState


class SchedulerCheckpoint:
    def snapshot(self, encode_problem: Callable, encode_payload: Callable) -> dict:
        """Everything needed to continue every admitted prompt after a crash: its estimator
        state, its finished rollouts (``encode_payload``), its deadline; the counters and
        the drops not yet handed over (``dropped``). Rollouts in flight are not kept:
        ``restore`` asks for them again."""
        prompts = []
        for g in self.inflight.values():
            prompts.append({
                "uid": g.uid, "problem": encode_problem(g.problem), "state": g.state.to_dict(),
                "admitted_version": g.admitted_version, "deadline": g.deadline,
                "t_admit": g.t_admit, "t_done": g.t_done, "regenerations": g.regenerations,
                "cancelled_rollouts": g.cancelled_rollouts,
                "cancelled_tokens": g.cancelled_tokens, "ready": g.uid in self.ready,
                "rollouts": [[i, g.start_version[i], encode_payload(p)]
                             for i, p in sorted(g.payloads.items())]})
        # ``dropped``: drops not yet handed over (they reach dropped.jsonl with the next
        # batch); without them a resumed run would have those uids nowhere.
        return {"version": self.version, "counts": dict(self.counts), "drops": dict(self.drops),
                "dropped": [[uid, why] for uid, why in self.dropped],
                "refills": {str(d): n for d, n in self.refills.items()},
                "quota": {str(d): n for d, n in self.quota.items()}, "inflight": prompts}

    def restore(self, snap: dict, decode_problem: Callable, decode_payload: Callable) -> list:
        """Load a ``snapshot`` into this (fresh) scheduler; returns the dispatches that ask
        again for the rollouts that were in flight. Ages keep counting from the versions
        that started the samples, so the staleness bound still holds after a resume: a sample
        too old by the time it would be trained is re-generated (see ``take_batch``).

        The resumed learner trains the snapshot's weights, possibly under a higher number
        (generators that outlived the crashed run serve newer ones: see
        ``cluster.nodes.roles.resume_state``); this scheduler's version is that number. Every
        version in the snapshot (starts, admissions, deadlines) moves by the difference, so
        an age counts weight updates, not renumbering: a sample started on the checkpoint's
        weights is as old after the resume as it was at the checkpoint."""
        if self.inflight:
            raise ValueError("restore into a scheduler that already has prompts")
        # Absent from checkpoints written before it was kept: no shift, as then.
        shift = self.version - snap.get("version", self.version)
        if shift < 0:
            raise ValueError(f"restore at version {self.version}, older than the snapshot's "
                             f"{snap['version']}")
        # Counters are named as summary.json names them; checkpoints written before that
        # used three short names.
        old = {"admitted": "prompts_admitted", "handed": "prompts_handed",
               "extra_rollouts": "extra_rollouts_requested"}
        self.counts.update({old.get(k, k): n for k, n in snap["counts"].items()})
        self.drops.update(snap["drops"])
        # Absent from checkpoints written before it was kept.
        self.dropped = [(uid, why) for uid, why in snap.get("dropped", [])]
        self.refills.update({int(d) + shift: n for d, n in snap["refills"].items()})
        self.quota.update({int(d) + shift: n for d, n in snap["quota"].items()})
        actions = []
        # "groups": the key of checkpoints written before the rename to "inflight".
        for d in snap["inflight"] if "inflight" in snap else snap["groups"]:
            pif = PromptInFlight(d["uid"], decode_problem(d["problem"]),
                                 PromptState.from_dict(self.est, d["state"]),
                                 d["admitted_version"] + shift, d["deadline"] + shift, -1,
                                 d["t_admit"], t_done=d["t_done"],
                                 regenerations=d["regenerations"],
                                 cancelled_rollouts=d["cancelled_rollouts"],
                                 cancelled_tokens=d["cancelled_tokens"])
            for i, v, payload in d["rollouts"]:
                pif.payloads[int(i)] = decode_payload(payload)
                pif.start_version[int(i)] = int(v) + shift
            self.inflight[pif.uid] = pif
            if d["ready"]:
                self.ready[pif.uid] = pif
                self._recheck.add(pif.uid)
                continue
            self.unfinished[pif.deadline] += 1
            lost = tuple(pif.state.outstanding_indices())
            if lost:  # in flight when the checkpoint was taken: generate them again
                self.counts["reissued_requests"] += 1
                st = pif.state
                first = st.round_of(lost[0]) == 1 and pif.regenerations == 0
                x = self._dispatch(pif, lost, priority(pif.deadline, first), st.round_of(lost[0]))
                actions += [x] if x is not None else []
            else:
                actions += self._plan(pif)
        return actions

