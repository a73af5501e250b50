"""Figures in the docs that come from results files, written by code and checked against them.

A figure in README.md or docs/*.md is marked where it stands, with the results file and the
key it comes from and its format, in a comment that Markdown does not show::

    V0.5 with selection minus the best baseline: <!-- fig learning_selection.json
    summary.settings.warm.selection_minus_best.mean +.3f -->+0.012<!-- /fig -->

The key is a dotted path into the JSON file (``bench/results/<file>``; list items by index);
the format is Python's (``+.3f``, ``.1%``, ``.2f``, ``d``); ``x`` after it (``.2fx``) appends
an x. ``python -m bench.figures --write`` rewrites every marked figure from its file;
``python -m bench.figures`` (and ``tests/unit/test_docs_figures.py``) checks them and lists
each that differs, with its file, key and both values, exiting 1.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DOCS = ("README.md", "docs")
MARK = re.compile(r"<!-- fig (?P<file>\S+) (?P<key>\S+) (?P<fmt>\S+) -->(?P<value>.*?)<!-- /fig -->",
                  re.DOTALL)


def lookup(data, key: str):
    """The value at dotted ``key`` (an integer part indexes a list)."""
    for part in key.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def render(value, fmt: str) -> str:
    suffix = "x" if fmt.endswith("x") else ""
    return format(value, fmt.removesuffix("x")) + suffix


def marks(text: str):
    """Every marked figure of a text: (match, file, key, format, value as written)."""
    for m in MARK.finditer(text):
        yield m, m["file"], m["key"], m["fmt"], m["value"]


def expected(file: str, key: str, fmt: str, results: Path, cache: dict) -> str:
    if file not in cache:
        cache[file] = json.loads((results / file).read_text())
    return render(lookup(cache[file], key), fmt)


def check_text(text: str, results: Path = RESULTS) -> list[str]:
    """Each marked figure whose written value is not its file's: one line each."""
    cache, out = {}, []
    for _, file, key, fmt, value in marks(text):
        try:
            want = expected(file, key, fmt, results, cache)
        except (OSError, KeyError, IndexError, ValueError, TypeError) as err:
            out.append(f"{file} {key}: cannot be read ({type(err).__name__}: {err})")
            continue
        if value != want:
            out.append(f"{file} {key}: the doc says {value!r}, the file {want!r}")
    return out


def write_text(text: str, results: Path = RESULTS) -> str:
    """The text with every marked figure rewritten from its file."""
    cache: dict = {}

    def repl(m):
        want = expected(m["file"], m["key"], m["fmt"], results, cache)
        return m.group(0).replace(f"-->{m['value']}<!--", f"-->{want}<!--")
    return MARK.sub(repl, text)


def doc_files(root: Path = REPO) -> list[Path]:
    out = []
    for d in DOCS:
        p = root / d
        out += sorted(p.glob("*.md")) if p.is_dir() else [p]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.figures", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite the figures from the files")
    args = ap.parse_args(argv)
    bad, n = 0, 0
    for f in doc_files():
        text = f.read_text()
        n += sum(1 for _ in marks(text))
        if args.write:
            f.write_text(write_text(text))
            continue
        for line in check_text(text):
            print(f"{f.relative_to(REPO)}: {line}")
            bad += 1
    print(f"{n} marked figures{'' if args.write else f', {bad} differ from their files'}",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
