"""The driver of a run: the step loop over the role handles, checkpoints, outputs.

    for step in steps:
        batch   = source.next_batch()        # sync: generate B prompts, wait for the slowest
                                             # async: the first B prompts the coordinator finished
        metrics = learner.train_step(batch.samples)
        publish(learner weights -> generators)   # version v+1, loaded in place
        evaluate every N; write metrics.jsonl; checkpoint every M
"""
from __future__ import annotations

import json
import time

import numpy as np

from actors.telemetry import Telemetry
from cluster.config import Config, dump_config
from cluster.metrics import RunWriter
from cluster.rollouts import GeneratorPool, PromptSampler
from cluster.sources import AsyncSource, SyncSource
from cluster.sync import evaluate
from estimator.registry import ESTIMATORS


class Trainer:
    def __init__(self, cfg: Config, roles, task):
        self.cfg, self.roles, self.task = cfg, roles, task
        self.est = ESTIMATORS[cfg.algo.name](cfg.algo.estimator_config(task.rewards))
        self.pool = GeneratorPool(roles.generators)
        # The sender lives on learner rank 0, beside the weights (NCCL needs its GPU).
        roles.learner.connect_weight_sync(cfg.cluster.weight_sync, roles.generators)
        self.ckpt_dir = cfg.run_dir / "checkpoints"
        self.version = self.step = 0
        self.totals = {"prompts_trained": 0, "prompts_skipped_nan": 0, "rollouts": 0,
                       "tokens_generated": 0, "nan_skipped_steps": 0,
                       "generator_update_failures": 0, "learner_wait_s": 0.0}
        self.recorder = None
        if cfg.run.record_rollouts:
            from learner.replay import RolloutRecorder

            self.recorder = RolloutRecorder(cfg.run_dir / "rollouts.msgpack")

    # -- weights -------------------------------------------------------------------------
    def publish(self) -> float:
        """Learner rank 0's weights -> every generator, in place; returns seconds."""
        import ray

        t = time.time()
        payload, refs = self.roles.learner.publish_weights(self.roles.generators, self.version)
        for ref in refs:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                # A generator died mid-update; when Ray restarts it the coordinator gives it
                # the newest weights before sending it work again.
                self.totals["generator_update_failures"] += 1
        self.source.weights_published(self.version, payload)
        return time.time() - t

    def save(self) -> None:
        state = {"step": self.step, "data_pos": self.source.data_pos(),
                 "policy_version": self.version, "totals": self.totals,
                 "accounting": self.source.accounting()}
        self.roles.learner.save_checkpoint(str(self.ckpt_dir), state)

    def restore(self) -> dict:
        if not (self.ckpt_dir / "latest").exists():
            raise FileNotFoundError(f"run.resume=true but no checkpoint under {self.ckpt_dir}")
        state = self.roles.learner.load_checkpoint(str(self.ckpt_dir))
        self.step, self.version = state["step"], state["policy_version"]
        self.totals.update(state.get("totals", {}))
        return state

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        writer = RunWriter(cfg.run_dir, dump_config(cfg), resume=cfg.run.resume,
                           tensorboard=cfg.logging.tensorboard, progress=cfg.run.progress)
        import ray

        # Versions continue from what the generators hold (actors may outlive one run).
        self.version = served = max(ray.get([g.version.remote() for g in self.roles.generators]))
        state = self.restore() if cfg.run.resume else {"data_pos": 0}
        if cfg.run.resume and served >= self.version:
            self.version = served + 1  # generators outlived the run: load over theirs
        sampler = PromptSampler(self.task.train(), cfg.run.seed, state["data_pos"])
        src_cls = AsyncSource if cfg.mode == "async" else SyncSource
        self.source = src_cls(cfg, self.roles, self.task, self.est, self.pool, sampler,
                              self.version, state.get("accounting"))
        if cfg.run.resume:
            self.publish()  # generators start from the checkpoint's weights
        heldout = self.task.heldout()[: cfg.run.eval_prompts]
        initial = evaluate(self.pool, self.task, heldout, cfg.rollout.max_tokens) \
            if cfg.run.eval_every and not cfg.run.resume else {}
        prompts_log = (cfg.run_dir / "prompts.jsonl").open("a" if cfg.run.resume else "w")
        self.telemetry = ray.remote(Telemetry).options(num_cpus=0).remote(cfg.run.name)
        t_start, busy_start = time.time(), self._busy()
        try:
            self.source.start()
            while self.step < cfg.run.max_steps:
                self.step += 1
                m = self.one_step(prompts_log, t_start)
                if cfg.run.eval_every and self.step % cfg.run.eval_every == 0:
                    m.update(evaluate(self.pool, self.task, heldout, cfg.rollout.max_tokens))
                writer.step(m)
                ks = [g["k"] for g in self._last_groups]
                self.telemetry.report.remote(m, ks, sum(max(0, k - self.est.cfg.k_init) for k in ks))
                if cfg.run.checkpoint_every and self.step % cfg.run.checkpoint_every == 0:
                    self.save()
            acct = self.source.stop()
            self.save()
        finally:
            ray.kill(self.telemetry)
            prompts_log.close()
            if self.recorder:
                self.recorder.close()
        wall = time.time() - t_start
        busy = busy_between(busy_start, self._busy())
        # Prompts of a step the learner skipped (NaN) count as dropped, with their reason.
        acct["prompts_dropped"] += self.totals["prompts_skipped_nan"]
        acct.setdefault("drop_reasons", {})["learner_nan_skip"] = self.totals["prompts_skipped_nan"]
        summary = {**acct, **self.totals, "steps": self.step, "policy_version": self.version,
                   "mode": cfg.mode, "algo": cfg.algo.name, "wall_time_s": wall,
                   "prompts_per_s": self.totals["prompts_trained"] / wall,
                   "rollouts_per_s": self.totals["rollouts"] / wall,
                   "generator_busy_fraction": busy / (len(self.roles.generators) * wall),
                   "learner_idle_fraction": self.totals["learner_wait_s"] / wall,
                   "t_start": t_start,
                   "eval_accuracy_initial": initial.get("eval_accuracy")}
        writer.summary(summary)
        return summary

    def one_step(self, prompts_log, t_start: float) -> dict:
        busy0, t0 = self._busy(), time.time()
        batch = self.source.next_batch()
        t1 = time.time()
        self.totals["learner_wait_s"] += t1 - t0
        samples = batch["samples"]
        staleness = np.array([self.version - s.version for s in samples] or [0])
        lm = self.roles.learner.train_step(samples)
        t2 = time.time()
        skipped = bool(lm.get("skipped"))
        self.totals["nan_skipped_steps"] += skipped
        if not skipped:
            self.version += 1
        sync_s = self.publish() if not skipped else 0.0
        t3 = time.time()
        groups = self._last_groups = batch["groups"]
        self._log_prompts(prompts_log, groups, t1)
        self._record(batch)
        gm = group_metrics(groups)
        self.totals["prompts_skipped_nan" if skipped else "prompts_trained"] += len(groups)
        self.totals["rollouts"] += gm["rollouts"]
        self.totals["tokens_generated"] += gm["tokens_generated"]
        wall = t3 - t_start
        n_gen = len(self.roles.generators)
        return {"step": self.step, "policy_version": self.version, **gm,
                **{k: lm.get(k) for k in ("loss", "grad_norm", "entropy", "clip_fraction",
                                          "approx_kl", "skipped", "skip_reason")},
                "staleness_mean": float(staleness.mean()), "staleness_max": int(staleness.max()),
                "step_time_s": t3 - t0, "gen_time_s": batch.get("gen_time_s", t1 - t0),
                "learner_wait_s": t1 - t0, "train_time_s": t2 - t1, "sync_time_s": sync_s,
                "learner_idle_fraction": (t1 - t0) / (t3 - t0),
                "t_train_start": t1, "t_train_end": t2, "t_step_end": t3,
                # Stats are read just after t3, so the ratio can overshoot by a hair: clamp.
                "generator_busy_fraction": min(1.0, busy_between(busy0, self._busy())
                                               / (n_gen * (t3 - t0))),
                "prompts_per_s": self.totals["prompts_trained"] / wall,
                "rollouts_per_s": self.totals["rollouts"] / wall,
                "tokens_per_s": self.totals["tokens_generated"] / wall,
                **batch.get("extra", {})}

    def _busy(self) -> list:
        """Each generator's cumulative busy seconds (None while it is dead or restarting)."""
        import ray

        out = []
        for ref in [g.stats.remote() for g in self.roles.generators]:
            try:
                out.append(ray.get(ref, timeout=60)["busy_s"])
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                out.append(None)
        return out


    def _log_prompts(self, f, groups: list[dict], t_trained: float) -> None:
        for g in groups:
            f.write(json.dumps({**g, "step": self.step, "t_trained": t_trained}) + "\n")
        f.flush()

    def _record(self, batch: dict) -> None:
        if self.recorder is None:
            return
        samples = iter(batch["samples"])
        for g in batch["groups"]:
            group_samples = [next(samples) for _ in range(g["k"])]
            self.recorder.append(g["prompt_id"], g["prompt"], g["rewards"],
                                 g["baseline"], self.version, group_samples)


def group_metrics(groups: list[dict]) -> dict:
    """Per-step metrics of the prompt groups a learner step trained on."""
    if not groups:
        return {"reward_mean": float("nan"), "rollouts": 0, "tokens_generated": 0,
                "k_mean": float("nan"), "k_hist": [], "prior_accept_rate": None,
                "unparsed_fraction": 0.0}
    ks = np.array([g["k"] for g in groups])
    accepted = [g["prior_accepted"] for g in groups if g["prior_accepted"] is not None]
    rollouts = int(ks.sum())
    return {"reward_mean": float(np.mean([r for g in groups for r in g["rewards"]])),
            "rollouts": rollouts, "tokens_generated": int(sum(g["tokens"] for g in groups)),
            "k_mean": float(ks.mean()), "k_hist": np.bincount(ks).tolist(),
            "prior_accept_rate": float(np.mean(accepted)) if accepted else None,
            "unparsed_fraction": sum(g["unparsed"] for g in groups) / max(1, rollouts)}


def busy_between(before: list, after: list) -> float:
    """Busy seconds between two samples; a restarted generator counts from its restart."""
    return sum(max(0.0, b - (a if a is not None and a <= b else 0.0))
               for a, b in zip(before, after) if b is not None)
