"""Every reader's machine: the book's stored results must not depend on the last bits of rounding.

Another CPU runs another BLAS kernel (and another NumPy SIMD loop), which sums in another
order; a product can then round differently in its last bits, and differently again when a
matrix gains a row. Strict nbval on one machine cannot see a stored output or an ``assert``
that depends on those bits. Two guards can:

1. ``test_notebook_reproduces_when_products_sum_in_another_order`` re-executes every notebook
   of ``_toc.yml`` (one test per notebook, so pytest-xdist spreads them over its workers) in a
   Jupyter kernel that loads ``reorder_sums``: every ``@`` in the cells
   and in ``mha_lit`` sums in another order, chosen by the shapes and the line of code (see
   that module), and, on a CPU with AVX-512, NumPy's own vectorised functions (``exp``, for
   one) run their AVX2 versions, as on most laptops. Every cell must still run, every ``assert`` hold and every stored output match.
2. ``test_no_stored_output_shows_rounding_noise`` reads the stored outputs: no number of
   rounding size (a difference of 1e-17) and no "bit for bit" claim about a computed value.

The OpenBLAS environment variables are left as the machine sets them. Every test here is
marked `book`: ``-m "not book"`` leaves the guard out.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import book_pages
import numpy as np
import pytest
import reorder_sums
from reorder_sums import matmul_in_another_order, split_point

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
KERNEL = "reorder-sums"


def _toc_notebooks() -> list[Path]:
    """The notebooks _toc.yml lists, found by the root conftest (the one nbval collects with)."""
    return sorted(book_pages.BOOK.TOC_NOTEBOOKS)


TOC_NOTEBOOKS = _toc_notebooks()
pytestmark = pytest.mark.book

SHAPES = [(3, 5, 7), (4, 5, 7), (2, 11, 3), (13, 22, 5), (1, 17, 19)]


# --- the reordering itself -------------------------------------------------------------------


@pytest.mark.parametrize("m, k, n", SHAPES)
def test_reordered_product_is_the_same_product_to_rounding(m, k, n):
    rng = np.random.default_rng(m * k * n)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    assert np.allclose(matmul_in_another_order(a, b), a @ b, rtol=0, atol=1e-13)
    assert np.allclose(matmul_in_another_order(a, b[:, 0]), a @ b[:, 0], rtol=0, atol=1e-13)
    stack = rng.standard_normal((2, m, k))  # a batch of two, like two heads
    assert np.allclose(matmul_in_another_order(stack, b), stack @ b, rtol=0, atol=1e-13)


def test_reordered_product_moves_last_bits():
    """The guard perturbs for real: some entries of a random product round differently."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((64, 11)), rng.standard_normal((11, 13))
    assert not np.array_equal(matmul_in_another_order(a, b), a @ b)


def test_gaining_a_row_moves_the_split_and_the_bits():
    """As under a BLAS kernel chosen by shape: the first 39 rows of a 40-row product differ."""
    assert split_point(3, 7, 5) != split_point(4, 7, 5)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((40, 7)), rng.standard_normal((7, 5))
    assert not np.array_equal(matmul_in_another_order(a[:39], b), matmul_in_another_order(a, b)[:39])


def test_exact_products_stay_exact():
    """Sums of small integers and one-hot selections are exact in every order."""
    rng = np.random.default_rng(5)
    a = rng.integers(-50, 50, (6, 13)).astype(float)
    b = rng.integers(-50, 50, (13, 7)).astype(float)
    assert np.array_equal(matmul_in_another_order(a, b), a.astype(int) @ b.astype(int))
    one_hot = np.eye(13)[[4, 0, 12]]  # (3, 13)
    table = rng.standard_normal((13, 5))
    assert np.array_equal(matmul_in_another_order(one_hot, table), table[[4, 0, 12]])


def test_same_shapes_and_code_repeat_themselves_other_code_does_not():
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((30, 22)), rng.standard_normal((22, 5))
    once = matmul_in_another_order(a, b, site=17)
    assert np.array_equal(once, matmul_in_another_order(a.copy(), b.copy(), site=17))
    assert split_point(30, 22, 5, site=17) != split_point(30, 22, 5, site=18)
    assert not np.array_equal(once, matmul_in_another_order(a, b, site=18))


def test_short_sums_meet_every_way_of_adding_three_terms():
    """3 terms can be added in 3 ways ((p+q)+r, (p+r)+q, (q+r)+p); 2 split points reach only 2.

    Rotating the terms before the split reaches all 3.
    """
    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((200, 3)), rng.standard_normal((3, 9))
    results = {matmul_in_another_order(a, b, site=site).tobytes() for site in range(12)}
    assert len(results) == 3
    for site in range(12):
        assert np.allclose(matmul_in_another_order(a, b, site=site), a @ b, rtol=0, atol=1e-13)


