"""Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4,
``--remote-debugging-pipe``), so no websocket client is needed: the run report's browser test
(test_report_browser.py) and the Ray dashboard's (test_job_submit.py) share it.

Chromium is the Debian package, which ``python -m cluster.install`` installs when it runs as
root with apt; tests that need it skip with ``NO_CHROMIUM`` when ``chromium_binary()`` finds
none.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

NO_CHROMIUM = ("no Chromium binary (chromium, chromium-browser, google-chrome) on PATH: "
               "`apt-get install chromium`, or `python -m cluster.install` as root")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe"]


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


class Browser:
    """Chromium driven over ``--remote-debugging-pipe``: it reads NUL-terminated JSON
    commands on fd 3 and writes replies and events on fd 4."""

    def __init__(self, binary: str, user_data_dir: Path, log: Path):
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        # Copies above fd 9 (close-on-exec) so that placing them at 3 and 4 in the child
        # cannot overwrite one with the other.
        src_r, src_w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_r, from_w))

        def child_fds():
            os.dup2(src_r, 3)   # dup2 clears close-on-exec: chromium inherits 3 and 4
            os.dup2(src_w, 4)

        self.log = log.open("w")
        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={user_data_dir}",
                                      "about:blank"], stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, close_fds=False,
                                     preexec_fn=child_fds, start_new_session=True)
        for fd in (to_r, from_w, src_r, src_w):
            os.close(fd)
        self.w, self.r = to_w, from_r
        self.buf, self.next_id, self.events = b"", 0, []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout, f"{method} reply")
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while True:
            e = self._read(timeout, method)
            if e.get("method") == method:
                return e
            self.events.append(e)

    def _read(self, timeout: float, what: str) -> dict:
        deadline = time.time() + timeout
        while b"\0" not in self.buf:
            left = deadline - time.time()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError(f"chromium: no {what} within {timeout:.0f}s")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\0", 1)
        return json.loads(line)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - it is going away either way
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)  # the group this test started
            self.proc.wait(timeout=20)
        for fd in (self.w, self.r):
            os.close(fd)
        self.log.close()


def open_page(browser: Browser, url: str, width: int = 1200, height: int = 900) -> str:
    """A new tab at ``url`` (``width`` x ``height`` CSS pixels), its load event waited for;
    returns the DevTools session to talk to it."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target,
                                                     "flatten": True})["sessionId"]
    browser.send("Page.enable", session=session)
    browser.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                        "deviceScaleFactor": 1,
                                                        "mobile": False}, session=session)
    browser.send("Page.navigate", {"url": url}, session=session)
    browser.wait_event("Page.loadEventFired")
    return session


def evaluate(browser: Browser, session: str, expression: str):
    """The value of a JavaScript expression in the page (a promise is awaited)."""
    out = browser.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                            "returnByValue": True}, session=session)
    return out["result"].get("value")


def screenshot(browser: Browser, session: str, path: Path, width: int, height: int) -> Path:
    """A PNG of the page's top ``width`` x ``height`` CSS pixels, written to ``path``."""
    shot = browser.send("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
        session=session, timeout=120)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path
