"""Generating one token at a time: the KV cache.

Book: Part I, chapter 7 "The KV cache"; prefill and batches of
sequences: Part II, chapter 12 "Computing it efficiently"; grouped K/V
heads, rotated keys and the ring buffer of a sliding window: Part III,
chapters 14, 15 and 16.

When a row x is appended to X, rows 1..n of every intermediate stay as
they were (chapter 6), so only the new row must be computed. Its query q
is used once and dropped; its key and value rows are kept, because every
later token will look at them.

Letters in shape comments: n rows cached so far, cap the buffer capacity
(>= n, or the window w), d_model, d_k, d_v, h heads, h_kv key/value
heads, g = h / h_kv.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import rope
from .attention import check_variants
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

    Part III. With grouped key/value heads (W.kv_heads < W.heads) only the
    h_kv heads are cached (chapter 14). With ``rope_base`` every key is
    stored already rotated by its own position, which is fixed when it
    arrives (chapter 15). With ``window`` w the buffers never hold more than
    w rows: the row of position p lives in slot p % w, a ring buffer, so
    memory stops growing with the context (chapter 16); ``held`` says how
    many rows are kept, ``len`` how many positions were seen.
    """

    def __init__(self, W: Weights, capacity: int = 16, *,
                 batch: int | None = None, rope_base=None,
                 window: int | None = None):
        if not isinstance(W, Weights):
            raise TypeError(
                f"KVCache needs mha_lit.Weights, got {type(W).__name__}")
        self.rope_base, self.window = check_variants(W, True, rope_base,
                                                     window)
        for name, value in (("capacity", capacity), ("batch", batch)):
            if value is None and name == "batch":
                continue
            if (isinstance(value, bool)
                    or not isinstance(value, numbers.Integral) or value < 1):
                raise ValueError(
                    f"{name} must be a positive integer, got {value!r}")
        capacity = int(capacity)
        if self.window is not None:  # a ring of w rows at most
            capacity = min(capacity, self.window)
        batch = None if batch is None else int(batch)
        self.W = W
        self.batch = batch
        B = 1 if batch is None else batch
        # rows cached, per sequence
        self._lengths = np.zeros(B, dtype=np.int64)
        # zeros, not empty: a shorter sequence's unused rows take part in
        # a batched product with weight exactly 0
        self._K = np.zeros((B, W.kv_heads, capacity, W.d_k),
                           dtype=W.dtype)  # (B, h_kv, cap, d_k)
        self._V = np.zeros((B, W.kv_heads, capacity, W.d_v),
                           dtype=W.dtype)  # (B, h_kv, cap, d_v)

    # --- what is cached -------------------------------------------------

    def __len__(self) -> int:
        """Rows seen; with a batch, by the longest sequence."""
        return int(self._lengths.max())

    @property
    def lengths(self) -> np.ndarray:
        """Rows cached for each sequence, (B,) (a copy)."""
        return self._lengths.copy()

    @property
    def held(self) -> int:
        """Rows kept in the buffers: ``len(self)``, or at most the window w.

        Book: Part III, chapter 16, "The ring buffer".
        """
        n = len(self)
        return n if self.window is None else min(n, self.window)

    @property
    def capacity(self) -> int:
        """Rows the buffers can hold now, per sequence (they grow by
        doubling, and never past the window)."""
        return self._K.shape[2]

    def _in_order(self, buf: np.ndarray) -> np.ndarray:
        """The held rows of ``buf`` (B, h_kv, cap, d) by position: oldest
        first, each sequence's last ``held`` positions (zeros before its
        first); a view without a window."""
        n = self.held
        if self.window is None:
            return buf[:, :, :n]  # (B, h_kv, n, d)
        # position of row j of sequence b: L[b] - n + j; slot: that mod w
        pos = self._lengths[:, None] - n + np.arange(n)[None, :]  # (B, n)
        slots = np.where(pos < 0, 0, pos % self.window)  # (B, n)
        rows = np.take_along_axis(buf, slots[:, None, :, None], axis=2)
        rows[np.broadcast_to((pos < 0)[:, None, :, None], rows.shape)] = 0
        return rows  # (B, h_kv, n, d)

    @property
    def keys(self) -> np.ndarray:
        """Cached keys, read-only: (h_kv, n, d_k); with a batch
        (B, h_kv, n, d_k), rows past a sequence's length are 0. With a
        window, the last ``held`` positions, oldest first (chapter 16);
        with RoPE, rotated by their positions (chapter 15)."""
        K = self._in_order(self._K)
        return _readonly(K[0] if self.batch is None else K)

    @property
    def values(self) -> np.ndarray:
        """Cached values, read-only: (h_kv, n, d_v); with a batch
        (B, h_kv, n, d_v)."""
        V = self._in_order(self._V)
        return _readonly(V[0] if self.batch is None else V)

    def truncate(self, lengths) -> None:
        """Forget every row past ``lengths`` (an int, or (B,) ints).

        Book: chapter 12. The kept rows stay as they were; the forgotten
        ones are set to 0, as never-used rows are. ``truncate(0)`` starts
        over (``reset``). With a window, the w - 1 rows before the new
        length must still be held (chapter 16): a ring buffer has already
        overwritten older rows.
        """
        L = np.broadcast_to(np.asarray(lengths), self._lengths.shape)
        if (not np.issubdtype(L.dtype, np.integer) or (L < 0).any()
                or (L > self._lengths).any()):
            raise ValueError(
                f"lengths must be integers in 0 .. {self._lengths.tolist()} "
                f"(the rows cached), got {np.asarray(lengths).tolist()}")
        w = self.window
        if w is None:
            for b, n in enumerate(L):
                self._K[b, :, n:] = 0
                self._V[b, :, n:] = 0
        else:
            oldest = np.maximum(self._lengths - w, 0)  # first position held
            needed = np.maximum(L - w + 1, 0)  # first position still needed
            if ((L > 0) & (needed < oldest)).any():
                raise ValueError(
                    f"cannot go back to {L.tolist()} rows: a window of {w} "
                    f"holds positions from {oldest.tolist()} on, and "
                    "the older keys it would need are overwritten")
            for b, (n, old) in enumerate(zip(L, self._lengths, strict=True)):
                slots = np.arange(n, old) % w  # the forgotten positions
                self._K[b, :, slots] = 0
                self._V[b, :, slots] = 0
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
        if self.window is not None:  # a ring never holds more than w rows
            need = min(need, self.window)
        new_cap = cap
        while new_cap < need:
            new_cap *= 2
        if self.window is not None:
            new_cap = min(new_cap, self.window)
        new_dtype = np.result_type(self._K.dtype, dtype)
        if new_cap == cap and new_dtype == self._K.dtype:
            return
        # a ring only grows before it wraps: rows 0 .. n-1 are in slots 0..
        n = min(len(self), cap)
        for name in ("_K", "_V"):
            old = getattr(self, name)
            new = np.zeros(old.shape[:2] + (new_cap, old.shape[3]),
                           dtype=new_dtype)  # (B, h_kv, new_cap, d)
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
        h, h_kv, d_k, d_v = W.heads, W.kv_heads, W.d_k, W.d_v
        W_QKV_T, W_O = fused_weights(W, dtype)  # every head's, side by side
        b_QKV, b_O = fused_biases(W, dtype)  # None, None: W has no biases
        # all sequences at once: each weight read once for the B rows
        qkv = few_rows_product(W_QKV_T, X)  # (B, (h+h_kv) d_k + h_kv d_v)
        if b_QKV is not None:
            qkv += b_QKV
        B = len(X)
        k0, v0 = h * d_k, (h + h_kv) * d_k  # where K's and V's entries start
        # scaled by 1/sqrt(d_k); the g query heads of a group side by side
        q = qkv[:, :k0].reshape(B, h_kv, h // h_kv, d_k)  # (B, h_kv, g, d_k)
        k = qkv[:, k0:v0].reshape(B, h_kv, 1, d_k)  # (B, h_kv, 1, d_k)
        if self.rope_base is not None:  # chapter 15: at position L[b]
            at = L[:, None, None]  # (B, 1, 1), broadcast over heads
            q = rope.rotate(q, at, self.rope_base)  # (B, h_kv, g, d_k)
            k = rope.rotate(k, at, self.rope_base)  # (B, h_kv, 1, d_k)
        self._make_room(L + 1, dtype)
        seqs = np.arange(B)
        slot = L if self.window is None else L % self.window  # chapter 16
        # row L[b] of sequence b's K and V, every key/value head
        self._K[seqs, :, slot] = k[:, :, 0]  # (B, h_kv, d_k)
        self._V[seqs, :, slot] = qkv[:, v0:].reshape(B, h_kv, d_v)
        n = min(int(L.max()) + 1, self._K.shape[2])  # slots in use
        K = self._K[:, :, :n]  # (B, h_kv, n, d_k)
        V = self._V[:, :, :n]  # (B, h_kv, n, d_v)
        # (B, h_kv, g, d_k) @ (B, h_kv, d_k, n) -> (B, h_kv, g, n)
        scores = q @ K.transpose(0, 1, 3, 2)
        if (L + 1 < n).any():  # shorter sequences: hide the rows past them
            past = np.arange(n)[None, :] > L[:, None]  # (B, n)
            scores[np.broadcast_to(past[:, None, None, :],
                                   scores.shape)] = -np.inf
        # softmax of each head's one score row: it sees every key, no mask
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # (.., g, n)
        heads = (e @ V) / e.sum(axis=-1, keepdims=True)  # (B, h_kv, g, d_v)
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
            # chapter 15: row j of sequence b is at position L[b] + j
            positions = np.concatenate([np.arange(p, p + c)
                                        for p, c in zip(L, counts,
                                                        strict=True)])
            # one product for all rows; queries and keys rotated if RoPE
            Q_T, K_T, V_T = project_heads(rows, W, positions, self.rope_base)
            if self.window is not None:  # chapter 16: through a ring
                concat = self._extend_ring(Q_T, K_T, V_T, counts, dtype)
            else:
                concat = self._extend_rows(Q_T, K_T, V_T, counts, dtype)
            _, W_O = fused_weights(W, dtype)
            _, b_O = fused_biases(W, dtype)
            Y = concat.reshape(len(rows), -1) @ W_O  # (N, d_model)
            if b_O is not None:
                Y += b_O
            out[mask] = Y
            self._lengths = new_L  # commit only once everything succeeded
        out = out.astype(X.dtype, copy=False)
        return out[0] if self.batch is None else out

    def _extend_rows(self, Q_T, K_T, V_T, counts, dtype) -> np.ndarray:
        """Append each sequence's new keys and values, attend its new
        queries to everything cached; return their Concat rows (N, h, d_v).

        Book: chapter 12, "Prefill, then one token at a time".
        """
        W, L = self.W, self._lengths
        self._make_room(L + counts, dtype)
        concat = np.empty((Q_T.shape[2], W.heads, W.d_v), dtype)  # (N, h, d_v)
        s0 = 0
        for b, c in enumerate(counts):
            if c == 0:
                continue
            s1, p = s0 + int(c), int(L[b])
            # the new keys and values join sequence b's cache
            self._K[b, :, p:p + c] = K_T[:, :, s0:s1].transpose(0, 2, 1)
            self._V[b, :, p:p + c] = V_T[:, :, s0:s1].transpose(0, 2, 1)
            n = p + int(c)
            block, tile = choose_sizes(n, W, Q_T.itemsize, None, None)
            # the c new queries (positions p .. n-1) against keys 0 .. n-1
            _attend_sequence(Q_T[:, :, s0:s1],
                             self._K[b, :, :n].transpose(0, 2, 1),
                             self._V[b, :, :n].transpose(0, 2, 1),
                             True, block, tile, concat[s0:s1], q0=p)
            s0 = s1
        return concat

    def _extend_ring(self, Q_T, K_T, V_T, counts, dtype) -> np.ndarray:
        """``_extend_rows`` through a ring buffer of w rows.

        Book: Part III, chapter 16, "The ring buffer". The new queries need
        the w - 1 keys before them, which the ring holds, and each other:
        both are laid end to end in a scratch buffer (positions p - k ..
        p + c - 1), attended with the window, and only the last w new rows
        are written into their slots (position mod w).
        """
        W, L, w = self.W, self._lengths, self.window
        self._make_room(L + counts, dtype)
        concat = np.empty((Q_T.shape[2], W.heads, W.d_v), dtype)  # (N, h, d_v)
        old_K, old_V = self._in_order(self._K), self._in_order(self._V)
        writes = []  # into the ring only once every sequence is computed
        s0 = 0
        for b, c in enumerate(counts):
            if c == 0:
                continue
            s1, p = s0 + int(c), int(L[b])
            k = min(p, w - 1, old_K.shape[2])  # earlier keys still in view
            # (h_kv, d, k + c): the k held keys, then the c new ones
            K_b = np.concatenate([old_K[b, :, old_K.shape[2] - k:]
                                  .transpose(0, 2, 1), K_T[:, :, s0:s1]],
                                 axis=2)
            V_b = np.concatenate([old_V[b, :, old_V.shape[2] - k:]
                                  .transpose(0, 2, 1), V_T[:, :, s0:s1]],
                                 axis=2)
            block, tile = choose_sizes(k + int(c), W, Q_T.itemsize, None,
                                       None)
            # positions counted from p - k: the queries start at k
            _attend_sequence(Q_T[:, :, s0:s1], K_b, V_b, True, block, tile,
                             concat[s0:s1], q0=k, window=w)
            last = np.arange(max(p, p + int(c) - w), p + int(c))  # positions
            writes.append((b, last % w, K_b[:, :, k + last - p],
                           V_b[:, :, k + last - p]))  # (h_kv, d, rows)
            s0 = s1
        for b, slots, K_new, V_new in writes:
            # (rows, h_kv, d): one row per slot
            self._K[b, :, slots] = K_new.transpose(2, 0, 1)
            self._V[b, :, slots] = V_new.transpose(2, 0, 1)
        return concat

    def __repr__(self) -> str:
        rows = (f"rows={len(self)}" if self.batch is None
                else f"batch={self.batch}, rows={self._lengths.tolist()}")
        grouped = ("" if self.W.kv_heads == self.W.heads
                   else f", kv_heads={self.W.kv_heads}")
        extra = ("" if self.rope_base is None
                 else f", rope_base={self.rope_base:g}")
        extra += "" if self.window is None else f", window={self.window}"
        return (f"KVCache({rows}, heads={self.W.heads}{grouped}, "
                f"d_k={self.W.d_k}, d_v={self.W.d_v}{extra})")


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
    g = dims.group  # query heads per K/V head (Part III, chapter 14)
    products = []
    for i in range(h):
        # new rows need all n keys and values; the cache already holds
        # n - rows of them. A K/V head is projected once for its group.
        kv = [(rows, d, dk), (rows, d, dv)] if i % g == 0 else []
        products += [(rows, d, dk), *kv, (rows, dk, n), (rows, n, dv)]
    # Concat (rows, h*d_v) @ W_O (h*d_v, d_model)
    return products + [(rows, h * dv, d)]


def step_multiply_adds(n: int, dims) -> int:
    """Multiply-adds for output row n when rows 1..n-1 of K, V are cached.

    Book: chapter 7. One row each of Q, K, V per head (the new token's),
    one row of scores against the n keys, one weighted sum of the n values,
    and one row of Concat times W_O:
    h (d_model (2 d_k + d_v) + n (d_k + d_v)) + h d_v d_model, linear in n.
    With grouped K/V heads (Part III, chapter 14) the key and value rows
    are projected h_kv times, not h.
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
