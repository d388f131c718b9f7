"""Generating one token at a time: the KV cache.

Book: Part I, chapter 7 "The KV cache"; prefill and batches of
sequences: Part II, chapter 12 "Computing it efficiently".

When a row x is appended to X, rows 1..n of every intermediate stay as
they were (chapter 6), so only the new row must be computed. Its query q
is used once and dropped; its key and value rows are kept, because every
later token will look at them.

Letters in shape comments: n rows cached so far, cap the buffer capacity
(>= n), d_model, d_k, d_v, h heads.
"""

from __future__ import annotations

import numbers

import numpy as np

from .fast import (
    _attend_sequence,
    choose_sizes,
    few_rows_product,
    fused_biases,
    fused_weights,
    project_heads,
    transposed_output_weights,
)
from .shapes import Weights, as_float_array

__all__ = ["KVCache", "step_multiply_adds", "recompute_multiply_adds"]


class KVCache:
    """Causal multi-head attention computed as tokens arrive, keeping K and V.

    Book: chapter 7 (one token at a time) and chapter 12 (prefill and
    batches). ``cache.step(x)`` takes one new input row x (d_model,) and
    returns its output row y (d_model,), equal to the last row of
    ``multi_head_attention`` on all rows seen so far. A step costs
    O(n * d) multiply-adds: one product of x with every head's fused
    W_Q, W_K, W_V, one dot product per cached key and one weighted sum of
    cached values per head, and W_O; nothing earlier is recomputed.

    ``cache.extend(X)`` appends a block of rows X (m, d_model) at once, as a
    prompt is *prefilled*: one matrix product projects all m rows, and the
    m new queries attend to the cached keys and to each other (causally)
    with the matrix products of chapter 12's fast path. Its outputs are the
    last m rows of ``multi_head_attention`` on everything seen.

    ``KVCache(W, batch=B)`` keeps B sequences side by side: ``step`` takes
    (B, d_model) and ``extend`` (B, m, d_model), with an optional
    ``key_mask`` (B, m), True for real tokens, for prompts of different
    lengths (padded rows are not cached; their outputs are 0). The weights
    are read once for all B sequences; every sequence has its own keys and
    values.

    Dtypes follow ``multi_head_attention``: computed in the wider of the
    input's and W's float types, returned in the input's. Keys and values
    live in buffers that double when full (amortised O(1) append). A refused
    input (wrong shape, NaN, bad mask) leaves the cache exactly as it was.
    Biases of W are added as in ``multi_head_attention`` (chapter 8).
    """

    def __init__(self, W: Weights, capacity: int = 16, *,
                 batch: int | None = None):
        if not isinstance(W, Weights):
            raise TypeError(
                f"KVCache needs mha_lit.Weights, got {type(W).__name__}")
        for name, value in (("capacity", capacity), ("batch", batch)):
            if value is None and name == "batch":
                continue
            if (isinstance(value, bool)
                    or not isinstance(value, numbers.Integral) or value < 1):
                raise ValueError(
                    f"{name} must be a positive integer, got {value!r}")
        capacity = int(capacity)
        batch = None if batch is None else int(batch)
        self.W = W
        self.batch = batch
        B = 1 if batch is None else batch
        # rows cached, per sequence
        self._lengths = np.zeros(B, dtype=np.int64)
        # zeros, not empty: a shorter sequence's unused rows take part in
        # a batched product with weight exactly 0
        self._K = np.zeros((B, W.heads, capacity, W.d_k),
                           dtype=W.dtype)  # (B, h, cap, d_k)
        self._V = np.zeros((B, W.heads, capacity, W.d_v),
                           dtype=W.dtype)  # (B, h, cap, d_v)

    # --- what is cached -------------------------------------------------

    def __len__(self) -> int:
        """Rows seen; with a batch, by the longest sequence."""
        return int(self._lengths.max())

    @property
    def lengths(self) -> np.ndarray:
        """Rows cached for each sequence, (B,) (a copy)."""
        return self._lengths.copy()

    @property
    def keys(self) -> np.ndarray:
        """Cached keys, read-only: (h, n, d_k); with a batch (B, h, n, d_k),
        rows past a sequence's length are 0."""
        K = self._K[:, :, : len(self)]
        return _readonly(K[0] if self.batch is None else K)

    @property
    def values(self) -> np.ndarray:
        """Cached values, read-only: (h, n, d_v); with a batch
        (B, h, n, d_v)."""
        V = self._V[:, :, : len(self)]
        return _readonly(V[0] if self.batch is None else V)

    def truncate(self, lengths) -> None:
        """Forget every row past ``lengths`` (an int, or (B,) ints).

        Book: chapter 12. The kept rows stay as they were; the forgotten
        ones are set to 0, as never-used rows are. ``truncate(0)`` starts
        over (``reset``).
        """
        L = np.broadcast_to(np.asarray(lengths), self._lengths.shape)
        if (not np.issubdtype(L.dtype, np.integer) or (L < 0).any()
                or (L > self._lengths).any()):
            raise ValueError(
                f"lengths must be integers in 0 .. {self._lengths.tolist()} "
                f"(the rows cached), got {np.asarray(lengths).tolist()}")
        for b, n in enumerate(L):
            self._K[b, :, n:] = 0
            self._V[b, :, n:] = 0
        self._lengths = L.astype(np.int64)

    def reset(self) -> None:
        """Forget every row: an empty cache, buffers kept."""
        self.truncate(0)

    # --- checks, before anything changes ----------------------------------

    def _compute_dtype(self, x: np.ndarray) -> np.dtype:
        return np.result_type(x.dtype, self.W.dtype)

    def _checked(self, x, what: str, shape: str, ndim: int) -> np.ndarray:
        x = np.asanyarray(x)  # keeps ndarray subclasses (chapter 10)
        B, d = self.batch, self.W.d_model
        want_batch = () if B is None else (B,)
        ok = (x.ndim == ndim and x.shape[-1] == d
              and x.shape[:len(want_batch)] == want_batch)
        if not ok:
            raise ValueError(f"{what} takes {shape}, with d_model = {d}"
                             + ("" if B is None else f" and B = {B}")
                             + f", got shape {x.shape}")
        return as_float_array(x, "x" if what == "step" else "X")

    def _check_mask(self, key_mask, m: int) -> np.ndarray:
        B = 1 if self.batch is None else self.batch
        if key_mask is None:
            return np.ones((B, m), dtype=bool)
        mask = np.asarray(key_mask)
        want = (m,) if self.batch is None else (B, m)
        if mask.dtype != bool:
            raise TypeError(f"key_mask must be a boolean array of shape "
                            f"{want}, got dtype {mask.dtype}")
        if mask.shape != want:
            raise ValueError(f"key_mask must be a boolean array of shape "
                             f"{want}, got {mask.dtype} {mask.shape}")
        return mask.reshape(B, m)

    def _make_room(self, lengths: np.ndarray, dtype: np.dtype) -> None:
        """Buffers that hold ``lengths`` rows per sequence, in ``dtype``."""
        cap = self._K.shape[2]
        need = int(lengths.max())
        new_cap = cap
        while new_cap < need:
            new_cap *= 2
        new_dtype = np.result_type(self._K.dtype, dtype)
        if new_cap == cap and new_dtype == self._K.dtype:
            return
        n = len(self)
        for name in ("_K", "_V"):
            old = getattr(self, name)
            new = np.zeros(old.shape[:2] + (new_cap, old.shape[3]),
                           dtype=new_dtype)  # (B, h, new_cap, d)
            new[:, :, :n] = old[:, :, :n]
            setattr(self, name, new)

    # --- one token per sequence ---------------------------------------------

    def step(self, x) -> np.ndarray:
        """Append one row per sequence; return its output row.

        x (d_model,) -> y (d_model,); with a batch, (B, d_model) ->
        (B, d_model).
        """
        shape = "one row x (d_model,)" if self.batch is None else \
            "one row per sequence, x (B, d_model)"
        x = self._checked(x, "step", shape, 1 if self.batch is None else 2)
        dtype = self._compute_dtype(x)
        X = x.reshape(-1, self.W.d_model).astype(dtype, copy=False)  # (B, d)
        W, L = self.W, self._lengths
        h, d_k, d_v = W.heads, W.d_k, W.d_v
        W_QKV_T, W_O = fused_weights(W, dtype)  # every head's, side by side
        b_QKV, b_O = fused_biases(W, dtype)  # None, None: W has no biases
        # all sequences at once: each weight read once for the B rows
        qkv = few_rows_product(W_QKV_T, X)  # (B, h*(2 d_k + d_v))
        if b_QKV is not None:
            qkv += b_QKV
        B = len(X)
        q = qkv[:, : h * d_k].reshape(B, h, 1, d_k)  # scaled by 1/sqrt(d_k)
        self._make_room(L + 1, dtype)
        seqs = np.arange(B)
        # row L[b] of sequence b's K and V, every head
        self._K[seqs, :, L] = qkv[:, h * d_k: 2 * h * d_k].reshape(B, h, d_k)
        self._V[seqs, :, L] = qkv[:, 2 * h * d_k:].reshape(B, h, d_v)
        n = int(L.max()) + 1  # keys of the longest sequence
        K = self._K[:, :, :n]  # (B, h, n, d_k)
        V = self._V[:, :, :n]  # (B, h, n, d_v)
        # (B, h, 1, d_k) @ (B, h, d_k, n) -> (B, h, 1, n)
        scores = q @ K.transpose(0, 1, 3, 2)
        if (L != L[0]).any():  # shorter sequences: hide the rows past them
            past = np.arange(n)[None, :] > L[:, None]  # (B, n)
            scores[past[:, None, None, :].repeat(h, axis=1)] = -np.inf
        # softmax of each head's one score row: it sees every key, no mask
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # (B, h, 1, n)
        heads = (e @ V) / e.sum(axis=-1, keepdims=True)  # (B, h, 1, d_v)
        # Concat times W_O: (B, h*d_v) @ (h*d_v, d_model) -> (B, d_model)
        W_O_T = transposed_output_weights(W, dtype)  # (d_model, h*d_v)
        y = few_rows_product(W_O_T, heads.reshape(B, h * d_v))  # (B, d_model)
        if b_O is not None:
            y += b_O
        self._lengths = L + 1  # commit only once everything succeeded
        y = y.astype(x.dtype, copy=False)
        return y[0] if self.batch is None else y

    # --- a block of tokens per sequence: prefill ----------------------------

    def extend(self, X, key_mask=None) -> np.ndarray:
        """Append a block of rows; return their outputs, computed at once.

        X (m, d_model) -> (m, d_model); with a batch, (B, m, d_model) ->
        (B, m, d_model), and ``key_mask`` (B, m) (True = real token) for
        prompts of different lengths: each sequence appends its real rows
        in order; padded rows are not cached and output 0.
        """
        shape = "a block X (m, d_model)" if self.batch is None else \
            "a block per sequence, X (B, m, d_model)"
        X = self._checked(X, "extend", shape, 2 if self.batch is None else 3)
        m = X.shape[-2]
        mask = self._check_mask(key_mask, m)  # (B, m)
        dtype = self._compute_dtype(X)
        W, L = self.W, self._lengths
        Xb = X.reshape(len(L), m, W.d_model).astype(dtype, copy=False)
        rows = Xb[mask]  # (N, d_model): every sequence's real rows, in order
        counts = mask.sum(axis=1)  # (B,) new rows per sequence
        out = np.zeros(Xb.shape, dtype)  # (B, m, d_model)
        if len(rows):
            new_L = L + counts
            self._make_room(new_L, dtype)
            Q_T, K_T, V_T = project_heads(rows, W)  # one product, all rows
            # (N, h, d_v)
            concat = np.empty((len(rows), W.heads, W.d_v), dtype)
            s0 = 0
            for b, c in enumerate(counts):
                if c == 0:
                    continue
                s1, p = s0 + int(c), int(L[b])
                # the new keys and values join sequence b's cache
                self._K[b, :, p:p + c] = K_T[:, :, s0:s1].transpose(0, 2, 1)
                self._V[b, :, p:p + c] = V_T[:, :, s0:s1].transpose(0, 2, 1)
                n = p + int(c)
                block, tile = choose_sizes(n, W, rows.itemsize, None, None)
                # the c new queries (positions p .. n-1) against keys 0 .. n-1
                _attend_sequence(Q_T[:, :, s0:s1],
                                 self._K[b, :, :n].transpose(0, 2, 1),
                                 self._V[b, :, :n].transpose(0, 2, 1),
                                 True, block, tile, concat[s0:s1], q0=p)
                s0 = s1
            _, W_O = fused_weights(W, dtype)
            _, b_O = fused_biases(W, dtype)
            Y = concat.reshape(len(rows), -1) @ W_O  # (N, d_model)
            if b_O is not None:
                Y += b_O
            out[mask] = Y
            self._lengths = new_L  # commit only once everything succeeded
        out = out.astype(X.dtype, copy=False)
        return out[0] if self.batch is None else out

    def __repr__(self) -> str:
        rows = (f"rows={len(self)}" if self.batch is None
                else f"batch={self.batch}, rows={self._lengths.tolist()}")
        return (f"KVCache({rows}, heads={self.W.heads}, "
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
