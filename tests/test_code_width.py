"""Code cells fit the desktop content column, checked from the notebooks alone.

The browser test (tests/test_browser.py) measures the rendered pages in Chromium; this test
applies the same rule to the sources and stored outputs, so it also runs where no browser is
installed. Measured in Chromium at 1280 px: a code cell's box holds 77 characters (684 px,
16 px padding each side, 8.43 px a character); inside a toggle (a hide-input cell's input, a
hide-cell cell's input and output, a hide-output cell's output) it holds 75. A solution's
code (inside an exercise's solution box, 4 rem narrower) is set at 12.5 px instead of 14 px
(book/_static/book.css) and holds 77 again, so a cell there has the plain limit. Parts removed
with remove-* tags are not shown. Outputs count where the page shows them as preformatted
text: streams, errors, and results whose richest form is text/plain.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import book_pages
import pytest

ROOT = Path(__file__).resolve().parent.parent
MAIN, TOGGLE = 77, 75  # characters a code box holds at 1280 px
pytestmark = pytest.mark.book  # a check of the book's notebooks: `-m "not book"` leaves it out
RICHER = ("application/vnd.jupyter.widget-view+json", "text/html", "image/svg+xml",
          "image/png", "image/jpeg", "text/markdown", "text/latex")


def _pages() -> list[str]:
    return [p for p in book_pages.toc_pages() if (ROOT / f"{p}.ipynb").exists()]


def _width(line: str) -> int:
    """Columns a line takes in a monospace font (wide East Asian characters take 2)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


def _output_texts(cell: dict):
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            yield "".join(out["text"])
        elif out["output_type"] == "error":
            yield "\n".join(out["traceback"])
        else:
            data = out.get("data", {})
            if "text/plain" in data and not any(k in data for k in RICHER):
                yield "".join(data["text/plain"])


def wide_lines(path: Path) -> list[str]:
    """Every shown code or output line of the notebook wider than its box."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    found = []
    for i, cell in enumerate(cells):
        tags = set(cell["metadata"].get("tags", []))
        if "remove-cell" in tags:
            continue
        parts = []
        if "remove-input" not in tags:
            parts.append(("input", "".join(cell["source"]),
                          TOGGLE if tags & {"hide-input", "hide-cell"} else MAIN))
        if "remove-output" not in tags:
            limit = TOGGLE if tags & {"hide-output", "hide-cell"} else MAIN
            parts += [("output", text, limit) for text in _output_texts(cell)]
        for part, text, limit in parts:
            for n, line in enumerate(text.split("\n"), 1):
                if _width(line) > limit:
                    found.append(f"code cell {i} {part} line {n}: {_width(line)} > {limit} "
                                 f"characters: {line[:60]}")
    return found


@pytest.mark.parametrize("page", _pages())
def test_code_fits_the_desktop_column(page):
    wide = wide_lines(ROOT / f"{page}.ipynb")
    assert not wide, f"{page}: lines a desktop reader must scroll sideways:\n" + "\n".join(wide)


def test_the_rule_catches_a_wide_line(tmp_path):
    """The check can fail: one 78-character line in a plain cell, 76 in a toggle."""
    nb = {"cells": [
        {"cell_type": "code", "metadata": {}, "source": ["x = 1  # " + "a" * 69], "outputs": []},
        {"cell_type": "code", "metadata": {"tags": ["hide-input"]}, "source": ["y" * 76],
         "outputs": [{"output_type": "stream", "name": "stdout", "text": ["z" * 77]}]},
    ]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    wide = wide_lines(path)
    assert len(wide) == 2 and "78 > 77" in wide[0] and "76 > 75" in wide[1]
