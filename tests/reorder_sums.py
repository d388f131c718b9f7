"""Run the book's code as if on another CPU: every ``@`` sums in another order.

A BLAS library picks its kernel by CPU and blocks its sums by the shapes it is given, so one
product can round differently on a reader's machine, or when a matrix gains a row. A stored
output or an ``assert`` that depends on those last bits passes where the outputs were written
and fails elsewhere. This module makes such a dependence fail here.

Loaded into a Jupyter kernel as an IPython extension (``--IPKernelApp.extensions=reorder_sums``),
it rewrites every ``a @ b`` in the notebook's cells, and in every ``mha_lit`` module the kernel
imports, into ``matmul_in_another_order(a, b, site)``: the same product with the sum over the
shared axis split in two at a point chosen from the operands' shapes and from ``site``, a
number that names the line of code the product is written on. Mathematically nothing
changes; in floating point the association of the sum does, so last bits move as they would
under another kernel. A product whose sums are exact (small integers, one-hot selections, a
zero weight times a finite number) is exact in every order and is unchanged. The same line
of code on the same shapes always splits at the same point, so a computation repeated with
the same code and sizes still repeats itself, as it does with the BLAS inside NumPy's
packages; two different code paths (a batched product and a loop over heads, say) split
differently, so an exact comparison between them fails here as it may on a reader's machine.

Not rewritten: ``np.einsum``, ``np.dot`` and other product functions (the book uses ``@``),
and NumPy's reductions such as ``sum``, whose pairwise order is the same on every CPU.

``tests/test_reader_machines.py`` re-executes every notebook of the book in such a kernel and
compares each cell's outputs with the stored ones (strict nbval).
"""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import sys
import tracemalloc
import zlib

import numpy as np

CALL_NAME = "__matmul_in_another_order__"
SHORT = 8  # sums this short also have their terms rotated: more orders to choose from
PACKAGE = "mha_lit"


def split_point(m: int, k: int, n: int, site: int = 0) -> int:
    """Where the sum over k >= 2 terms is split, for an (m, k) @ (k, n) product: 1 .. k-1.

    Adding a row (m + 1) or a column (n + 1) moves the split point, as a change of shape can
    change a BLAS kernel's choice; so does another line of code (``site``) when k > 2.
    """
    return 1 + (m + n + site) % (k - 1)


def matmul_in_another_order(a, b, site: int = 0):
    """``a @ b``, with the sum over the shared axis split in two by ``split_point``.

    A short sum (k <= SHORT terms) also has its terms rotated first, by a number of places
    chosen like the split point, so that two different lines of code are more likely to add
    in different orders (for three terms, all three ways of adding them are reached).

    Anything that is not a pair of floating NumPy arrays (SymPy matrices, integer arrays) is
    multiplied as usual, and so is a pair whose shapes do not fit, so that NumPy raises its own
    error. An ndarray subclass (chapter 10's tracked arrays) still sees its one ``@``, and the
    product it returns then holds the reordered values, as the plain arrays would. While
    ``tracemalloc`` traces (a cell measuring peak memory), products are left as they are: the
    split would add temporaries that the measured code does not allocate.
    """
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return a @ b
    if tracemalloc.is_tracing():
        return a @ b
    if type(a) is not np.ndarray or type(b) is not np.ndarray:
        product = a @ b  # the subclass's own bookkeeping
        if isinstance(product, np.ndarray):
            product.view(np.ndarray)[...] = matmul_in_another_order(
                np.asarray(a), np.asarray(b), site)
        return product
    if a.ndim == 0 or b.ndim == 0 or not (
            a.dtype.kind in "fc" or b.dtype.kind in "fc"):
        return a @ b
    k = a.shape[-1]
    b_k = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k != b_k or k < 2:
        return a @ b
    m = a.shape[-2] if a.ndim >= 2 else 1
    n = b.shape[-1] if b.ndim >= 2 else 1
    s = split_point(m, k, n, site)
    if k <= SHORT:  # few split points: also rotate the order of the terms
        turn = ((m + n + site) // (k - 1)) % k
        order = np.roll(np.arange(k), -turn)
        a = a[..., order]
        b = b[order] if b.ndim == 1 else b[..., order, :]
    if b.ndim == 1:
        head, tail = b[:s], b[s:]
    else:
        head, tail = b[..., :s, :], b[..., s:, :]
    return a[..., :s] @ head + a[..., s:] @ tail


class _MatmulToCall(ast.NodeTransformer):
    """``a @ b`` becomes ``__matmul_in_another_order__(a, b, site)``; ``a @= b`` likewise.

    ``site`` names the place in the source: a number made from the file's name, the line and
    the column of the product, the same every time that code runs.
    """

    def __init__(self, filename: str):
        self.filename = filename

    def _call(self, node: ast.AST, left: ast.expr, right: ast.expr) -> ast.Call:
        name = f"{self.filename}:{node.lineno}:{node.col_offset}"
        site = zlib.crc32(name.encode()) % 1009  # stable across runs, unlike hash()
        return ast.Call(ast.Name(CALL_NAME, ast.Load()), [left, right, ast.Constant(site)], [])

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.op, ast.MatMult):
            return node
        return ast.copy_location(self._call(node, node.left, node.right), node)

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.op, ast.MatMult) or not isinstance(node.target, ast.Name):
            return node  # a[i] @= b: rare; left to NumPy
        load = ast.Name(node.target.id, ast.Load())
        call = self._call(node, load, node.value)
        return ast.copy_location(ast.Assign([node.target], call), node)


def rewrite(tree: ast.AST, filename: str = "<cell>") -> ast.AST:
    """The tree with every ``@`` routed through ``matmul_in_another_order``."""
    return ast.fix_missing_locations(_MatmulToCall(filename).visit(tree))


class _RewritingLoader(importlib.machinery.SourceFileLoader):
    """Loads a module from its source with the products rewritten; never reads or writes .pyc."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        tree = rewrite(ast.parse(self.get_data(path), path), path)
        return compile(tree, path, "exec", dont_inherit=True)


class _PackageFinder(importlib.abc.MetaPathFinder):
    """Finds ``mha_lit`` and its modules as usual, then hands them to the rewriting loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.origin is None or not spec.origin.endswith(".py"):
            return spec
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=_RewritingLoader(fullname, spec.origin),
            submodule_search_locations=spec.submodule_search_locations)


def install() -> None:
    """Route every product of ``mha_lit`` (imported from now on) through the reordering."""
    if any(module == PACKAGE or module.startswith(PACKAGE + ".") for module in sys.modules):
        raise RuntimeError(f"{PACKAGE} is already imported; install the reordering first")
    setattr(builtins, CALL_NAME, matmul_in_another_order)
    if not any(isinstance(f, _PackageFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PackageFinder())


class _CellTransformer(ast.NodeTransformer):
    """IPython's hook for rewriting each cell's syntax tree before it runs."""

    def __init__(self):
        self.cells = itertools.count()  # each cell is a place of its own

    def visit_Module(self, node: ast.Module) -> ast.AST:
        return rewrite(node, f"<cell {next(self.cells)}>")


def load_ipython_extension(ipython) -> None:
    """IPython entry point: rewrite the cells' products and mha_lit's."""
    install()
    ipython.ast_transformers.append(_CellTransformer())
