"""Exact, symbolic versions of the book's products, with SymPy.

Book: Part I, chapter 1 "A linear-algebra refresher" (matrix, product_entry), chapter 3
"Q, K, V" (qk_transpose). With the book's primes every entry of Q K^T is a sum of exactly
7 products, and a wrong shape fails loudly instead of broadcasting.
"""

from __future__ import annotations

import sympy as sp

from .shapes import Dims

__all__ = ["matrix", "qk_transpose", "product_entry", "causal_mask", "softmax"]


def matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    """A rows x cols matrix of symbols name_{i,j}, counted from 1. Book: chapter 1."""
    if rows <= 0 or cols <= 0:
        raise ValueError(f"matrix {name} needs positive sizes, got {rows} x {cols}")
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{{{i + 1},{j + 1}}}"))


def qk_transpose(dims: Dims | None = None) -> sp.Matrix:
    """Q K^T with Q, K of symbols q_{i,a}, k_{j,a}: a (tokens x tokens) Matrix. Book: chapter 3.

    Entry (i, j) is the inner product of query row i and key row j: the sum over a = 1..d_k
    of q_{i,a} k_{j,a}.
    """
    dims = Dims() if dims is None else dims
    Q = matrix("q", dims.tokens, dims.d_k)  # (n, d_k)
    K = matrix("k", dims.tokens, dims.d_k)  # (n, d_k)
    return Q * K.T  # (n, d_k) (d_k, n) -> (n, n)


def product_entry(A: sp.Matrix, B: sp.Matrix, x: int, y: int) -> sp.Expr:
    """Entry R_xy of R = A B: row x of A times column y of B, counted from 1. Book: chapter 1.

    The result is the sum over k of A_{x,k} B_{k,y}: as many products as A has columns.
    """
    (a, b), (b2, c) = A.shape, B.shape
    if b != b2:
        raise ValueError(f"A is {a} x {b} and B is {b2} x {c}: A B needs A's {b} columns "
                         f"to match B's {b2} rows")
    if not (1 <= x <= a and 1 <= y <= c):
        raise ValueError(f"R = A B is {a} x {c}; entry ({x}, {y}) does not exist")
    return sp.Add(*(A[x - 1, k] * B[k, y - 1] for k in range(b)))  # b products


def causal_mask(M: sp.Matrix) -> sp.Matrix:
    """M with its strictly upper triangle set to -oo. Book: chapter 3, "The causal mask"."""
    return sp.Matrix(*M.shape, lambda i, j: -sp.oo if j > i else M[i, j])  # (n, m)


def softmax(M: sp.Matrix) -> sp.Matrix:
    """Exact row-wise softmax of a SymPy matrix; -oo becomes 0. Book: chapter 3, "Softmax".

    Entry (i, j) is exp(M_ij) / sum_k exp(M_ik), left unevaluated, so e^4 / (e^4 + e^5)
    stays readable. A row that is entirely -oo has no distribution and is refused.
    """
    E = M.applyfunc(sp.exp)  # (n, m), exp(-oo) = 0
    for i in range(E.rows):
        if all(e == 0 for e in E.row(i)):
            raise ValueError(f"row {i + 1} of the {M.rows} x {M.cols} matrix is entirely -oo")
    return sp.Matrix(*M.shape, lambda i, j: E[i, j] / sum(E.row(i)))  # (n, m), rows sum to 1
