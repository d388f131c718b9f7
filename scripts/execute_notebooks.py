"""Re-execute the book's notebooks in place, top to bottom, in a fresh kernel each.

    python scripts/execute_notebooks.py              # every notebook _toc.yml lists
    python scripts/execute_notebooks.py book/part1/03_qkv.ipynb ...

Stored outputs are what strict nbval compares, so they are only ever written by this script,
never edited by hand. Execution is deterministic: fixed hash seed, no timing metadata,
the Agg backend, and the kernel of the Python that runs this script.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conftest import toc_notebooks  # noqa: E402


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
        allow_errors=False,
    )
    client.execute()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata.pop("widgets", None)
    nbformat.validate(nb)
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    os.environ["PYTHONHASHSEED"] = "0"
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    paths = [Path(a).resolve() for a in argv] or sorted(toc_notebooks())
    for path in paths:
        print(f"executing {path.relative_to(ROOT)}", flush=True)
        execute(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
