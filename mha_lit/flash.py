"""FlashAttention's forward and backward passes, tiled, in NumPy.

Book: chapter 20 "What the backward pass costs". The backward pass of
chapter 19 (``grad.attention_backward``) builds the n x n weights S of
every head. FlashAttention (Dao et al. 2022) never does: its forward pass
keeps, beside its output H, two numbers per query row, the online
softmax's maximum m and sum l. FlashAttention-2 (Dao 2024), which this
module follows, keeps one instead, the log-sum-exp

    lambda_t = m_t + log l_t = log sum_u exp(Z_tu)      (its L_i)

of the row's masked scores Z = scale Q K^T, so that the backward pass can
recompute any block of weights as S = exp(Z - lambda) from a block of Q
and a block of K. With Delta_t = dH_t . H_t (the paper's D_i, the row sum
of dH * H) the softmax's backward needs no whole row either:

    dZ = S * (dS - Delta)         dS = dH V^T

Both loops follow FlashAttention-2 (Dao 2024): the forward, its
Algorithm 1, takes query blocks outside and key blocks inside, with chapter
12's online softmax; the backward, its Algorithm 2, takes key blocks
outside, accumulates a key block's dK and dV while every query block
passes, and adds each query block's share to dQ. Causal blocks above the
diagonal are never visited. Nothing n x n is ever built: the loops make
arrays of one block's size (scores and weights, and their gradients,
b x c per head; blocks of b or c rows: the scaled queries and the running
sum of H forward, and of dQ, dK, dV backward), and the rest (H, lambda,
Delta and the gradients themselves) have n rows.

Letters in shape comments (see ``mha_lit.shapes``): n tokens, d_k, d_v,
b query rows in a block (the paper's B_r), c keys in a block (B_c).
Leading axes (..) are a stack of heads and sequences, as in ``grad``.
"""

from __future__ import annotations

import math

import numpy as np

from . import checks

__all__ = ["flash_forward", "flash_backward", "BLOCK_ROWS", "BLOCK_KEYS"]

BLOCK_ROWS = 64  # query rows per block (the paper's B_r)
BLOCK_KEYS = 64  # keys per block (the paper's B_c)


def flash_forward(Q, K, V, causal: bool = True, *,
                  scale: float | None = None, block_rows: int = BLOCK_ROWS,
                  block_keys: int = BLOCK_KEYS):
    """H and the log-sum-exp lambda of each query row, tiled.

    Book: chapter 20, "FlashAttention's backward pass". Q (.., n, d_k),
    K (.., n, d_k), V (.., n, d_v): n queries against the same n keys;
    ``scale`` is 1/sqrt(d_k) if None. For each block of queries, the keys
    go by in blocks with chapter 12's running maximum m and sum ell
    (``fast.attend_tiled``); at the end H = acc / ell and
    lambda = m + log ell. Returns H (.., n, d_v) and lambda (.., n).
    """
    Q, K, V, scale = _operands(Q, K, V, scale)
    b, c = _block_sizes(block_rows, block_keys)
    n = Q.shape[-2]
    H = np.empty(Q.shape[:-1] + V.shape[-1:], Q.dtype)  # (.., n, d_v)
    lse = np.empty(Q.shape[:-1], Q.dtype)  # (.., n)
    for r0 in range(0, n, b):  # outer loop: a block of queries
        r1 = min(r0 + b, n)
        Q_i = Q[..., r0:r1, :] * scale  # (.., b, d_k)
        mx = np.full(Q_i.shape[:-1] + (1,), -np.inf, Q.dtype)  # (.., b, 1)
        ell = np.zeros(mx.shape, Q.dtype)  # (.., b, 1)
        acc = np.zeros(H[..., r0:r1, :].shape, Q.dtype)  # (.., b, d_v)
        for c0 in range(0, r1 if causal else n, c):  # inner: keys
            c1 = min(c0 + c, n)
            Z = Q_i @ np.swapaxes(K[..., c0:c1, :], -1, -2)  # (.., b, c)
            _hide_later_keys(Z, r0, c0, causal)
            mx_new = np.maximum(mx, Z.max(axis=-1, keepdims=True))
            alpha = np.exp(mx - mx_new)  # rescales what was summed so far
            E = np.exp(Z - mx_new)  # (.., b, c); a hidden key gives 0
            ell = ell * alpha + E.sum(axis=-1, keepdims=True)  # (.., b, 1)
            acc = acc * alpha + E @ V[..., c0:c1, :]  # (.., b, d_v)
            mx = mx_new
        H[..., r0:r1, :] = acc / ell
        lse[..., r0:r1] = (mx + np.log(ell))[..., 0]
    return H, lse


