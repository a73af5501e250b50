"""``python -m bench.gpu_check``: see ``bench/gpu_check/cli.py``; exit status 1 when a check failed."""
import sys

from bench.gpu_check.cli import main

sys.exit(1 if main().get("errors") else 0)
