"""Offline use of the prior server: ``python -m actors.priors predict --context C.jsonl
--queries Q.jsonl [--backend NAME] [--option key=value ...]`` (or ``python -m actors.priors.cli``).

Context lines are ``{"prompt": str, "score": float in [0, 1]}``, query lines ``{"prompt": str}``;
one ``{"prompt", "p"}`` JSON line per query comes out, in order. A bad line, an unknown backend
or option, or missing v0 files print ``error: ...`` and exit 2. Only the standard library is
imported before the arguments are parsed (``--help`` is instant).
"""
from __future__ import annotations

import argparse
import json
import sys

from actors.priors.server import PriorServer, check_prompt, check_score
from common.types import PriorObservation


class InputError(ValueError):
    """A bad line in an input file (the message names the file and line)."""


def read_jsonl(path: str, need_score: bool) -> list[dict]:
    """Rows of a JSONL file: {"prompt": str} (+ "score" in [0, 1] when ``need_score``)."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from e
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: not valid JSON ({e.msg})") from e
        if not isinstance(row, dict) or "prompt" not in row:
            raise InputError(f"{where}: expected an object with a \"prompt\" key")
        try:
            item = {"prompt": check_prompt(row["prompt"], where)}
            if need_score:
                if "score" not in row:
                    raise ValueError(f"{where}: missing \"score\"")
                item["score"] = check_score(row["score"], where)
        except ValueError as e:
            raise InputError(str(e)) from e
        rows.append(item)
    return rows


def _parse_options(pairs: list[str]) -> dict:
    """--option key=value; values are JSON when they parse as JSON, else strings."""
    opts = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--option expects key=value, got {pair!r}")
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    return opts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m actors.priors",
                                     description="Offline use of the V0 prior server.")
    sub = parser.add_subparsers(dest="command", required=True)
    pred = sub.add_parser("predict", help="predict p for queries given a context (JSONL in, JSONL out)")
    pred.add_argument("--context", required=True,
                      help='JSONL, one {"prompt": str, "score": float in [0, 1]} per line')
    pred.add_argument("--queries", required=True, help='JSONL, one {"prompt": str} per line')
    pred.add_argument("--backend", default="embedded",
                      help="prior backend: embedded (default), v0, constant")
    pred.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                      help="backend option (repeatable), e.g. --option halflife=null")
    pred.add_argument("--window", type=int, default=None,
                      help="keep only the last N context lines (default: all of them)")
    pred.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    pred.add_argument("--fallback", default="none",
                      help="backend that answers when the backend fails or exceeds --budget-s "
                           "(default none: errors are reported, as an evaluation wants)")
    pred.add_argument("--budget-s", type=float, default=None,
                      help="seconds the backend has per call before the fallback answers "
                           "(needs --fallback; default: no limit)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        context = read_jsonl(args.context, need_score=True)
        queries = read_jsonl(args.queries, need_score=False)
        options = _parse_options(args.option)
        window = args.window if args.window is not None else max(1, len(context))
        server = PriorServer(args.backend, options, window=window, cpu_threads=args.threads,
                             fallback=args.fallback, budget_s=args.budget_s)
        server.observe([PriorObservation(r["prompt"], r["score"], 0) for r in context])
        ps = server.predict([q["prompt"] for q in queries])
    except (InputError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = sys.stdout
    for q, p in zip(queries, ps):
        out.write(json.dumps({"prompt": q["prompt"], "p": p}, ensure_ascii=False) + "\n")
    out.flush()
    stats = server.stats()
    if stats.fallbacks.total:
        print(f"note: answered by the fallback {stats.fallback!r} ({stats.last_fallback})",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
