"""python -m bench.gpu_check [--tiny] [--real-model] [--memory-cpu] [--plan CONFIG] [--out DIR]
                           [--deadline-s S]

Default: on CUDA, the Qwen3-4B checks (writes gpu_check.json); without CUDA the tiny ones.
--real-model: the learner on SmolLM2-135M's architecture (configs/smollm2-135m.yaml's learner
settings and batch shapes; random weights from the config carried in bench/gpu_check/
smollm2_135m/): step time, tokens/s, model FLOP/s against the device's matmul peak, memory,
the weight-sync payload (writes gpu_check_real_model.json; without CUDA or with --tiny a
shrunk model, gpu_check_real_model_tiny.json). On a lent GPU machine:
bash bench/gpu_check/run_on_device.sh (installs the carried wheels; see docs/learner.md).
--memory-cpu: the CPU memory measurements and the memory plan projected from them (writes
gpu_check_memory_cpu.json); with --tiny, small sizes (a smoke test of that code path).
--plan CONFIG: the projected per-GPU memory of CONFIG's learner on the Qwen3-4B shape, from
the measurements already in DIR/gpu_check_memory_cpu.json (prints it; measures nothing).
A failed check is recorded in the JSON (``errors``) and makes the exit status 1.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Sizes per mode. "gpu": the Qwen3-4B plan at DAPO lengths; "tiny": seconds on a CPU.
SIZES = {
    "gpu": dict(shape="qwen3-4b", prompt_len=512, resp_lens=[16384, 20480], responses=2,
                steps=2, lp_tokens=16384, lp_hidden=2560, lp_vocab=151936, lp_chunk=1024),
    "tiny": dict(shape="tiny", prompt_len=16, resp_lens=[48, 96], responses=2, steps=1,
                 lp_tokens=256, lp_hidden=64, lp_vocab=4096, lp_chunk=64),
}
MEMORY_CPU = {
    "full": dict(tokens=1024, hidden=256, vocab=151936, chunk=256, layer_tokens=512),
    "tiny": dict(tokens=256, hidden=32, vocab=4096, chunk=16, layer_tokens=256),
}


def _log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _env() -> dict:
    import deepspeed
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    return {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "transformers": transformers.__version__, "deepspeed": deepspeed.__version__,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "device_total_gib": (torch.cuda.get_device_properties(0).total_memory / 2 ** 30
                                 if cuda else None)}


def device_checks(mode: str, deadline_s: float) -> dict:
    """The three checks of ``checks``, each isolated; a failure is recorded, not raised."""
    from bench.gpu_check import checks
    from bench.gpu_check.memory_cpu import isolated

    z = SIZES[mode]
    start = time.perf_counter()
    out: dict = {"mode": mode, "sizes": z, "errors": {}}
    with tempfile.TemporaryDirectory(prefix="v05_gpu_check_") as tmp:
        parts = [
            ("learner", checks.learner_memory, (z["shape"], tmp, z["prompt_len"], z["resp_lens"],
                                                z["responses"], z["steps"])),
            ("logprob", checks.logprob_memory, (z["lp_tokens"], z["lp_hidden"], z["lp_vocab"],
                                                z["lp_chunk"])),
            ("decoupled", checks.decoupled_steps, (tmp,)),
        ]
        for name, fn, args in parts:
            if time.perf_counter() - start > deadline_s:
                out["errors"][name] = f"skipped: past the {deadline_s:.0f} s deadline"
                _log(out["errors"][name])
                continue
            _log(f"{name} ...")
            t = time.perf_counter()
            try:
                out[name] = isolated(checks.noting_imports, fn, *args)
                _log(f"{name}: {json.dumps(out[name])}")
                if out[name]["loaded_not_needed"]:
                    out["errors"][name] = (f"loaded {out[name]['loaded_not_needed']}: the check "
                                           f"must need only torch, transformers and DeepSpeed")
            except Exception as err:  # recorded, the run goes on to the next check
                out["errors"][name] = "".join(traceback.format_exception_only(err)).strip()
                _log(f"{name} FAILED: {out['errors'][name]}")
                traceback.print_exc()
            out.setdefault("seconds", {})[name] = round(time.perf_counter() - t, 1)
    if "learner" in out and mode == "gpu":
        out["projection_8gpu"] = project_from_device(out["learner"])
    return out


def real_model_checks(mode: str, deadline_s: float) -> dict:
    """``real_model.child`` in a fresh process (torch, transformers and DeepSpeed only: a Ray
    or vLLM import counts as a failure); its runs not started within ``deadline_s`` are
    skipped. A failed part is recorded under ``errors``."""
    from bench.gpu_check import checks
    from bench.gpu_check import real_model as rm
    # a plain fresh process (memory_cpu.isolated's malloc setting would slow the CPU run)
    from bench.gpu_learner.core import isolated

    out: dict = {"mode": mode, "sizes": rm.SIZES[mode], "errors": {}}
    t = time.perf_counter()
    _log(f"real model ({mode}) ...")
    with tempfile.TemporaryDirectory(prefix="v05_gpu_check_real_") as tmp:
        try:
            res = isolated(checks.noting_imports, rm.child, mode, tmp, time.time() + deadline_s)
            out["errors"].update(res.pop("errors"))
            out.update(res)
            if res["loaded_not_needed"]:
                out["errors"]["imports"] = (f"loaded {res['loaded_not_needed']}: the check must "
                                            "need only torch, transformers and DeepSpeed")
        except Exception as err:  # the process died or could not start
            out["errors"]["real_model"] = "".join(
                traceback.format_exception_only(err)).strip()
            traceback.print_exc()
    out["total_s"] = round(time.perf_counter() - t, 1)
    for r in (out.get("learner") or {}).get("runs", []):
        if not r.get("oom"):
            _log(f"{r['name']}: {r['samples']} samples, {r['tokens']} tokens, "
                 f"{r['micro_batches']} micro-batches: {r['mean_step_s']:.3f} s/step, "
                 f"{r['tokens_per_s']:.0f} tokens/s, peak {r['peak_gib']:.2f} GiB")
    if "weight_sync" in out:
        ws = out["weight_sync"]
        _log(f"weight sync: {ws['tensors']} tensors, {ws['bytes'] / 2 ** 20:.1f} MiB "
             f"({ws['dtypes']}), {ws['duplicate_bytes'] / 2 ** 20:.1f} MiB shared storage")
    return out


def project_from_device(learner: dict) -> list[dict]:
    """8 learner GPUs at ZeRO-2/3 from one GPU at ZeRO-0: the measured step working memory
    (peak - rest) plus the sharded states of ``plan.state_bytes_per_param``."""
    from bench.gpu_check.plan import GIB, state_bytes_per_param

    rows = []
    for run in learner["runs"]:
        if run.get("oom"):
            continue
        for stage in (2, 3):
            states = learner["params"] * state_bytes_per_param(stage, 8) / GIB
            buffers = 2.0  # DeepSpeed's buckets and gathered weights (plan.learner_memory)
            total = 1.1 * (states + run["step_working_gib"] + buffers)
            rows.append({"tokens": run["prompt_len"] + run["resp_len"], "zero_stage": stage,
                         "states_gib": round(states, 2),
                         "step_working_gib": round(run["step_working_gib"], 2),
                         "projected_peak_gib": round(total, 2)})
    return rows


def count_params(shape: dict) -> int:
    """Parameters of a Qwen3 model of ``shape`` (built on the meta device: no memory)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    return sum(p.numel() for p in model.parameters())


