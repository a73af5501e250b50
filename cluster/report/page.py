"""One self-contained HTML page per run: ``<run>/report.html``.

    python -m cluster.report runs/NAME [-o OUT.html] [--check]

Reads only the run's files (``metrics.jsonl``, ``prompts.jsonl``, ``dropped.jsonl``,
``inflight_at_end.json``, ``summary.json``, ``config.yaml``; see docs/pipeline.md), so it
needs no Ray and no torch, and renders in seconds: the trainer calls ``write_report`` at the
end of every run. Figures are PNGs inlined as base64 (``cluster/report/plots.py``); no
script, stylesheet or font is fetched, the page opens offline. The run's files are read in
``cluster/report/data.py``, the sections built in ``cluster/report/sections.py``; a section
without data says "no data".

Exit codes: 0 the page was written; 1 with ``--check``, written but an accounting check
failed (admitted = trained + dropped + in flight, the files against summary.json); 2 the
run directory or its ``metrics.jsonl`` is missing.
"""
from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path

from cluster.report.analysis import accounting_checks
from cluster.report.data import ReportError, RunData, load_run

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;
max-width:1100px;padding:1em 2em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
nav a{margin-right:1em}img.plot{max-width:100%;height:auto;display:block;margin:.6em 0}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}th{background:#f4f4f4}
td:first-child,th:first-child,table.checks td{text-align:left}tr.sub td:first-child{padding-left:2em}
.ok{color:#1a7f37;font-weight:bold}.fail{color:#c62828;font-weight:bold}
.banner{padding:.6em 1em;border-radius:4px;margin:.6em 0}
.banner.ok{background:#e8f5e9;border:1px solid #1a7f37}
.banner.fail{background:#ffebee;border:1px solid #c62828}
.nodata{color:#777;font-style:italic;border:1px dashed #bbb;padding:.8em;margin:.6em 0}
.caption{color:#555;font-size:.9em}pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em}
"""


def render(run: RunData) -> tuple[str, bool]:
    """The page, and whether every accounting check the run's files allow holds."""
    from cluster.report.sections import SECTIONS  # lazy: it imports matplotlib (~1 s)

    body, nav = [], []
    for sid, title, build in SECTIONS:
        try:
            inner = build(run)
        except Exception as err:  # noqa: BLE001 - one broken section must not lose the page
            inner = (f'<p class="nodata fail">this section failed: '
                     f"{html.escape(type(err).__name__)}: {html.escape(str(err))}</p>")
        nav.append(f'<a href="#{sid}">{html.escape(title)}</a>')
        body.append(f'<section id="{sid}"><h2>{html.escape(title)}</h2>\n{inner}\n</section>')
    name = html.escape(run.dir.resolve().name)
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>v05rl run report: {name}</title>\n<style>{CSS}</style></head>\n<body>\n"
            f"<h1>Run report: {name}</h1>\n<nav>{' '.join(nav)}</nav>\n"
            + "\n".join(body) + "\n</body></html>\n")
    return page, all(ok for _, ok, _ in accounting_checks(run) if ok is not None)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Render ``run_dir``'s report to ``out`` (default ``<run_dir>/report.html``) and return
    its path. Raises ``ReportError`` when the directory or its metrics.jsonl is missing;
    missing or partial data otherwise shows as "no data" in its section."""
    return _write(load_run(run_dir), out)[0]


def _write(run: RunData, out: str | Path | None) -> tuple[Path, bool]:
    page, ok = render(run)
    out = Path(out) if out is not None else run.dir / "report.html"
    tmp = out.with_name(f".{out.name}.tmp")  # a reader never sees half a page
    tmp.write_text(page)
    tmp.replace(out)
    return out, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cluster.report",
                                 description="Write a run's self-contained HTML report.")
    ap.add_argument("run_dir", type=Path, help="the run directory (runs/NAME)")
    ap.add_argument("-o", "--out", type=Path, default=None,
                    help="where to write the page (default: RUN_DIR/report.html)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the prompt accounting does not add up")
    args = ap.parse_args(argv)
    try:
        run = load_run(args.run_dir)
    except ReportError as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    out, ok = _write(run, args.out)
    print(out)
    if not ok:
        print("report: the prompt accounting does not add up (see the page's Accounting)",
              file=sys.stderr)
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
