"""Collect exactly the notebooks that _toc.yml lists (for strict nbval), and never _build/;
mark the notebooks' cells `book` (see pyproject.toml's markers)."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent


def _toc_files(node) -> list[str]:
    """Every `root:` / `file:` entry of a Jupyter Book table of contents, in order."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("root", "file") and isinstance(value, str):
                found.append(value)
            else:
                found.extend(_toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_toc_files(item))
    return found


def toc_notebooks() -> set[Path]:
    """Absolute paths of the .ipynb pages listed in _toc.yml."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    paths = {(ROOT / name).with_suffix(".ipynb") for name in _toc_files(toc)}
    return {p for p in paths if p.exists()}


TOC_NOTEBOOKS = toc_notebooks()


def pytest_ignore_collect(collection_path, config):
    path = Path(collection_path).resolve()
    if "_build" in path.parts:
        return True
    if path.suffix == ".ipynb":
        return path not in TOC_NOTEBOOKS
    return None


def pytest_collection_modifyitems(config, items):
    """Every notebook cell that nbval collects is marked `book`: `-m "not book"` leaves them out.

    (The whole-book test modules in tests/ mark themselves, with `pytestmark`.)
    """
    book = ROOT / "book"
    for item in items:
        path = Path(item.path).resolve()
        if path.suffix == ".ipynb" or book in path.parents:
            item.add_marker(pytest.mark.book)


# pytest-xdist: which tests one worker runs together, one after the other (`-n 2 --dist
# loadscope` in pyproject.toml). loadscope makes each module one unit, so each notebook's cells
# stay in one worker, in order, in one kernel (nbval's cells are a notebook's items), and the
# browser test builds the book once, as does the PDF test (they build into separate folders and
# may run side by side). Refined: each notebook's run of the reader's-machine guard is a unit
# of its own, so the guard is spread over the workers instead of running every notebook in one.
# (Not `--dist loadgroup` with xdist_group marks: with pytest 9.2 and pytest-xdist 3.8 it
# silently stops grouping, pytest-dev/pytest-xdist#1386, and a notebook's cells would each start
# a fresh kernel.) `--no-loadscope-reorder`: units start in collection order, so the browser
# test, the longest, starts within seconds.
ONE_UNIT_EACH = "tests/test_reader_machines.py::test_notebook_reproduces_"


def xdist_unit(nodeid: str) -> str | None:
    """The unit of work of a test, where it is not its module (None: loadscope decides)."""
    return nodeid if nodeid.startswith(ONE_UNIT_EACH) else None


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it, never called
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class BookScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid) or super()._split_scope(nodeid)

    return BookScheduling(config, log)
