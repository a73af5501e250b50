"""`python -m cluster.launch CONFIG --check-placement` as a user runs it (a subprocess that
builds its own simulated cluster of the config's shape), on the 32-GPU config. The failing
cases that need no cluster are in tests/unit/test_placement.py."""
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.config.schema import load_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "configs" / "qwen3-4b-dapo-32gpu.yaml"
SHAPE = ["cluster.nodes=4", "cluster.gpus_per_node=8"]  # the paper's cluster, 4 x 8 GPUs


def test_check_placement_command_on_the_32_gpu_config(tmp_path):
    cfg = load_config(PAPER)
    shape = [] if cfg.cluster.gpus_per_node else SHAPE
    # cluster.address=local: simulate even if a cluster is running on this machine; the
    # output directory a test's launch may look at is its own (test_bad_input.py).
    out = subprocess.run([sys.executable, "-m", "cluster.launch", str(PAPER),
                          "cluster.address=local", *shape, f"run.output_dir={tmp_path}",
                          "--check-placement"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "simulated" in out.stdout and out.stdout.rstrip().endswith("placement OK")
    assert "learner: %d actor(s)" % cfg.learner.ranks in out.stdout
    assert "rendezvous" in out.stdout and "(rank 0's node)" in out.stdout
    assert "GPUs placed: 32 of 32 on 4 node(s)" in out.stdout


@pytest.mark.parametrize("name, gpus", [("qwen3-4b-8gpu.yaml", 8), ("one-gpu.yaml", 1)])
def test_check_placement_command_on_the_one_node_recipes(tmp_path, name, gpus):
    """The one-node recipes (issue 43, 45): 8 GPUs, an actor on each; one GPU that the
    generator and the learner share (half each, its weights through host memory)."""
    out = subprocess.run([sys.executable, "-m", "cluster.launch", str(ROOT / "configs" / name),
                          "cluster.address=local", f"run.output_dir={tmp_path}",
                          "--check-placement"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.rstrip().endswith("placement OK")
    assert f"GPUs placed: {gpus:g} of {gpus:g} on 1 node(s)" in out.stdout, out.stdout
    assert ("(1 shared by several actors)" in out.stdout) == (gpus == 1), out.stdout
