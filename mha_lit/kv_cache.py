"""Generating one token at a time: the KV cache.

Book: Part I, chapter 7 "The KV cache"; prefill and batches of
sequences: Part II, chapter 12 "Computing it efficiently"; grouped K/V
heads, rotated keys and the ring buffer of a sliding window: Part III,
chapters 14, 15 and 16.

When a row x is appended to X, rows 1..n of every intermediate stay as
they were (chapter 6), so only the new row must be computed. Its query q
is used once and dropped; its key and value rows are kept, because every
later token will look at them. The cache only stores: every score and
weight is computed by chapter 3's ``attention``, through the fast path's
``fast.attend``, which works from the positions of queries and keys.

Letters in shape comments (see ``mha_lit.shapes``): n rows held, c new
rows per sequence, N new real rows in all, cap the buffer capacity
(>= n, or the window w), d_model, d_k, d_v, h heads, h_kv key/value
heads, B sequences in a batch.
"""

from __future__ import annotations

import numpy as np

from . import checks, fast, masks
from .attention import attention
from .shapes import Weights

__all__ = ["KVCache", "step_multiply_adds", "recompute_multiply_adds",
           "products"]


class KVCache:
    """Causal multi-head attention computed as tokens arrive, keeping K and V.

    Book: chapter 7 (one token at a time) and chapter 12 (prefill and
    batches). ``cache.step(x)`` takes one new input row x (d_model,) and
    returns its output row y (d_model,), equal to the last row of
    ``multi_head_attention`` on all rows seen so far. A step costs
    O(n * d) multiply-adds: the new row's q, k, v, one score per cached
    key, one weighted sum of cached values per head, and W_O.

    ``cache.extend(X)`` appends a block of rows X (m, d_model) at once, as a
    prompt is *prefilled*: one matrix product projects all m rows, and the
    m new queries attend to the cached keys and to each other (causally).
    Its outputs are the last m rows of ``multi_head_attention`` on
    everything seen. ``step`` is ``extend`` with one row.

    ``KVCache(W, batch=B)`` keeps B sequences side by side: ``step`` takes
    (B, d_model) and ``extend`` (B, m, d_model), with an optional
    ``key_mask`` (B, m), True for real tokens, for prompts of different
    lengths (padded rows are not cached; their outputs are 0).

    Dtypes follow ``multi_head_attention``: computed in the wider of the
    input's and W's float types, returned in the input's. Keys and values
    live in buffers that double when full (amortised O(1) append). A refused
    input leaves the cache exactly as it was.

    Part III. With grouped key/value heads (W.kv_heads < W.heads) only the
    h_kv heads are cached (chapter 14). With ``rope_base`` every key is
    stored already rotated by its own position (chapter 15). With
    ``window`` w the buffers never hold more than w rows: the row of
    position p lives in slot p % w, a ring buffer (chapter 16); ``held``
    says how many rows are kept, ``len`` how many positions were seen.
    ``rope_scaling`` rescales the rotary frequencies (chapter 15, "Beyond
    the trained length"); under a "dynamic" rule the new rows are turned
    with the frequencies of the length reached, while the keys already
    cached keep theirs, as Hugging Face's cache keeps them: the result
    then differs from ``multi_head_attention`` on the whole sequence.
    """

    def __init__(self, W: Weights, capacity: int = 16, *,
                 batch: int | None = None, rope_base=None,
                 window: int | None = None, rope_scaling=None):
        self.W = checks.weights(W, "KVCache")
        self.rope_base = checks.rotary_base(rope_base, W)
        self.rope_scaling = checks.rope_scaling(rope_scaling, rope_base)
        self.window = checks.window(window)
        self._seen = masks.rule(True, self.window)  # which keys a query sees
        capacity = checks.positive_int(capacity, "capacity")
        self.batch = None if batch is None else checks.positive_int(
            batch, "batch")
        if self.window is not None:  # a ring of w rows at most
            capacity = min(capacity, self.window)
        B = 1 if batch is None else self.batch
        self._lengths = np.zeros(B, dtype=np.int64)  # positions seen
        # zeros, not empty: an unused slot takes part in a batched product
        # with weight exactly 0
        self._K = np.zeros((B, W.kv_heads, capacity, W.d_k),
                           dtype=W.dtype)  # (B, h_kv, cap, d_k)
        self._V = np.zeros((B, W.kv_heads, capacity, W.d_v),
                           dtype=W.dtype)  # (B, h_kv, cap, d_v)
        # the position whose key and value each slot holds; -1: empty
        self._at = np.full((B, capacity), -1, dtype=np.int64)  # (B, cap)

    # --- what is cached -------------------------------------------------

    def __len__(self) -> int:
        """Rows seen; with a batch, by the longest sequence."""
        return int(self._lengths.max())

    @property
    def lengths(self) -> np.ndarray:
        """Rows seen for each sequence, (B,) (a copy)."""
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
        """Rows the buffers hold now, per sequence (they double when full,
        and never grow past the window)."""
        return self._K.shape[2]

    def _in_order(self, buf: np.ndarray) -> np.ndarray:
        """The held rows of ``buf`` (B, h_kv, cap, d) in position order: the
        first ``held`` positions (0 past a sequence's length), or with a
        window each sequence's last ``held`` (0 before its first)."""
        n = self.held
        if self.window is None:  # slot j holds position j; 0 past a length
            return buf[:, :, :n].copy()  # (B, h_kv, n, d)
        # position of row j of sequence b: L[b] - n + j
        pos = self._lengths[:, None] - n + np.arange(n)[None, :]  # (B, n)
        slots = self._slot(np.maximum(pos, 0))  # (B, n)
        rows = np.take_along_axis(buf, slots[:, None, :, None], axis=2)
        rows[np.broadcast_to((pos < 0)[:, None, :, None], rows.shape)] = 0
        return rows  # (B, h_kv, n, d)

    @property
    def keys(self) -> np.ndarray:
        """Cached keys, read-only: (h_kv, n, d_k); with a batch
        (B, h_kv, n, d_k), rows past a sequence's length are 0. With a
        window, the last ``held`` positions, oldest first (chapter 16);
        with RoPE, rotated by their positions (chapter 15)."""
        return self._view(self._in_order(self._K))

    @property
    def values(self) -> np.ndarray:
        """Cached values, read-only: (h_kv, n, d_v); with a batch
        (B, h_kv, n, d_v)."""
        return self._view(self._in_order(self._V))

    def _view(self, a: np.ndarray) -> np.ndarray:
        a = a[0] if self.batch is None else a
        a.flags.writeable = False
        return a

    def truncate(self, lengths) -> None:
        """Forget every row past ``lengths`` (an int, or (B,) ints).

        Book: chapter 12. The kept rows stay as they were; the forgotten
        slots are emptied. ``truncate(0)`` starts over (``reset``). With a
        window, the w - 1 rows before the new length must still be held
        (chapter 16): a ring buffer has already overwritten older rows.
        """
        L = np.broadcast_to(np.asarray(lengths), self._lengths.shape)
        if (not np.issubdtype(L.dtype, np.integer) or (L < 0).any()
                or (L > self._lengths).any()):
            raise ValueError(
                f"lengths must be integers in 0 .. {self._lengths.tolist()} "
                f"(the rows cached), got {np.asarray(lengths).tolist()}")
        w = self.window
        if w is not None:
            oldest = np.maximum(self._lengths - w, 0)  # first position held
            needed = np.maximum(L - w + 1, 0)  # first position still needed
            if ((L > 0) & (needed < oldest)).any():
                raise ValueError(
                    f"cannot go back to {L.tolist()} rows: a window of {w} "
                    f"holds positions from {oldest.tolist()} on, and "
                    "the older keys it would need are overwritten")
        self._lengths = L.astype(np.int64)
        self._forget_past_lengths()

    def reset(self) -> None:
        """Forget every row: an empty cache, buffers kept."""
        self.truncate(0)

    def _forget_past_lengths(self) -> None:
        """Empty every slot holding a position at or past its length."""
        gone = self._at >= self._lengths[:, None]  # (B, cap)
        for buf in (self._K, self._V):  # (B, cap, h_kv, d) views
            buf.transpose(0, 2, 1, 3)[gone] = 0
        self._at[gone] = -1

    # --- appending rows -----------------------------------------------------

    def step(self, x) -> np.ndarray:
        """Append one row; return its output row. Book: chapter 7.

        x (d_model,) -> y (d_model,): ``_append`` with one row. (A cache of
        B sequences takes one row for each, (B, d_model); chapter 12.)
        """
        X = self._rows(x, "step", 1)  # (sequences, 1 row, d_model)
        Y = self._append(X, np.ones(X.shape[:2], dtype=bool))  # (B, 1, d)
        return self._as_given(Y[:, 0].astype(X.dtype, copy=False))

    def extend(self, X, key_mask=None) -> np.ndarray:
        """Append a block of rows; return their outputs, computed at once.

        Book: chapter 12, "Prefill, then one token at a time". X (m,
        d_model) -> (m, d_model); with a batch, (B, m, d_model) ->
        (B, m, d_model), and ``key_mask`` (B, m) (True = real token) for
        prompts of different lengths: each sequence appends its real rows
        in order; padded rows are not cached and output 0.
        """
        Xb = self._rows(X, "extend", 2)  # (B, m, d_model)
        real = checks.key_mask(key_mask, np.shape(X)[:-1],
                               of=f"X {np.shape(X)}")
        real = (np.ones(Xb.shape[:2], dtype=bool) if real is None
                else real.reshape(Xb.shape[:2]))  # (B, m)
        Y = np.concatenate([self._append(Xb[:, a:b], real[:, a:b])
                            for a, b in self._spans(Xb.shape[1])], axis=1)
        return self._as_given(Y.astype(Xb.dtype, copy=False))  # X's shape

    def _append(self, X: np.ndarray, real: np.ndarray) -> np.ndarray:
        """Store the new rows' keys and values, attend their queries to
        every key held, and return their output rows. Book: chapter 7.

        X (sequences, c rows, d_model) -> Y of the same shape. ``real``
        marks the rows that are real tokens: all of them, except in the
        padded batches of chapters 8 and 12. Nothing is kept if anything
        fails.
        """
        new = self._project(X, real)  # their q, k, v and positions
        undo = self._store(new)  # their keys and values join the cache
        try:
            H = self._attend(new)  # every new query against every key held
            Y = self._output(H, real)  # Concat W_O; padded rows 0
        except BaseException:
            undo()  # the cache as it was
            raise
        self._lengths += real.sum(axis=1)  # committed
        return Y

    # --- the steps of _append ------------------------------------------------

    def _rows(self, x, what: str, ndim: int) -> np.ndarray:
        """x checked against the cache's batch and d_model, as (B, c, d)."""
        x = np.asanyarray(x)  # keeps ndarray subclasses (chapter 10)
        B, d = self.batch, self.W.d_model
        lead = () if B is None else (B,)
        if not (x.ndim == ndim + len(lead) and x.shape[-1] == d
                and x.shape[:len(lead)] == lead):
            rows = ("one row x" if ndim == 1 else "a block X") + (
                " (d_model,)" if ndim == 1 else " (m, d_model)")
            if B is not None:
                rows = ("one row per sequence, x (B, d_model)" if ndim == 1
                        else "a block per sequence, X (B, m, d_model)")
            raise ValueError(f"{what} takes {rows}, with d_model = {d}"
                             + ("" if B is None else f" and B = {B}")
                             + f", got shape {x.shape}")
        x = checks.float_array(x, "x" if ndim == 1 else "X")
        return x.reshape(len(self._lengths), -1, d)  # (B, c, d_model)

    def _as_given(self, Y: np.ndarray) -> np.ndarray:
        """Y (B, ..) without its batch axis if the cache has no batch."""
        return Y[0] if self.batch is None else Y

    def _spans(self, m: int):
        """The blocks of columns that are appended at once: all m of them.

        With a window (chapter 16), once the ring is full, one column at a
        time: storing a block's keys would overwrite keys that the block's
        earlier queries still need.
        """
        if self.window is None or m == 0:
            return [(0, m)]
        first = min(m, max(0, self.window - len(self)))  # fills the ring
        return [(0, first)] * (first > 0) + [(j, j + 1)
                                             for j in range(first, m)]

    def _project(self, X: np.ndarray, real: np.ndarray) -> dict:
        """The new rows' queries, keys and values, from one product.

        Book: chapter 12. Row j of sequence b stands at position
        L[b] + (its rank among b's real rows); with ``rope_base`` its query
        and key are turned by it (chapter 15).
        """
        dtype = np.result_type(X, self.W.dtype)
        if real.all():  # row j of sequence b at L[b] + j
            B, c = real.shape
            seq = np.arange(B).repeat(c)  # (N,): the sequence of each row
            at = (self._lengths.copy() if c == 1 else  # (N,)
                  (self._lengths[:, None] + np.arange(c)).ravel())
            rows = X.reshape(-1, X.shape[-1])  # (N, d_model)
        else:
            seq = np.nonzero(real)[0]  # (N,)
            at = (self._lengths[:, None] + np.cumsum(real, axis=1) - 1)[real]
            rows = X[real]  # (N, d_model)
        Q_T, K_T, V_T = fast.project_heads(
            rows.astype(dtype, copy=False), self.W)  # (.., N) each
        if self.rope_base is not None:
            length = int(at.max()) + 1 if len(at) else 0  # for "dynamic"
            for A_T in (Q_T, K_T):
                fast.rotate_heads(A_T, at, self.rope_base,
                                  self.rope_scaling, length)
        Q, K, V = (A.transpose(0, 2, 1) for A in (Q_T, K_T, V_T))  # (.., N, d)
        return {"Q": Q, "K": K, "V": V, "seq": seq, "at": at,
                "counts": real.sum(axis=1), "dtype": dtype}

    def _slot(self, at: np.ndarray) -> np.ndarray:
        """The buffer slot of position ``at``: itself, or at mod w."""
        return at if self.window is None else at % self.window

    def _store(self, new: dict):
        """Write the new keys and values into the slots of their positions.

        Returns a function that puts back what the slots held before.
        """
        self._make_room(self._lengths + new["counts"], new["dtype"])
        seq, slots = new["seq"], self._slot(new["at"])  # (N,), (N,)
        # without a window, position p >= L[b] is slot p: always empty
        if self.window is None or (self._at[seq, slots] < 0).all():
            undo = self._forget_past_lengths
        else:  # a ring buffer overwrites held keys: keep copies
            old = (self._K[seq, :, slots], self._V[seq, :, slots],
                   self._at[seq, slots])  # copies: advanced indexing

            def undo():
                self._K[seq, :, slots], self._V[seq, :, slots] = old[:2]
                self._at[seq, slots] = old[2]
        if len(self._at) == 1 and self.window is None and len(slots):  # a run
            run = slice(slots[0], slots[0] + len(slots))
            self._K[0, :, run], self._V[0, :, run] = new["K"], new["V"]
            self._at[0, run] = new["at"]
        else:  # (N, h_kv, d) into their (sequence, slot)
            self._K[seq, :, slots] = new["K"].transpose(1, 0, 2)
            self._V[seq, :, slots] = new["V"].transpose(1, 0, 2)
            self._at[seq, slots] = new["at"]
        return undo

    def _attend(self, new: dict) -> np.ndarray:
        """H (h, N, d_v): every new query against the keys held.

        The sequences that append the same number of rows (every sequence,
        in a decoding step) are computed together, batched.
        """
        W, counts = self.W, new["counts"]
        used = min(int((self._lengths + counts).max()),
                   self.capacity)  # slots in use
        K, V = self._K[:, :, :used], self._V[:, :, :used]  # (B, h_kv, ..)
        at_k = self._at[:, :used]  # (B, used), -1 where empty
        Q, at = new["Q"], new["at"]
        together = len(counts) == 1 or bool((counts == counts[0]).all())
        # one new row for each sequence, all of one length: every slot in use
        # holds one of the last w positions before the new query's own, so
        # the mask would hide nothing (chapter 7: the new token sees all)
        L = self._lengths  # before the new rows
        sees_all = together and counts[0] == 1 and (
            len(L) == 1 or bool((L == L[0]).all()))
        seen = None if sees_all else self._seen
        block, tile = fast.choose_sizes(
            int(counts.max()), used, W, self._K.itemsize,
            stack=len(counts) if together else 1)
        if together:  # (B, h, c, d_k): all at once
            B, c = len(counts), int(counts[0])
            Qb = Q.reshape(W.heads, B, c, W.d_k).transpose(1, 0, 2, 3)
            H = self._attend_rows(Qb, K, V, at.reshape(B, c), at_k, seen,
                                  block, tile)  # (B, h, c, d_v)
            return H.transpose(1, 0, 2, 3).reshape(W.heads, -1, W.d_v)
        H = np.empty(Q.shape[:2] + (W.d_v,), np.result_type(Q, V))
        ends = np.cumsum(counts)  # each sequence's rows, one after another
        for b, (s0, s1) in enumerate(zip(ends - counts, ends, strict=True)):
            if s1 > s0:
                H[:, s0:s1] = self._attend_rows(Q[:, s0:s1], K[b], V[b],
                                                at[s0:s1], at_k[b], seen,
                                                block, tile)  # (h, c_b, d_v)
        return H

    def _attend_rows(self, Q, K, V, at, at_k, seen, block,
                     tile) -> np.ndarray:
        """The kernel, each K/V head's query heads side by side: ``attention``
        itself when nothing is hidden, else ``fast.attend`` with the rule."""
        Qg, at_g = fast.group_queries(Q, at, self.W.kv_heads)  # chapter 14
        if seen is None and tile is None:  # no mask, whole rows: the kernel
            H = attention(Qg, K, V, scale=1.0).astype(Qg.dtype, copy=False)
        else:
            H = fast.attend(Qg, K, V, at_g, at_k, seen,
                            in_order=self.window is None,  # slot j: position j
                            block=block * self.W.group, tile=tile)
        return fast.ungroup(H, self.W.heads)  # (.., h, c, d_v)

    def _output(self, H: np.ndarray, real: np.ndarray) -> np.ndarray:
        """Concat (N, h*d_v) @ W_O, put back as (B, c, d_model)."""
        N, h_dv = H.shape[1], self.W.heads * self.W.d_v
        concat = H.transpose(1, 0, 2).reshape(N, h_dv)  # (N, h*d_v)
        Y = fast.output_projection(concat, self.W)  # (N, d_model)
        if N == real.size:  # every row real
            return Y.reshape(real.shape + Y.shape[-1:])  # (B, c, d_model)
        out = np.zeros(real.shape + Y.shape[-1:], Y.dtype)  # (B, c, d_model)
        out[real] = Y  # padded rows 0
        return out

    def _make_room(self, lengths: np.ndarray, dtype: np.dtype) -> None:
        """Buffers that hold ``lengths`` rows per sequence, in ``dtype``."""
        cap = self.capacity
        need = int(lengths.max())
        if need <= cap and dtype == self._K.dtype:  # room already
            return
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
        # a ring only grows before it wraps: slots 0 .. cap-1 are in order
        for name in ("_K", "_V"):
            old = getattr(self, name)
            new = np.zeros(old.shape[:2] + (new_cap, old.shape[3]),
                           dtype=new_dtype)  # (B, h_kv, new_cap, d)
            new[:, :, :cap] = old
            setattr(self, name, new)
        at = np.full((len(self._at), new_cap), -1, dtype=np.int64)
        at[:, :cap] = self._at
        self._at = at

    def __repr__(self) -> str:
        rows = (f"rows={len(self)}" if self.batch is None
                else f"batch={self.batch}, rows={self._lengths.tolist()}")
        grouped = ("" if self.W.kv_heads == self.W.heads
                   else f", kv_heads={self.W.kv_heads}")
        extra = ("" if self.rope_base is None
                 else f", rope_base={self.rope_base:g}")
        if self.rope_scaling is not None:
            extra += f", rope_scaling={self.rope_scaling['rope_type']!r}"
        extra += "" if self.window is None else f", window={self.window}"
        return (f"KVCache({rows}, heads={self.W.heads}{grouped}, "
                f"d_k={self.W.d_k}, d_v={self.W.d_v}{extra})")