def memory_cpu(size: str) -> dict:
    """CPU measurements, then the memory plan projected from them (Qwen3-4B, 8 GPUs)."""
    from bench.gpu_check import memory_cpu as mc
    from bench.gpu_check.plan import memory_plan
    from bench.gpu_learner import SHAPES

    z = MEMORY_CPU[size]
    width = SHAPES["qwen3-4b"] if size == "full" else SHAPES["tiny"]
    layer_shape = {**width, "vocab_size": 1024 if size == "full" else 512,
                   "tie_word_embeddings": False}
    out = mc.run(z["tokens"], z["hidden"], z["vocab"], z["chunk"], "fp32", z["layer_tokens"],
                 layer_shape, log=_log)
    out["sizes"] = z
    d = out["layer_derived_fp32"]
    chunked = next(r for r in out["logprob_step"] if r["kind"] == "chunked")
    # fp32 CPU -> bf16 GPU: activations halve; the log-prob chunk keeps its fp32 temporaries
    # (learner/logprobs: bf16 logits 2 + fp32 copy 4 + fp32 temporary 4 = 10 bytes/element).
    qwen = SHAPES["qwen3-4b"]
    out["plan"] = memory_plan(qwen, count_params(qwen),
                              layer_work_bytes_per_token=d["working_bytes_per_token"] / 2)
    out["plan_inputs"] = {
        "layer_work_bytes_per_token_bf16": d["working_bytes_per_token"] / 2,
        "logprob_bytes_per_chunk_element_fp32_measured":
            chunked["peak_mib"] * mc.MIB / (chunked["chunk"] * chunked["vocab"]),
        "logprob_bytes_per_chunk_element_bf16_assumed": 10.0,
    }
    return out


