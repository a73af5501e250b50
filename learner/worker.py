"""One learner rank: a Hugging Face causal LM inside a DeepSpeed engine.

A plain class; ``learner/ranks.py`` wraps it with ``ray.remote``. Heavy imports (torch,
deepspeed, transformers) happen inside methods so that importing this module is cheap.

Loss normalisation across ranks (why R ranks give the same update as 1 rank):
every rank divides its summed per-token (or per-response) losses by the GLOBAL token (or
response) count, all-reduced before the first forward, and DeepSpeed averages gradients over
ranks, so each rank backpropagates ``world_size * local_sum / global_count``; the average of
those gradients is exactly the gradient of the global-batch loss whatever the shard sizes.

Micro-batches: a rank packs its shard into micro-batches by token budget (``learner/batch``),
and all ranks run the same number of them (the shortest pad with filler micro-batches that
weigh nothing), so their collectives stay in lockstep under every ZeRO stage. DeepSpeed wraps
a ``LogprobModel`` (``learner/logprobs``): its forward returns response-token log-probs
computed chunk by chunk, never the batch's full-vocabulary logits.

What goes in and out of the rank besides training (its weights to the generators, checkpoints,
an HF copy) is done by the rank's ``StateIO`` (``learner/state_io``); the public methods for
it below hand each call to it. The rank owns its training state: the update count ``step``
and the count of consecutive skipped steps ``consecutive_nan`` are written by
``_apply_update`` and, from a checkpoint, by ``load_checkpoint``, nowhere else.
"""
from __future__ import annotations

import math
import os
import time

from common.types import TrainSample
from common.records import PER_TOKEN, StepResult
from learner.config import LearnerConfig
from learner.state_io import StateIO

# The all-reduced metric sums of ``train_step``, in order: the loss, each per-token metric
# (``PER_TOKEN``, weighted by the micro-batch's tokens), the token count.
_SUMS = ("loss", *PER_TOKEN, "n_tokens")


