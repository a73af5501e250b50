"""A dataset file as rows, read through the Hugging Face ``datasets`` library, local files only.

``read_table(path, columns)`` opens

- a Parquet file (``.parquet``: verl's recipes ship DAPO-Math-17k and GSM8K so),
- a JSON file (``.jsonl``: one object per line, blank lines skipped; ``.json``: the same, or
  one array of objects), optionally compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``),
- a directory written by ``Dataset.save_to_disk``,

and returns a ``Table``: its columns (dotted paths into nested structs, e.g.
``reward_model.ground_truth``) and its rows one at a time, each with a location for messages
(``data.jsonl:12`` for a JSON-lines file, by line; ``data.parquet: row 11 (0-based)`` for the
rest, rows counted as ``dataset[i]`` and ``df.iloc[i]`` count them). Nothing is fetched from the
Hugging Face hub. ``datasets`` (and pyarrow) is imported on first use, not with this module.

When ``datasets`` cannot read a JSON-lines file, the file is read line by line to say which
line is wrong (not UTF-8, not JSON, not an object); a file whose every line is a JSON object
(so one that Arrow refused only because a column mixes types, e.g. answers 2 and "x") is then
taken from that line-by-line reading, as JSON has it.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# What datasets' save_to_disk writes: a Dataset's files, or a DatasetDict's.
_SAVED = ("dataset_info.json", "state.json", "dataset_dict.json")
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
SUPPORTED = ("a .parquet file, a .jsonl or .json file (optionally .gz/.bz2/.xz/.zst), or a "
             "directory written by datasets' save_to_disk")
# JSON's names for Python values, for messages about a field's type.
_JSON_TYPE = {dict: "an object", list: "an array", str: "a string", int: "a number",
              float: "a number", bool: "a boolean", type(None): "null"}


def json_type(value) -> str:
    """What ``value`` is, in JSON's words ("a string", "an array", ...)."""
    return _JSON_TYPE.get(type(value), type(value).__name__)


def _suffix(path: Path) -> str:
    """The format suffix, under a compression one: data.jsonl.gz -> .jsonl."""
    s = path.suffixes
    if len(s) >= 2 and s[-1] in _COMPRESSED:
        return s[-2]
    return path.suffix


def check_source(path: str | Path) -> None:
    """``path`` is something ``read_table`` can open (its contents are read later)."""
    path = Path(path)
    if path.is_dir():
        if not any((path / f).is_file() for f in _SAVED):
            raise ValueError(f"{path} is a directory but not one written by save_to_disk "
                             f"(no dataset_info.json); a dataset is {SUPPORTED}")
        return
    if not path.is_file():
        raise ValueError(f"dataset file {path} does not exist")
    if _suffix(path) not in _BUILDERS:
        raise ValueError(f"{path}: unknown dataset format {_suffix(path) or '(no suffix)'!r}; "
                         f"a dataset is {SUPPORTED}")


@dataclass
class Table:
    """A dataset's rows (an iterator of dicts, top-level columns as keys) and how to name a
    row in a message."""

    path: Path
    columns: list[str]            # every dotted column path, e.g. "reward_model.ground_truth"
    rows: Iterator[dict]
    lines: list[int] | None       # the line of each row (JSON-lines files), else None

    def number(self, i: int) -> int:
        """Row ``i``'s line (JSON lines), else ``i``."""
        return self.lines[i] if self.lines is not None and i < len(self.lines) else i

    def not_an_object(self, i: int) -> str | None:
        """Why row ``i`` of a JSON-lines file is no record ('expected a JSON object, got
        null'), or None. Arrow reads a line ``null`` as a row of nulls; asked when a row is
        wrong, so that such a line is named for what it is."""
        if self.lines is None or i >= len(self.lines) or self.path.suffix in _COMPRESSED:
            return None
        with self.path.open("rb") as f:
            raw = next(itertools.islice(f, self.lines[i] - 1, None))
        try:
            obj = json.loads(raw)
        except ValueError:
            return None
        return None if isinstance(obj, dict) else f"expected a JSON object, got {json_type(obj)}"

    def where(self, i: int) -> str:
        """Row ``i``'s location: 'FILE:LINE' (JSON lines) or 'FILE: row i (0-based)'."""
        if self.lines is not None and i < len(self.lines):
            return f"{self.path}:{self.lines[i]}"
        return f"{self.path}: row {i} (0-based)"


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ValueError("reading a dataset needs the `datasets` package: python -m "
                         "cluster.install (or pip install datasets)") from None
    datasets.disable_progress_bars()
    # Its reader logs a failure at ERROR before raising it; the error we raise says it better.
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    return datasets