def plan_config(config: str, measured: Path) -> dict:
    """The projected peak memory of one GPU of ``config``'s learner (``plan.config_memory``)
    on the Qwen3-4B shape, the width the CPU measurements in ``measured`` were taken at."""
    from bench.gpu_check.plan import config_memory
    from bench.gpu_learner import SHAPES
    from cluster.config.schema import load_config

    cfg = load_config(config)
    inputs = json.loads(measured.read_text())["plan_inputs"]
    qwen = SHAPES["qwen3-4b"]
    gib = config_memory(cfg, qwen, count_params(qwen), inputs["layer_work_bytes_per_token_bf16"],
                        inputs["logprob_bytes_per_chunk_element_bf16_assumed"])
    o = cfg.optim
    return {"projection": True, "measured_inputs": str(measured), "config": config,
            "shape": "qwen3-4b", "ranks": cfg.learner.ranks, "zero_stage": o.zero_stage,
            "micro_batch_tokens": o.micro_batch_tokens,
            "max_model_len": cfg.generators.engine.max_model_len,
            "logprob_chunk_tokens": o.logprob_chunk_tokens,
            "gib": {k: round(v, 2) for k, v in gib.items()}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (automatic without CUDA)")
    ap.add_argument("--memory-cpu", action="store_true",
                    help="CPU memory measurements and the memory plan, instead of the checks")
    ap.add_argument("--real-model", action="store_true",
                    help="the learner on SmolLM2-135M's architecture (configs/smollm2-135m.yaml)"
                         ", instead of the Qwen3-4B checks")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="skip checks (--real-model: runs) not started within this many "
                         "seconds (default 480; --real-model 300)")
    ap.add_argument("--plan", metavar="CONFIG",
                    help="print the projected learner memory of CONFIG (a run config) from "
                         "OUT/gpu_check_memory_cpu.json; measures nothing")
    a = ap.parse_args(argv)
    if a.memory_cpu and a.real_model:
        ap.error("--memory-cpu and --real-model are separate measurements: give one")
    if a.plan:
        out = plan_config(a.plan, Path(a.out) / "gpu_check_memory_cpu.json")
        print(json.dumps(out, indent=1))
        return out
    import torch

    argv_used = argv if argv is not None else sys.argv[1:]
    out = {**_env(), "command": "python -m bench.gpu_check " + " ".join(argv_used)}
    mode = "tiny" if a.tiny or not torch.cuda.is_available() else "gpu"
    if a.memory_cpu:
        out.update(memory_cpu("tiny" if a.tiny else "full"))
        name = "gpu_check_memory_cpu_tiny.json" if a.tiny else "gpu_check_memory_cpu.json"
    elif a.real_model:
        out.update(real_model_checks(mode, 300.0 if a.deadline_s is None else a.deadline_s))
        name = "gpu_check_real_model.json" if mode == "gpu" else "gpu_check_real_model_tiny.json"
    else:
        out.update(device_checks(mode, 480.0 if a.deadline_s is None else a.deadline_s))
        name = "gpu_check.json" if mode == "gpu" else "gpu_check_tiny.json"
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / name).write_text(json.dumps(out, indent=1))
    _log(f"wrote {Path(a.out) / name}")
    if out.get("errors"):
        _log(f"FAILED checks: {sorted(out['errors'])}")
    return out

