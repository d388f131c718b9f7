"""A paged KV cache: blocks of rows from one pool, a block table per sequence.

Book: Part III, chapter 18, "A paged cache".

``KVCache`` (chapters 7 and 12) keeps each sequence's keys and values in
buffers of its own that double when full, and a batch of B sequences in
buffers as long as the longest. A serving system instead cuts memory into
*blocks* of a fixed number of rows, takes them from one pool as sequences
grow, and keeps for each sequence a *block table*, the list of its blocks
in order (Kwon et al. 2023, "Efficient Memory Management for Large
Language Model Serving with PagedAttention"). Row p of a sequence lives in
slot p % b of block table[p // b]. Sequences that share a prefix share its
blocks: each block has a reference count, and a shared block is copied
only when a sequence writes into it (copy-on-write).

The cache adds no arithmetic of its own: it projects new rows with the
fast path's functions, stores their keys and values, and leaves the
scores and weights to the package's one kernel, as ``KVCache`` does: a
sequence's rows are gathered from its blocks in position order and
handed to ``attention`` (or ``fast.attend``, which calls it).

Letters in shape comments (see ``mha_lit.shapes``): m new rows, n rows
of a sequence, b rows per block (``block_size``), N blocks in the pool
(``num_blocks``), t blocks in a sequence's table, d_model, d_k, d_v, h
heads, h_kv key/value heads.
"""

from __future__ import annotations

import heapq

import numpy as np

from . import checks, fast, masks
from .attention import attention
from .shapes import Weights

__all__ = ["PagedKVCache", "OutOfBlocksError", "blocks_needed"]


class OutOfBlocksError(RuntimeError):
    """The pool has too few free blocks for the rows asked to be appended.

    Book: Part III, chapter 18, "A paged cache". The cache is left as it
    was; a server would now free or pause a sequence.
    """


