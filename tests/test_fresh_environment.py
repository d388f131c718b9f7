"""A reader's fresh Jupyter: the notebooks install the book's package themselves and need no MyST-NB.

Every notebook of ``_toc.yml`` starts its code with the same hidden cell (tagged
``remove-cell``): when ``mha_lit`` is missing (Colab, a plain Jupyter) it installs it with pip,
from ``repository.url`` of ``_config.yml``, or from ``$MHA_LIT_SOURCE`` where that is set. The
pages glue their numbers with ``mha_lit.book.glue``, which works without MyST-NB.

The structural tests read the notebooks: that cell first in every one, its address the
configured one, no code cell that imports ``myst_nb``.

The execution tests run ``book/first_look.ipynb`` and one Part I chapter in a new virtual
environment holding only ``nbclient`` and ``ipykernel`` (from the package index), with
``MHA_LIT_SOURCE`` pointing at a copy of this checkout. Each precaution keeps the run from
finding what a reader would not have:

- the environment is made by ``python -m venv`` from the base interpreter, without system site
  packages: none of this project's ``.venv`` (where ``mha_lit`` and ``myst_nb`` are installed)
  is visible;
- ``PYTHONPATH`` (and ``PYTHONHOME``, ``PYTHONSTARTUP``) are cleared, and Jupyter's and
  IPython's configuration directories are new empty ones: no path or startup file reaches in;
- the kernel's working directory is a temporary one, not the repository root, where
  ``import mha_lit`` would find the source folder and prove nothing;
- before any notebook runs, ``import mha_lit`` and ``import myst_nb`` must fail there;
- pip installs from a copy of the checkout, because pip builds a local folder in place and
  would leave ``build/`` and ``mha_lit.egg-info/`` in the working tree;
- a last cell, added to the copy being run, reports the kernel's interpreter and where
  ``mha_lit`` was imported from: the fresh environment's, its site-packages.

One environment serves both notebooks (the first one's cell installs the package; it is the
timed part). Without the package index (no network) the execution tests skip, and fail in CI
(``book_pages.cannot_run``). Every test here is marked ``book``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import book_pages
import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
NOTEBOOKS = [path for page in book_pages.toc_pages()
             if (path := ROOT / f"{page}.ipynb").exists()]
RUN = ["book/first_look.ipynb", "book/part1/03_qkv.ipynb"]
CELL_TIMEOUT = 600  # seconds per cell: the first cell installs NumPy, matplotlib and SymPy
# The checkout's folders a package build does not need (.gitignore's, and setuptools' build/).
NOT_COPIED = (".git", ".venv", "venv", "_build", "build", "*.egg-info", "__pycache__",
              ".pytest_cache", ".hypothesis", ".ipynb_checkpoints")

pytestmark = pytest.mark.book


def _code_cells(path: Path) -> list:
    return [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


# --- what the notebooks hold (no environment needed) -----------------------------------------


def test_every_notebook_starts_its_code_with_the_same_hidden_install_cell():
    assert len(NOTEBOOKS) == len(book_pages.BOOK.TOC_NOTEBOOKS) > 1
    first = {path.relative_to(ROOT).as_posix(): _code_cells(path)[0] for path in NOTEBOOKS}
    sources = {cell.source.rstrip("\n") for cell in first.values()}
    assert len(sources) == 1, "the notebooks' first code cells differ"
    untagged = [name for name, cell in first.items()
                if "remove-cell" not in cell.metadata.get("tags", [])]
    assert untagged == [], f"first code cell not tagged remove-cell: {untagged}"
    source = sources.pop()
    assert 'find_spec("mha_lit") is None' in source and "MHA_LIT_SOURCE" in source


def test_the_install_cell_installs_from_the_configured_repository():
    """Its one ``git+`` address (adjacent literals joined, as Python reads them) is _config.yml's."""
    tree = ast.parse(_code_cells(NOTEBOOKS[0])[0].source)
    addresses = [node.value for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and node.value.startswith("git+")]
    assert addresses == ["git+" + CONFIG["repository"]["url"]]


def test_no_notebook_imports_myst_nb():
    """A reader's Jupyter has no MyST-NB: the pages glue with ``mha_lit.book.glue``."""
    found = [(path.relative_to(ROOT).as_posix(), index)
             for path in NOTEBOOKS for index, cell in enumerate(_code_cells(path))
             if re.search(r"\bmyst_nb\b", cell.source)]
    assert found == []


