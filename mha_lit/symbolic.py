"""Exact, symbolic versions of the book's products, with SymPy.

Book: Part I, chapter 1 "A linear-algebra refresher" (matrix,
product_entry), chapter 3 "Q, K, V" (qk_transpose). With the book's primes
every entry of Q K^T is a sum of exactly 7 products, and a wrong shape
fails loudly instead of broadcasting.
"""

from __future__ import annotations

import sympy as sp

from .shapes import Dims

__all__ = ["matrix", "qk_transpose", "product_entry", "causal_mask",
           "softmax", "weight_matrices", "multi_head_output", "output_rows",
           "depends_on"]


def matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    """A rows x cols matrix of symbols name_{i,j}, counted from 1.

    Book: chapter 1.
    """
    if rows <= 0 or cols <= 0:
        raise ValueError(
            f"matrix {name} needs positive sizes, got {rows} x {cols}")
    return sp.Matrix(rows, cols,
                     lambda i, j: sp.Symbol(f"{name}_{{{i + 1},{j + 1}}}"))


def qk_transpose(dims: Dims | None = None) -> sp.Matrix:
    """Q K^T with Q, K of symbols q_{i,a}, k_{j,a}. Book: chapter 3.

    The result is a (tokens x tokens) Matrix. Entry (i, j) is the inner
    product of query row i and key row j: the sum over a = 1..d_k of
    q_{i,a} k_{j,a}.
    """
    dims = Dims() if dims is None else dims
    Q = matrix("q", dims.tokens, dims.d_k)  # (n, d_k)
    K = matrix("k", dims.tokens, dims.d_k)  # (n, d_k)
    return Q * K.T  # (n, d_k) (d_k, n) -> (n, n)


def product_entry(A: sp.Matrix, B: sp.Matrix, x: int, y: int) -> sp.Expr:
    """Entry R_xy of R = A B: row x of A times column y of B.

    Book: chapter 1. Rows and columns are counted from 1. The result is
    the sum over k of A_{x,k} B_{k,y}: as many products as A has columns.
    """
    (a, b), (b2, c) = A.shape, B.shape
    if b != b2:
        raise ValueError(f"A is {a} x {b} and B is {b2} x {c}: "
                         f"A B needs A's {b} columns to match B's {b2} rows")
    if not (1 <= x <= a and 1 <= y <= c):
        raise ValueError(
            f"R = A B is {a} x {c}; entry ({x}, {y}) does not exist")
    # b products
    return sp.Add(*(A[x - 1, k] * B[k, y - 1] for k in range(b)))


def causal_mask(M: sp.Matrix) -> sp.Matrix:
    """M with its strictly upper triangle set to -oo.

    Book: chapter 3, "The causal mask".
    """
    return sp.Matrix(*M.shape,
                     lambda i, j: -sp.oo if j > i else M[i, j])  # (n, m)


def softmax(M: sp.Matrix) -> sp.Matrix:
    """Exact row-wise softmax of a SymPy matrix; -oo becomes 0.

    Book: chapter 3, "Softmax". Entry (i, j) is exp(M_ij) / sum_k
    exp(M_ik), left unevaluated, so e^4 / (e^4 + e^5) stays readable. A
    row that is entirely -oo has no distribution and is refused.
    """
    E = M.applyfunc(sp.exp)  # (n, m), exp(-oo) = 0
    for i in range(E.rows):
        if all(e == 0 for e in E.row(i)):
            raise ValueError(f"row {i + 1} of the {M.rows} x {M.cols} "
                             "matrix is entirely -oo")
    # (n, m), rows sum to 1
    return sp.Matrix(*M.shape, lambda i, j: E[i, j] / sum(E.row(i)))


# --- Part I, chapter 6: how outputs depend on inputs -----------------------


