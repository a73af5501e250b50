"""The README's test command on a clean clone, timed: ``bench/results/suite.json``.

    python -m bench.suite [--out FILE] [--keep DIR] [pytest args ...]

Clones this checkout's HEAD (committed files only, as CI and a newcomer get them) into a
temporary folder, runs ``python -m pytest -q`` there with the installed packages (the README's
second command, after its first installed them), and writes what a reader of "the suite takes
N minutes" needs: the wall time, the counts (passed, failed, skipped, errors, deselected), the
25 slowest phases (pytest's ``--durations``), the machine (CPU model, cores, load average at
the start), the commit and the CPU dtype the runs computed in (``V05_CPU_DTYPE=bf16 python -m
bench.suite --out bench/results/suite_bf16.json`` runs the suite as a CPU whose dtype probe
picks bf16 does). Extra arguments go to pytest (``-m acceptance`` times that tier).
Exits with pytest's status; the file is written either way.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import REPO, stamp, write_json

COUNTS = ("passed", "failed", "skipped", "errors", "deselected", "xfailed", "xpassed")
DURATION = re.compile(r"^\s*([\d.]+)s (call|setup|teardown)\s+(\S+)")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def parse(output: str) -> dict:
    """Counts and slowest phases from pytest's ``-q --durations`` output."""
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    counts = {name: int(n.replace(",", "")) for n, name in
              re.findall(r"([\d,]+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)",
                         tail)}
    if "error" in counts:
        counts["errors"] = counts.pop("error")
    slowest = [{"seconds": float(m.group(1)), "phase": m.group(2), "test": m.group(3)}
               for m in map(DURATION.match, output.splitlines()) if m]
    return {"counts": {k: counts.get(k, 0) for k in COUNTS}, "slowest": slowest[:25],
            "summary_line": tail}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "suite.json")
    ap.add_argument("--keep", type=Path, help="clone here and keep it (default: a temporary "
                    "folder, removed after)")
    a, pytest_args = ap.parse_known_args(argv)
    where = a.keep or Path(tempfile.mkdtemp(prefix="v05-suite-"))
    if where.exists() and any(where.iterdir()):
        raise SystemExit(f"--keep {where}: not empty")
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "--durations=25", *pytest_args]
    load = os.getloadavg()[0]
    print(f"[suite] {' '.join(cmd[1:])} in a clean clone at {where}", file=sys.stderr, flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={k: v for k, v in os.environ.items()
                                          if k != "RAY_ADDRESS"})
    wall = time.time() - t0
    sys.stdout.write(proc.stdout[-3000:])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                          text=True).stdout.strip()
    out = {**stamp("bench.suite", argv), "tested_commit": head, "pytest": " ".join(cmd[1:]),
           "exit_status": proc.returncode, "wall_s": round(wall, 1),
           "wall_min": round(wall / 60, 2), "cpu_model": cpu_model(),
           "load_average_at_start": round(load, 2),
           # the dtype the suite's runs compute in on the CPU (tests/conftest.py forces the
           # dtype probe's answer to fp32 unless V05_CPU_DTYPE is set; suite_dtype.py)
           "cpu_dtype": os.environ.get("V05_CPU_DTYPE") or "fp32",
           **parse(proc.stdout),
           "units": "seconds of wall clock on this machine; counts as pytest reports them"}
    write_json(a.out, out)
    print(f"[suite] {out['summary_line']} -> {a.out}", file=sys.stderr)
    if a.keep is None:
        shutil.rmtree(where, ignore_errors=True)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
