"""The learner on the real model's shape: ``python -m bench.gpu_check --real-model``.

SmolLM2-135M-Instruct (Llama, 134.5 M parameters, vocabulary 49,152, 30 layers, hidden 576,
tied embeddings) is built from its ``config.json``, carried in the repository next to this
file (``smollm2_135m/``: the 538 MB weights cannot travel to a lent GPU machine), with
random weights (seeded), saved as a Hugging Face checkpoint in a temporary folder and
trained by a real ``LearnerWorker`` (one rank; bf16 and NCCL on CUDA, fp32 and gloo on the
CPU, chosen by the learner itself) with the optimiser settings of the run config
``configs/smollm2-135m.yaml`` (its ``optim``: lr, micro_batch_size, micro_batch_tokens, ...).

One process (``child``) measures, each part recorded on its own (a failure is noted under
``errors`` and the others go on):

- ``matmul``: the device's dense matmul rate (bf16 on CUDA, fp32 on the CPU), a timed large
  square matmul: the peak the learner's model FLOP/s are compared with (``mfu``);
- ``weight_sync``: what the learner would publish per update, through its own path
  (``LearnerWorker.publish_weights`` with the NCCL/gloo sender and no generators: the same
  ``state_dict`` and ``broadcast_plan`` that a broadcast announces), in bytes and tensors,
  the tensors that share storage (the tied embedding is sent twice), the host copy the
  object-store transport (and ``restart_fallback``) makes, and a gloo broadcast of it to one
  receiver process on this machine (``BroadcastGroup``, the loop NCCL runs too);
- ``shared_gpu`` (CUDA only; vLLM cannot be carried, so its share is held as ballast):
  ``nccl_same_device``, two processes on one GPU in one NCCL group, what the planner refuses
  for actors that share a device (docs/cluster.md) - whether NCCL refused it, and how; and
  ``one_gpu_split``, ``configs/one-gpu.yaml``'s split: the engine's share of the device
  (``gpu_memory_utilization``) held while the learner trains the run's ``k_max`` batch with
  that config's micro-batch budget - whether it fits, and the headroom left;
- ``learner.runs``: a warm-up step, then timed steps, on synthetic batches shaped like the
  run's: ``rollout.batch_prompts`` prompts of ~50 tokens, ``algo.k_init`` and ``algo.k_max``
  responses each of 5 to ``rollout.max_tokens`` tokens, then a batch 8 times larger to show
  the scaling, also with larger micro-batch budgets (packed rows: sdpa's attention grows
  with the square of the budget). Each: seconds per step, trained tokens/s, model FLOP/s
  (6 x parameters x trained tokens / s) and their share of the matmul peak, peak device
  memory and the memory at rest (the model and optimiser states between steps).

``SIZES["tiny"]`` shrinks the model (2 layers, hidden 192, vocabulary 4,096; everything
else from the same config.json) and the batches: the CPU test of the same code path.
"""
from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(__file__).resolve().parent / "smollm2_135m"
RUN_CONFIG = ROOT / "configs" / "smollm2-135m.yaml"
ONE_GPU_CONFIG = ROOT / "configs" / "one-gpu.yaml"
# Files of the cached conversion (tasks/pretrained.py) carried here; no weights, no
# tokenizer (the learner trains on token ids).
CARRIED = ("config.json", "generation_config.json", "tokenizer_config.json",
           "chat_template.jinja")
GIB = 2 ** 30
PROMPT_TOKENS = 50     # a word-arithmetic question in the chat template, about
MIN_RESPONSE = 5       # the shortest answers; rollout.max_tokens bounds the longest

# name, responses per prompt (an ``algo`` field of the run config), prompts as a multiple of
# ``batch_prompts``, micro-batch overrides (None: the run config's optim settings)
RUNS = (
    ("k_init", "k_init", 1, None),
    ("k_max", "k_max", 1, None),
    ("large", "k_max", "large_factor", None),
    ("large_micro4096", "k_max", "large_factor", {"micro_batch_tokens": 4096,
                                                  "micro_batch_size": 64}),
    ("large_micro16384", "k_max", "large_factor", {"micro_batch_tokens": 16384,
                                                   "micro_batch_size": 256}),
)
TINY_SHAPE = dict(num_hidden_layers=2, hidden_size=192, intermediate_size=512,
                  num_attention_heads=3, num_key_value_heads=1, vocab_size=4096)
