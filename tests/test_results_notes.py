"""``benchmarks/results/README.json`` is the notes page's tables, row for row."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _tables(markdown: str) -> dict[str, list[list[str]]]:
    tables: dict[str, list[list[str]]] = {}
    section = None
    for line in markdown.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif section and line.startswith("|") and not set(line) <= set("|- "):
            tables.setdefault(section, []).append([c.strip() for c in line.strip("| ").split("|")])
    return tables


def test_the_notes_json_holds_every_row_of_the_notes_page() -> None:
    tables = _tables((RESULTS / "README.md").read_text(encoding="utf-8"))
    data = json.loads((RESULTS / "README.json").read_text(encoding="utf-8"))["tables"]
    assert set(data) == set(tables)
    for name, (header, *rows) in tables.items():
        assert data[name] == [dict(zip(header, row, strict=True)) for row in rows], name
