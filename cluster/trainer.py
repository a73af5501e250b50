"""The driver of a run: the step loop over the role handles, checkpoints, outputs.

    for step in steps:
        groups  = generate_batch(generators, ...)     # sync: the batch waits for its slowest
        metrics = learner.train_step(samples(groups))
        publish(learner.get_weights() -> generators)  # version v+1, loaded in place
        evaluate every N; write metrics.jsonl; checkpoint every M
"""
from __future__ import annotations

import time
from pathlib import Path

from cluster.config import Config, dump_config
from cluster.metrics import RunWriter
from cluster.rollouts import GeneratorPool, PromptSampler
from cluster.sync import batch_metrics, evaluate, generate_batch
from estimator.registry import ESTIMATORS


class Trainer:
    def __init__(self, cfg: Config, roles, task):
        from actors.weight_sync import make_sender

        self.cfg, self.roles, self.task = cfg, roles, task
        self.est = ESTIMATORS[cfg.algo.name](cfg.algo.estimator_config(task.rewards))
        self.pool = GeneratorPool(roles.generators)
        self.sender = make_sender(cfg.cluster.weight_sync)
        self.ckpt_dir = cfg.run_dir / "checkpoints"
        self.version = 0
        self.step = 0
        self.totals = {"prompts_admitted": 0, "prompts_trained": 0, "prompts_dropped": 0,
                       "rollouts": 0, "tokens_generated": 0, "nan_skipped_steps": 0}
        self.recorder = None
        if cfg.run.record_rollouts:
            from learner.replay import RolloutRecorder

            self.recorder = RolloutRecorder(cfg.run_dir / "rollouts.msgpack")

    # -- weights -------------------------------------------------------------------------
    def publish(self) -> float:
        """Learner rank 0's weights -> every generator, in place; returns seconds."""
        import ray

        t = time.time()
        payload = self.sender.publish(self.roles.learner.get_weights(), self.version)
        ray.get([g.update_weights.remote(payload, self.version) for g in self.roles.generators])
        self.sender.release(payload)
        return time.time() - t

    def save(self, data_pos: int) -> None:
        state = {"step": self.step, "data_pos": data_pos, "policy_version": self.version,
                 "totals": self.totals}
        self.roles.learner.save_checkpoint(str(self.ckpt_dir), state)

    def restore(self) -> int:
        if not (self.ckpt_dir / "latest").exists():
            raise FileNotFoundError(f"run.resume=true but no checkpoint under {self.ckpt_dir}")
        state = self.roles.learner.load_checkpoint(str(self.ckpt_dir))
        self.step, self.version = state["step"], state["policy_version"]
        self.totals.update(state.get("totals", {}))
        self.publish()
        return state["data_pos"]

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        writer = RunWriter(cfg.run_dir, dump_config(cfg), resume=cfg.run.resume,
                           tensorboard=cfg.logging.tensorboard, progress=cfg.run.progress)
        data_pos = self.restore() if cfg.run.resume else 0
        sampler = PromptSampler(self.task.train(), cfg.run.seed, data_pos)
        heldout = self.task.heldout()[: cfg.run.eval_prompts]
        t_start = time.time()
        while self.step < cfg.run.max_steps:
            self.step += 1
            m = self.one_step(sampler)
            if cfg.run.eval_every and (self.step % cfg.run.eval_every == 0 or self.step == 1):
                m.update(evaluate(self.pool, self.task, heldout, cfg.rollout.max_tokens))
            writer.step(m)
            if cfg.run.checkpoint_every and self.step % cfg.run.checkpoint_every == 0:
                self.save(sampler.position)
        self.save(sampler.position)
        if self.recorder:
            self.recorder.close()
        wall = time.time() - t_start
        summary = {**self.totals, "steps": self.step, "policy_version": self.version,
                   "wall_time_s": wall, "prompts_in_flight_at_end": 0,
                   "prompts_per_s": self.totals["prompts_trained"] / wall,
                   "rollouts_per_s": self.totals["rollouts"] / wall}
        writer.summary(summary)
        return summary

    def one_step(self, sampler: PromptSampler) -> dict:
        cfg = self.cfg
        from actors.types import SamplingConfig

        sampling = SamplingConfig(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                  max_tokens=cfg.rollout.max_tokens)
        t0 = time.time()
        busy0 = self._busy()
        pos0 = sampler.position
        kept, dropped, served = generate_batch(self.pool, self.task, self.est, sampler,
                                               cfg.rollout.batch_prompts, sampling)
        t1 = time.time()
        busy1 = self._busy()
        samples = [s for g in kept for s in g.samples()]
        lm = self.roles.learner.train_step(samples) if samples else {"skipped": True,
                                                                     "skip_reason": "no samples"}
        t2 = time.time()
        if not lm.get("skipped"):
            self.version += 1
        self.totals["nan_skipped_steps"] += int(bool(lm.get("skipped")) and bool(samples))
        sync_s = self.publish()
        t3 = time.time()
        self._record(kept)
        bm = batch_metrics(kept, dropped)
        self._count(bm, sampler.position - pos0)
        n_gen = len(self.roles.generators)
        return {"step": self.step, "policy_version": self.version, **bm,
                **{k: lm.get(k) for k in ("loss", "grad_norm", "entropy", "clip_fraction",
                                          "approx_kl", "skipped", "skip_reason")},
                "step_time_s": t3 - t0, "gen_time_s": t1 - t0, "train_time_s": t2 - t1,
                "sync_time_s": sync_s,
                "generator_busy_fraction": (busy1 - busy0) / (n_gen * (t3 - t0)),
                "requests_per_generator": served}

    def _busy(self) -> float:
        return sum(s["busy_s"] for s in self.pool.call_all("stats"))

    def _count(self, bm: dict, admitted: int) -> None:
        t = self.totals
        t["prompts_admitted"] += admitted
        t["prompts_trained"] += bm["prompts_trained"]
        t["prompts_dropped"] += bm["prompts_dropped"]
        t["rollouts"] += bm["rollouts"]
        t["tokens_generated"] += bm["tokens_generated"]

    def _record(self, kept) -> None:
        if self.recorder is None:
            return
        for g in kept:
            self.recorder.append(g.problem.id, g.problem.prompt, g.rewards, g.state.baseline,
                                 self.version, g.samples())
