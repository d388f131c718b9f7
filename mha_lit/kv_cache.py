"""Generating one token at a time: the KV cache.

Book: Part I, chapter 7 "The KV cache".

When a row x is appended to X, rows 1..n of every intermediate stay as
they were (chapter 6), so only the new row must be computed. Its query q
is used once and dropped; its key and value rows are kept, because every
later token will look at them.

Letters in shape comments: n rows cached so far, cap the buffer capacity
(>= n), d_model, d_k, d_v, h heads.
"""

from __future__ import annotations

import numpy as np

from .fast import fused_biases, fused_weights
from .shapes import Weights, as_float_array

__all__ = ["KVCache", "step_multiply_adds", "recompute_multiply_adds"]


class KVCache:
    """Causal multi-head attention computed row by row, keeping K and V.

    Book: chapter 7. ``cache.step(x)`` takes one new input row x (d_model,)
    and returns its output row y (d_model,), equal to the last row of
    ``multi_head_attention`` on all rows seen so far. A step costs O(n * d)
    multiply-adds: three projections of one row, one dot product per cached
    key and one weighted sum of cached values per head, and W_O; nothing
    earlier is recomputed. Keys and values live in buffers that double when
    full (amortised O(1) append). A refused step (wrong width, NaN) leaves
    the cache exactly as it was. Biases of W are added as in
    ``multi_head_attention`` (chapter 8, "GPT-2's block, exactly").
    """

    def __init__(self, W: Weights, capacity: int = 16):
        if not isinstance(W, Weights):
            raise TypeError(
                f"KVCache needs mha_lit.Weights, got {type(W).__name__}")
        if (isinstance(capacity, bool) or not isinstance(capacity, int)
                or capacity < 1):
            raise ValueError(
                f"capacity must be a positive integer, got {capacity!r}")
        self.W = W
        self._n = 0
        self._K = np.empty((W.heads, capacity, W.d_k),
                           dtype=W.dtype)  # (h, cap, d_k)
        self._V = np.empty((W.heads, capacity, W.d_v),
                           dtype=W.dtype)  # (h, cap, d_v)

    def __len__(self) -> int:
        """Number of rows seen (and of cached keys and values per head)."""
        return self._n

    @property
    def keys(self) -> np.ndarray:
        """Cached keys, read-only: (h, n, d_k)."""
        return _readonly(self._K[:, : self._n])

    @property
    def values(self) -> np.ndarray:
        """Cached values, read-only: (h, n, d_v)."""
        return _readonly(self._V[:, : self._n])

    def _check_row(self, x) -> np.ndarray:
        x = np.asanyarray(x)  # keeps ndarray subclasses (chapter 10)
        if x.ndim != 1 or x.shape[0] != self.W.d_model:
            raise ValueError("a KV-cache step takes one row x of shape "
                             f"(d_model,) = ({self.W.d_model},), "
                             f"got shape {x.shape}")
        return as_float_array(x, "x").astype(self.W.dtype, copy=False)

    def _grow(self) -> None:
        cap = self._K.shape[1]
        for name in ("_K", "_V"):
            old = getattr(self, name)
            new = np.empty((old.shape[0], 2 * cap, old.shape[2]),
                           dtype=old.dtype)  # (h, 2cap, d)
            new[:, :cap] = old
            setattr(self, name, new)

    def step(self, x) -> np.ndarray:
        """Append one row x (d_model,); return its output row y (d_model,)."""
        x = self._check_row(x)
        W, n = self.W, self._n
        h, d_k = W.heads, W.d_k
        # every head's W_Q/sqrt(d_k), W_K, W_V in one matrix
        W_QKV_T, W_O = fused_weights(W)
        b_QKV, b_O = fused_biases(W)  # None, None: W has no biases
        # one matrix-vector product: (h*(2 d_k + d_v), d_model) @ (d_model,)
        qkv = W_QKV_T @ x  # (h*(2 d_k + d_v),)
        if b_QKV is not None:  # chapter 8: GPT-2's b_Q, b_K, b_V
            qkv = qkv + b_QKV  # (h*(2 d_k + d_v),)
        # the new queries, already divided by sqrt(d_k)
        q = qkv[: h * d_k].reshape(h, 1, d_k)  # (h, 1, d_k)
        if n == self._K.shape[1]:
            self._grow()
        # row n+1 of every head's K and of every head's V
        self._K[:, n] = qkv[h * d_k: 2 * h * d_k].reshape(h, d_k)  # (h, d_k)
        self._V[:, n] = qkv[2 * h * d_k:].reshape(h, W.d_v)  # (h, d_v)
        K, V = (self._K[:, : n + 1],  # (h, n+1, d_k)
                self._V[:, : n + 1])  # (h, n+1, d_v)
        # (h, 1, d_k) @ (h, d_k, n+1) -> (h, 1, n+1)
        scores = q @ K.transpose(0, 2, 1)  # (h, 1, n+1)
        # softmax of each head's last score row: it sees every key, no mask
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # (h, 1, n+1)
        # the last row of each H_i
        heads = (e @ V) / e.sum(axis=-1, keepdims=True)  # (h, 1, d_v)
        # Concat times W_O: (h*d_v,) @ (h*d_v, d_model) -> (d_model,)
        y = heads.reshape(-1) @ W_O  # (d_model,)
        if b_O is not None:
            y = y + b_O  # (d_model,)
        self._n = n + 1  # commit only once everything succeeded
        return y

    def extend(self, X) -> np.ndarray:
        """Append several rows X (m, d_model) one step at a time.

        Returns their outputs (m, d_model).
        """
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != self.W.d_model:
            raise ValueError("extend takes X of shape "
                             f"(m, d_model = {self.W.d_model}), "
                             f"got shape {X.shape}")
        # refuse the whole block before anything is cached
        as_float_array(X, "X")
        return (np.stack([self.step(x) for x in X])  # (m, d_model)
                if len(X) else np.empty((0, self.W.d_model), self.W.dtype))

    def __repr__(self) -> str:
        return (f"KVCache(rows={self._n}, heads={self.W.heads}, "
                f"d_k={self.W.d_k}, d_v={self.W.d_v})")


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


