"""Numba kernels for the two operations that bound a cached decoding step.

Used by ``benchmarks/alternatives.py`` as candidates next to NumPy and OpenBLAS;
the package itself does not use them. Numba is optional (``pip install numba``).

- ``rows_product(W_T, X, out)``: out (B, n) = X (B, k) @ W_T (n, k)^T, the product of a
  few rows X with a large weight matrix stored transposed, as ``mha_lit.fast.few_rows_product``
  takes it. Each weight is read from memory once for all B rows: four rows of W_T at a time
  are held while four rows of X at a time meet them (sixteen sums in registers), and the
  next four rows of W_T are prefetched meanwhile.
- ``attend_one(Q, K, V, m, out)``: one query per sequence and head against the first m
  cached keys, softmax and weighted sum of values fused in one pass per (sequence, head),
  without the (B, h, 1, m) score arrays NumPy makes.

Both run their outer loop in parallel (``prange``) with ``numba.set_num_threads`` threads,
compute in float32 with ``fastmath`` (sums may be reordered: they differ from NumPy's in the
last digits) and are compiled on first use (``cache=True`` keeps the compiled code in
``benchmarks/__pycache__``). ``check()`` compares them with NumPy on ragged shapes.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["rows_product", "attend_one", "check", "RTOL", "ATOL"]

RTOL = ATOL = 1e-4  # float32 agreement with NumPy that ``check`` asserts


@intrinsic
def _prefetch(typingctx, arr, i, j):
    """Ask the processor to bring arr[i, j] into its caches (LLVM's prefetch).

    A hint, not a load: nothing is read into a register, and an address past the array
    would not fault (the callers never pass one).
    """
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1], args[2]],
                                       wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read (0), keep in every cache level (3), data cache (1)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def rows_product(W_T, X, out):
    """out (B, n) = X (B, k) @ W_T (n, k)^T, float32, all C-contiguous; any B >= 1, n >= 1.

    Rows of W_T are taken four at a time (i .. i+3), the groups shared among the threads.
    Against each group, rows of X go four at a time (4 x 4 sums), then one at a time for the
    B % 4 rows left; the last n % 4 rows of W_T go one at a time. While a group is used, the
    next group's rows are prefetched, one request per 64-byte line (16 float32).
    """
    n, k = W_T.shape
    B = X.shape[0]
    B4 = B - B % 4  # rows of X taken four at a time
    for g in prange((n + 3) // 4):
        i = 4 * g  # first row of W_T in this group
        if i + 8 <= n:  # the next group is whole: prefetch its four rows
            for r in range(4):
                for c in range(0, k, 16):
                    _prefetch(W_T, i + 4 + r, c)
        if i + 4 <= n:  # a whole group of four rows of W_T
            for b in range(0, B4, 4):  # out[b:b+4, i:i+4]: sixteen sums
                a00 = a01 = a02 = a03 = np.float32(0)
                a10 = a11 = a12 = a13 = np.float32(0)
                a20 = a21 = a22 = a23 = np.float32(0)
                a30 = a31 = a32 = a33 = np.float32(0)
                for c in range(k):
                    w0, w1, w2, w3 = W_T[i, c], W_T[i + 1, c], W_T[i + 2, c], W_T[i + 3, c]
                    x0, x1, x2, x3 = X[b, c], X[b + 1, c], X[b + 2, c], X[b + 3, c]
                    a00 += w0 * x0
                    a01 += w0 * x1
                    a02 += w0 * x2
                    a03 += w0 * x3
                    a10 += w1 * x0
                    a11 += w1 * x1
                    a12 += w1 * x2
                    a13 += w1 * x3
                    a20 += w2 * x0
                    a21 += w2 * x1
                    a22 += w2 * x2
                    a23 += w2 * x3
                    a30 += w3 * x0
                    a31 += w3 * x1
                    a32 += w3 * x2
                    a33 += w3 * x3
                out[b, i], out[b + 1, i], out[b + 2, i], out[b + 3, i] = a00, a01, a02, a03
                out[b, i + 1], out[b + 1, i + 1] = a10, a11
                out[b + 2, i + 1], out[b + 3, i + 1] = a12, a13
                out[b, i + 2], out[b + 1, i + 2] = a20, a21
                out[b + 2, i + 2], out[b + 3, i + 2] = a22, a23
                out[b, i + 3], out[b + 1, i + 3] = a30, a31
                out[b + 2, i + 3], out[b + 3, i + 3] = a32, a33
            for b in range(B4, B):  # the rows of X left: one at a time, four sums
                a0 = a1 = a2 = a3 = np.float32(0)
                for c in range(k):
                    x = X[b, c]
                    a0 += W_T[i, c] * x
                    a1 += W_T[i + 1, c] * x
                    a2 += W_T[i + 2, c] * x
                    a3 += W_T[i + 3, c] * x
                out[b, i], out[b, i + 1], out[b, i + 2], out[b, i + 3] = a0, a1, a2, a3
        else:  # the last n % 4 rows of W_T: one dot product each
            for r in range(i, n):
                for b in range(B):
                    a = np.float32(0)
                    for c in range(k):
                        a += W_T[r, c] * X[b, c]
                    out[b, r] = a


@njit(parallel=True, fastmath=True, cache=True, boundscheck=False)
def attend_one(Q, K, V, m, out):
    """out (B, h, d_v) = softmax(q K^T) V for each sequence b and head g, over m keys.

    Q (B, h, d_k): one query per sequence and head, already scaled (the package folds
    1/sqrt(d_k) into W_Q); K (B, h, cap, d_k) and V (B, h, cap, d_v): the whole cache
    buffers, C-contiguous, of which the first m >= 1 rows are used (cap >= m). The B h pairs
    are shared among the threads; each computes its m scores, their maximum, then in one
    more pass the exponentials, their sum and the weighted sum of the values.
    """
    B, h, dk = Q.shape
    dv = V.shape[3]
    for bg in prange(B * h):
        b, g = bg // h, bg % h
        s = np.empty(m, np.float32)  # (m,) scores of this query
        top = np.float32(-np.inf)
        for j in range(m):
            acc = np.float32(0)
            for c in range(dk):
                acc += Q[b, g, c] * K[b, g, j, c]
            s[j] = acc
            top = max(top, acc)
        total = np.float32(0)
        o = np.zeros(dv, np.float32)  # (d_v,) sum of e_j V_j
        for j in range(m):
            e = np.exp(s[j] - top)  # <= 1
            total += e
            for c in range(dv):
                o[c] += e * V[b, g, j, c]
        for c in range(dv):
            out[b, g, c] = o[c] / total


def check(seed: int = 0) -> None:
    """Assert both kernels equal NumPy (rtol = atol = 1e-4, float32) on ragged shapes.

    Products: B from 1 to 9 rows (every remainder of 4) against n = 1, 3, 4, 5, 7, 8, 13
    and 258 rows of W_T (whole groups, a partial last group, prefetch on and off), k = 37
    and 768. Attention: B = 1 and 3, h = 2, m = 1, 5 and 300 keys of a buffer longer than
    m, against the same softmax computed by NumPy. Values of unit scale.
    """
    rng = np.random.default_rng(seed)
    for k in (37, 768):
        for n in (1, 3, 4, 5, 7, 8, 13, 258):
            W_T = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
            for B in range(1, 10):
                X = rng.standard_normal((B, k)).astype(np.float32)
                out = np.full((B, n), np.nan, np.float32)
                rows_product(W_T, X, out)
                np.testing.assert_allclose(out, X @ W_T.T, rtol=RTOL, atol=ATOL,
                                           err_msg=f"rows_product B={B} n={n} k={k}")
    for B in (1, 3):
        for m in (1, 5, 300):
            cap, h, dk = m + 7, 2, 64
            Q = (rng.standard_normal((B, h, dk)) / 8).astype(np.float32)
            K, V = (rng.standard_normal((B, h, cap, dk)).astype(np.float32) for _ in "KV")
            out = np.full((B, h, dk), np.nan, np.float32)
            attend_one(Q, K, V, m, out)
            S = np.einsum("bgc,bgjc->bgj", Q, K[:, :, :m])  # (B, h, m)
            e = np.exp(S - S.max(axis=-1, keepdims=True))
            want = np.einsum("bgj,bgjc->bgc", e, V[:, :, :m]) / e.sum(axis=-1)[..., None]
            np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"attend_one B={B} m={m}")