def test_cells_and_modules_are_rewritten_with_their_own_sites():
    tree = reorder_sums.rewrite(ast.parse("Y = X @ W\nZ = X @ W"), "<cell 0>")
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert [c.func.id for c in calls] == [reorder_sums.CALL_NAME] * 2
    sites = [c.args[2].value for c in calls]
    assert sites[0] != sites[1]  # two lines, two places
    again = reorder_sums.rewrite(ast.parse("Y = X @ W\nZ = X @ W"), "<cell 0>")
    assert [c.args[2].value for c in ast.walk(again) if isinstance(c, ast.Call)] == sites


def test_other_operands_are_multiplied_as_usual():
    ints = np.arange(12).reshape(3, 4)
    assert np.array_equal(matmul_in_another_order(ints, ints.T), ints @ ints.T)
    with pytest.raises(ValueError, match="matmul"):
        matmul_in_another_order(np.ones((3, 5)), np.ones((7, 2)))


# --- guard 1: the notebooks, executed with products that sum in another order ---------------


def _avx512_features() -> list[str]:
    """NumPy's AVX-512 dispatch targets this CPU has: disabling them selects the AVX2 loops."""
    from numpy._core._multiarray_umath import (
        __cpu_dispatch__,
        __cpu_features__,
    )

    return [f for f in __cpu_dispatch__
            if (f.startswith("AVX512") or f == "X86_V4") and __cpu_features__.get(f)]


def _write_kernel_spec(jupyter_path: Path) -> None:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    if features := _avx512_features():
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(features)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--IPKernelApp.extensions=reorder_sums"],
        "display_name": "Python 3 (products summed in another order)",
        "language": "python",
        "env": env,
    }
    folder = jupyter_path / "kernels" / KERNEL
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))


def test_the_guard_covers_every_notebook_of_the_toc():
    pages = {ROOT / f"{page}.ipynb" for page in book_pages.toc_pages()}
    assert TOC_NOTEBOOKS, "no notebook found in _toc.yml"
    assert set(TOC_NOTEBOOKS) == {page for page in pages if page.exists()}


@pytest.mark.parametrize("path", TOC_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_reproduces_when_products_sum_in_another_order(path, tmp_path):
    _write_kernel_spec(tmp_path)
    env = dict(os.environ)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("JUPYTER_PATH")]))
    command = [
        sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider",
        "-p", "no:xdist", "--nbval", "--nbval-kernel-name", KERNEL,
        "--nbval-sanitize-with", "book/nbval_sanitize.cfg",
        "-q", "--no-header", "-rf", "--color=no", str(path.relative_to(ROOT)),
    ]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    report = (run.stdout + run.stderr)[-12000:]
    assert run.returncode == 0, (
        f"{path.name}: a stored output or an assert depends on the order in which products sum "
        "(as it differs between CPUs):\n" + report)
    cells = sum(1 for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    assert re.search(rf"\b{cells} passed\b", run.stdout), report


# --- guard 2: no rounding noise in what the book stores -------------------------------------

# A number in e-notation: its mantissa and exponent.
E_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([-+]?\d+)\b")


def _output_texts(path: Path):
    """(cell index, text) of every text an executed cell stored: prints, values, glue."""
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        for output in cell.get("outputs", []):
            if output["output_type"] == "stream":
                yield index, "".join(output["text"])
            for mime, data in output.get("data", {}).items():
                # text/plain, text/latex, ..., and glue: application/papermill.record/text/plain
                if mime.startswith("text/") or "/text/" in mime:
                    yield index, data if isinstance(data, str) else "".join(data)


def noise_in(text: str) -> list[str]:
    """Numbers of rounding size, and bitwise claims, in a stored output.

    Rounding size: below 1e-13 (no bound a float64 computation on numbers near 1 can
    promise), or below 1e-6 and not a plain power of ten such as the bound 1e-8, or a 0 in
    e-notation (a difference printed as 0.0e+00 claims agreement to the last bit).
    """
    found = []
    for match in E_NUMBER.finditer(text):
        mantissa, exponent = float(match[1]), int(match[2])
        value = mantissa * 10.0**exponent
        if value == 0 or value < 1e-13 or (value < 1e-6 and mantissa != 1):
            found.append(match[0])
    found += re.findall(r"bit for bit|bit-for-bit|bitwise", text, flags=re.IGNORECASE)
    return found


def test_noise_detector_finds_the_old_defects():
    assert noise_in("'to within 8.3e-17'") == ["8.3e-17"]
    assert noise_in("'exactly, bit for bit'") == ["bit for bit"]
    assert noise_in("'2e-16'") == ["2e-16"] and noise_in("'1e-16'") == ["1e-16"]
    assert noise_in("largest difference: 0.0e+00") == ["0.0e+00"]
    assert noise_in("error 3.1E-07") == ["3.1E-07"]
    assert noise_in("below 1e-12: True; eps = 1e-06; 2.5e-3 of a second") == []


@pytest.mark.parametrize("path", TOC_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_stored_output_shows_rounding_noise(path):
    noisy = [(index, noise) for index, text in _output_texts(path) for noise in noise_in(text)]
    assert not noisy, f"{path.name}: outputs that show rounding noise (cell, text): {noisy}"
