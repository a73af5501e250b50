"""The broadcast transport (``nccl`` on GPUs, ``gloo`` on CPUs): learner rank 0 broadcasts
each tensor to every generator's worker, in a group that survives generator restarts.

The sender keeps a group *epoch* (see ``group.py`` for one epoch). Each ``send``:

1. probes every generator (``incarnation()``, within ``probe_timeout_s``); one that does not
   answer (dead, being restarted, hung) is left out of this publish and its update is
   reported as failed;
2. rebuilds the group when the live membership (actor, incarnation) differs from the
   current epoch's, or the epoch is broken: a new epoch on a new rendezvous port, every
   live generator re-initialises its side (``Generator.init_weight_sync``);
3. announces the version to every member (``update_weights(payload, version)``; the payload
   names the epoch and the tensors), broadcasts the tensors and waits for every member's
   acknowledgement, each step bounded by ``timeout_s``;
4. on a failed step (``BroadcastError``: a receiver died, hung or failed), closes the epoch
   (receivers blocked in it fail), settles the members' updates (dead or hung ones are
   dropped; those that failed only because the epoch broke stay) and rebuilds with the
   others, at most ``max_attempts`` tries per publish.

A restarted generator is not in the current epoch: ``update_weights`` with the published
payload (the coordinator's re-sync) raises ``NotInGroupError`` until the next publish
reconnects it, unless ``restart_fallback`` put the same version into the object store.
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.weight_sync.base import (BroadcastError, CollectivePayload, GroupSpec,
                                     NotInGroupError, WeightReceiver, WeightSender,
                                     WeightSyncConfig, WeightSyncError, broadcast_plan,
                                     check_payload)
from common.weight_sync.group import BroadcastGroup, Listener
from common.weight_sync.object_store import ObjectStoreReceiver, put_state_dict


@dataclass
class SendReport:
    """What one ``send`` did (``CollectiveSender.reports``); indices into its generators."""

    version: int
    epoch: int = 0
    attempts: int = 0
    rebuilds: int = 0
    updated: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class _Settled:
    """Outcome of a batch of generator calls, by generator index."""

    refs: dict[int, Any] = field(default_factory=dict)    # the calls, by generator
    ok: dict[int, Any] = field(default_factory=dict)      # value returned
    lost: dict[int, Any] = field(default_factory=dict)    # ref: actor dead, or still pending
    raised: dict[int, str] = field(default_factory=dict)  # alive, the call raised


class CollectiveSender(WeightSender):
    def __init__(self, cfg: WeightSyncConfig):
        self.cfg = cfg
        self.backend = cfg.type
        self.epoch = 0  # 0: no group built yet
        self.sender_id = uuid.uuid4().hex[:8]  # tells this sender's epochs from another's
        self.reports: list[SendReport] = []  # the last 100 sends
        self._group: BroadcastGroup | None = None
        self._members: tuple[tuple[str, str], ...] = ()  # (actor id, incarnation), rank order
        self._workers_per_generator = 1
        self._addr: str | None = None  # rank 0's address (config, else this node's Ray IP)
        # Generators whose last weight-sync call never returned: left out until it does.
        self._stuck: dict[str, Any] = {}

    # ------------------------------------------------------------------ interface
    def connect(self, generators: list, workers_per_generator: int = 1) -> None:
        """Build the first epoch with every generator that answers."""
        if workers_per_generator < 1:
            raise ValueError(f"workers_per_generator must be >= 1, got {workers_per_generator}")
        self._workers_per_generator = workers_per_generator
        gens, report = list(generators), SendReport(version=0)
        failed: dict[int, Any] = {}
        live = self._probe(gens, list(range(len(gens))), failed)
        if live and not self._ensure_group(gens, live, failed, report):
            raise WeightSyncError(f"could not build a weight-sync group with generators "
                                  f"{sorted(live)}: {report.errors}")

    def send(self, generators: list, weights: Mapping[str, Any],
             version: int) -> tuple[CollectivePayload, list]:
        meta, order = broadcast_plan(weights)
        fallback = put_state_dict(weights, version) if self.cfg.restart_fallback else None
        gens, report = list(generators), SendReport(version=version)
        done: dict[int, Any] = {}    # index -> ref of a completed update
        failed: dict[int, Any] = {}  # index -> ref that raises RayActorError or stays pending
        for _ in range(self.cfg.max_attempts):
            todo = [i for i in range(len(gens)) if i not in done and i not in failed]
            live = self._probe(gens, todo, failed) if todo else {}
            if not live:
                break
            report.attempts += 1
            if not self._ensure_group(gens, live, failed, report):
                continue
            payload = self._payload(version, meta, fallback)
            refs = {i: gens[i].update_weights.remote(payload, version) for i in live}
            try:
                self._group.send(weights[k] for k in order)
            except BroadcastError as e:
                report.errors.append(str(e))
                self._close_group()  # receivers still blocked in this epoch fail now
                self._absorb(gens, self._settle(refs, self._settle_s()), done, failed, report)
                continue
            done.update(refs)
            break
        left = [i for i in range(len(gens)) if i not in done and i not in failed]
        report.epoch, report.updated, report.failed = self.epoch, sorted(done), sorted(failed)
        self._record(report)
        if left:
            raise WeightSyncError(f"weight version {version} not delivered to generators "
                                  f"{left} in {self.cfg.max_attempts} attempts: "
                                  f"{report.errors}")
        payload = self._payload(version, meta, fallback)
        return payload, [done[i] if i in done else failed[i] for i in range(len(gens))]

    def close(self) -> None:
        self._close_group()

    # ------------------------------------------------------------------ membership
    def _probe(self, gens: list, todo: list[int], failed: dict[int, Any]) -> dict[int, str]:
        """``{index: incarnation}`` of the generators in ``todo`` that answer in time; the
        others go to ``failed`` with the ref that shows why."""
        import ray

        refs = {i: gens[i].incarnation.remote() for i in todo}
        settled = self._settle(refs, self.cfg.probe_timeout_s)
        failed.update(settled.lost)
        if settled.raised:
            raise WeightSyncError(f"generators' incarnation() raised: {settled.raised}")
        live = {}
        for i, inc in settled.ok.items():
            stuck = self._stuck.get(_key(gens[i]))
            if stuck is not None and not ray.wait([stuck], timeout=0)[0]:
                failed[i] = stuck  # its last weight-sync call is still running
                continue
            self._stuck.pop(_key(gens[i]), None)
            live[i] = inc
        return live

    def _ensure_group(self, gens: list, live: dict[int, str], failed: dict[int, Any],
                      report: SendReport) -> bool:
        """The current epoch when its members are exactly ``live``; else a new epoch with
        them. False (the epoch closed, the generators that could not join moved to
        ``failed``) when some did not join."""
        members = tuple((_key(gens[i]), inc) for i, inc in live.items())
        if self._group is not None and not self._group.closed and members == self._members:
            return True
        self._close_group()
        self.epoch += 1
        report.rebuilds += 1
        wpg = self._workers_per_generator
        listener = Listener(self._address(), self.cfg.master_port)
        spec = GroupSpec(backend=self.backend, address=self._address(), port=listener.port,
                         epoch=self.epoch, world_size=1 + len(live) * wpg,
                         timeout_s=self.cfg.timeout_s, sender_id=self.sender_id)
        refs = {i: gens[i].init_weight_sync.remote(spec, 1 + k * wpg)
                for k, i in enumerate(live)}
        group = None
        try:
            group = BroadcastGroup.open(spec, 0, self._device(), listener.detach())
        except BroadcastError as e:
            report.errors.append(str(e))
        finally:
            listener.close()
        settled = self._settle(refs, self._settle_s())
        self._absorb(gens, settled, {}, failed, report)
        if group is None or len(settled.ok) < len(refs):
            if group is not None:
                group.close()
            return False
        self._group = group
        self._members = tuple((_key(gens[i]), settled.ok[i]) for i in live)
        return True

    def _absorb(self, gens: list, settled: _Settled, done: dict[int, Any],
                failed: dict[int, Any], report: SendReport) -> None:
        """Sort the outcome of calls made inside a broken epoch: lost generators are dropped
        (a pending call marks its generator stuck), those whose call raised stay for the
        next attempt, a call that completed anyway counts as done."""
        import ray

        for i, ref in settled.lost.items():
            failed[i] = ref
            if not ray.wait([ref], timeout=0)[0]:
                self._stuck[_key(gens[i])] = ref
        report.errors.extend(f"generator {i}: {msg}" for i, msg in settled.raised.items())
        for i in settled.ok:
            done[i] = settled.refs[i]

    def _settle(self, refs: dict[int, Any], timeout_s: float) -> _Settled:
        """Wait at most ``timeout_s`` for ``refs`` together and sort them."""
        import ray

        out = _Settled(refs=refs)
        if not refs:
            return out
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        ready = set(ready)
        for i, ref in refs.items():
            if ref not in ready:
                out.lost[i] = ref
                continue
            try:
                out.ok[i] = ray.get(ref)
            except ray.exceptions.RayActorError:
                out.lost[i] = ref
            except ray.exceptions.RayTaskError as e:
                out.raised[i] = _cause(e)
        return out

    # ------------------------------------------------------------------ helpers
    def _payload(self, version: int, meta: tuple, fallback: Any) -> CollectivePayload:
        return CollectivePayload(version=version, backend=self.backend, epoch=self.epoch,
                                 meta=meta, fallback=fallback, sender_id=self.sender_id)

    def _settle_s(self) -> float:
        # A receiver of a broken epoch fails at once (gloo: connection closed) or at its own
        # step timeout (NCCL); then its answer crosses Ray.
        return self.cfg.timeout_s + self.cfg.probe_timeout_s

    def _address(self) -> str:
        if self._addr is None:
            import ray

            self._addr = self.cfg.master_address or ray.util.get_node_ip_address()
        return self._addr

    def _device(self) -> Any:
        if self.backend != "nccl":
            return None
        import torch

        return torch.device("cuda", torch.cuda.current_device())

    def _close_group(self) -> None:
        if self._group is not None:
            self._group.close()
        self._group, self._members = None, ()

    def _record(self, report: SendReport) -> None:
        self.reports = self.reports[-99:] + [report]


class CollectiveReceiver(WeightReceiver):
    """A generator's side: which group its workers joined; the workers hold the group."""

    def __init__(self) -> None:
        self.group: str | None = None  # GroupSpec.name

    async def join(self, engine: Any, spec: GroupSpec, rank_offset: int) -> None:
        """Every worker of ``engine`` joins ``spec`` (rank ``rank_offset`` + its local rank);
        returns once the whole group has joined."""
        self.group = None
        await engine.collective_rpc("v05_join_group", args=(spec.to_dict(), rank_offset))
        self.group = spec.name

    def check(self, payload: Any) -> None:
        check_payload(payload, CollectivePayload, "collective")
        if payload.group != self.group and payload.fallback is None:
            raise NotInGroupError(f"weight version {payload.version} was broadcast in group "
                                  f"{payload.group}, this generator joined: "
                                  f"{self.group or 'none'} (restarted or dropped); the sender "
                                  "reconnects it at its next publish")

    async def load(self, engine: Any, payload: Any) -> int:
        self.check(payload)
        if payload.group != self.group:  # not in its group: the object-store copy
            return await ObjectStoreReceiver().load(engine, payload.fallback)
        try:
            counts = await engine.collective_rpc(
                "v05_receive", args=(payload.group, [list(m) for m in payload.meta]))
        except BaseException:
            self.group = None  # the worker left the group on any failure
            raise
        return int(counts[0])


def _key(handle: Any) -> str:
    """A Ray actor's identity across restarts and re-serialised handles."""
    return handle._actor_id.hex()


def _cause(e: Exception) -> str:
    cause = getattr(e, "cause", None) or e
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[-1][:300] if lines else ''}"
