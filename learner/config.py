"""The learner's typed configuration. Pure pydantic: no torch, Ray or DeepSpeed import."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LoraSpec(BaseModel):
    """LoRA adapters on the policy (``learner.lora``; learner/lora.py): only the adapters train,
    the generators get the merged weights, checkpoints hold the adapters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(..., ge=1, description="The adapters' rank r.")
    alpha: float = Field(..., gt=0.0, description=(
        "The adapters' scale numerator: an adapter adds (alpha / rank) * B @ A to its weight "
        "(verl's lora_alpha; 2 * rank is a common choice)."))
    target_modules: tuple[str, ...] | Literal["all-linear"] = Field("all-linear", description=(
        "The linear layers that get an adapter, by module name (e.g. [q_proj, v_proj]), or "
        "all-linear: every linear layer but the LM head. A name the model lacks fails at start."))
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input.")


class LearnerConfig(BaseModel):
    """Optimiser, loss and DeepSpeed settings of the learner (one object for all ranks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(1e-4, gt=0.0, description=(
        "AdamW peak learning rate: reached after lr_warmup_steps, then held (lr_schedule "
        "constant) or decayed (cosine); see learner/schedule.py."))
    lr_warmup_steps: int = Field(0, ge=0, description=(
        "Linear warm-up over this many optimiser updates: update s (0-based) uses "
        "lr * (s + 1) / lr_warmup_steps. 0: no warm-up. Skipped (non-finite) steps do not count."))
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description=(
        "After warm-up, constant: lr; cosine: from lr down to lr_min over lr_decay_steps "
        "updates, then lr_min."))
    lr_decay_steps: int = Field(0, ge=0, description=(
        "Length of the cosine decay in optimiser updates, counted from the end of warm-up "
        "(e.g. run.max_steps - lr_warmup_steps). Must be >= 1 for lr_schedule cosine."))
    lr_min: float = Field(0.0, ge=0.0, description="Floor of the cosine decay (<= lr).")
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
    objective: Literal["ppo", "decoupled"] = Field("ppo", description=(
        "ppo: clip the ratio pi / pi_behaviour (the behaviour log-probs from the generator). "
        "decoupled: clip pi / pi_prox, pi_prox = the policy before this update (the learner "
        "takes one optimiser step per batch, so pi_prox is the learner's own log-probs of the "
        "same forward, detached; no extra forward), and weight each token by the importance "
        "weight pi_prox / pi_behaviour (truncated at tis_cap): the trust region is measured "
        "from the current policy, staleness is corrected by the weight. See learner/loss.py."))
    tis_cap: float | None = Field(None, ge=1.0, description=(
        "Truncated importance sampling: cap on the importance weight to the behaviour policy "
        "(decoupled: pi_prox / pi_behaviour; ppo: the ratio pi / pi_behaviour, its value and "
        "gradient weight), so no stale or mismatched token weighs more than this. None: "
        "untruncated. Typical: 2 to 5."))
    dual_clip: float | None = Field(None, gt=1.0, description=(
        "Dual clip c: for a negative advantage the per-token loss is bounded by c * |A| "
        "(without it, a token whose probability rose since sampling has an unbounded ratio, "
        "up to e^20). None: off. Typical: 3."))
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
        "Most responses in one micro-batch (one forward/backward on one rank). A rank's shard "
        "is split into micro-batches whose gradients accumulate into one optimiser step."))
    micro_batch_tokens: int | None = Field(None, ge=1, description=(
        "Token budget of one micro-batch: prompt + response tokens, packed into one row "
        "(position ids restart per response, no attention across responses, no padding). "
        "Responses fill micro-batches longest first up to this budget (and micro_batch_size); "
        "a longer response trains alone. The learner's activation memory scales with it. "
        "None: no token budget, micro_batch_size alone bounds a micro-batch."))
    pack_row_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field("auto", description=(
        "A micro-batch's samples are packed into rows of at most this many tokens (a longer "
        "sample has a row of its own; shorter rows padded to the longest). Attention runs over "
        "whole rows, masked to each sample, so its cost grows with the square of a row's "
        "length: 16 SmolLM2 samples of 112 tokens train 1.5x as fast in rows of 256 as in one "
        "row on a CPU (bench/results/real_model.json). None: the whole "
        "micro-batch in one row, no padding (what long responses of very different lengths "
        "want: padding them costs memory). auto: 256 on a CPU, one row on CUDA."))
    logprob_chunk_tokens: int = Field(1024, ge=1, description=(
        "The LM head and log-softmax run over this many response tokens at a time (logits "
        "recomputed in backward), so no full-vocabulary logits of a whole micro-batch exist. "
        "Peak extra memory about chunk * vocab * 10 bytes (bf16): 1.5 GiB at 1024 x 152k."))
    seed: int = Field(0, description="torch seed of every rank.")
    dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description=(
            "Training dtype. auto: bf16 on CUDA; on a CPU, bf16 where a short probe measures "
            "it clearly faster than fp32 on this machine (common/cpu_dtype.py), else fp32. "
            "bf16 on a CPU computes under bf16 autocast with float32 weights and optimiser "
            "state; on CUDA, DeepSpeed's bf16 (float32 master weights)."))
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend. auto: gloo on CPU, nccl on CUDA.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward (HF gradient checkpointing).")
    lora: LoraSpec | None = Field(None, description=(
        "Train LoRA adapters instead of every weight (LoraSpec: rank, alpha, target_modules, "
        "dropout). None: full fine-tuning."))
    grad_noise: bool = Field(False, description=(
        "Measure the gradient's noise-to-signal every step (``grad_noise_to_signal`` in "
        "metrics.jsonl): the batch's prompts split in two halves, each half's gradient "
        "scaled to an estimate of the batch's, |g_A - g_B|^2 / |(g_A + g_B) / 2|^2. Costs "
        "one copy of the gradient (and, on several ranks, one all-reduce of it) a step. "
        "fp32 at zero_stage 0 only (ZeRO and the bf16 optimiser keep gradients elsewhere)."))

    @model_validator(mode="after")
    def _check(self) -> "LearnerConfig":
        b1, b2 = self.betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas must each lie in [0, 1), got {self.betas}")
        if self.clip_low == 0.0 and self.clip_high == 0.0:
            raise ValueError("clip_low and clip_high are both 0: every token would be clipped")
        if self.lr_schedule == "cosine" and self.lr_decay_steps < 1:
            raise ValueError("lr_schedule 'cosine' needs lr_decay_steps >= 1")
        if self.grad_noise and self.zero_stage != 0:
            raise ValueError("grad_noise needs zero_stage 0 (ZeRO partitions the gradient)")
        if self.lora is not None and self.zero_stage == 3:
            raise ValueError("optim.lora with zero_stage 3 is not supported yet (the adapters' "
                             "merge gathers the weights it has not been tested with); use "
                             "zero_stage 0, 1 or 2: LoRA's optimiser state is small")
        if self.lr_min > self.lr:
            raise ValueError(f"lr_min {self.lr_min} exceeds lr {self.lr}")
        return self

    def resolved_dtype(self, cuda: bool, model_path: str) -> str:
        """'fp32' or 'bf16' once the device is known (a CPU's auto: its measured choice for
        ``model_path``)."""
        if self.dtype != "auto":
            return self.dtype
        if cuda:
            return "bf16"
        from common.cpu_dtype import cpu_dtype
        return cpu_dtype(model_path)["chosen"]

    def resolved_pack_rows(self, cuda: bool) -> int | None:
        """``pack_row_tokens`` once the device is known."""
        if self.pack_row_tokens != "auto":
            return self.pack_row_tokens
        return None if cuda else 256

    def resolved_backend(self, cuda: bool) -> str:
        if self.backend != "auto":
            if self.backend == "nccl" and not cuda:
                raise ValueError("backend='nccl' needs CUDA; use 'gloo' (or 'auto') on CPU")
            return self.backend
        return "nccl" if cuda else "gloo"
