"""The run report in a real browser: headless Chromium (the Debian package, which
``python -m cluster.install`` installs when it runs as root with apt) loads ``report.html``
from disk and every figure is found by its id, decoded, with a non-zero size on the page;
the page fetches nothing. Driven over the DevTools protocol on a pipe (chromium.py).

Set ``V05RL_REPORT_SCREENSHOT=/path.png`` to keep the page's full-length screenshot.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from chromium import NO_CHROMIUM, Browser, chromium_binary, evaluate, open_page, screenshot

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_report_data import make_run  # noqa: E402

from cluster.report.page import write_report  # noqa: E402
from cluster.report.sections import PLOTS, SECTIONS  # noqa: E402

pytestmark = pytest.mark.integration

PROBE = """(async () => {
  const imgs = Array.from(document.querySelectorAll('img.plot'));
  const decoded = await Promise.all(imgs.map(i => i.decode().then(() => true, () => false)));
  return JSON.stringify({
    images: imgs.map((i, n) => { const r = i.getBoundingClientRect();
      return {id: i.id, alt: i.alt, decoded: decoded[n], complete: i.complete,
              natural: [i.naturalWidth, i.naturalHeight], shown: [r.width, r.height]}; }),
    sections: Array.from(document.querySelectorAll('section')).map(s => s.id),
    nodata: Array.from(document.querySelectorAll('.nodata')).map(e => e.id),
    identity: (document.getElementById('accounting-identity') || {}).className,
    fetched: performance.getEntriesByType('resource').map(e => e.name),
    height: document.documentElement.scrollHeight, title: document.title});
})()"""


def render_in_chromium(page: Path, tmp: Path, shot: Path | None = None) -> dict:
    browser = Browser(chromium_binary(), tmp / "chromium-profile", tmp / "chromium.log")
    try:
        session = open_page(browser, page.resolve().as_uri())
        found = json.loads(evaluate(browser, session, PROBE))
        if shot is not None:
            screenshot(browser, session, shot, 1200, found["height"])
        return found
    finally:
        browser.close()


@pytest.mark.skipif(chromium_binary() is None, reason=NO_CHROMIUM)
def test_every_figure_renders_in_headless_chromium(tmp_path):
    page = write_report(make_run(tmp_path / "run"))
    shot = Path(os.environ.get("V05RL_REPORT_SCREENSHOT") or tmp_path / "report.png")
    found = render_in_chromium(page, tmp_path, shot)
    assert found["title"] == "v05rl run report: run"
    assert found["sections"] == [sid for sid, _, _ in SECTIONS]
    by_id = {i["id"]: i for i in found["images"]}
    assert set(by_id) == set(PLOTS) and found["nodata"] == []
    for pid, img in by_id.items():
        assert img["alt"] == PLOTS[pid]
        assert img["decoded"] and img["complete"], img
        assert min(img["natural"]) > 100 and min(img["shown"]) > 50, img
    assert found["identity"] == "banner ok"
    assert found["fetched"] == []  # self-contained: the page loaded nothing
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
