"""Where a learner step's batch comes from: the sync loop or the async coordinator.

Both hand the trainer ``{"groups": [Group.export()...], "samples": [TrainSample...]}`` and
keep the prompt accounting (admitted, dropped with reasons, in flight).
"""
from __future__ import annotations

import time
from collections import Counter

from actors.types import SamplingConfig
from cluster.rollouts import checked_priors
from cluster.sync import generate_batch


def _sampling(cfg) -> SamplingConfig:
    r = cfg.rollout
    return SamplingConfig(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens)


class SyncSource:
    """Generate B prompts to completion (extra rollouts as each prompt's test asks), wait for
    the slowest, hand them over. Nothing is in flight between steps."""

    def __init__(self, cfg, roles, task, est, pool, sampler, version, accounting=None):
        self.cfg, self.roles, self.task, self.est = cfg, roles, task, est
        self.pool, self.sampler = pool, sampler
        acct = accounting or {}
        self.admitted = acct.get("prompts_admitted", 0)
        self.handed = acct.get("prompts_handed", 0)
        self.drops = Counter(acct.get("drop_reasons", {}))
        self.fallbacks = acct.get("prior_fallbacks", 0)

    def start(self) -> None:
        pass

    def next_batch(self) -> dict:
        t0, pos0 = time.time(), self.sampler.position
        kept, dropped, served = generate_batch(
            self.pool, self.task, self.est, self.sampler, self.cfg.rollout.batch_prompts,
            _sampling(self.cfg), priors=self._priors if self.est.needs_prior else None)
        self.admitted += self.sampler.position - pos0
        self.drops["filtered_all_equal"] += len(dropped)
        self.handed += len(kept)
        self._observe(kept + dropped)
        return {"groups": [g.export() for g in kept],
                "samples": [s for g in kept for s in g.samples()],
                "gen_time_s": time.time() - t0,
                "extra": {"requests_per_generator": served, "prompts_dropped_step": len(dropped)}}

    def _priors(self, problems) -> list:
        import ray

        try:
            ref = self.roles.prior.predict.remote([p.prompt for p in problems])
            return checked_priors(ray.get(ref, timeout=self.cfg.prior.timeout_s), len(problems))
        except Exception:
            self.fallbacks += len(problems)
            return [None] * len(problems)

    def _observe(self, groups) -> None:
        if self.roles.prior is None:
            return
        self.roles.prior.observe.remote(
            [(g.problem.prompt, g.success_rate(self.task.rewards), 0) for g in groups])

    def weights_published(self, version: int, payload) -> None:
        pass

    def data_pos(self) -> int:
        return self.sampler.position

    def accounting(self) -> dict:
        return {"prompts_admitted": self.admitted, "prompts_handed": self.handed,
                "prompts_dropped": sum(self.drops.values()),
                "drop_reasons": dict(self.drops), "prior_fallbacks": self.fallbacks}

    def stop(self) -> dict:
        return {**self.accounting(), "prompts_in_flight_at_end": 0}


class AsyncSource:
    """The coordinator actor runs the whole rollout side; the learner takes the first B
    prompts to finish, whenever they were admitted."""

    def __init__(self, cfg, roles, task, est, pool, sampler, version, accounting=None):
        import ray

        from actors.coordinator import Coordinator
        from cluster.placement import COORDINATOR_CPUS
        from cluster.runtime import pg_strategy

        self.cfg = cfg
        slots = cfg.generators.engine.get("max_num_seqs", 64)
        self.coord = ray.remote(Coordinator).options(
            num_cpus=COORDINATOR_CPUS, max_concurrency=1000,
            scheduling_strategy=pg_strategy(roles.groups["coordinator"], 0)).remote(
            roles.generators, roles.prior, cfg.task, est, cfg.rollout, seed=cfg.run.seed,
            data_pos=sampler.position, version=version, prior_timeout_s=cfg.prior.timeout_s,
            slots_per_generator=slots, accounting=accounting)

    def start(self) -> None:
        import ray

        ray.get(self.coord.start.remote())

    def next_batch(self) -> dict:
        import ray

        return ray.get(self.coord.next_batch.remote(self.cfg.rollout.batch_prompts))

    def weights_published(self, version: int, payload) -> None:
        import ray

        ray.get(self.coord.set_version.remote(version, payload))

    def data_pos(self) -> int:
        import ray

        return ray.get(self.coord.summary.remote())["data_pos"]

    def accounting(self) -> dict:
        import ray

        return ray.get(self.coord.summary.remote())

    def stop(self) -> dict:
        import ray

        return ray.get(self.coord.stop.remote())