def flash_backward(Q, K, V, O, dO, lse, causal: bool = True, *,
                   scale: float | None = None, block_rows: int = BLOCK_ROWS,
                   block_keys: int = BLOCK_KEYS):
    """dQ, dK, dV from Q, K, V, the output O = H, dO = dH and lambda.

    Book: chapter 20, "FlashAttention's backward pass". The shapes of
    ``flash_forward``: Q, K (.., n, d_k), V, O, dO (.., n, d_v), lse
    (.., n). FlashAttention-2's Algorithm 2: Delta = rowsum(dO * O) once;
    then for each block of keys, every query block that meets it
    recomputes its scores and S = exp(Z - lambda), adds S^T dO to dV and
    dZ^T Q scale to dK (kept for the key block) and dZ K scale to its
    rows of dQ.
    """
    Q, K, V, scale = _operands(Q, K, V, scale)
    O, dO, lse = _saved(Q, V, O, dO, lse)
    b, c = _block_sizes(block_rows, block_keys)
    n = Q.shape[-2]
    Delta = (dO * O).sum(axis=-1)  # (.., n): dH_t . H_t, row by row
    dQ = np.zeros(Q.shape, Q.dtype)  # (.., n, d_k), summed over key blocks
    dK, dV = np.empty(K.shape, Q.dtype), np.empty(V.shape, Q.dtype)
    for c0 in range(0, n, c):  # outer loop: a block of keys and values
        c1 = min(c0 + c, n)
        K_j, V_j = K[..., c0:c1, :], V[..., c0:c1, :]  # (.., c, d)
        dK_j = np.zeros(K_j.shape, Q.dtype)  # (.., c, d_k)
        dV_j = np.zeros(V_j.shape, Q.dtype)  # (.., c, d_v)
        for r0 in range(c0 // b * b if causal else 0, n, b):  # queries
            r1 = min(r0 + b, n)
            Q_i, dO_i = Q[..., r0:r1, :], dO[..., r0:r1, :]  # (.., b, d)
            Z = (Q_i @ np.swapaxes(K_j, -1, -2)) * scale  # (.., b, c)
            _hide_later_keys(Z, r0, c0, causal)
            S = np.exp(Z - lse[..., r0:r1, None])  # (.., b, c), recomputed
            dV_j += np.swapaxes(S, -1, -2) @ dO_i  # (.., c, d_v)
            dS = dO_i @ np.swapaxes(V_j, -1, -2)  # (.., b, c)
            dZ = S * (dS - Delta[..., r0:r1, None])  # (.., b, c)
            dQ[..., r0:r1, :] += (dZ @ K_j) * scale  # (.., b, d_k)
            dK_j += (np.swapaxes(dZ, -1, -2) @ Q_i) * scale  # (.., c, d_k)
        dK[..., c0:c1, :], dV[..., c0:c1, :] = dK_j, dV_j
    return dQ, dK, dV


def _hide_later_keys(Z, r0: int, c0: int, causal: bool) -> None:
    """Set to -inf, in place, the scores in Z (.., b, c) of keys after
    their query: query r0 + i meets key c0 + j, hidden if c0 + j > r0 + i.
    """
    b, c = Z.shape[-2:]
    if causal and c0 + c - 1 > r0:  # the block reaches above the diagonal
        later = np.subtract.outer(np.arange(b), np.arange(c)) < c0 - r0
        Z[..., later] = -np.inf  # (b, c) pattern, the same for the stack


def _operands(Q, K, V, scale):
    """Q, K, V in one float type (at least float32), and the scale."""
    Q, K, V = (checks.float_array(a, name) for a, name in
               ((Q, "Q"), (K, "K"), (V, "V")))
    if Q.ndim < 2 or K.shape != Q.shape or V.shape[:-1] != Q.shape[:-1]:
        raise ValueError(
            f"Q {Q.shape}, K {K.shape} and V {V.shape} do not fit: Q and K "
            "must both be (.., n, d_k) and V (.., n, d_v), n queries "
            "against the same n keys, with the same leading axes")
    if Q.shape[-2] == 0 or Q.shape[-1] == 0:
        raise ValueError(f"Q has shape {Q.shape}: it needs at least one "
                         "token and one column")
    dtype = np.result_type(Q, K, V, np.float32)
    scale = 1 / math.sqrt(Q.shape[-1]) if scale is None else float(scale)
    return (Q.astype(dtype, copy=False), K.astype(dtype, copy=False),
            V.astype(dtype, copy=False), scale)


def _saved(Q, V, O, dO, lse):
    """O, dO (.., n, d_v) and lse (.., n) in Q's float type, or an error."""
    O, dO, lse = (checks.float_array(a, name) for a, name in
                  ((O, "O"), (dO, "dO"), (lse, "lse")))
    want = Q.shape[:-1] + V.shape[-1:]
    if O.shape != want or dO.shape != want or lse.shape != Q.shape[:-1]:
        raise ValueError(
            f"O {O.shape}, dO {dO.shape} and lse {lse.shape} do not fit Q "
            f"{Q.shape} and V {V.shape}: O and dO must have H's shape "
            f"{want}, lse one number per query row, {Q.shape[:-1]}")
    return (O.astype(Q.dtype, copy=False), dO.astype(Q.dtype, copy=False),
            lse.astype(Q.dtype, copy=False))


def _block_sizes(block_rows, block_keys) -> tuple[int, int]:
    """The block sizes as positive ints, or an error naming them."""
    return (checks.positive_int(block_rows, "block_rows"),
            checks.positive_int(block_keys, "block_keys"))
