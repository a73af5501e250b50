"""Run outputs (architecture.md): config.yaml, metrics.jsonl, summary.json, progress lines."""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path


def _clean(v):
    """JSON-safe: NaN/inf become null so that every line parses."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class RunWriter:
    def __init__(self, run_dir: Path, config_yaml: str, resume: bool = False,
                 tensorboard: bool = False, progress: bool = True):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(config_yaml)
        self.metrics_path = self.dir / "metrics.jsonl"
        if not resume and self.metrics_path.exists():
            self.metrics_path.unlink()
        self.progress = progress
        self.t0 = time.time()
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tb"))

    def step(self, m: dict) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(_clean(m)) + "\n")
        if self._tb is not None:
            for k, v in m.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, m["step"])
            self._tb.flush()
        if self.progress:
            acc = m.get("eval_accuracy")
            parts = [f"step {m['step']:>4}", f"reward {m.get('reward_mean', float('nan')):+.3f}",
                     f"acc {acc:.3f}" if acc is not None else "acc   -  ",
                     f"k {m.get('k_mean', float('nan')):4.1f}",
                     f"busy {100 * m.get('generator_busy_fraction', 0):3.0f}%",
                     f"{m.get('step_time_s', 0):5.1f}s/step",
                     f"[{time.time() - self.t0:6.0f}s]"]
            print(" | ".join(parts), file=sys.stderr, flush=True)

    def summary(self, s: dict) -> None:
        (self.dir / "summary.json").write_text(json.dumps(_clean(s), indent=2) + "\n")
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
