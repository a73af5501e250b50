"""The learner's typed configuration. Pure pydantic: no torch, Ray or DeepSpeed import."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LearnerConfig(BaseModel):
    """Optimiser, loss and DeepSpeed settings of the learner (one object for all ranks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(1e-4, gt=0.0, description="AdamW learning rate (constant, no schedule).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1).")
    eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, ge=0.0, description="Clip the global gradient norm to this; 0 = off.")
    zero_stage: Literal[0, 1, 2, 3] = Field(
        0, description="DeepSpeed ZeRO stage. 0 = plain data parallel; 3 shards the weights too.")
    clip_low: float = Field(0.2, ge=0.0, lt=1.0,
                            description="PPO clip below: the ratio is clipped at 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0.0,
                             description="PPO clip above (DAPO's decoupled clip): ratio clipped at 1 + clip_high.")
    kl_coef: float = Field(0.0, ge=0.0, description=(
        "Weight of the k3 KL to the frozen reference policy; 0 turns it off and no reference "
        "model is loaded."))
    aggregation: Literal["token_mean", "seq_mean"] = Field("token_mean", description=(
        "token_mean: sum over all response tokens of the global batch / their count. seq_mean: "
        "mean over each response's tokens, then mean over responses."))
    temperature: float = Field(1.0, gt=0.0, description=(
        "Logits are divided by this before log-softmax. It must match the distribution the "
        "behaviour log-probs were computed under (vLLM's default raw_logprobs: 1.0)."))
    max_consecutive_nan: int = Field(3, ge=0, description=(
        "Steps with a non-finite loss or gradient norm are skipped; more than this many in a "
        "row raise RuntimeError."))
    micro_batch_size: int = Field(8, ge=1, description=(
        "Responses per forward/backward on one rank; a rank's shard is split into micro-batches "
        "whose gradients accumulate into one optimiser step."))
    seed: int = Field(0, description="torch seed of every rank.")
    dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Training dtype. auto: fp32 on CPU, bf16 on CUDA.")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend. auto: gloo on CPU, nccl on CUDA.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward (HF gradient checkpointing).")

    @model_validator(mode="after")
    def _check(self) -> "LearnerConfig":
        b1, b2 = self.betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas must each lie in [0, 1), got {self.betas}")
        if self.clip_low == 0.0 and self.clip_high == 0.0:
            raise ValueError("clip_low and clip_high are both 0: every token would be clipped")
        return self

    def resolved_dtype(self, cuda: bool) -> str:
        """'fp32' or 'bf16' once the device is known."""
        if self.dtype != "auto":
            return self.dtype
        return "bf16" if cuda else "fp32"

    def resolved_backend(self, cuda: bool) -> str:
        if self.backend != "auto":
            if self.backend == "nccl" and not cuda:
                raise ValueError("backend='nccl' needs CUDA; use 'gloo' (or 'auto') on CPU")
            return self.backend
        return "nccl" if cuda else "gloo"