# --- a fresh environment ---------------------------------------------------------------------

RUNNER = r'''
"""Execute one notebook in this interpreter's Jupyter kernel; print one JSON line."""
import json, sys, time
import nbformat
from nbclient import NotebookClient

path, workdir, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3])
nb = nbformat.read(path, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell(
    "import json, sys, mha_lit\n"
    "print(json.dumps({'executable': sys.executable, 'mha_lit': mha_lit.__file__,"
    " 'myst_nb': 'myst_nb' in sys.modules}))"))
client = NotebookClient(nb, timeout=timeout, kernel_name=nb.metadata.kernelspec.name,
                        resources={"metadata": {"path": workdir}})
start = time.perf_counter()
try:
    client.execute()
except Exception as error:  # CellExecutionError, CellTimeoutError, DeadKernelError
    print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
    sys.exit(1)
probe = json.loads(nb.cells[-1].outputs[0].text)
print(json.dumps(dict(probe, seconds=time.perf_counter() - start)))
'''


def _bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


def _run(args, env, cwd, timeout) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    """A new venv with nbclient and ipykernel only, its environment variables and folders."""
    base = tmp_path_factory.mktemp("fresh")
    venv, workdir, source = base / "venv", base / "work", base / "source"
    workdir.mkdir()
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_COPIED))
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV",
                          "MPLBACKEND", "JUPYTER_PATH", "JUPYTER_RUNTIME_DIR")}
    env.update(PATH=f"{_bin(venv, 'python').parent}{os.pathsep}{env.get('PATH', '')}",
               VIRTUAL_ENV=str(venv), MHA_LIT_SOURCE=str(source),
               JUPYTER_CONFIG_DIR=str(base / "jupyter-config"),
               JUPYTER_DATA_DIR=str(base / "jupyter-data"), IPYTHONDIR=str(base / "ipython"))
    base_python = getattr(sys, "_base_executable", sys.executable)
    made = _run([base_python, "-m", "venv", venv], env, workdir, 300)
    if made.returncode != 0:
        book_pages.cannot_run("fresh-environment test",
                              f"python -m venv failed: {_tail(made.stderr, 3)}")
    python = _bin(venv, "python")
    pip = _run([python, "-m", "pip", "install", "--quiet", "nbclient", "ipykernel"],
               env, workdir, 900)
    if pip.returncode != 0:
        book_pages.cannot_run("fresh-environment test",
                              f"pip cannot install nbclient and ipykernel: {_tail(pip.stderr, 3)}")
    missing = _run([python, "-c",
                    "import importlib\n"
                    "for name in ('mha_lit', 'myst_nb'):\n"
                    "    try:\n"
                    "        importlib.import_module(name)\n"
                    "    except ImportError:\n"
                    "        continue\n"
                    "    print(name)\n"], env, workdir, 60)
    assert missing.returncode == 0, missing.stderr
    assert missing.stdout.split() == [], f"the fresh environment can import {missing.stdout.split()}"
    runner = base / "run_notebook.py"
    runner.write_text(RUNNER)
    return {"venv": venv, "python": python, "env": env, "workdir": workdir, "runner": runner}


@pytest.mark.parametrize("notebook", RUN)
def test_notebook_runs_in_a_fresh_environment(fresh, notebook):
    done = _run([fresh["python"], fresh["runner"], ROOT / notebook, fresh["workdir"],
                 CELL_TIMEOUT], fresh["env"], fresh["workdir"], 60 * 60)
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"{notebook}: the runner printed no result\n{_tail(done.stderr, 30)}")
    if "error" in result:
        error = re.sub(r"\x1b\[[0-9;]*m", "", result["error"])  # the traceback's colours
        pytest.fail(f"{notebook} fails in a fresh environment:\n{error}", pytrace=False)
    assert done.returncode == 0, done.stderr
    venv = Path(os.path.abspath(fresh["venv"]))  # not resolved: its python links to the base one
    assert venv in Path(os.path.abspath(result["executable"])).parents, result
    installed = Path(os.path.abspath(result["mha_lit"]))
    assert venv in installed.parents and "site-packages" in installed.parts, result
    assert not result["myst_nb"], result
    print(f"{notebook}: {result['seconds']:.1f} s in a fresh kernel")
