"""A quiet console: each role writes its output to a file under the run directory.

``to_file(path)``, called first in a role actor's constructor: everything the process (and
any process it spawns afterwards, e.g. vLLM's engine core) writes to stdout/stderr goes to
``path``; records at WARNING and above still go to the original stderr, which Ray forwards to
the driver's console prefixed with the role, e.g. ``(Generator pid=123)``. Standard library only.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

# Libraries whose loggers do not propagate to the root logger: they get the handler too.
LOGGERS = ("", "vllm", "ray", "deepspeed", "DeepSpeed", "transformers", "torch")


def to_file(path: str | Path | None) -> Path | None:
    """Redirect this process's output to ``path`` (None: leave it as it is, verbose)."""
    if path is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    loud = os.fdopen(os.dup(2), "w", buffering=1)  # the console, via Ray's log forwarding
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (1, 2):
        os.dup2(fd, stream)  # Python's sys.stdout/err keep these numbers: they follow
    os.close(fd)
    fmt = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    console = logging.StreamHandler(loud)
    console.setLevel(logging.WARNING)
    console.setFormatter(fmt)
    logfile = logging.StreamHandler(os.fdopen(os.dup(2), "w", buffering=1))  # the file
    logfile.setFormatter(fmt)
    for name in LOGGERS:
        lg = logging.getLogger(name)
        if not name or not lg.propagate:  # the others reach the root logger's handlers
            lg.addHandler(console)
            if not lg.handlers[:-1]:  # a logger with no output of its own: the file too
                lg.addHandler(logfile)
    logging.captureWarnings(True)
    return path