# --- Part I, chapter 7: what a step costs, with and without the cache ------


def _products(rows: int, n: int, dims) -> list[tuple[int, int, int]]:
    """Shapes (a, b, c) of every product (a x b) @ (b x c) that computes
    `rows` output rows against n keys: per head X W_Q, X W_K, X W_V,
    Q K^T, S V, then Concat W_O."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"n must be a positive number of tokens, got {n!r}")
    d, dk, dv, h = dims.d_model, dims.d_k, dims.d_v, dims.heads
    # new rows need all n keys and values; the cache already holds
    # n - rows of them
    per_head = [(rows, d, dk), (rows, d, dk), (rows, d, dv),
                (rows, dk, n), (rows, n, dv)]
    # Concat (rows, h*d_v) @ W_O (h*d_v, d_model)
    return per_head * h + [(rows, h * dv, d)]


def step_multiply_adds(n: int, dims) -> int:
    """Multiply-adds for output row n when rows 1..n-1 of K, V are cached.

    Book: chapter 7. One row each of Q, K, V per head (the new token's),
    one row of scores against the n keys, one weighted sum of the n values,
    and one row of Concat times W_O:
    h (d_model (2 d_k + d_v) + n (d_k + d_v)) + h d_v d_model, linear in n.
    """
    return sum(a * b * c for a, b, c in _products(1, n, dims))


def recompute_multiply_adds(n: int, dims) -> int:
    """Multiply-adds to recompute all n output rows, as without a cache.

    Book: chapter 7. The same products as ``step_multiply_adds`` with n
    rows instead of one: every Q, K, V, the full n x n score matrix (masked
    entries included, as a dense computation does), S V and Concat W_O,
    quadratic in n.
    """
    return sum(a * b * c for a, b, c in _products(n, n, dims))
