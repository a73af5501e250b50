"""LoRA on the learner's policy (``optim.lora``, ``learner.config.LoraSpec``).

PEFT injects the adapters in place, so the policy stays its Hugging Face class (``base_model``
and the LM head are where ``LogprobModel`` finds them) and only the adapters require a
gradient: the optimiser holds their state alone. What leaves the rank is the merged weights
under the base model's names (``merged_state_dict``), so the generators, the HF copy and
everything downstream see a plain model; DeepSpeed checkpoints hold the adapters and their
optimiser state (the frozen base is the model's files). Heavy imports stay in the functions.
"""
from __future__ import annotations

from learner.config import LoraSpec

ADAPTER = "default"  # PEFT's adapter name: one adapter per policy


def inject(model, spec: LoraSpec):
    """Put ``spec``'s adapters into ``model`` (in place; returned). Every other weight is
    frozen. A target module the model lacks fails here, naming the model's linear layers."""
    from peft import LoraConfig, inject_adapter_in_model

    check_targets(model, spec)
    targets = spec.target_modules if spec.target_modules == "all-linear" else list(
        spec.target_modules)
    cfg = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                     target_modules=targets, bias="none")
    model = inject_adapter_in_model(cfg, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def check_targets(model, spec: LoraSpec) -> None:
    """Raise ValueError naming the model's linear layers when ``spec`` targets one it lacks
    (``model`` may live on the meta device: only its modules are read)."""
    import torch

    if spec.target_modules == "all-linear":
        return
    have = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules()
            if isinstance(mod, torch.nn.Linear)}
    missing = sorted(set(spec.target_modules) - have)
    if missing:
        raise ValueError(f"optim.lora.target_modules {missing}: {type(model).__name__} has "
                         f"no such linear layer (it has {', '.join(sorted(have))})")


def merged_state_dict(model) -> dict:
    """The policy as a plain model: {base parameter name: base weight + its adapter's
    (alpha / rank) * B @ A}, detached, in the weights' dtype; the adapters' own entries left
    out. The model is not changed (no merge in place, so training goes on)."""
    import torch
    from peft.tuners.lora import LoraLayer

    state = model.state_dict()
    out = {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, LoraLayer):
                key = f"{name}.weight"
                out[key] = out[key] + mod.get_delta_weight(ADAPTER).to(out[key].dtype)
    return {k: v.detach() for k, v in out.items()}
