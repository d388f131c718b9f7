"""Collect exactly the notebooks that _toc.yml lists (for strict nbval), and never _build/."""

from pathlib import Path

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