class LearnerWorker:
    def __init__(self, model_path: str, cfg: LearnerConfig | dict, rank: int, world_size: int,
                 master_port: int, num_threads: int = 1, master_addr: str = "127.0.0.1",
                 log_path: str | None = None):
        from common.logs import to_file

        to_file(log_path)  # DeepSpeed's and torch's chatter: the rank's log file
        import torch

        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be an int >= 1, got {num_threads!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.cfg = cfg if isinstance(cfg, LearnerConfig) else LearnerConfig(**cfg)
        self.rank, self.world_size = rank, world_size
        self.model_path = str(model_path)
        torch.set_num_threads(num_threads)
        torch.manual_seed(self.cfg.seed)
        self.cuda = torch.cuda.is_available()
        self.device = self._pick_device()
        self.dtype_name = self.cfg.resolved_dtype(self.cuda, self.model_path)
        # bf16 on a CPU: float32 weights and optimiser state, matmuls under bf16 autocast
        # (DeepSpeed's bf16 optimiser is a GPU path); on CUDA, DeepSpeed's bf16.
        self.autocast = self.dtype_name == "bf16" and not self.cuda
        self.pack_rows = self.cfg.resolved_pack_rows(self.cuda)
        self.dtype = torch.bfloat16 if self.dtype_name == "bf16" and self.cuda else torch.float32
        self._init_dist(master_addr, master_port)
        self.engine = self._init_engine(self._load_model())
        if self.cfg.grad_noise and hasattr(self.engine.optimizer, "overflow"):
            raise ValueError("optim.grad_noise needs fp32 at zero_stage 0: this optimiser "
                             f"({type(self.engine.optimizer).__name__}) keeps its gradients "
                             "outside p.grad")
        self.model = self.engine.module.policy  # the HF model: its state dict is the policy's
        self.state_io = StateIO(self.engine, self.model, rank, self.model_path,
                                zero3=self.cfg.zero_stage == 3, lora=self.cfg.lora is not None)
        self.ref_model = self._load_ref() if self.cfg.kl_coef > 0 else None
        self.step = 0  # optimiser updates applied
        self.consecutive_nan = 0  # steps skipped in a row (non-finite loss or gradient)

    # ---------------------------------------------------------------- setup
    def _pick_device(self):
        import torch

        if not self.cuda:
            return torch.device("cpu")
        # Under Ray each rank sees only its own GPU (index 0); without Ray, one GPU per rank.
        idx = self.rank % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)

    def _init_dist(self, addr: str, port: int) -> None:
        from datetime import timedelta

        import deepspeed

        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.device.index or 0))
        deepspeed.init_distributed(dist_backend=self.cfg.resolved_backend(self.cuda),
                                   auto_mpi_discovery=False, init_method=f"tcp://{addr}:{port}",
                                   rank=self.rank, world_size=self.world_size,
                                   timeout=timedelta(minutes=10), verbose=False)

    def _load_model(self, trainable: bool = True):
        """The HF model inside a ``LogprobModel``. Trainable: in train mode, since
        from_pretrained returns eval mode, where HF skips gradient checkpointing silently."""
        from transformers import AutoModelForCausalLM

        from learner.logprobs import LogprobModel, check_packing_support

        check_packing_support()
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype)
        if trainable and self.cfg.lora is not None:
            from learner.lora import inject

            model = inject(model, self.cfg.lora)
        if trainable and self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        model.train(trainable)
        return LogprobModel(model, self.cfg.temperature, self.cfg.logprob_chunk_tokens)

    def _load_ref(self):
        model = self._load_model(trainable=False).to(self.device)
        model.requires_grad_(False)
        return model

    def ds_config(self) -> dict:
        cfg = self.cfg
        return {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            # We set the accumulation boundary ourselves (variable micro-batch counts per step).
            "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            # check_grad_overflow makes the bf16 optimiser skip steps with a non-finite norm.
            "bf16": {"enabled": self.dtype_name == "bf16" and not self.autocast,
                     "check_grad_overflow": True},
            "zero_allow_untested_optimizer": True,  # a torch AdamW: no compiled op needed
            "steps_per_print": 2 ** 31,
            "wall_clock_breakdown": False,
        }

    def _init_engine(self, model):
        import deepspeed
        import torch

        from learner.schedule import lr_at

        # The schedule sets the lr before every update (``_set_lr``); start at update 0's. Only
        # what trains has optimiser state (under LoRA: the adapters).
        self._opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr_at(self.cfg, 0),
                                      betas=self.cfg.betas, eps=self.cfg.eps,
                                      weight_decay=self.cfg.weight_decay)
        engine, *_ = deepspeed.initialize(model=model, optimizer=self._opt,
                                          config=self.ds_config())
        return engine

    def _set_lr(self) -> float:
        """Put the schedule's lr for the next update (number ``self.step``) into every param
        group the optimiser steps: torch's AdamW and DeepSpeed's wrapper (its ZeRO/bf16
        optimisers step the torch one; a checkpoint load may replace the group dicts)."""
        from learner.schedule import lr_at

        lr = lr_at(self.cfg, self.step)
        for opt in {id(o): o for o in (self._opt, self.engine.optimizer)}.values():
            for group in getattr(opt, "param_groups", []):
                group["lr"] = lr
        return lr

    # ---------------------------------------------------------------- training
    def ready(self) -> int:
        return self.rank

    def model_fingerprint(self) -> tuple[str, str]:
        """(this node's address, the model files' fingerprint: ``common.model_files``)."""
        import ray

        from common.model_files import fingerprint

        return ray.util.get_node_ip_address(), fingerprint(self.model_path)

    def train_step(self, samples: list[TrainSample]) -> StepResult:
        """One optimiser step on this rank's shard (every rank must be called; shards may
        differ in length, see ``_micro_batches``)."""
        import torch

        t0 = time.perf_counter()
        if len(samples) == 0:
            raise ValueError("train_step got an empty shard; shard_samples gives every rank "
                             "at least one sample")
        counts = torch.tensor([sum(len(s.token_ids) for s in samples),
                               sum(1 for s in samples if s.token_ids)], dtype=torch.float64)
        counts = self._all_reduce(counts)  # (global tokens, global non-empty responses)
        n_tok, n_seq = int(counts[0]), int(counts[1])
        if n_tok == 0:
            return self._metrics(None, math.nan, "no response tokens in the global batch", t0,
                                 n_seq)
        normalizer = n_tok if self.cfg.aggregation == "token_mean" else n_seq
        micro, n_first, share_a = self._micro_batches(samples, normalizer)
        lr = self._set_lr()
        sums, loss_bad, first = self._forward_backward(micro, normalizer, n_first)
        sums = self._all_reduce(sums)  # one collective for every metric
        noise = (self._grad_noise(first, share_a) if first is not None and not loss_bad
                 else math.nan)
        skip_reason, grad_norm = self._apply_update(loss_bad)
        return self._metrics(sums, grad_norm, skip_reason, t0, n_seq, lr, len(micro), noise)

    def _micro_batches(self, samples: list[TrainSample], normalizer: int):
        """This rank's micro-batches by token budget, padded with fillers to the largest
        count of any rank (a collective). Returns (micro-batches, how many of them hold the
        first prompt half, that half's global share of the normalizer): both None but with
        ``grad_noise`` (``learner.grad_noise.plan_halves``)."""
        import torch
        import torch.distributed as dist

        from learner.batch import filler_sample, plan_micro_batches
        from learner.grad_noise import plan_halves

        def plan(xs):
            return plan_micro_batches(xs, self.cfg.micro_batch_tokens, self.cfg.micro_batch_size)

        n_first = share_a = None
        if self.cfg.grad_noise:
            micro, n_first, size_a = plan_halves(samples, plan, self.cfg.aggregation)
            share_a = float(self._all_reduce(torch.tensor([float(size_a)]))[0]) / normalizer
        else:
            micro = plan(samples)
        want = len(micro) + (n_first is not None)  # and a filler last: see plan_halves
        n = self._all_reduce(torch.tensor([want], dtype=torch.float64), dist.ReduceOp.MAX)
        return micro + [[filler_sample(samples[0])]] * (int(n[0]) - len(micro)), n_first, share_a

    def _flat_grad(self):
        from learner.grad_noise import flat_grad

        return flat_grad(self.engine.module.parameters())

    def _grad_noise(self, first, share_a: float) -> float:
        """``learner.grad_noise.noise_to_signal`` of this step. ``first``: this rank's gradient
        after the first half (local, unreduced); the whole one is in p.grad after the
        boundary (each rank's loss was scaled by the world size and DeepSpeed averaged: the
        sum over ranks)."""
        from learner.grad_noise import noise_to_signal

        if not 0.0 < share_a < 1.0:
            return math.nan
        g_a = self._all_reduce(first) / self.world_size if self.world_size > 1 else first
        return noise_to_signal(g_a, self._flat_grad(), share_a)

    def _forward_backward(self, micro: list[list[TrainSample]], normalizer: int,
                          n_first: int | None = None):
        """Forward/backward every micro-batch. Returns (unreduced metric sums (len(_SUMS),),
        whether any rank saw a non-finite loss, this rank's gradient after the first
        ``n_first`` micro-batches (None: n_first None))."""
        import torch

        from learner.batch import pack
        from learner.packed_loss import packed_loss

        sums = torch.zeros(len(_SUMS), dtype=torch.float64)
        bad = False
        first = self._flat_grad() if n_first == 0 else None
        for i, mb in enumerate(micro):
            last = i == len(micro) - 1
            # Reduce gradients only after the last micro-batch (they accumulate locally before).
            self.engine.set_gradient_accumulation_boundary(last)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                out = packed_loss(self.engine, pack(mb, self.pack_rows).to(self.device), self.cfg, normalizer,
                                  self.ref_model)
            # DeepSpeed averages gradients over ranks; undo that so they sum (see module doc).
            loss = out.loss * self.world_size
            bad = bad or not bool(torch.isfinite(out.loss.detach()))
            if last:
                bad = bool(self._all_reduce(torch.tensor([float(bad)]))[0] > 0)
                if bad:
                    # A NaN loss can still leave finite gradients (NaN compares false in the
                    # clamp/min backward, so the token just gets 0). Poison the gradient on
                    # every rank instead: each optimiser path then skips and clears its own
                    # accumulated state (DeepSpeed's overflow check, or ours at stage 0).
                    loss = loss * float("nan")
            self.engine.backward(loss)
            n = out.n_tokens.detach()
            sums += torch.stack([out.loss.detach()] + [getattr(out, k) * n for k in PER_TOKEN]
                                + [n]).double().cpu()  # one device-to-host copy
            if n_first is not None and i + 1 == n_first:
                first = self._flat_grad()  # before the boundary: this rank's alone
        return sums, bad, first

    def _apply_update(self, loss_bad: bool) -> tuple[str, float]:
        """Step the optimiser unless the gradient is non-finite (it is whenever the loss was,
        see ``_forward_backward``). Returns (skip_reason or "", pre-clip global grad norm)."""
        import torch

        eng = self.engine
        if hasattr(eng.optimizer, "overflow"):
            # ZeRO / bf16 optimisers check the global norm themselves and skip on inf/NaN.
            eng.step()
            norm = eng.get_global_grad_norm()
            norm = math.nan if norm is None else float(norm)
            ok = eng.was_step_applied()
        else:
            # Plain torch AdamW at stage 0: the boundary backward already all-reduced p.grad.
            grads = [p.grad for p in eng.module.parameters() if p.grad is not None]
            norm = float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))) if grads else 0.0
            ok = math.isfinite(norm)
            if ok:
                eng.step()  # clips to grad_clip, then AdamW
            else:
                eng.zero_grad()
        if ok and loss_bad:
            raise AssertionError("learner: a step with a non-finite loss was applied")
        if ok:
            self.step += 1
            self.consecutive_nan = 0
            return "", norm
        reason = "non-finite loss" if loss_bad else "non-finite gradient norm"
        self.consecutive_nan += 1
        if self.consecutive_nan > self.cfg.max_consecutive_nan:
            n, self.consecutive_nan = self.consecutive_nan, 0
            raise RuntimeError(
                f"learner: {n} consecutive steps skipped (last: {reason}), more than "
                f"max_consecutive_nan={self.cfg.max_consecutive_nan}; check the advantages and "
                "behaviour log-probs for NaN/inf, or lower the learning rate")
        return reason, norm

    def _metrics(self, sums, grad_norm: float, skip_reason: str, t0: float, n_seq: int,
                 lr: float = math.nan, n_micro: int = 0, noise: float = math.nan) -> StepResult:
        s = dict(zip(_SUMS, [float(x) for x in sums])) if sums is not None else {}
        n = s.get("n_tokens", 0.0)
        return StepResult(
            loss=s.get("loss", math.nan), grad_norm=grad_norm, grad_noise_to_signal=noise,
            **{k: s[k] / n if n else math.nan for k in PER_TOKEN},
            n_tokens=int(n), n_samples=n_seq, skipped=bool(skip_reason), skip_reason=skip_reason,
            updates_applied=self.step, consecutive_skips=self.consecutive_nan,
            learner_step_s=time.perf_counter() - t0, lr=lr, micro_batches=n_micro)

    def _all_reduce(self, t, op=None):
        import torch.distributed as dist

        dev = t.to(self.device) if self.cuda else t  # NCCL reduces only CUDA tensors
        dist.all_reduce(dev, op=dist.ReduceOp.SUM if op is None else op)
        return dev.cpu()

    # ---------------------------------------------------------------- weights and checkpoints
    # Called remotely by learner/ranks.py; ``StateIO`` (learner/state_io.py) says what each does.
    def get_weights(self, all_ranks: bool = False) -> dict:
        """Full fp32 state dict {HF parameter name: np.ndarray}; {} on ranks > 0 unless all_ranks.
        Every rank must be called (ZeRO-3 gathers)."""
        return self.state_io.get_weights(all_ranks)

    def connect_weight_sync(self, transport: str | dict, generators: list) -> None:
        """Rank 0 becomes the weight sender to ``generators``; other ranks do nothing."""
        self.state_io.connect_weight_sync(transport, generators)

    def publish_weights(self, generators: list, version: int) -> tuple:
        """Send this learner's weights to ``generators`` as ``version``; every rank must be
        called (ZeRO-3 gathers). Rank 0: (payload, refs of the generators' updates); others:
        (None, [])."""
        return self.state_io.publish_weights(generators, version)

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> str:
        """DeepSpeed checkpoint ``<ckpt_dir>/step<step>`` with ``client_state`` and this rank's
        update count; all ranks call. Returns its path."""
        return self.state_io.save_checkpoint(ckpt_dir, client_state, self.step)

    def load_checkpoint(self, ckpt_dir: str, tag: str | None = None) -> dict:
        """Restore the latest (or ``tag``) checkpoint; returns the saved client_state. The
        update count comes back with it (the lr schedule resumes there; a checkpoint without
        one keeps the current count) and the run of skipped steps starts again at 0."""
        restored = self.state_io.load_checkpoint(ckpt_dir, tag)
        if restored.step is not None:
            self.step = restored.step
        self.consecutive_nan = 0
        return restored.client_state

    def save_hf(self, out_dir: str) -> str:
        """Write the current weights as an HF checkpoint (rank 0), with the tokenizer files."""
        return self.state_io.save_hf(out_dir)

    def close(self) -> None:
        import torch.distributed as dist

        self.state_io.close()
        if dist.is_initialized():
            dist.destroy_process_group()

