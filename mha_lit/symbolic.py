"""Exact, symbolic versions of the book's products, with SymPy.

Book: Part I, chapter 1 "A linear-algebra refresher" (matrix, product_entry), chapter 3
"Q, K, V" (qk_transpose). With the book's primes every entry of Q K^T is a sum of exactly
7 products, and a wrong shape fails loudly instead of broadcasting.
"""

from __future__ import annotations

import sympy as sp

from .shapes import Dims

__all__ = ["matrix", "qk_transpose"]


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