def _flat_columns(features, prefix: str = "") -> list[str]:
    """Dotted paths of ``features``: a struct's fields are columns too; a list is a leaf."""
    out = []
    for name, feat in features.items():
        out.append(prefix + name)
        if isinstance(feat, dict):
            out += _flat_columns(feat, prefix + name + ".")
    return out


def _batched_rows(path: Path, ds, top: list[str], batch: int = 4096) -> Iterator[dict]:
    """The rows of ``ds`` restricted to the ``top`` columns, converted a batch at a time (a
    million-row file never sits in memory as Python objects all at once)."""
    if not top:
        return
    ds = ds.select_columns(top)
    for start in range(0, len(ds), batch):
        try:
            b = ds[start:start + batch]
        except Exception as err:  # noqa: BLE001 - Arrow's conversions raise many kinds
            raise ValueError(f"{path}: rows {start}-{min(start + batch, len(ds)) - 1} (0-based) "
                             f"cannot be read ({type(err).__name__}: {str(err)[:200]})") from None
        for i in range(len(b[top[0]])):
            yield {c: b[c][i] for c in top}


def read_table(path: str | Path, wanted: list[str]) -> Table:
    """The rows of the dataset at ``path``; only the top-level columns that ``wanted`` (dotted
    paths) start with are converted. Raises ValueError naming the file (and the line of a
    JSON-lines file that cannot be read)."""
    path = Path(path)
    check_source(path)
    fmt = "disk" if path.is_dir() else _BUILDERS[_suffix(path)]
    datasets = _datasets()
    lines = _json_lines(path) if fmt == "json" else None  # names a line that is not UTF-8
    try:
        ds = _load(datasets, path, fmt)
    except Exception as err:  # noqa: BLE001 - Arrow, datasets and codecs raise many kinds
        if fmt != "json":
            raise ValueError(f"{path}: not a readable {fmt} dataset ({type(err).__name__}: "
                             f"{str(err)[:300]})") from None
        return _json_by_line(path, err)
    if not hasattr(ds, "features"):  # save_to_disk of a DatasetDict
        raise ValueError(f"{path}: a DatasetDict with splits {sorted(ds)}; give the directory "
                         f"of one split (e.g. {path / sorted(ds)[0]})")
    columns = _flat_columns(ds.features)
    top = [c for c in ds.column_names if any(w.split(".")[0] == c for w in wanted)]
    if lines is not None and len(lines) != len(ds):
        lines = None  # a JSON array, not JSON lines: rows are named by index
    return Table(path, columns, _batched_rows(path, ds, top), lines)


def _load(datasets, path: Path, fmt: str):
    if fmt == "disk":
        return datasets.load_from_disk(str(path))
    return datasets.load_dataset(fmt, data_files=str(path), split="train")


def _json_lines(path: Path) -> list[int] | None:
    """The line number of each non-blank line of a JSON-lines file (None for a compressed
    file or one JSON array); a line that is not UTF-8 is named (Arrow would read it and fail
    only when the row is converted)."""
    if path.suffix in _COMPRESSED:
        return None
    lines: list[int] = []
    array = False
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            text = _decode(path, n, raw)
            if text.strip():
                array = array or (not lines and text.lstrip().startswith("["))
                lines.append(n)
    return None if array else lines


def _decode(path: Path, n: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig" if n == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{n}: not UTF-8 text (byte {raw[e.start]:#04x} at column "
                         f"{e.start + 1})") from None


def _json_by_line(path: Path, err: Exception) -> Table:
    """``datasets`` could not read ``path``: read it line by line, naming the first bad line;
    when every line is a JSON object, the rows are those objects."""
    if path.suffix in _COMPRESSED:
        raise ValueError(f"{path}: datasets cannot read it ({type(err).__name__}: "
                         f"{str(err)[:300]})")
    rows, lines = [], []
    with path.open("rb") as f:  # decoded per line, so that bad bytes are named by line
        for n, raw in enumerate(f, 1):
            text = _decode(path, n, raw)
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {json_type(obj)}")
            rows.append(obj)
            lines.append(n)
    columns: list[str] = []
    for r in rows:
        columns += [c for c in _flat_columns(r) if c not in columns]
    return Table(path, columns, iter(rows), lines)
