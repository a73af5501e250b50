"""Install the carried wheels that a lent GPU machine lacks, then check the imports the device
check needs: ``python -m bench.gpu_check.wheels [DIR]`` (default ``.wheels``; what
``run_on_device.sh`` runs first).

The machine has torch, transformers and no network; DeepSpeed and whatever of its runtime
imports is missing travel as wheels in DIR (an ignored folder, carried with the working
tree), filled on a machine with the registry:

    pip wheel deepspeed==0.19.8 --no-deps --no-build-isolation -w .wheels
    pip download --no-deps -d .wheels hjson==3.1.0 einops==0.8.2 py-cpuinfo==9.0.0 \\
        annotated-types==0.7.0 typing-inspection==0.4.2 pydantic==2.13.4
    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \\
        -d .wheels/cp312-x86_64 msgpack==1.2.4 psutil==7.2.2 pydantic-core==2.46.4

(pure-Python ``py3-none-any`` wheels, and in ``cp312-x86_64/`` the three compiled ones for
CPython 3.12 on x86-64 Linux; pydantic-core must be the version that pydantic pins.)

A wheel is installed (``pip install --no-deps --no-index``, one at a time so that one the
platform refuses does not stop the others) only when its distribution is not installed, or,
for the pinned ones (``PINNED``), installed at another version: what the machine has is left
alone. Exit status 1 when a needed module still does not import.
"""
from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# The learner is tested with this DeepSpeed; another installed version is replaced.
PINNED = {"deepspeed": "0.19.8"}
# What the device check imports (DeepSpeed's runtime imports included: measured with
# ``import deepspeed`` on this project's install).
NEEDED = ("torch", "transformers", "safetensors", "numpy", "yaml", "pydantic", "deepspeed",
          "hjson", "einops", "msgpack", "psutil")


def canonical(name: str) -> str:
    """A distribution's normalised name (PEP 503): ``Py_CPUinfo`` -> ``py-cpuinfo``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_dist(path: Path) -> tuple[str, str]:
    """(distribution, version) from a wheel's file name (``name-version-...whl``)."""
    parts = path.name.split("-")
    if not path.name.endswith(".whl") or len(parts) < 5:
        raise ValueError(f"not a wheel file name: {path.name}")
    return canonical(parts[0]), parts[1]


def installed_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def to_install(folder: Path, installed=installed_version) -> list[Path]:
    """The wheels under ``folder`` (any depth) whose distribution is missing, or is pinned
    and installed at another version; one per distribution (the first in path order)."""
    out, seen = [], set()
    for path in sorted(Path(folder).rglob("*.whl")):
        dist, version = wheel_dist(path)
        if dist in seen:
            continue
        seen.add(dist)
        have = installed(dist)
        if have is None or (dist in PINNED and have != version):
            out.append(path)
    return out


_PROBE = """
import importlib, json, sys
out = {}
for mod in sys.argv[1:]:
    try:
        out[mod] = str(getattr(importlib.import_module(mod), "__version__", "ok"))
    except Exception as e:
        out[mod] = f"MISSING: {type(e).__name__}: {e}"
print("\\n" + json.dumps(out))
"""


def check_imports(modules=NEEDED) -> dict[str, str]:
    """{module: version, or 'MISSING: why'}, imported in a fresh interpreter (the wheels
    just installed are visible there, and nothing is left half-imported here)."""
    import json

    r = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                       text=True)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {m: f"MISSING: the import probe failed: {r.stderr.strip()[-300:]}"
                for m in modules}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0] if args else ".wheels")
    if not folder.is_dir():
        print(f"[wheels] no folder {folder}: nothing to install", flush=True)
    else:
        for path in to_install(folder):
            print(f"[wheels] installing {path}", flush=True)
            r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                                "--no-index", "--disable-pip-version-check", str(path)])
            if r.returncode:
                print(f"[wheels] {path.name}: pip exited {r.returncode}", flush=True)
    found = check_imports()
    for mod, version in found.items():
        print(f"[wheels] {mod}: {version}", flush=True)
    missing = [m for m, v in found.items() if v.startswith("MISSING")]
    if missing:
        print(f"[wheels] missing modules: {missing}", flush=True)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
