"""``python -m bench.gpu_learner [--out DIR] [--shapes a,b] [--deadline-s S]``: the check, then
each shape measured (see the package docstring); writes ``gpu_learner.json``."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_learner.core import SHAPES, check, isolated, log, measure


def main(argv: list[str] | None = None) -> dict:
    import torch

    ap = argparse.ArgumentParser(prog="python -m bench.gpu_learner", description=(
        "The DeepSpeed learner on one CUDA device: a correctness check and a throughput "
        "measurement."))
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--shapes", default="qwen3-4b,qwen3-0.6b",
                    help=f"comma-separated, from {sorted(SHAPES)}")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--resp-len", type=int, default=1792)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--deadline-s", type=float, default=1e9,
                    help="skip shapes not started within this many seconds of the start")
    a = ap.parse_args(argv)
    shapes = [s for s in a.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        raise SystemExit(f"--shapes: unknown {bad}; valid: {sorted(SHAPES)}")
    cuda = torch.cuda.is_available()
    if not cuda:
        shapes = ["tiny"]
        a.prompt_len, a.resp_len = min(a.prompt_len, 16), min(a.resp_len, 32)
    start = time.perf_counter()
    import deepspeed
    import transformers

    out = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "deepspeed": deepspeed.__version__, "transformers": transformers.__version__,
           "command": "python -m bench.gpu_learner " + " ".join(argv if argv is not None
                                                                 else sys.argv[1:]),
           "gpu": torch.cuda.get_device_name() if cuda else None, "measure": []}
    with tempfile.TemporaryDirectory(prefix="v05_gpu_") as d:
        log("part 1: check on the tiny policy")
        out["check"] = isolated(check, Path(d))
        log(f"check passed: {out['check']}")
        for s in shapes:
            if time.perf_counter() - start > a.deadline_s:
                log(f"deadline: skipping {s}")
                continue
            log(f"part 2: measuring {s}")
            r = isolated(measure, s, Path(d), a.batch, a.prompt_len, a.resp_len, a.micro, a.steps)
            log(json.dumps(r))
            out["measure"].append(r)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpu_learner.json").write_text(json.dumps(out, indent=1))
    log(f"wrote {Path(a.out) / 'gpu_learner.json'}")
    return out
