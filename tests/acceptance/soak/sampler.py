"""What tests.acceptance.soak samples, every ``every_s`` seconds, while a run goes on: each process's
resident memory and open file descriptors (by role), the object store's use, the run
directory's size, and the coordinator's state (entries per container).

Processes are found from the bench's own process down (the bench started the local Ray
cluster, so raylet, gcs_server, every actor's worker and the vLLM engine processes are its
descendants) and named by their role: ``ray::Generator`` -> ``generator#0``, a non-Ray child
of it -> ``generator#0/<its title>``, and so on. A name is given to a pid once, at first
sight, so that a series follows one process; a process that restarts starts a new series.
"""
from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

MB = 2.0 ** 20
IDLE = "ray::IDLE"  # Ray's pool of idle workers: they come and go, no role's memory


def _title(p) -> str:
    cmd = p.cmdline()
    return (" ".join(cmd) if cmd else p.name()).strip()


def role_of(title: str) -> str:
    """The role a process title names: ``ray::Generator.generate`` -> ``generator``,
    ``/…/raylet --flags`` -> ``raylet``, ``VLLM::EngineCore`` -> ``vllm-enginecore``."""
    if title.startswith("ray::"):
        return title[5:].split(".")[0].split()[0].lower() or "ray"
    first = title.split()[0] if title.split() else "?"
    if "::" in first:
        return first.replace("::", "-").lower()
    base = os.path.basename(first)
    if base.startswith("python"):  # name the program, not the interpreter
        args = title.split()[1:]
        if "-m" in args[:-1]:  # python -m ray.dashboard.agent -> agent
            return args[args.index("-m") + 1].rsplit(".", 1)[-1]
        if "-c" in args:  # multiprocessing's helpers: resource_tracker, spawn ...
            m = re.search(r"multiprocessing\.(\w+)", title)
            return m.group(1) if m else "python-c"
        script = next((a for a in args if a.endswith(".py")), None)
        if script:  # python .../log_monitor.py -> log_monitor
            return os.path.basename(script)[:-3]
    return re.sub(r"[^\w.-]", "_", base)[:40] or "?"


class Processes:
    """The bench's descendants, each named once (``role#n`` by start time; a child of a
    named role process is ``parent/role``)."""

    def __init__(self, root_pid: int | None = None):
        import psutil

        self.root = psutil.Process(root_pid or os.getpid())
        self.names: dict[tuple[int, float, str], str] = {}
        self.counts: dict[str, int] = {}
        self.titles: dict[str, str] = {}  # name -> the process's command line (for the reader)

    def _name(self, p, parent_name: str | None) -> str | None:
        title = _title(p)
        if title.startswith(IDLE):
            return None  # not named: an idle worker that becomes an actor is named then
        role = role_of(title)
        if parent_name and not title.startswith("ray::"):
            role = f"{parent_name}/{role}"
        # By role too: Ray's setup_worker execs the actor's worker in the same process.
        key = (p.pid, p.create_time(), role)
        if key not in self.names:
            n = self.counts.get(role, 0)
            self.counts[role] = n + 1
            self.names[key] = f"{role}#{n}"
            self.titles[self.names[key]] = title[:160]
        return self.names[key]

    def sample(self) -> dict[str, dict]:
        """{name: {"rss_mb", "fds"}} of the driver and every live, named descendant."""
        import psutil

        out = {"driver": _usage(self.root)}
        named: dict[int, str] = {self.root.pid: None}
        try:
            procs = sorted(self.root.children(recursive=True), key=lambda q: q.create_time())
        except psutil.Error:
            return out
        for p in procs:
            try:
                parent = named.get(p.ppid())
                name = self._name(p, parent)
                if name is None:
                    continue
                # an actor's worker names its own children (the vLLM engine core)
                named[p.pid] = name if _title(p).startswith("ray::") else None
                out[name] = _usage(p)
            except psutil.Error:
                pass  # gone meanwhile
        return out


def _usage(p) -> dict:
    return {"rss_mb": round(p.memory_info().rss / MB, 2), "fds": p.num_fds()}


