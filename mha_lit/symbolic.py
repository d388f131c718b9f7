"""Exact, symbolic versions of the book's products, with SymPy.

Book: Part I, chapter 1 "A linear-algebra refresher" (matrix,
product_entry), chapter 3 "Q, K, V" (qk_transpose). With the book's primes
every entry of Q K^T is a sum of exactly 7 products, and a wrong shape
fails loudly instead of broadcasting. Chapter 19 "The backward pass of
attention" differentiates with them (pairing, gradient) and opts in to
symbols for the biases of chapter 8 "GPT-2's block, exactly"
(bias_vectors, ``b`` of multi_head_output).
"""

from __future__ import annotations

import sympy as sp

from .checks import positive_int
from .shapes import Dims

__all__ = ["matrix", "qk_transpose", "product_entry", "causal_mask",
           "softmax", "weight_matrices", "bias_vectors", "multi_head_output",
           "output_rows", "depends_on", "pairing", "gradient",
           "gradient_matrix"]


def matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    """A rows x cols matrix of symbols name_{x,y} (row x, column y), from 1.

    Book: chapter 1.
    """
    rows = positive_int(rows, f"the rows of matrix {name}")
    cols = positive_int(cols, f"the columns of matrix {name}")
    return sp.Matrix(rows, cols,
                     lambda i, j: sp.Symbol(f"{name}_{{{i + 1},{j + 1}}}"))


def gradient_matrix(name: str, rows: int, cols: int) -> sp.Matrix:
    """Symbols for any gradient dA: entries \\mathrm{d}name_{x,y}, from 1.

    Book: chapter 19, "A gradient has the shape of its matrix". The
    entries print with an upright d, as the book writes a gradient:
    ``gradient_matrix("r", 3, 7)`` holds dr_{1,1} .. dr_{3,7}.
    """
    return matrix(r"\mathrm{d}" + name, rows, cols)


def qk_transpose(dims: Dims | None = None) -> sp.Matrix:
    """Q K^T with Q, K of symbols q_{t,r}, k_{u,r}. Book: chapter 3.

    The result is a (tokens x tokens) Matrix. Entry (t, u) is the inner
    product of query row t and key row u: the sum over r = 1..d_k of
    q_{t,r} k_{u,r}.
    """
    dims = Dims() if dims is None else dims
    Q = matrix("q", dims.tokens, dims.d_k)  # (n, d_k)
    K = matrix("k", dims.tokens, dims.d_k)  # (n, d_k)
    return Q * K.T  # (n, d_k) (d_k, n) -> (n, n)


def product_entry(A: sp.Matrix, C: sp.Matrix, x: int, y: int) -> sp.Expr:
    """Entry R_xy of R = A C: row x of A times column y of C.

    Book: chapter 1. Rows and columns are counted from 1. The result is
    the sum over k of A_{x,k} C_{k,y}: as many products as A has columns.
    """
    (a, b), (b2, c) = A.shape, C.shape
    if b != b2:
        raise ValueError(f"A is {a} x {b} and C is {b2} x {c}: "
                         f"A C needs A's {b} columns to match C's {b2} rows")
    if not (1 <= x <= a and 1 <= y <= c):
        raise ValueError(
            f"R = A C is {a} x {c}; entry ({x}, {y}) does not exist")
    # b products
    return sp.Add(*(A[x - 1, k] * C[k, y - 1] for k in range(b)))


def causal_mask(Z: sp.Matrix) -> sp.Matrix:
    """Scores Z with their strictly upper triangle set to -oo.

    Book: chapter 3, "The causal mask" (eq-mask).
    """
    return sp.Matrix(*Z.shape,
                     lambda i, j: -sp.oo if j > i else Z[i, j])  # (n, m)