SIZES = {
    # one H200: ~2 minutes after the imports (5 batches of up to 1,024 responses, each a
    # warm-up step and 3 timed ones)
    "gpu": dict(shape={}, batch_prompts=None, large_factor=8, steps=3, matmul_n=8192,
                matmul_iters=50, sync_timeout_s=120.0),
    # seconds on a CPU core
    "tiny": dict(shape=TINY_SHAPE, batch_prompts=1, large_factor=2, steps=1, matmul_n=256,
                 matmul_iters=5, sync_timeout_s=120.0),
}


def run_settings(config: str | Path = RUN_CONFIG) -> dict:
    """The run config's learner (``optim``, a ``LearnerConfig``) and batch shape."""
    from cluster.config.schema import load_config

    cfg = load_config(str(config))
    return {"path": str(config), "optim": cfg.optim, "batch_prompts": cfg.rollout.batch_prompts,
            "max_tokens": cfg.rollout.max_tokens, "k_init": cfg.algo.k_init,
            "k_max": cfg.algo.k_max}


def plan_runs(mode: str, run: dict) -> list[dict]:
    """The batches of ``mode`` for the run settings ``run`` (``run_settings``)."""
    z = SIZES[mode]
    prompts = z["batch_prompts"] or run["batch_prompts"]
    out = []
    for name, per_prompt, factor, micro in RUNS:
        factor = z[factor] if isinstance(factor, str) else factor
        out.append({"name": name, "prompts": prompts * factor, "per_prompt": run[per_prompt],
                    "max_response": run["max_tokens"], "micro": micro})
    return out


def real_batch(prompts: int, per_prompt: int, max_response: int, vocab: int, seed: int):
    """Synthetic ``TrainSample``s shaped like the run's: ``prompts`` prompts of about
    ``PROMPT_TOKENS`` tokens with ``per_prompt`` responses each (they share the prompt) of
    ``MIN_RESPONSE`` to ``max_response`` tokens; behaviour log-probs near a uniform policy's
    (-log V, what a random model gives, so the ratios are near 1), advantages +-1."""
    import numpy as np

    from common.types import TrainSample

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(prompts):
        prompt = rng.integers(3, vocab, PROMPT_TOKENS + int(rng.integers(-6, 7))).tolist()
        for _ in range(per_prompt):
            n = int(rng.integers(MIN_RESPONSE, max_response + 1))
            lp = (-math.log(vocab) + rng.normal(0.0, 0.05, n)).tolist()
            out.append(TrainSample(prompt, rng.integers(3, vocab, n).tolist(), lp,
                                   float(rng.choice([-1.0, 1.0])), 0))
    return out


