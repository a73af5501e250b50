"""The learner's memory plan: a per-GPU peak-memory projection from arithmetic and measurements.

    learner_memory(shape, n_params, gpus=8, zero_stage=3, tokens=20480, ...) -> {term: GiB}
    config_memory(cfg, shape, n_params, layer_work_bytes_per_token) -> the same, for a run config

A PROJECTION, not a measurement: every term is a formula (written next to it) whose only
measured inputs are the per-token working memory of one decoder layer (measured on the CPU,
``memory_cpu.layer_step``, halved for bf16) and the log-prob kernel's bytes per chunk element
(checked on the CPU, ``memory_cpu.logprob_step``). Training dtype: bf16 weights with fp32
master weights, fp32 gradient accumulation and fp32 Adam moments (DeepSpeed bf16).
"""
from __future__ import annotations

GIB = 2 ** 30

# Bytes per parameter of the model states (DeepSpeed bf16 mixed precision):
# bf16 weights 2, bf16 gradients 2, fp32 gradient accumulation 4, fp32 master 4, Adam m+v 8.
_W, _G16, _G32, _MASTER, _ADAM = 2, 2, 4, 4, 8


def state_bytes_per_param(zero_stage: int, gpus: int) -> float:
    """Model-state bytes per parameter on one GPU.

    0: nothing sharded (BF16_Optimizer keeps bf16 and fp32 gradients): 20.
    1: optimiser states (master, Adam) sharded: 2 + 2 + (4 + 4 + 8) / g.
    2: gradients sharded too: 2 + (2 + 4 + 4 + 8) / g.
    3: weights sharded too: 20 / g.
    """
    g = gpus
    return {0: _W + _G16 + _G32 + _MASTER + _ADAM,
            1: _W + _G16 + (_G32 + _MASTER + _ADAM) / g,
            2: _W + (_G16 + _G32 + _MASTER + _ADAM) / g,
            3: (_W + _G16 + _G32 + _MASTER + _ADAM) / g}[zero_stage]


def learner_memory(shape: dict, n_params: int, *, gpus: int, zero_stage: int, tokens: int,
                   chunk: int, layer_work_bytes_per_token: float, packed: bool = False,
                   logprob_bytes_per_element: float = 10.0, zero_buffers_gib: float = 2.0,
                   overhead_fraction: float = 0.10) -> dict:
    """Projected peak GiB of one learner GPU for a micro-batch of ``tokens`` tokens.

    shape: the HF config fields (hidden_size, num_hidden_layers, vocab_size, ...).
    layer_work_bytes_per_token: one decoder layer's recomputation + backward, bf16.
    packed: the micro-batch holds several sequences, so sdpa gets a (tokens, tokens) mask
    (bool, plus a bf16 additive copy inside the kernel); a single sequence uses is_causal.
    logprob_bytes_per_element: the chunked log-prob step per (position, vocab) element:
    bf16 logits 2 + fp32 copy 4 + one fp32 temporary 4 (``learner/logprobs``).
    zero_buffers_gib: DeepSpeed's communication buckets and, at stage 3, gathered weights
    (default bucket sizes: reduce 5e8 and all-gather 5e8 elements, prefetch 5e7).
    overhead_fraction: CUDA caching-allocator fragmentation on top of the sum.
    """
    H, L, V = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    terms = {
        # weights, gradients, master weights and Adam moments
        "model_states": n_params * state_bytes_per_param(zero_stage, gpus),
        # gradient checkpointing keeps each layer's bf16 input
        "checkpointed_layer_inputs": L * tokens * H * 2,
        # the one layer being recomputed and back-propagated
        "layer_working_memory": tokens * layer_work_bytes_per_token,
        # final hidden states, the response positions' copy and their gradient (bf16)
        "final_hidden_states": 3 * tokens * H * 2,
        # one chunk's logits and temporaries, plus the head's weight-gradient temporary
        "logprob_chunk": chunk * V * logprob_bytes_per_element + V * H * 2,
        "packed_attention_mask": 3 * tokens ** 2 if packed else 0,
        "zero_buffers": zero_buffers_gib * GIB if zero_stage > 0 else 0,
    }
    subtotal = sum(terms.values())
    terms["allocator_overhead"] = overhead_fraction * subtotal
    out = {k: v / GIB for k, v in terms.items()}
    out["total"] = sum(out.values())
    return out


def memory_plan(shape: dict, n_params: int, layer_work_bytes_per_token: float,
                logprob_bytes_per_element: float = 10.0) -> list[dict]:
    """The plan's table: 8 learner GPUs, ZeRO-2 and ZeRO-3 (and stage 0 for contrast), at
    16k- and 20k-token micro-batches (one long response, or shorter ones packed)."""
    rows = []
    for tokens in (16384 + 1024, 20480 + 1024):
        for stage in (0, 2, 3):
            for packed in (False, True):
                if stage == 0 and packed:
                    continue
                m = learner_memory(shape, n_params, gpus=8, zero_stage=stage, tokens=tokens,
                                   chunk=1024, packed=packed,
                                   layer_work_bytes_per_token=layer_work_bytes_per_token,
                                   logprob_bytes_per_element=logprob_bytes_per_element)
                rows.append({"tokens": tokens, "zero_stage": stage, "packed": packed,
                             "gpus": 8, **{k: round(v, 2) for k, v in m.items()}})
    return rows


def config_memory(cfg, shape: dict, n_params: int, layer_work_bytes_per_token: float,
                  logprob_bytes_per_element: float = 10.0) -> dict:
    """``learner_memory`` for the learner of a run config (``cluster.config.schema.Config``): ZeRO
    shards the states over ``learner.ranks``; the micro-batch is the most tokens one can hold:
    ``optim.micro_batch_tokens``, or one sample of ``generators.engine.max_model_len`` tokens
    when that is longer (a sample over the budget trains alone), or without a budget
    ``micro_batch_size`` such samples; packed when the budget holds more than one response."""
    o, max_len = cfg.optim, cfg.generators.engine.max_model_len
    if not o.gradient_checkpointing:
        raise ValueError("the plan assumes gradient checkpointing (optim.gradient_checkpointing)")
    budget = o.micro_batch_tokens if o.micro_batch_tokens is not None else (
        o.micro_batch_size * max_len)
    return learner_memory(shape, n_params, gpus=cfg.learner.ranks, zero_stage=o.zero_stage,
                          tokens=max(budget, max_len), chunk=o.logprob_chunk_tokens,
                          packed=o.micro_batch_size > 1,
                          layer_work_bytes_per_token=layer_work_bytes_per_token,
                          logprob_bytes_per_element=logprob_bytes_per_element)
