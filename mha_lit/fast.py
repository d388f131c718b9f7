"""Multi-head attention computed fast; same result as the book's reference.

Book: chapter 12 "Computing it efficiently".

The reference ``multi_head_attention_reference`` follows the equations head
by head. This module computes the same Y with four ideas, each a way to do
less work or to move fewer bytes:

1. Fused heads. The 3h projection matrices W_Qi, W_Ki, W_Vi are laid side
   by side once, so one matrix product projects X for every head at once.
   It is computed transposed, W_QKV^T X^T, so that each head's Q^T, K^T,
   V^T is a contiguous block of rows; the scale 1/sqrt(d_k) is folded into
   the W_Q rows, so the scores need no extra pass.
2. Causal block skipping. Queries are taken a block of rows at a time; a
   causal query block ending at row r1 multiplies only against keys
   0 .. r1-1. The blocks above the diagonal, which the mask would set to
   -inf anyway, are never computed: about half the score work.
3. Softmax in place. Each block of scores is turned into exp(S - max) in
   its own buffer, and the division by the row sum is applied to H
   (n x d_v) instead of to S (n x n).
4. Online softmax for long sequences. When one block of scores would
   exceed a memory limit, the keys are taken a tile at a time with a
   running maximum and a running sum (Milakov and Gimelshein 2018; Rabe
   and Staats 2021; Dao et al. 2022), so memory stays O(n * d) instead of
   O(h * n^2).

Biases (GPT-2's b_Q, b_K, b_V, b_O; chapter 8, "GPT-2's block, exactly")
join the fused product as one bias vector, and batches of padded
sequences (chapter 8, "Batches of sequences") are computed on their real
tokens only.

Part III: with grouped key/value heads (chapter 14) the g query heads of
a group are stacked as g*b rows of one product against their shared K and
V, which are never copied per query head; rotary positions (chapter 15)
turn Q and K once, right after the projection; a sliding window (chapter
16) starts each query block's keys w - 1 positions before its first row.

Letters in shape comments (see ``mha_lit.shapes``): n tokens, d_model,
d_k, d_v, h heads, h_kv key/value heads, g = h / h_kv, b query rows in a
block, w keys in a tile, m keys a
query block looks at, B sequences in a batch, N real tokens in it.
"""

from __future__ import annotations

import math

import numpy as np

from . import rope
from .shapes import Weights

__all__ = ["fused_weights", "fused_biases", "project_heads", "attend_block",
           "attend_tiled", "choose_sizes", "multi_head_attention_fast",
           "few_rows_product", "transposed_output_weights",
           "BLOCK_ROWS", "TILE_ROWS", "TILE_KEYS", "SCORES_LIMIT_BYTES"]

BLOCK_ROWS = 128  # query rows per block when whole key rows are used
TILE_ROWS = 256  # query rows per block on the online-softmax path
TILE_KEYS = 512  # keys per tile on the online-softmax path
# one block's scores (h, b, n) above this -> tiled path
SCORES_LIMIT_BYTES = 32 * 2**20
# rows of a weight matrix per product in few_rows_product: 256 x 768 float32
# numbers are 768 KiB, which stay in a core's cache while every row uses them
PANEL_ROWS = 256


def few_rows_product(W_T: np.ndarray, X: np.ndarray) -> np.ndarray:
    """X @ W_T.T for a few rows X (B, k) and a large W_T (n, k): (B, n).

    Book: chapter 12, "Prefill, then one token at a time". One row is a
    matrix-vector product, which streams the weights at the speed of
    memory. For a few rows, a general matrix product first copies
    ("packs") the large factor, and on such thin shapes that copy costs
    more than the arithmetic; taking W_T a panel of ``PANEL_ROWS`` rows at a
    time keeps each panel in the cache while all B rows use it, so the
    weights are still read from memory once. W_T must be C-contiguous.
    """
    if len(X) == 1:
        return (W_T @ X[0])[None]  # (1, n): matrix-vector
    if not W_T.flags.c_contiguous:
        raise ValueError(f"few_rows_product needs a C-contiguous W_T, got one "
                         f"of shape {W_T.shape} with strides {W_T.strides}")
    X_T = np.ascontiguousarray(X.T)  # (k, B)
    out = np.empty((W_T.shape[0], len(X)), np.result_type(W_T, X))  # (n, B)
    for r0 in range(0, W_T.shape[0], PANEL_ROWS):
        np.matmul(W_T[r0:r0 + PANEL_ROWS], X_T, out=out[r0:r0 + PANEL_ROWS])
    return out.T  # (B, n)


