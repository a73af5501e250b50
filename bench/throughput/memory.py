"""Per-actor peak memory while a benchmark runs: the RSS of each Ray actor process (and its
children, e.g. vLLM's engine core), sampled every ``period`` seconds. Reads only."""
from __future__ import annotations

import threading

ROLES = ("Generator", "LearnerWorker", "PriorServer", "Coordinator")


class MemorySampler:
    def __init__(self, period: float = 0.5):
        import psutil

        self._psutil, self.period = psutil, period
        self._peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        ps = self._psutil
        for proc in ps.process_iter(["cmdline"]):
            cmd = " ".join(proc.info.get("cmdline") or [])
            role = next((r for r in ROLES if cmd.startswith(f"ray::{r}")), None)
            if role is None:
                continue
            try:
                rss = proc.memory_info().rss + sum(c.memory_info().rss
                                                   for c in proc.children(recursive=True))
            except ps.Error:
                continue
            key = f"{role}:{proc.pid}"
            self._peaks[key] = max(self._peaks.get(key, 0.0), rss / 2**20)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def reset(self) -> None:
        self._peaks = {}

    def peaks_mib(self) -> dict[str, float]:
        """Peak RSS (MiB) per role: the largest over that role's actor processes."""
        out: dict[str, float] = {}
        for key, v in self._peaks.items():
            role = key.split(":")[0]
            out[role] = round(max(out.get(role, 0.0), v), 1)
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