def weight_matrices(dims: Dims | None = None) -> tuple[sp.Matrix, ...]:
    """W = (W_Q1, W_K1, W_V1, ..., W_Qh, W_Kh, W_Vh, W_O) as symbol matrices.

    Book: chapter 6. With the book's two heads that is seven matrices: six
    of 5 x 7 or 5 x 11, then W_O 22 x 5. Entries are named like
    ``W^{Q1}_{2,3}`` (row 2, column 3 of W_Q1).
    """
    dims = Dims() if dims is None else dims
    W = []
    for i in range(1, dims.heads + 1):
        W.append(matrix(f"W^{{Q{i}}}",
                        dims.d_model, dims.d_k))  # (d_model, d_k)
        W.append(matrix(f"W^{{K{i}}}",
                        dims.d_model, dims.d_k))  # (d_model, d_k)
        W.append(matrix(f"W^{{V{i}}}",
                        dims.d_model, dims.d_v))  # (d_model, d_v)
    W.append(matrix("W^{O}", dims.concat, dims.d_model))  # (h*d_v, d_model)
    return tuple(W)


def multi_head_output(X: sp.Matrix, W: tuple[sp.Matrix, ...]) -> sp.Matrix:
    """Y = Concat(H_1, ..., H_h) W_O, exactly, for symbolic X and W.

    Book: chapter 6. W is ordered as ``weight_matrices`` returns it. The
    mask and softmax are this module's ``causal_mask`` (scores above the
    diagonal become -oo) and ``softmax`` (exp(-oo) = 0 exactly); nothing
    else about causality is built in.
    """
    *per_head, W_O = W
    if len(per_head) % 3 or X.shape[1] != per_head[0].shape[0]:
        raise ValueError(
            "W must be (W_Q1, W_K1, W_V1, ..., W_O) and X must have "
            f"{per_head[0].shape[0]} columns; "
            f"got {len(W)} matrices, X {X.shape}")
    H = []
    for W_Qi, W_Ki, W_Vi in zip(per_head[0::3], per_head[1::3],
                                per_head[2::3], strict=False):
        # (n, d_k), (n, d_k), (n, d_v)
        Q, K, V = X * W_Qi, X * W_Ki, X * W_Vi
        scores = Q * K.T / sp.sqrt(W_Qi.shape[1])  # (n, n)
        # zero above the diagonal, rows sum to 1
        S = softmax(causal_mask(scores))  # (n, n)
        H.append(S * V)  # (n, d_v)
    # (n, h*d_v) (h*d_v, d_model) -> (n, d_model)
    return sp.Matrix.hstack(*H) * W_O


def output_rows(dims: Dims | None = None
                ) -> tuple[sp.Matrix, sp.Matrix, tuple[sp.Matrix, ...]]:
    """(Y, X, W): the layer's output for a symbol matrix X (entries x_{i,j}).

    Book: chapter 6. Y and X are (tokens x d_model); W is
    ``weight_matrices(dims)``. Row i of Y is the book's
    Y_i = f_i(X_1, ..., X_i; W).
    """
    dims = Dims() if dims is None else dims
    X = matrix("x", dims.tokens, dims.d_model)  # (n, d_model)
    W = weight_matrices(dims)
    return multi_head_output(X, W), X, W


def depends_on(Y: sp.Matrix, X: sp.Matrix) -> list[list[bool]]:
    """Pattern D: D[i][j] True iff some entry of Y's row i holds X's row j.

    Book: chapter 6. An entry free of every symbol of X_j has derivative
    exactly 0 with respect to all of them.
    """
    if Y.shape[0] != X.shape[0]:
        raise ValueError(f"Y has {Y.shape[0]} rows but X has {X.shape[0]}; "
                         "need one output row per input row")
    used = [set().union(*(y.free_symbols for y in Y.row(i)))
            for i in range(Y.shape[0])]
    return [[bool(used[i] & set(X.row(j))) for j in range(X.shape[0])]
            for i in range(Y.shape[0])]