def save_model(shape: dict, out: Path, seed: int = 0) -> dict:
    """The architecture of the carried config.json (``shape`` overrides some fields), random
    weights from ``seed``, saved as an HF checkpoint in ``out`` (with the carried files
    other than the config). Built on the device in its training dtype."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(MODEL_DIR)
    for k, v in shape.items():
        setattr(cfg, k, v)
    cuda = torch.cuda.is_available()
    torch.manual_seed(seed)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16 if cuda else
                                                         torch.float32)
    model.save_pretrained(out)
    for name in CARRIED[1:]:
        shutil.copy(MODEL_DIR / name, out / name)
    emb = model.get_input_embeddings().weight
    info = {"architecture": type(model).__name__, "params": sum(p.numel()
                                                                for p in model.parameters()),
            "embedding_params": emb.numel(), "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
            "tied": model.get_output_embeddings().weight is emb, "shape_overrides": shape}
    del model, emb
    if cuda:
        torch.cuda.empty_cache()
    return info


def matmul_peak(n: int, iters: int, dtype: str) -> dict:
    """FLOP/s of ``iters`` n x n matmuls in the learner's compute dtype (``bf16``: on CUDA,
    and on a CPU whose dtype probe chose it; ``fp32``), after warm-up: the peak its MFU reads."""
    import torch

    cuda = torch.cuda.is_available()
    dev, dt = ("cuda" if cuda else "cpu"), (torch.bfloat16 if dtype == "bf16" else torch.float32)
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=dev).to(dt)
    b = torch.randn(n, n, generator=g, device=dev).to(dt)
    out = torch.empty(n, n, device=dev, dtype=dt)
    for _ in range(3):
        torch.mm(a, b, out=out)
    _sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.mm(a, b, out=out)
    _sync()
    s = time.perf_counter() - t0
    del a, b, out
    if cuda:
        torch.cuda.empty_cache()
    return {"n": n, "iters": iters, "dtype": str(dt).removeprefix("torch."), "seconds": s,
            "flops_per_s": 2 * n ** 3 * iters / s, "threads": torch.get_num_threads()}


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _itemsize(dtype: str) -> int:
    import torch

    return torch.empty(0, dtype=getattr(torch, dtype)).element_size()


def weight_sync(w, timeout_s: float) -> dict:
    """The payload one update publishes (``LearnerWorker.publish_weights``), its host copy
    (object store) and a gloo broadcast of it to one receiver process."""
    from common.weight_sync import broadcast_plan, make_sender, to_numpy_state_dict

    transport = "nccl" if w.cuda else "gloo"
    # What connect_weight_sync installs, without its connect (a Ray probe of the generators):
    # with no generators, send() builds the payload and broadcasts nothing.
    w.state_io.sender = make_sender({"type": transport, "master_address": "127.0.0.1"})
    try:
        _sync()
        t0 = time.perf_counter()
        payload, refs = w.publish_weights([], 1)
        build_s = time.perf_counter() - t0
    finally:
        w.state_io.sender.close()
        w.state_io.sender = None
    assert refs == [] and payload.version == 1, (payload, refs)
    sizes = {name: math.prod(shape) * _itemsize(dt) for name, dt, shape in payload.meta}
    # Which published tensors are views of one storage (tied weights), from the same state
    # dict publish_weights hands the sender.
    sd = w.model.state_dict()
    meta, order = broadcast_plan(sd)
    assert [m[0] for m in meta] == list(sizes), "the payload is not the learner's state dict"
    first: dict[int, str] = {}
    shared = []
    for (name, _, _), raw in zip(meta, order):
        ptr = sd[raw].untyped_storage().data_ptr()
        if ptr in first:
            shared.append([name, first[ptr]])
        else:
            first[ptr] = name
    dup = sum(sizes[a] for a, _ in shared)
    params_bytes = sum(p.numel() * p.element_size() for p in w.model.parameters())
    out = {"transport": payload.transport, "tensors": len(payload.meta),
           "bytes": sum(sizes.values()), "dtypes": sorted({m[1] for m in payload.meta}),
           "build_s": build_s, "largest": max(sizes.items(), key=lambda kv: kv[1]),
           "shared_storage": shared, "duplicate_bytes": dup,
           "unique_bytes": sum(sizes.values()) - dup, "parameter_bytes": params_bytes}
    # The object-store transport (the CPU default; with restart_fallback, every publish
    # over NCCL too): checkpoint-named NumPy copies on the host, bf16 widened to fp32.
    t0 = time.perf_counter()
    host = to_numpy_state_dict(sd)
    out["object_store_host_copy"] = {"seconds": time.perf_counter() - t0,
                                     "tensors": len(host),
                                     "bytes": int(sum(a.nbytes for a in host.values())),
                                     "dtypes": sorted({str(a.dtype) for a in host.values()})}
    del host
    out["gloo_broadcast"] = gloo_broadcast(sd, meta, order, timeout_s)
    return out


def gloo_broadcast(sd, meta, order, timeout_s: float) -> dict:
    """``BroadcastGroup.send`` of the payload (rank 0, from the learner's device) to one
    receiver process on this machine over gloo (TCP loopback), acknowledgement included;
    the receiver counts what it got."""
    import multiprocessing as mp

    from common.weight_sync import GroupSpec
    from common.weight_sync.group import BroadcastGroup, Listener

    ctx = mp.get_context("spawn")
    replies = ctx.Queue()
    listener = Listener("127.0.0.1", 0)
    spec = GroupSpec(backend="gloo", address="127.0.0.1", port=listener.port, epoch=1,
                     world_size=2, timeout_s=timeout_s, sender_id="gpu-check")
    proc = ctx.Process(target=_receiver, args=(spec.to_dict(), [list(m) for m in meta],
                                               replies), daemon=True)
    proc.start()
    try:
        try:
            group = BroadcastGroup.open(spec, 0, None, listener.detach())
        finally:
            listener.close()
        try:
            t0 = time.perf_counter()
            group.send(sd[k] for k in order)
            seconds = time.perf_counter() - t0
        finally:
            group.close()
        reply = replies.get(timeout=timeout_s)
    finally:
        proc.join(timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if reply[0] != "ok":
        raise RuntimeError(f"gloo receiver: {reply[1]}")
    _, tensors, nbytes = reply
    return {"receivers": 1, "seconds": seconds, "tensors_received": tensors,
            "bytes_received": nbytes, "bytes_per_s": nbytes / seconds}


def _receiver(spec: dict, meta: list, replies) -> None:
    """The receiving rank of ``gloo_broadcast`` (a spawned process)."""
    from common.weight_sync import GroupSpec
    from common.weight_sync.group import GroupMember

    member = GroupMember()
    try:
        s = GroupSpec.from_dict(spec)
        member.join(s, 1)
        got = [0]

        def load(stream) -> int:
            n = 0
            for _, t in stream:
                got[0] += t.numel() * t.element_size()
                n += 1
            return n

        n = member.receive_into(s.name, meta, load)
        replies.put(("ok", n, got[0]))
    except Exception as e:  # reported to rank 0
        replies.put(("error", f"{type(e).__name__}: {e}"))
    finally:
        member.leave()


def nccl_same_device(timeout_s: float = 120.0) -> dict:
    """Two spawned processes, both on CUDA device 0, in one NCCL group broadcasting one
    tensor: NCCL is expected to refuse it (two ranks on one device), which is why the planner
    refuses ``nccl`` where actors share a GPU. ``refused``: every rank that answered failed."""
    import multiprocessing as mp

    from learner.ranks import free_port

    ctx = mp.get_context("spawn")
    replies = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_nccl_rank, args=(r, port, timeout_s, replies), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in procs:
            got.append(replies.get(timeout=timeout_s + 30))
    except Exception:  # noqa: BLE001 - a rank that never answered: hung
        pass
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return nccl_outcome(got, len(procs))


def nccl_outcome(replies: list, ranks: int) -> dict:
    """``nccl_same_device``'s verdict from its ranks' replies (("ok",) or ("error", message))."""
    errors = sorted({r[1] for r in replies if r[0] == "error"})
    return {"ranks": ranks, "answered": len(replies), "ok": sum(r[0] == "ok" for r in replies),
            "refused": bool(replies) and all(r[0] == "error" for r in replies),
            "hung": len(replies) < ranks, "errors": [e[:300] for e in errors]}


def _nccl_rank(rank: int, port: int, timeout_s: float, replies) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, timeout=timedelta(seconds=timeout_s))
        t = torch.ones(4, device="cuda")
        dist.broadcast(t, 0)
        torch.cuda.synchronize()
        replies.put(("ok",))
    except Exception as err:  # noqa: BLE001 - the expected outcome, reported
        replies.put(("error", f"{type(err).__name__}: {' '.join(str(err).split())}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def one_gpu_split(w, run: dict, vocab: int, params: int, steps: int) -> dict:
    """``configs/one-gpu.yaml``: its engine's share of the device held (as vLLM would hold it
    from its start; the learner starts after the engines) while the learner trains the run's
    ``k_max`` batch with that config's micro-batch settings. Fits or not, and the headroom."""
    import torch

    from cluster.config.schema import load_config

    cfg = load_config(ONE_GPU_CONFIG)
    share = cfg.generators.engine.gpu_memory_utilization
    total = torch.cuda.get_device_properties(0).total_memory
    ballast = torch.empty(int(share * total), dtype=torch.uint8, device="cuda")
    try:
        micro = {"micro_batch_tokens": cfg.optim.micro_batch_tokens,
                 "micro_batch_size": cfg.optim.micro_batch_size}
        spec = {**plan_runs("gpu", run)[1], "name": "one_gpu_k_max", "micro": micro}
        r = train_run(w, spec, vocab, params, steps, 0, None)
        reserved = torch.cuda.max_memory_reserved()
    finally:
        del ballast
        torch.cuda.empty_cache()
    return {"config": str(ONE_GPU_CONFIG.relative_to(ROOT)), "engine_share": share,
            "total_gib": total / GIB, "fits": not r.get("oom"),
            "peak_reserved_with_engine_share_gib": reserved / GIB,
            "headroom_gib": (total - reserved) / GIB, "run": r}


