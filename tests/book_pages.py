"""What the tests that read the whole book share: its pages in order, and the CI rule.

The pages come from the root conftest's own parser of `_toc.yml` (the one nbval collects
with); it is loaded from its file because this directory has a conftest.py of its own.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _book_conftest():
    spec = importlib.util.spec_from_file_location("book_toc", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BOOK = _book_conftest()


def toc_pages() -> list[str]:
    """Every page of _toc.yml, in reading order (paths from the root, without suffix)."""
    import yaml

    return BOOK._toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text()))


def in_ci() -> bool:
    """True under CI=true (or 1, yes): tests that need a browser must run there."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cannot_run(what: str, reason: str):
    """``what`` (e.g. "browser test") cannot run here. Fail in CI; elsewhere skip, loudly (a warning in the summary as well as the skip)."""
    message = f"{what.upper()} NOT RUN: {reason}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: the {what} must run)", pytrace=False)
    warnings.warn(message, UserWarning, stacklevel=2)
    pytest.skip(message)