# --- Part I, chapter 7: what a step costs, with and without the cache ------


def products(rows: int, n: int, dims) -> list[tuple[int, int, int]]:
    """Shapes (a, b, c) of the products (a x b) @ (b x c) that compute
    ``rows`` output rows against n keys. Book: chapter 7.

    Per query head the new rows' q, Q K^T against the n keys and S V; per
    key/value head the new rows' k and v (one per head in multi-head
    attention; fewer, shared, in Part III, chapter 14); then Concat W_O.
    """
    rows, n = (checks.positive_int(v, name)
               for v, name in ((rows, "rows"), (n, "n")))
    d, d_k, d_v, h = dims.d_model, dims.d_k, dims.d_v, dims.heads
    per_query_head = [(rows, d, d_k), (rows, d_k, n), (rows, n, d_v)]
    per_kv_head = [(rows, d, d_k), (rows, d, d_v)]  # k and v
    return (per_query_head * h + per_kv_head * dims.kv_heads
            + [(rows, h * d_v, d)])  # and Concat W_O


def step_multiply_adds(n: int, dims) -> int:
    """Multiply-adds for output row n when rows 1..n-1 of K, V are cached.

    Book: chapter 7. One row each of q, k, v per head (the new token's),
    one row of scores against the n keys, one weighted sum of the n
    values, and one row of Concat times W_O:
    h (d_model (2 d_k + d_v) + n (d_k + d_v)) + h d_v d_model, linear in n.
    """
    n = checks.positive_int(n, "n")
    return sum(a * b * c for a, b, c in products(1, n, dims))


def recompute_multiply_adds(n: int, dims) -> int:
    """Multiply-adds to recompute all n output rows, as without a cache.

    Book: chapter 7. The same products as ``step_multiply_adds`` with n
    rows instead of one: every Q, K, V, the full n x n score matrix (masked
    entries included, as a dense computation does), S V and Concat W_O,
    quadratic in n.
    """
    n = checks.positive_int(n, "n")
    return sum(a * b * c for a, b, c in products(n, n, dims))