def blocks_needed(rows: int, block_size: int) -> int:
    """Blocks that hold ``rows`` rows, ceil(rows / b). Book: chapter 18."""
    rows = checks.whole_number(rows, "rows")
    b = checks.positive_int(block_size, "block_size")
    return -(-rows // b)  # ceil, in integers


class PagedKVCache:
    """Causal multi-head attention for many sequences, K and V in blocks.

    Book: Part III, chapter 18, "A paged cache". ``add_sequence()`` starts
    a sequence and returns its id; ``extend(seq, X)`` appends rows X
    (m, d_model) to it and returns their outputs (m, d_model), and
    ``step(seq, x)`` one row. Each sequence's outputs equal those of a
    ``KVCache`` given the same rows. ``fork(seq)`` starts a new sequence
    that shares every block of ``seq`` (it takes no block), as parallel
    samples of one prompt do; ``free(seq)`` ends a sequence and returns
    the blocks no other sequence uses to the pool.

    The pool holds ``num_blocks`` blocks of ``block_size`` rows of K and
    V, for the W.kv_heads key/value heads only (chapter 14). A new block
    is taken only when a sequence's last block is full. Copy-on-write is
    lazy, as in vLLM: a row appended to a last block that other
    sequences share (reference count > 1) and that is only partly filled
    copies that block first. With ``rope_base`` keys are stored rotated by
    their positions (chapter 15). Dtypes follow ``KVCache``. A refused or
    failed append leaves the cache as it was; too few free blocks raise
    ``OutOfBlocksError``.
    """

    def __init__(self, W: Weights, block_size: int = 16,
                 num_blocks: int = 64, *, rope_base=None):
        self.W = checks.weights(W, "PagedKVCache")
        self.rope_base = checks.rotary_base(rope_base, W)
        self.block_size = checks.positive_int(block_size, "block_size")
        self.num_blocks = checks.positive_int(num_blocks, "num_blocks")
        b, N = self.block_size, self.num_blocks
        self._K = np.zeros((N, W.kv_heads, b, W.d_k),
                           dtype=W.dtype)  # (N, h_kv, b, d_k)
        self._V = np.zeros((N, W.kv_heads, b, W.d_v),
                           dtype=W.dtype)  # (N, h_kv, b, d_v)
        self._refs = np.zeros(N, dtype=np.int64)  # (N,): sequences per block
        self._free = list(range(N))  # a heap: the lowest free id first
        self._tables: dict[int, list[int]] = {}  # sequence -> block ids
        self._lengths: dict[int, int] = {}  # sequence -> rows
        self._next_id = 0

    # --- sequences and blocks ---------------------------------------------

    def add_sequence(self) -> int:
        """Start an empty sequence (it takes no block); return its id."""
        seq, self._next_id = self._next_id, self._next_id + 1
        self._tables[seq], self._lengths[seq] = [], 0
        return seq

    def fork(self, seq: int) -> int:
        """A new sequence sharing all of ``seq``'s blocks; no block taken.

        Book: chapter 18. Every block of ``seq`` gains one reference; the
        two sequences part only when one of them writes (copy-on-write).
        """
        table = self._table(seq)
        new = self.add_sequence()
        self._tables[new], self._lengths[new] = list(table), self._lengths[seq]
        self._refs[table] += 1
        return new

    def free(self, seq: int) -> None:
        """End ``seq``: blocks no other sequence uses go back to the pool."""
        table = self._table(seq)
        self._refs[table] -= 1
        for block in table:
            if self._refs[block] == 0:
                heapq.heappush(self._free, block)
        del self._tables[seq], self._lengths[seq]

    @property
    def sequences(self) -> list[int]:
        """The ids of the live sequences, in increasing order."""
        return sorted(self._tables)

    @property
    def blocks_in_use(self) -> int:
        """Blocks held by a sequence or more (a shared one counts once)."""
        return int(np.count_nonzero(self._refs))

    @property
    def free_blocks(self) -> int:
        """Blocks in the pool that no sequence holds."""
        return len(self._free)

    @property
    def ref_counts(self) -> np.ndarray:
        """The reference count of every block of the pool, (N,) (a copy)."""
        return self._refs.copy()

    def length(self, seq: int) -> int:
        """Rows appended to ``seq`` so far."""
        self._table(seq)
        return self._lengths[seq]

    @property
    def lengths(self) -> dict[int, int]:
        """Rows of every live sequence, {id: rows} (a copy)."""
        return dict(sorted(self._lengths.items()))

    def block_table(self, seq: int) -> tuple[int, ...]:
        """The ids of ``seq``'s blocks, in position order."""
        return tuple(self._table(seq))

    def keys(self, seq: int) -> np.ndarray:
        """``seq``'s keys (h_kv, n, d_k) in position order, read-only."""
        return self._read_only(self._gather(self._K, seq, self.length(seq)))

    def values(self, seq: int) -> np.ndarray:
        """``seq``'s values (h_kv, n, d_v) in position order, read-only."""
        return self._read_only(self._gather(self._V, seq, self.length(seq)))

    def _table(self, seq) -> list[int]:
        """The block table of a live sequence, or an error naming the id."""
        if (isinstance(seq, (bool, np.bool_))
                or not isinstance(seq, (int, np.integer))
                or int(seq) not in self._tables):
            raise ValueError(f"no sequence {seq!r} in this cache: its "
                             f"sequences are {self.sequences}")
        return self._tables[int(seq)]

    def _gather(self, pool: np.ndarray, seq: int, n: int) -> np.ndarray:
        """Rows 0 .. n-1 of ``seq`` from its blocks, (h_kv, n, d)."""
        rows = pool[self._tables[int(seq)]]  # (t, h_kv, b, d): a copy
        rows = rows.transpose(1, 0, 2, 3).reshape(
            pool.shape[1], -1, pool.shape[3])  # (h_kv, t*b, d)
        return rows[:, :n]  # (h_kv, n, d)

    @staticmethod
    def _read_only(a: np.ndarray) -> np.ndarray:
        a.flags.writeable = False
        return a

    # --- appending rows -----------------------------------------------------

    def step(self, seq: int, x) -> np.ndarray:
        """Append one row x (d_model,) to ``seq``; return its output y."""
        x = self._rows(x, 1)  # (1, d_model)
        return self.extend(seq, x)[0]

    def extend(self, seq: int, X) -> np.ndarray:
        """Append rows X (m, d_model) to ``seq``; return Y (m, d_model).

        Book: chapter 18. The m new queries attend to the sequence's
        cached keys and to each other, causally, as ``KVCache.extend``.
        """
        table = self._table(seq)
        X = self._rows(X, 2)  # (m, d_model)
        if len(X) == 0:
            return X.copy()  # (0, d_model): nothing appended
        saved = (list(table), self._refs.copy(), list(self._free))
        self._make_room(int(seq), len(X))  # blocks, or OutOfBlocksError
        try:
            Y = self._append(int(seq), X)
        except BaseException:  # the cache as it was
            self._tables[int(seq)], self._refs, self._free = saved
            raise
        self._lengths[int(seq)] += len(X)  # committed
        return Y.astype(X.dtype, copy=False)

    def _rows(self, X, ndim: int) -> np.ndarray:
        """X checked against d_model, as (m, d_model) floats."""
        X = np.asanyarray(X)
        d = self.W.d_model
        if X.ndim != ndim or X.shape[-1] != d:
            want = "one row x (d_model,)" if ndim == 1 else \
                "a block X (m, d_model)"
            raise ValueError(f"{'step' if ndim == 1 else 'extend'} takes "
                             f"{want}, with d_model = {d}, got shape "
                             f"{X.shape}")
        X = checks.float_array(X, "x" if ndim == 1 else "X")
        return X.reshape(-1, d)  # (m, d_model)

    def _make_room(self, seq: int, m: int) -> None:
        """Blocks for m more rows of ``seq``: a copy of a shared, partly
        filled last block, then new blocks when the last is full."""
        table, n, b = self._tables[seq], self._lengths[seq], self.block_size
        partly = n % b != 0  # the last block has free slots
        copy = partly and self._refs[table[-1]] > 1  # ... and is shared
        new = blocks_needed(n + m, b) - blocks_needed(n, b)
        if copy + new > len(self._free):
            raise OutOfBlocksError(
                f"appending {m} rows to sequence {seq} ({n} rows) needs "
                f"{copy + new} free blocks of {b} rows, but the pool of "
                f"{self.num_blocks} blocks has {len(self._free)} free")
        if copy:  # copy-on-write: this sequence gets its own last block
            old, mine = table[-1], heapq.heappop(self._free)
            self._K[mine], self._V[mine] = self._K[old], self._V[old]
            self._refs[old] -= 1
            self._refs[mine] = 1
            table[-1] = mine
        for _ in range(new):
            block = heapq.heappop(self._free)
            self._refs[block] = 1
            table.append(block)

    def _append(self, seq: int, X: np.ndarray) -> np.ndarray:
        """Project X, store its keys and values in their slots, attend."""
        W, n, b = self.W, self._lengths[seq], self.block_size
        dtype = np.result_type(X, W.dtype)
        if dtype != self._K.dtype:  # a wider input widens the pool
            self._K, self._V = (np.asarray(p, dtype) for p in (self._K,
                                                                self._V))
        at = n + np.arange(len(X))  # (m,): the new rows' positions
        Q_T, K_T, V_T = fast.project_heads(X.astype(dtype, copy=False), W)
        if self.rope_base is not None:  # chapter 15: keys stored rotated
            fast.rotate_heads(Q_T, at, self.rope_base)
            fast.rotate_heads(K_T, at, self.rope_base)
        blocks = np.asarray(self._tables[seq])[at // b]  # (m,)
        self._K[blocks, :, at % b] = K_T.transpose(2, 0, 1)  # (m, h_kv, d_k)
        self._V[blocks, :, at % b] = V_T.transpose(2, 0, 1)  # (m, h_kv, d_v)
        # every row of the sequence, the new ones included, in order
        K = self._gather(self._K, seq, n + len(X))  # (h_kv, n + m, d_k)
        V = self._gather(self._V, seq, n + len(X))  # (h_kv, n + m, d_v)
        H = self._attend_rows(Q_T.transpose(0, 2, 1), K, V, at)  # (h, m, d_v)
        concat = H.transpose(1, 0, 2).reshape(len(X), -1)  # (m, h*d_v)
        return fast.output_projection(concat, W)  # (m, d_model)

    def _attend_rows(self, Q, K, V, at) -> np.ndarray:
        """H (h, m, d_v): the kernel, as ``KVCache._attend_rows`` calls it.

        Q (h, m, d_k), already scaled; K (h_kv, n, d_k), V (h_kv, n, d_v)
        in position order. One new row sees every key: ``attention``
        itself while its scores fit at once (``fast.choose_sizes``), past
        that ``fast.attend``'s tiles; more rows go through ``fast.attend``
        with the causal rule.
        """
        W, n = self.W, K.shape[1]
        block, tile = fast.choose_sizes(len(at), n, W, K.itemsize)
        Qg, at_g = fast.group_queries(Q, at, W.kv_heads)  # chapter 14
        if len(at) == 1 and tile is None:  # no mask, whole rows
            H = attention(Qg, K, V, scale=1.0).astype(Qg.dtype, copy=False)
        else:
            H = fast.attend(Qg, K, V, at_g, np.arange(n), masks.visible,
                            in_order=True, block=block * W.group,
                            tile=tile)
        return fast.ungroup(H, W.heads)  # (h, m, d_v)

    def __repr__(self) -> str:
        return (f"PagedKVCache(sequences={self.lengths}, block_size="
                f"{self.block_size}, blocks_in_use={self.blocks_in_use}/"
                f"{self.num_blocks}, heads={self.W.heads}, kv_heads="
                f"{self.W.kv_heads}, d_k={self.W.d_k}, d_v={self.W.d_v})")