def fused_weights(W: Weights, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """W_QKV^T ((h + h_kv) d_k + h_kv d_v, d_model), 1/sqrt(d_k) folded in,
    and W_O.

    Book: chapter 12. Rows 0 .. h*d_k-1 are W_Q1^T/sqrt(d_k), ...,
    W_Qh^T/sqrt(d_k); then the h_kv blocks of W_K^T, then the h_kv blocks
    of W_V^T (h_kv = h except in grouped-query attention, chapter 14).
    Computed once per Weights and kept on it (Weights is frozen, so
    its matrices cannot change under the cached copy); ``dtype`` (default:
    W's) gives a copy in another float type, also made once and kept.
    """
    dtype = W.dtype if dtype is None else np.dtype(dtype)
    if dtype != W.dtype:
        return _kept_as(W, "_fused_as", dtype, fused_weights(W))
    cached = W.__dict__.get("_fused")
    if cached is None:
        scale = 1.0 / math.sqrt(W.d_k)
        W_QKV_T = np.concatenate([
            # (h*d_k, d_model): every head's W_Q^T / sqrt(d_k)
            (W.W_Q * scale).transpose(0, 2, 1).reshape(-1, W.d_model),
            # (h_kv*d_k, d_model): every key head's W_K^T
            W.W_K.transpose(0, 2, 1).reshape(-1, W.d_model),
            # (h_kv*d_v, d_model): every value head's W_V^T
            W.W_V.transpose(0, 2, 1).reshape(-1, W.d_model),
        ]).astype(W.dtype, copy=False)  # ((h+h_kv) d_k + h_kv d_v, d_model)
        W_QKV_T.flags.writeable = False
        cached = (W_QKV_T, W.W_O)
        object.__setattr__(W, "_fused", cached)
    return cached


def _kept_as(W: Weights, name: str, dtype, arrays: tuple) -> tuple:
    """``arrays`` converted to ``dtype`` once, and kept on W under ``name``."""
    kept = W.__dict__.setdefault(name, {})
    if dtype not in kept:
        converted = tuple(None if a is None else a.astype(dtype)
                          for a in arrays)
        for a in converted:
            if a is not None:
                a.flags.writeable = False
        kept[dtype] = converted
    return kept[dtype]


def transposed_output_weights(W: Weights, dtype=None) -> np.ndarray:
    """W_O^T (d_model, h*d_v), C-contiguous, for ``few_rows_product``.

    Book: chapter 12, "Prefill, then one token at a time". Made once per
    Weights and dtype, and kept on W.
    """
    dtype = W.dtype if dtype is None else np.dtype(dtype)
    kept = W.__dict__.setdefault("_W_O_T", {})
    if dtype not in kept:
        W_O_T = np.ascontiguousarray(W.W_O.T, dtype=dtype)
        W_O_T.flags.writeable = False
        kept[dtype] = W_O_T
    return kept[dtype]


def fused_biases(W: Weights, dtype=None) -> tuple[np.ndarray | None,
                                                  np.ndarray | None]:
    """b_QKV ((h + h_kv) d_k + h_kv d_v,), 1/sqrt(d_k) folded in, and b_O.

    Book: chapter 8, "GPT-2's block, exactly". Entry r of b_QKV is the
    bias of row r of W_QKV^T X^T: b_Q1/sqrt(d_k), ..., b_Qh/sqrt(d_k), then
    every head's b_K, then every head's b_V (zeros for a bias that is
    None). Returns (None, None) when W has no biases. Kept on W.
    """
    if not W.has_biases:
        return None, None
    dtype = W.dtype if dtype is None else np.dtype(dtype)
    if dtype != W.dtype:
        return _kept_as(W, "_fused_biases_as", dtype, fused_biases(W))
    cached = W.__dict__.get("_fused_biases")
    if cached is None:
        scale = 1.0 / math.sqrt(W.d_k)
        b_QKV = np.concatenate([
            (W.bias("b_Q") * scale).reshape(-1),  # (h*d_k,)
            W.bias("b_K").reshape(-1),  # (h_kv*d_k,)
            W.bias("b_V").reshape(-1),  # (h_kv*d_v,)
        ]).astype(W.dtype, copy=False)  # ((h+h_kv) d_k + h_kv d_v,)
        b_QKV.flags.writeable = False
        cached = (b_QKV, W.bias("b_O"))
        object.__setattr__(W, "_fused_biases", cached)
    return cached


def project_heads(X: np.ndarray, W: Weights, positions=None,
                  rope_base: float | None = None):
    """Q^T/sqrt(d_k), K^T, V^T of every head from ONE matrix product.

    Book: chapter 12. Returns Q_T (h, d_k, n), K_T (h_kv, d_k, n),
    V_T (h_kv, d_v, n): views into one contiguous array, each head's block
    contiguous, so no copy is needed to split the heads. Biases, if W has
    them, are added to the product's rows (chapter 8). With ``rope_base``
    every head's Q and K are rotated by ``positions`` (n,), the position
    of each row (Part III, chapter 15), in place.
    """
    W_QKV_T, _ = fused_weights(W, X.dtype)  # in X's dtype, converted once
    b_QKV, _ = fused_biases(W, X.dtype)
    h, h_kv, d_k, d_v = W.heads, W.kv_heads, W.d_k, W.d_v
    n = X.shape[0]
    QKV_T = W_QKV_T @ X.T  # ((h+h_kv) d_k + h_kv d_v, n)
    if b_QKV is not None:  # one bias per row, the same for every token
        QKV_T += b_QKV[:, None]  # (.., n)
    k0, v0 = h * d_k, (h + h_kv) * d_k  # where K's and V's rows start
    Q_T = QKV_T[:k0].reshape(h, d_k, n)  # (h, d_k, n)
    K_T = QKV_T[k0:v0].reshape(h_kv, d_k, n)  # (h_kv, d_k, n)
    V_T = QKV_T[v0:].reshape(h_kv, d_v, n)  # (h_kv, d_v, n)
    if rope_base is not None:  # chapter 15: turn each row by its position
        for A in (Q_T, K_T):  # rotate() takes rows (.., n, d_k)
            A[...] = rope.rotate(A.transpose(0, 2, 1), positions,
                                 rope_base).transpose(0, 2, 1)
    return Q_T, K_T, V_T


def _mask_later_keys(S: np.ndarray, r0: int, c0: int,
                     window: int | None = None) -> None:
    """Set S[..., i, j] to -inf where key c0 + j comes after query r0 + i.

    With ``window`` w also where it comes w or more positions before it
    (Part III, chapter 16). Works in place on the last two axes.
    """
    b, w = S.shape[-2:]
    keys = np.arange(c0, c0 + w)[None, :]  # (1, w)
    queries = np.arange(r0, r0 + b)[:, None]  # (b, 1)
    hidden = keys > queries  # (b, w)
    if window is not None:
        hidden |= keys <= queries - window  # (b, w)
    if hidden.any():
        S[..., hidden] = -np.inf  # (.., b, w)


def _grouped_queries(Q: np.ndarray, h_kv: int) -> np.ndarray:
    """Q (h, b, d_k) as (h_kv, g*b, d_k): each group's queries as rows.

    Book: Part III, chapter 14. The g query heads sharing one K/V head are
    stacked, so one product per K/V head computes all their scores and K
    and V are never repeated. Without groups (g = 1), Q as it is.
    """
    h, b, d_k = Q.shape
    if h == h_kv:
        return Q  # (h, b, d_k)
    return Q.reshape(h_kv, (h // h_kv) * b, d_k)  # (h_kv, g*b, d_k)


def _exp_shifted_inplace(S: np.ndarray, m: np.ndarray) -> np.ndarray:
    """S <- exp(S - m) in S's own memory; returns the row sums (h, b, 1)."""
    np.subtract(S, m, out=S)  # (h, b, w), every entry <= 0 or -inf
    np.exp(S, out=S)  # (h, b, w), exp(-inf) = 0
    return S.sum(axis=-1, keepdims=True)  # (h, b, 1)


def attend_block(Q_T, K_T, V_T, r0: int, r1: int,
                 causal: bool, q0: int = 0,
                 window: int | None = None) -> np.ndarray:
    """Rows r0 .. r1-1 of every head's H = softmax(mask(Q K^T)) V.

    Book: chapter 12. With ``causal`` the block looks only at keys
    0 .. r1-1: the key blocks to the right of the diagonal are skipped, and
    only the diagonal square is masked. Q_T's first column is the query of
    position ``q0`` (a KV cache's prefill sends only the new queries).
    K_T and V_T may have h_kv < h heads (chapter 14); with ``window`` w the
    block looks at keys r0 - w + 1 .. r1 - 1 only (chapter 16).
    Returns H (h, b, d_v).
    """
    assert q0 <= r0 < r1 <= q0 + Q_T.shape[2], (q0, r0, r1, Q_T.shape)
    m = r1 if causal else K_T.shape[2]
    c0 = 0 if window is None else max(0, r0 - window + 1)  # first key
    Q = Q_T[:, :, r0 - q0:r1 - q0].transpose(0, 2, 1)  # (h, b, d_k), a view
    h, b = Q.shape[:2]
    h_kv = K_T.shape[0]
    # (h_kv, g*b, d_k) @ (h_kv, d_k, m) -> (h_kv, g*b, m), already scaled
    S = _grouped_queries(Q, h_kv) @ K_T[:, :, c0:m]  # (h_kv, g*b, m - c0)
    S4 = S.reshape(h_kv, h // h_kv, b, m - c0)  # (h_kv, g, b, m - c0), view
    if window is not None:  # the band: mask the whole block
        _mask_later_keys(S4, r0, c0, window)
    elif causal:
        # only the diagonal square needs the mask
        _mask_later_keys(S4[..., r0:], r0, r0)  # (h_kv, g, b, b)
    # S <- exp(S - max)
    ell = _exp_shifted_inplace(S, S.max(axis=-1, keepdims=True))  # (.., 1)
    # (h_kv, g*b, m) @ (h_kv, m, d_v) -> (h_kv, g*b, d_v)
    H = S @ V_T[:, :, c0:m].transpose(0, 2, 1)  # (h_kv, g*b, d_v)
    H /= ell  # divide the (b, d_v) result, not the (b, m) scores
    return H.reshape(h, b, -1)  # (h, b, d_v)


def attend_tiled(Q_T, K_T, V_T, r0: int, r1: int, causal: bool,
                 tile: int, q0: int = 0,
                 window: int | None = None) -> np.ndarray:
    """The same H rows as ``attend_block``, with an online softmax.

    Book: chapter 12, "Online softmax". Keys are taken ``tile`` at a time.
    A running maximum mx, running sum ell and running unnormalised output
    acc are rescaled by exp(mx_old - mx_new) whenever the maximum grows, so
    no row of scores longer than ``tile`` ever exists. They are kept in at
    least float32, as FlashAttention keeps them, so that float16 inputs do
    not accumulate in float16. Grouped K/V heads and ``window`` as in
    ``attend_block`` (Part III, chapters 14 and 16). Returns H (h, b, d_v)
    in the input's dtype.
    """
    assert q0 <= r0 < r1 <= q0 + Q_T.shape[2], (q0, r0, r1, Q_T.shape)
    m = r1 if causal else K_T.shape[2]
    first = 0 if window is None else max(0, r0 - window + 1)  # first key
    Q = Q_T[:, :, r0 - q0:r1 - q0].transpose(0, 2, 1)  # (h, b, d_k)
    h, b, d_v = Q.shape[0], Q.shape[1], V_T.shape[1]
    h_kv = K_T.shape[0]
    Qg = _grouped_queries(Q, h_kv)  # (h_kv, g*b, d_k)
    dtype = np.promote_types(Q.dtype, np.float32)  # of the running values
    mx = np.full((h_kv, len(Qg[0]), 1), -np.inf, dtype)  # running maxima
    ell = np.zeros(mx.shape, dtype)  # running sums of exp(S - mx)
    acc = np.zeros((h_kv, len(Qg[0]), d_v), dtype)  # sum of exp(S - mx) V
    for c0 in range(first, m, tile):
        c1 = min(c0 + tile, m)
        # (h_kv, g*b, w), in float32 at least
        S = (Qg @ K_T[:, :, c0:c1]).astype(dtype, copy=False)
        if window is not None or (causal and c1 - 1 > r0):
            _mask_later_keys(S.reshape(h_kv, h // h_kv, b, c1 - c0), r0, c0,
                             window)
        # a row may see no key of this tile yet (a window): keep it finite
        mx_new = np.maximum(mx, S.max(axis=-1, keepdims=True))  # (.., 1)
        shift = np.where(np.isneginf(mx_new), 0.0, mx_new)  # (.., 1)
        # rescales what was summed so far
        alpha = np.exp(mx - shift)  # (h_kv, g*b, 1)
        ell = ell * alpha + _exp_shifted_inplace(S, shift)  # (.., 1)
        V = V_T[:, :, c0:c1].transpose(0, 2, 1)  # (h_kv, w, d_v)
        acc = acc * alpha + S @ V.astype(dtype, copy=False)  # (.., d_v)
        mx = mx_new
    H = (acc / ell).astype(Q.dtype, copy=False)  # (h_kv, g*b, d_v)
    return H.reshape(h, b, d_v)  # (h, b, d_v)


def choose_sizes(n: int, W: Weights, itemsize: int, block: int | None,
                 tile: int | None):
    """(block, tile) for n tokens: tile None means whole key rows.

    Book: chapter 12. Whole key rows while one block's scores
    (h, block, n) fit in SCORES_LIMIT_BYTES; past that the online-softmax
    path, TILE_ROWS queries by TILE_KEYS keys at a time. Sizes given are
    kept.
    """
    for name, size in (("block", block), ("tile", tile)):
        if size is not None and (isinstance(size, bool)
                                 or not isinstance(size, int) or size < 1):
            raise ValueError(
                f"{name} must be a positive integer, got {size!r}")
    if (tile is None
            and W.heads * (block or BLOCK_ROWS) * n * itemsize
            > SCORES_LIMIT_BYTES):
        return block or TILE_ROWS, TILE_KEYS
    return block or BLOCK_ROWS, tile


def multi_head_attention_fast(X: np.ndarray, W: Weights,
                              causal: bool = True, *,
                              key_mask: np.ndarray | None = None,
                              block: int | None = None,
                              tile: int | None = None,
                              rope_base: float | None = None,
                              window: int | None = None) -> np.ndarray:
    """Y = Concat(H_1, ..., H_h) W_O, computed fast. Book: chapter 12.

    X must already be checked (``check_input``, ``check_key_mask``) and in
    the dtype to compute in. Queries go ``block`` rows at a time;
    ``tile=None`` lets ``choose_sizes`` pick whole key rows or the online
    softmax; an integer ``tile`` forces the online softmax with that many
    keys per tile. Biases of W are added (chapter 8).

    X may be a batch (B, n, d_model) with ``key_mask`` (B, n), True where a
    token is real (Book: chapter 8, "Batches of sequences"). Padding is
    dropped first: the real tokens of all sequences are projected in one
    product, each sequence's real tokens attend among themselves, in
    order, and padded output rows are 0. That is the masked computation
    exactly: a padded key's weight would be exp(-inf) = 0.

    Part III (validated by ``attention.check_variants``): grouped K/V
    heads (chapter 14), ``rope_base`` (chapter 15; a token's position is
    the number of real tokens before it in its sequence) and ``window``
    (chapter 16).
    """
    n = X.shape[-2]
    block, tile = choose_sizes(n, W, X.itemsize, block, tile)
    rows, spans = _real_rows(X, key_mask)  # (N, d_model)
    positions = None
    if rope_base is not None:  # 0, 1, ... within each sequence
        positions = np.concatenate([np.arange(s1 - s0) for s0, s1 in spans])
    # (h, d_k, N), (h_kv, d_k, N), (h_kv, d_v, N)
    Q_T, K_T, V_T = project_heads(rows, W, positions, rope_base)
    # Concat(H_1..H_h), filled by rows
    concat = np.empty((len(rows), W.heads, W.d_v), X.dtype)  # (N, h, d_v)
    for s0, s1 in spans:  # one sequence at a time: views, no copies
        _attend_sequence(Q_T[:, :, s0:s1], K_T[:, :, s0:s1],
                         V_T[:, :, s0:s1], causal, block, tile,
                         concat[s0:s1], window=window)
    _, W_O = fused_weights(W, X.dtype)
    _, b_O = fused_biases(W, X.dtype)
    Y = (concat.reshape(len(rows), W.heads * W.d_v)  # (N, h*d_v)
         @ W_O)  # (h*d_v, d_model)
    if b_O is not None:
        Y += b_O  # (N, d_model)
    return _padded_rows(Y, X, key_mask)  # shape of X


def _attend_sequence(Q_T, K_T, V_T, causal: bool, block: int,
                     tile: int | None, concat: np.ndarray,
                     q0: int = 0, window: int | None = None) -> None:
    """Fill concat (m, h, d_v) with one sequence's Concat rows.

    Book: chapter 12. ``block`` query rows at a time, whole key rows
    (``tile`` None) or the online softmax. Q_T (h, d_k, m) holds the
    queries of positions q0 .. q0+m-1, K_T and V_T every key up to them.
    """
    n = q0 + Q_T.shape[2]
    for r0 in range(q0, n, block):
        r1 = min(r0 + block, n)
        if tile is None:
            H = attend_block(Q_T, K_T, V_T, r0, r1, causal,
                             q0=q0, window=window)  # (h, b, d_v)
        else:
            H = attend_tiled(Q_T, K_T, V_T, r0, r1, causal, tile,
                             q0=q0, window=window)  # (h, b, d_v)
        concat[r0 - q0:r1 - q0] = H.transpose(1, 0, 2)  # (b, h, d_v)


def _real_rows(X: np.ndarray, key_mask: np.ndarray | None):
    """The rows of X's real tokens, and each sequence's span in them.

    Book: chapter 8, "Batches of sequences". Returns rows (N, d_model),
    every sequence's real tokens in order, one sequence after the other,
    and [(start, end)] per sequence. One sequence without a mask is
    returned as it is, not copied.
    """
    if X.ndim == 2 and key_mask is None:
        return X, [(0, X.shape[0])]  # (n, d_model): one sequence, all real
    if key_mask is None:
        rows = X.reshape(-1, X.shape[-1])  # (B*n, d_model)
        lengths = np.full(X.shape[0], X.shape[1])  # (B,)
    else:
        rows = X[key_mask]  # (N, d_model): padding dropped
        lengths = key_mask.reshape(-1, X.shape[-2]).sum(axis=1)  # (B,)
    ends = np.cumsum(lengths)  # (B,)
    return rows, [(int(e - k), int(e)) for e, k in zip(ends, lengths,
                                                        strict=True)]


def _padded_rows(Y: np.ndarray, X: np.ndarray,
                 key_mask: np.ndarray | None) -> np.ndarray:
    """Y's rows (N, d_model) put back in X's shape; padded rows are 0.

    Book: chapter 8, "Batches of sequences".
    """
    if key_mask is None:
        return Y.reshape(X.shape)  # (n, d_model) or (B, n, d_model)
    out = np.zeros(X.shape, Y.dtype)  # (.., n, d_model)
    out[key_mask] = Y  # the real tokens' rows
    return out