def _memory_now() -> int:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    from bench.gpu_check.memory_cpu import proc_status_bytes

    return proc_status_bytes("VmRSS")


def train_run(w, spec: dict, vocab: int, params: int, steps: int, seed: int,
              peak_flops: float | None) -> dict:
    """A warm-up step, then ``steps`` timed steps of ``w`` on one synthetic batch; the run
    config's micro-batch settings unless ``spec["micro"]`` overrides them (for this run)."""
    import torch

    from bench.gpu_check.checks import _peak, _reset_peak
    from bench.gpu_learner import timed_steps

    samples = real_batch(spec["prompts"], spec["per_prompt"], spec["max_response"], vocab,
                         seed)
    prompt_tok = sum(len(s.prompt_token_ids) for s in samples)
    resp_tok = sum(len(s.token_ids) for s in samples)
    tokens = prompt_tok + resp_tok  # every position goes through forward and backward
    base = w.cfg
    # The micro-batch plan reads these per step; the engine does not depend on them (we set
    # the accumulation boundary ourselves), so one engine serves every budget.
    w.cfg = base.model_copy(update=spec["micro"] or {})
    run = {"name": spec["name"], "prompts": spec["prompts"], "per_prompt": spec["per_prompt"],
           "samples": len(samples), "prompt_tokens": prompt_tok, "response_tokens": resp_tok,
           "tokens": tokens, "micro_batch_tokens": w.cfg.micro_batch_tokens,
           "micro_batch_size": w.cfg.micro_batch_size}
    try:
        t0 = time.perf_counter()
        w.train_step(samples)  # warm-up: allocator, kernels, Adam's moments
        _sync()
        run["warmup_s"] = time.perf_counter() - t0
        rest = _reset_peak()
        times, m = timed_steps(w, samples, steps)
        peak = _peak(rest)
        mean = sum(times) / len(times)
        flops = 6 * params * tokens / mean
        run.update(step_s=times, mean_step_s=mean, tokens_per_s=tokens / mean,
                   response_tokens_per_s=resp_tok / mean, samples_per_s=len(samples) / mean,
                   model_flops_per_s=flops,
                   mfu=flops / peak_flops if peak_flops else None,
                   micro_batches=m.micro_batches, loss=m.loss, grad_norm=m.grad_norm,
                   rest_gib=rest / GIB, peak_gib=peak / GIB, step_working_gib=(peak - rest) / GIB)
        if torch.cuda.is_available():
            run["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    except torch.cuda.OutOfMemoryError as err:
        run.update(oom=True, error=str(err).splitlines()[0])
        torch.cuda.empty_cache()
    finally:
        w.cfg = base
    return run


def child(mode: str, tmp: str, deadline: float) -> dict:
    """Every part, in this (fresh) process; runs not started by ``deadline`` (``time.time()``)
    are skipped. Returns the results with ``errors`` {part: message}."""
    import traceback

    import torch

    from learner.ranks import free_port
    from learner.worker import LearnerWorker

    z = SIZES[mode]
    out: dict = {"errors": {}, "seconds": {}}

    def part(name, fn, *args):
        t = time.perf_counter()
        try:
            out[name] = fn(*args)
        except Exception as err:  # recorded; the next part goes on
            out["errors"][name] = "".join(traceback.format_exception_only(err)).strip()
            traceback.print_exc()
        out["seconds"][name] = round(time.perf_counter() - t, 2)
        return out.get(name)

    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # the learner's (LearnerWorker's num_threads)
    run = part("run_config", run_settings)
    model = part("model", save_model, z["shape"], Path(tmp) / "model")
    if run is None or model is None:
        return out
    cfg = run["optim"]
    out["run_config"] = {**run, "optim": cfg.model_dump(mode="json")}
    t0 = time.perf_counter()
    try:
        w = LearnerWorker(str(Path(tmp) / "model"), cfg, 0, 1, free_port())
    except Exception as err:
        out["errors"]["learner"] = "".join(traceback.format_exception_only(err)).strip()
        traceback.print_exc()
        return out
    import torch.distributed as dist

    learner = {"device": str(w.device), "dtype": w.dtype_name, "backend": dist.get_backend(),
               "init_s": time.perf_counter() - t0, "init_gib": _memory_now() / GIB,
               "memory": "cuda allocator" if w.cuda else "process resident set",
               "runs": []}
    out["learner"] = learner
    part("matmul", matmul_peak, z["matmul_n"], z["matmul_iters"], w.dtype_name)
    try:
        part("weight_sync", weight_sync, w, z["sync_timeout_s"])
        if w.cuda:
            part("shared_gpu/nccl_same_device", nccl_same_device)
            part("shared_gpu/one_gpu_split", one_gpu_split, w, run, model["vocab"],
                 model["params"], z["steps"])
        else:
            out["shared_gpu"] = "skipped: needs CUDA (one device shared by two processes)"
        peak_flops = (out.get("matmul") or {}).get("flops_per_s")
        for i, spec in enumerate(plan_runs(mode, run)):
            key = f"learner/{spec['name']}"
            if time.time() > deadline:
                out["errors"][key] = "skipped: past the deadline"
                continue
            t = time.perf_counter()
            try:
                r = train_run(w, spec, model["vocab"], model["params"], z["steps"], i,
                              peak_flops)
                learner["runs"].append(r)
                if r.get("oom"):
                    out["errors"][key] = f"out of memory: {r['error']}"
            except Exception as err:  # recorded; the next run goes on
                out["errors"][key] = "".join(traceback.format_exception_only(err)).strip()
                traceback.print_exc()
            out["seconds"][key] = round(time.perf_counter() - t, 2)
    finally:
        w.close()
    return out
