"""Figures in README.md and docs/ marked with their results file and key (bench/figures.py)
are the files' own: the check passes on the docs as they are, and fails, naming the figure,
the file and both values, when a figure is changed by hand or its key is renamed."""
from __future__ import annotations

import json

from bench.figures import check_text, doc_files, marks, write_text


def test_every_marked_figure_in_the_docs_is_its_files():
    bad = [f"{f.name}: {line}" for f in doc_files() for line in check_text(f.read_text())]
    assert bad == []


def test_the_check_fails_on_a_changed_figure_and_a_renamed_key(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"summary": {"gain": 0.0123, "runs": [3, 5]}}))
    doc = ("gain <!-- fig r.json summary.gain +.3f -->+0.012<!-- /fig --> over "
           "<!-- fig r.json summary.runs.1 d -->5<!-- /fig --> seeds")
    assert check_text(doc, tmp_path) == [] and len(list(marks(doc))) == 2
    changed = doc.replace("+0.012", "+0.015")
    assert check_text(changed, tmp_path) == [
        "r.json summary.gain: the doc says '+0.015', the file '+0.012'"]
    renamed = doc.replace("summary.gain", "summary.gains")
    assert check_text(renamed, tmp_path)[0].startswith("r.json summary.gains: cannot be read")
    assert write_text(changed, tmp_path) == doc  # --write puts the file's figure back