def softmax(M: sp.Matrix) -> sp.Matrix:
    """Exact row-wise softmax of a SymPy matrix; -oo becomes 0.

    Book: chapter 3, "Softmax". Entry (t, u) is exp(M_tu) / sum_u'
    exp(M_tu'), left unevaluated, so e^4 / (e^4 + e^5) stays readable. A
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


def bias_vectors(dims: Dims | None = None) -> tuple[sp.Matrix, ...]:
    """b = (b_Q1, b_K1, b_V1, ..., b_Qh, b_Kh, b_Vh, b_O) as symbol rows.

    Book: chapter 19 (the biases of chapter 8). Ordered like
    ``weight_matrices``; each is a 1 x width Matrix (1 x d_k, 1 x d_v, and
    1 x d_model for b_O) with entries named like ``b^{Q1}_{3}``.
    """
    dims = Dims() if dims is None else dims
    b = []
    for i in range(1, dims.heads + 1):
        b.append(_row(f"b^{{Q{i}}}", dims.d_k))  # (1, d_k)
        b.append(_row(f"b^{{K{i}}}", dims.d_k))  # (1, d_k)
        b.append(_row(f"b^{{V{i}}}", dims.d_v))  # (1, d_v)
    b.append(_row("b^{O}", dims.d_model))  # (1, d_model)
    return tuple(b)


def _row(name: str, cols: int) -> sp.Matrix:
    """A 1 x cols matrix of symbols name_{j}, counted from 1."""
    return sp.Matrix(1, cols, lambda _, j: sp.Symbol(
        f"{name}_{{{j + 1}}}"))  # (1, cols)


def _plus_row(M: sp.Matrix, b: sp.Matrix) -> sp.Matrix:
    """M with the row b added to each of its rows (SymPy cannot broadcast)."""
    if b.shape != (1, M.cols):
        raise ValueError(f"a bias added to the rows of a {M.rows} x "
                         f"{M.cols} matrix must be 1 x {M.cols}, got "
                         f"{b.rows} x {b.cols}")
    return M + sp.ones(M.rows, 1) * b  # (n, 1) (1, w) -> (n, w)


def multi_head_output(X: sp.Matrix, W: tuple[sp.Matrix, ...],
                      b: tuple[sp.Matrix, ...] | None = None) -> sp.Matrix:
    """Y = Concat(H_1, ..., H_h) W_O, exactly, for symbolic X and W.

    Book: chapter 6. W is ordered as ``weight_matrices`` returns it. The
    mask and softmax are this module's ``causal_mask`` (scores above the
    diagonal become -oo) and ``softmax`` (exp(-oo) = 0 exactly); nothing
    else about causality is built in. Optional ``b``, ordered as
    ``bias_vectors`` returns it, adds GPT-2's biases: Q_i = X W_Qi + b_Qi,
    ..., Y = Concat W_O + b_O (chapter 8, "GPT-2's block, exactly").
    """
    *per_head, W_O = W
    if len(per_head) % 3 or X.shape[1] != per_head[0].shape[0]:
        raise ValueError(
            "W must be (W_Q1, W_K1, W_V1, ..., W_O) and X must have "
            f"{per_head[0].shape[0]} columns; "
            f"got {len(W)} matrices, X {X.shape}")
    if b is not None and len(b) != len(W):
        raise ValueError(f"b must hold one bias per matrix of W: W has "
                         f"{len(W)} matrices, b has {len(b)} vectors")
    H = []
    for i, (W_Qi, W_Ki, W_Vi) in enumerate(zip(per_head[0::3], per_head[1::3],
                                               per_head[2::3], strict=False)):
        # (n, d_k), (n, d_k), (n, d_v)
        Q, K, V = X * W_Qi, X * W_Ki, X * W_Vi
        if b is not None:  # chapter 8: one bias row added to every row
            # (1, d_k), (1, d_k), (1, d_v)
            b_Qi, b_Ki, b_Vi = b[3 * i: 3 * i + 3]
            Q, K, V = (_plus_row(Q, b_Qi), _plus_row(K, b_Ki),
                       _plus_row(V, b_Vi))  # shapes unchanged
        scores = Q * K.T / sp.sqrt(W_Qi.shape[1])  # (n, n)
        # zero above the diagonal, rows sum to 1
        S = softmax(causal_mask(scores))  # (n, n)
        H.append(S * V)  # (n, d_v)
    # (n, h*d_v) (h*d_v, d_model) -> (n, d_model)
    Y = sp.Matrix.hstack(*H) * W_O
    return Y if b is None else _plus_row(Y, b[-1])  # (n, d_model)


def output_rows(dims: Dims | None = None
                ) -> tuple[sp.Matrix, sp.Matrix, tuple[sp.Matrix, ...]]:
    """(Y, X, W): the layer's output for a symbol matrix X (entries x_{x,y}).

    Book: chapter 6. Y and X are (tokens x d_model); W is
    ``weight_matrices(dims)``. Row t of Y is the book's
    Y_t = f_t(X_1, ..., X_t; W).
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


# --- Part IV, chapter 19: the backward pass ---------------------------------


def pairing(G: sp.Matrix, A: sp.Matrix) -> sp.Expr:
    """<G, A>: the sum over all entries of G times A, entry by entry.

    Book: chapter 19, "A gradient has the shape of its matrix". With G =
    dA held fixed, the derivative of <dA, A> with respect to whatever A is
    computed from is what the loss passes back through A. G and A must
    have the same shape.
    """
    if G.shape != A.shape:
        raise ValueError(f"<G, A> pairs entries of equal shapes: G is "
                         f"{G.rows} x {G.cols}, A is {A.rows} x {A.cols}")
    return sp.Add(*G.multiply_elementwise(A))  # a scalar


def gradient(f: sp.Expr, A: sp.Matrix) -> sp.Matrix:
    """The matrix of the derivatives of f, one per entry of A: A's shape.

    Book: chapter 19, "A gradient has the shape of its matrix". Entry
    (x, y) is the derivative of f by the symbol A_xy; every entry of A
    must be a symbol.
    """
    for x in range(A.rows):
        for y in range(A.cols):
            if not isinstance(A[x, y], sp.Symbol):
                raise ValueError(
                    f"entry ({x + 1}, {y + 1}) of the {A.rows} x {A.cols} "
                    f"matrix is {A[x, y]}, not a symbol")
    return A.applyfunc(lambda a: sp.diff(f, a))  # A's shape
