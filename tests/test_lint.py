"""Ruff passes on the repository's Python: `ruff check` with the settings of pyproject.toml.

The rules are `[tool.ruff]` in pyproject.toml: pycodestyle, Pyflakes, bugbear, import order and
PEP 8 names, with the book's math names (X, W_Q, ...) exempt. Ruff is pinned in
requirements.txt, so every machine applies the same rules. Not marked `book`: it takes a
second, and runs with `-m "not book"` too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["mha_lit", "tests", "scripts", "benchmarks", "conftest.py", "book/_ext"]
CONFIG = ROOT / "pyproject.toml"


def ruff_check(*paths: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`ruff check` with the repository's settings (no cache written into the work tree)."""
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(CONFIG),
               "--output-format", "concise", *map(str, paths)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_ruff_passes_on_the_repository():
    assert all((ROOT / path).exists() for path in PATHS)
    run = ruff_check(*PATHS)
    assert run.returncode == 0, f"ruff check {' '.join(PATHS)}:\n{run.stdout}{run.stderr}"


def test_the_lint_test_can_fail(tmp_path):
    """An unused import fails; the book's math names (W_Q, X, an O matrix) do not."""
    bad = tmp_path / "unused_import.py"
    bad.write_text("import os\n\n\nx = 1\n")
    run = ruff_check(bad, cwd=tmp_path)
    assert run.returncode == 1 and "F401" in run.stdout, run.stdout + run.stderr

    math = tmp_path / "math_names.py"
    math.write_text("def project(X, W_Q):\n    O = X @ W_Q\n    return O\n")
    run = ruff_check(math, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