def dir_mb(path: Path) -> float:
    """The size of every file under ``path`` (MiB; 0 if missing)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return round(total / MB, 3)


class ObjectStore:
    """The object store's use, from the raylet's memory summary (``ray memory``'s source)."""

    def __init__(self):
        self.state, self.error = None, None

    def sample(self) -> dict:
        try:
            import ray
            from ray._private.internal_api import get_memory_info_reply, get_state_from_address

            if self.state is None:
                self.state = get_state_from_address(ray.get_runtime_context().gcs_address)
            st = get_memory_info_reply(self.state, timeout_seconds=20).store_stats
            return {"object_store_mb": round(st.object_store_bytes_used / MB, 3),
                    "object_store_objects": int(st.num_local_objects),
                    "object_store_fallback_mb": round(st.object_store_bytes_fallback / MB, 3)}
        except Exception as err:  # noqa: BLE001 - a missing figure, not a failed soak
            self.error = f"{type(err).__name__}: {err}"[:200]
            return {}


GCS_FIELDS = {  # gcs_server's state dump (gcs_server.out, once a minute) -> sample key
    "Current num of task events stored": "gcs_task_events",
    "Total num task events reported": "gcs_task_events_reported",
}


def gcs_state(text: str) -> dict:
    """The last state dump's counts in gcs_server's log ``text`` (``GCS_FIELDS``), and the
    bytes its publisher holds buffered over every channel: what gcs_server keeps, from
    inside it."""
    out: dict = {}
    tail = text[text.rfind("GcsNodeManager:"):] if "GcsNodeManager:" in text else ""
    for line in tail.splitlines():
        line = line.strip().lstrip("-").strip()
        key, _, value = line.partition(":")
        if key in GCS_FIELDS and value.strip().isdigit():
            out[GCS_FIELDS[key]] = int(value)
        elif key == "current buffered bytes" and value.strip().isdigit():
            out["gcs_buffered_bytes"] = out.get("gcs_buffered_bytes", 0) + int(value)
    return out


def gcs_log() -> Path | None:
    """This process's cluster's gcs_server.out, or None."""
    try:
        from ray._private import worker

        return Path(worker._global_node.get_logs_dir_path()) / "gcs_server.out"
    except Exception:  # noqa: BLE001 - not connected, or a cluster it did not start
        return None


def read_gcs(path: Path | None, tail_bytes: int = 400_000) -> dict:
    if path is None or not path.is_file():
        return {}
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - tail_bytes))
        return gcs_state(f.read().decode("utf-8", "replace"))


class Sampler(threading.Thread):
    """Samples every ``every_s`` seconds until ``stop``: ``self.samples`` (one dict each)."""

    def __init__(self, coord, run_dir: Path, every_s: float, steps: list):
        super().__init__(name="soak-sampler", daemon=True)
        self.coord, self.run_dir, self.every_s, self.steps = coord, Path(run_dir), every_s, steps
        self.procs, self.store = Processes(), ObjectStore()
        self.gcs_log = gcs_log()
        self.samples: list[dict] = []
        self.t0 = time.time()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self._stop_event.wait(self.every_s):
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=60)
        self.samples.append(self.sample())

    def sample(self) -> dict:
        t = time.time()
        s = {"t_s": round(t - self.t0, 2), "steps": len(self.steps),
             "processes": self.procs.sample(), **self.store.sample(),
             "run_dir_mb": dir_mb(self.run_dir),
             "checkpoints_mb": dir_mb(self.run_dir / "checkpoints"),
             "logs_mb": dir_mb(self.run_dir / "logs"), **read_gcs(self.gcs_log)}
        s["coordinator_state"] = self.coordinator_state()
        s["coordinator_entries"] = (sum(s["coordinator_state"].values())
                                    if s["coordinator_state"] else None)
        s["sample_s"] = round(time.time() - t, 3)
        return s

    def coordinator_state(self) -> dict:
        import ray

        try:
            return ray.get(self.coord.state_size.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - the run stopping, or its coordinator gone
            return {}
