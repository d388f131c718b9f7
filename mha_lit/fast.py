"""Multi-head attention computed fast; same result as the book's reference.

Book: chapter 12 "Computing it efficiently".

The reference ``multi_head_attention_reference`` follows the equations
head by head. This module computes the same Y with chapter 3's kernel
``attention`` and three ideas, each a way to do less work or to move fewer
bytes:

1. Fused heads. The projection matrices W_Qi, W_Ki, W_Vi are laid side by
   side once, so one matrix product projects X for every head at once. It
   is computed transposed, W_QKV^T X^T, so that each head's Q^T, K^T, V^T
   is a contiguous block of rows; the scale 1/sqrt(d_k) is folded into the
   W_Q rows.
2. Causal block skipping. Queries are taken a block of rows at a time; a
   causal query block ending at row r1 meets only keys 0 .. r1-1. The
   blocks above the diagonal, which the mask would hide anyway, are never
   computed: about half the score work.
3. Online softmax for long sequences. When one block of scores would
   exceed a memory limit, the keys are taken a tile at a time with a
   running maximum and a running sum (Milakov and Gimelshein 2018; Rabe
   and Staats 2021; Dao et al. 2022), so memory stays O(n * d) instead of
   O(h * n^2): the one algorithm here other than chapter 3's kernel.

Every path works from *positions*: a block of queries at positions q_pos
meets keys at positions k_pos under ``masks.visible``. The forward pass,
the KV cache of chapters 7 and 12 (whose slots hold keys at their
positions) and the variants of Part III (a window; grouped key/value
heads, ``group_queries``) share this one loop, ``attend``.

Letters in shape comments (see ``mha_lit.shapes``): n tokens, d_model,
d_k, d_v, h heads, h_kv key/value heads, g = h / h_kv, b query rows in a
block, m keys, T keys in a tile, B sequences in a batch, N real tokens.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from . import checks, masks, rope
from .attention import attention
from .shapes import Weights

__all__ = ["few_rows_product", "fused_weights", "fused_biases",
           "project_heads", "rotate_heads", "output_projection",
           "group_queries", "ungroup", "attend_tiled", "choose_sizes",
           "attend", "causal_block_kinds", "multi_head_attention",
           "BLOCK_ROWS", "TILE_ROWS", "TILE_KEYS", "SCORES_LIMIT_BYTES",
           "FEW_ROWS", "SKIPPED", "MASKED", "COMPUTED"]

BLOCK_ROWS = 128  # query rows per block when whole key rows are used
TILE_ROWS = 256  # query rows per block on the online-softmax path
TILE_KEYS = 512  # keys per tile on the online-softmax path
# one block's scores (h, b, m) above this -> tiled path
SCORES_LIMIT_BYTES = 32 * 2**20
# rows of a weight matrix per product in few_rows_product: 256 x 768 float32
# numbers are 768 KiB, which stay in a core's cache while every row uses them
PANEL_ROWS = 256
FEW_ROWS = 64  # up to this many rows, products go through few_rows_product


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
    X_T = X.T.copy(order="C")  # (k, B), of X's array type (chapter 10)
    out = np.empty_like(X_T, shape=(W_T.shape[0], len(X)),
                        dtype=np.result_type(W_T, X))  # (n, B)
    for r0 in range(0, W_T.shape[0], PANEL_ROWS):
        np.matmul(W_T[r0:r0 + PANEL_ROWS], X_T, out=out[r0:r0 + PANEL_ROWS])
    return out.T  # (B, n)


# Arrays derived from a Weights, made once and kept while W lives. Weights
# is frozen (its arrays are read-only copies), so they can never go stale.
_DERIVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _kept(W: Weights, key, make):
    """``make()``, computed the first time W is asked for ``key``."""
    kept = _DERIVED.get(W)
    if kept is None:
        kept = _DERIVED[W] = {}
    if key not in kept:
        kept[key] = make()
    return kept[key]


def _read_only(*arrays):
    for a in arrays:
        if a is not None:
            a.flags.writeable = False
    return arrays


def fused_weights(W: Weights, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """W_QKV^T ((h + h_kv) d_k + h_kv d_v, d_model) and W_O, in ``dtype``.

    Book: chapter 12. Rows 0 .. h*d_k-1 are W_Q1^T/sqrt(d_k), ...,
    W_Qh^T/sqrt(d_k); then the h_kv blocks of W_K^T, then the h_kv blocks
    of W_V^T. Made once per Weights and dtype (default: W's), and kept.
    """
    dtype = W.dtype if dtype is None else np.dtype(dtype)

    def make():
        W_QKV_T = np.concatenate([
            # (h*d_k, d_model): every head's W_Q^T / sqrt(d_k)
            (W.W_Q / math.sqrt(W.d_k)).transpose(0, 2, 1).reshape(
                -1, W.d_model),
            # (h_kv*d_k, d_model): every key head's W_K^T
            W.W_K.transpose(0, 2, 1).reshape(-1, W.d_model),
            # (h_kv*d_v, d_model): every value head's W_V^T
            W.W_V.transpose(0, 2, 1).reshape(-1, W.d_model),
        ]).astype(dtype)  # ((h+h_kv) d_k + h_kv d_v, d_model)
        return _read_only(W_QKV_T, W.W_O.astype(dtype, copy=False))
    return _kept(W, ("fused", dtype), make)


def fused_biases(W: Weights, dtype=None) -> tuple[np.ndarray | None,
                                                  np.ndarray | None]:
    """b_QKV ((h + h_kv) d_k + h_kv d_v,), 1/sqrt(d_k) folded in, and b_O.

    Book: chapter 8, "GPT-2's block, exactly". Entry r of b_QKV is the
    bias of row r of W_QKV^T X^T: b_Q1/sqrt(d_k), ..., b_Qh/sqrt(d_k), then
    every head's b_K, then every head's b_V. (None, None) when W has no
    biases. Kept on W, as ``fused_weights``.
    """
    if not W.has_biases:
        return None, None
    dtype = W.dtype if dtype is None else np.dtype(dtype)

    def make():
        b_QKV = np.concatenate([
            (W.bias("b_Q") / math.sqrt(W.d_k)).reshape(-1),  # (h*d_k,)
            W.bias("b_K").reshape(-1),  # (h_kv*d_k,)
            W.bias("b_V").reshape(-1),  # (h_kv*d_v,)
        ]).astype(dtype)  # ((h+h_kv) d_k + h_kv d_v,)
        return _read_only(b_QKV, W.bias("b_O").astype(dtype, copy=False))
    return _kept(W, ("fused biases", dtype), make)


def _product(W_T: np.ndarray, X: np.ndarray) -> np.ndarray:
    """W_T @ X.T (n, rows) for rows X (rows, k), few rows or many."""
    if len(X) <= FEW_ROWS:  # weights streamed once for all rows
        return few_rows_product(W_T, X).T  # (n, rows)
    return W_T @ X.T  # (n, k) @ (k, rows) -> (n, rows)


def project_heads(X: np.ndarray, W: Weights):
    """Q^T/sqrt(d_k), K^T, V^T of every head from ONE matrix product.

    Book: chapter 12. X is (n, d_model); returns Q_T (h, d_k, n),
    K_T (h, d_k, n), V_T (h, d_v, n) (h_kv for K and V if they are shared,
    Part III, chapter 14): views into one contiguous array, each head's
    block contiguous, so no copy is needed to split the heads. Biases, if
    W has them, are added to the product's rows (chapter 8).
    """
    W_QKV_T, _ = fused_weights(W, X.dtype)  # in X's dtype, made once
    b_QKV, _ = fused_biases(W, X.dtype)
    QKV_T = _product(W_QKV_T, X)  # (3 h d_k + .., n): every head's rows
    if b_QKV is not None:  # one bias per row, the same for every token
        QKV_T = QKV_T + b_QKV[:, None]  # (.., n)
    n, d_k, d_v = X.shape[0], W.d_k, W.d_v
    h_Q, h_K = len(W.W_Q), len(W.W_K)  # query heads, key (and value) heads
    k0, v0 = h_Q * d_k, (h_Q + h_K) * d_k  # where K's and V's rows start
    Q_T = QKV_T[:k0].reshape(h_Q, d_k, n)  # (h, d_k, n)
    K_T = QKV_T[k0:v0].reshape(h_K, d_k, n)  # (h, d_k, n)
    V_T = QKV_T[v0:].reshape(h_K, d_v, n)  # (h, d_v, n)
    return Q_T, K_T, V_T


def rotate_heads(A_T: np.ndarray, positions, rope_base: float,
                 rope_scaling=None, length=None) -> None:
    """Turn every head's rows of A_T (heads, d_k, n) by their positions.

    Book: Part III, chapter 15. In place, right after the projection and
    before any score: RoPE is a step before the kernel, not inside it.
    A ``rope_scaling`` rule ("Beyond the trained length") changes the
    frequencies (``rope.rotate_scaled``); ``length`` is the sequence
    length a "dynamic" rule reads.
    """
    A_T[...] = rope.rotate_scaled(A_T.transpose(0, 2, 1), positions,
                                  rope_base, rope_scaling, length=length
                                  ).transpose(0, 2, 1)  # (heads, d_k, n)


def output_projection(concat: np.ndarray, W: Weights) -> np.ndarray:
    """Concat (N, h*d_v) @ W_O (+ b_O) -> (N, d_model). Book: chapter 12."""
    _, W_O = fused_weights(W, concat.dtype)
    _, b_O = fused_biases(W, concat.dtype)
    if len(concat) <= FEW_ROWS:
        W_O_T = _kept(W, ("W_O^T", concat.dtype),
                      lambda: _read_only(np.ascontiguousarray(W_O.T))[0])
        Y = few_rows_product(W_O_T, concat)  # (N, d_model)
    else:
        Y = concat @ W_O  # (N, h*d_v) @ (h*d_v, d_model)
    return Y if b_O is None else Y + b_O  # (N, d_model)


def group_queries(Q: np.ndarray, q_pos: np.ndarray, kv_heads: int):
    """Q (.., h, n, d_k) as (.., h_kv, n*g, d_k): a group's queries as rows.

    Book: Part III, chapter 14. The g query heads that share one K/V head
    are interleaved, position by position (rows p*g .. p*g + g-1 are
    the g queries of the 0-based position p), so that each K/V head
    meets all of them in one product and K and V are never repeated. The
    positions q_pos (.., n) come back repeated to match, (.., n*g).
    Without groups (g = 1), Q and q_pos as they are.
    """
    *lead, h, n, d_k = Q.shape
    g = h // kv_heads  # query heads per K/V head
    if g == 1:
        return Q, q_pos
    Qg = Q.reshape(*lead, kv_heads, g, n, d_k).swapaxes(-3, -2)  # (.., n, g)
    return (Qg.reshape(*lead, kv_heads, n * g, d_k),  # (.., h_kv, n*g, d_k)
            np.repeat(q_pos, g, axis=-1))  # (.., n*g)


def ungroup(H: np.ndarray, heads: int) -> np.ndarray:
    """H (.., h_kv, n*g, d_v) back to (.., h, n, d_v): undo group_queries."""
    *lead, h_kv, rows, d_v = H.shape
    g = heads // h_kv
    if g == 1:
        return H
    H = H.reshape(*lead, h_kv, rows // g, g, d_v).swapaxes(-3, -2)
    return H.reshape(*lead, heads, rows // g, d_v)  # (.., h, n, d_v)


def attend_tiled(Q, K, V, mask_of, tile: int) -> np.ndarray:
    """The same H as chapter 3's ``attention``, with an online softmax.

    Book: chapter 12, "Online softmax". Keys are taken ``tile`` at a time.
    A running maximum mx, running sum ell and running unnormalised output
    acc are rescaled by exp(mx_old - mx_new) whenever the maximum grows, so
    no row of scores longer than ``tile`` ever exists. They are kept in at
    least float32, as FlashAttention keeps them, so that float16 inputs do
    not accumulate in float16. Q (.., h, b, d_k), already scaled; K, V
    (.., h, m, d), m keys (a count, not the row maximum mx);
    ``mask_of(c0, c1)`` gives the mask (.., b, c1 - c0) of keys c0 .. c1-1,
    or None. Z holds one tile's scores, then their exponentials. Returns
    H (.., h, b, d_v).
    """
    dtype = np.promote_types(Q.dtype, np.float32)  # of the running values
    mx = np.full(Q.shape[:-1] + (1,), -np.inf, dtype)  # running maxima
    ell = np.zeros(mx.shape, dtype)  # running sums of exp(Z - mx)
    acc = np.zeros(Q.shape[:-1] + V.shape[-1:], dtype)  # sum exp(Z - mx) V
    for c0 in range(0, K.shape[-2], tile):
        c1 = min(c0 + tile, K.shape[-2])
        # (.., h, b, T), in float32 at least
        Z = (Q @ np.swapaxes(K[..., c0:c1, :], -1, -2)).astype(dtype)
        mask = mask_of(c0, c1)  # (.., b, T) or None
        if mask is not None:  # the same for every head
            np.copyto(Z, -np.inf, where=~mask[..., None, :, :])
        # a row may see no key of this tile yet: keep it finite
        mx_new = np.maximum(mx, Z.max(axis=-1, keepdims=True))  # (.., 1)
        shift = np.where(np.isneginf(mx_new), 0.0, mx_new)  # (.., 1)
        alpha = np.exp(mx - shift)  # rescales what was summed so far
        np.exp(Z - shift, out=Z)  # (.., h, b, T), exp(-inf) = 0
        ell = ell * alpha + Z.sum(axis=-1, keepdims=True)  # (.., 1)
        acc = acc * alpha + Z @ V[..., c0:c1, :].astype(dtype)  # (.., d_v)
        mx = mx_new
    return (acc / ell).astype(Q.dtype, copy=False)  # (.., h, b, d_v)


def choose_sizes(n: int, m: int, W: Weights, itemsize: int,
                 block: int | None = None, tile: int | None = None, *,
                 stack: int = 1):
    """(block, tile) for n queries meeting m keys: tile None = whole rows.

    Book: chapter 12. Whole key rows while one block's scores
    (stack, h, block, m) fit in SCORES_LIMIT_BYTES, ``stack`` sequences
    side by side; past that the online-softmax path, TILE_ROWS queries by
    TILE_KEYS keys at a time. Sizes given are kept.
    """
    rows = min(block or BLOCK_ROWS, n)  # query rows in one block
    if (tile is None
            and stack * W.heads * rows * m * itemsize > SCORES_LIMIT_BYTES):
        return block or TILE_ROWS, TILE_KEYS
    return block or BLOCK_ROWS, tile


def attend(Q, K, V, q_pos, k_pos, seen=None, *, in_order: bool = True,
           block: int = BLOCK_ROWS, tile: int | None = None,
           out: np.ndarray | None = None) -> np.ndarray:
    """H (.., h, n, d_v) for queries at q_pos against keys at k_pos.

    Book: chapter 12, "Skipping the masked blocks". Q (.., h, n, d_k),
    already scaled, K (.., h, m, d_k), V (.., h, m, d_v), m keys (a count,
    not the row maximum); q_pos (.., n) and k_pos (.., m) are positions
    (-1: an empty cache slot).
    ``seen(q_pos, k_pos)`` is the rule that makes the mask
    (``masks.visible`` for causal attention); None: every key.

    Queries go ``block`` rows at a time, in order of position. When key j
    stands at position j (``in_order``), a block meets only the keys from
    the first its first query may see to its last query: for causal
    attention the key blocks right of the diagonal are never computed.
    ``tile`` (an int) takes the online-softmax path, that many keys at a
    time. ``out``: an array (.., h, n, d_v) to write H into.
    """
    n, m = Q.shape[-2], K.shape[-2]
    one_block = out is None and 0 < n <= block  # its H is the whole H
    H = out if out is not None or one_block else np.empty(
        Q.shape[:-1] + V.shape[-1:], Q.dtype)  # (.., h, n, d_v)
    for r0 in range(0, n, block):
        r1 = min(r0 + block, n)
        qp = q_pos[..., r0:r1]  # (.., b): the block's positions
        c0, c1, first = 0, m, None  # the keys the block meets
        if seen is not None and in_order:
            c1 = min(m, int(qp.max()) + 1)  # no key after the last query
            # the block's first query sees the earliest key any of them sees
            first = seen(qp[..., :1], k_pos[..., :c1])  # (.., 1, c1)
            if not first[..., 0].all():  # key 0 hidden from some sequence
                c0 = int(np.argmax(first.reshape(-1, c1).any(axis=0)))
        Kb, Vb, kp = K[..., c0:c1, :], V[..., c0:c1, :], k_pos[..., c0:c1]
        if tile is None:  # whole key rows: chapter 3's kernel, every head
            if seen is None:
                mask = None
            elif first is not None and r1 - r0 == 1:  # one query: known
                mask = first[..., c0:]  # (.., 1, m)
            else:
                mask = seen(qp, kp)  # (.., b, m)
            if mask is not None and mask.all():  # nothing hidden
                mask = None
            Hb = attention(Q[..., r0:r1, :], Kb, Vb,
                           None if mask is None else mask[..., None, :, :],
                           scale=1.0)  # (.., h, b, d_v)
        else:  # the online softmax, a tile of keys at a time
            def mask_of(t0, t1, qp=qp, kp=kp):
                return None if seen is None else seen(qp, kp[..., t0:t1])
            Hb = attend_tiled(Q[..., r0:r1, :], Kb, Vb, mask_of, tile)
        if one_block:
            return Hb.astype(Q.dtype, copy=False)
        H[..., r0:r1, :] = Hb
    return H


SKIPPED, MASKED, COMPUTED = 0, 1, 2  # kinds of score block, chapter 12


def causal_block_kinds(n: int, block: int | None = None) -> np.ndarray:
    """Which (query block, key block) of S a causal blocked pass computes.

    Book: chapter 12, "Skipping the masked blocks". Blocks of ``block``
    rows (default BLOCK_ROWS) both ways; the query rows r0 .. r1-1 meet
    keys 0 .. r1-1 only, as in ``attend``. Returns (k, k) of COMPUTED,
    MASKED (computed, then partly masked) or SKIPPED, k = ceil(n / block).
    """
    n = checks.positive_int(n, "n")
    block = checks.positive_int(BLOCK_ROWS if block is None else block,
                                "block")
    starts = np.arange(0, n, block)  # (k,): first row of each block
    last = np.minimum(starts + block, n) - 1  # (k,): last row of each block
    met = starts[None, :] <= last[:, None]  # (k, k): key block j is met
    masked = met & (last[None, :] > starts[:, None])  # straddles diagonal
    return np.where(masked, MASKED, np.where(met, COMPUTED, SKIPPED))


def multi_head_attention(X, W: Weights, causal: bool = True, *,
                         key_mask=None, rope_base=None,
                         window=None, rope_scaling=None) -> np.ndarray:
    """Multi-head attention: X (n, d_model) -> Y (n, d_model), computed fast.

    Book: chapters 4 and 5; computed as chapter 12 ("Computing it
    efficiently") computes it, equal to ``variants.reference`` up to
    rounding. The output has X's floating dtype, computed in the wider of
    X's and W's. Biases of W are added as GPT-2 adds them (chapter 8).
    X may be a batch (B, n, d_model), and ``key_mask`` ((n,) or (B, n),
    True = real token) hides padded tokens; a padded query's output row
    is 0 (chapter 8, "Batches of sequences").

    Part III: grouped key/value heads (W.kv_heads < W.heads, chapter 14),
    ``rope_base`` for rotary positions (chapter 15; a token's position is
    the number of real tokens before it) and ``window`` for a sliding
    window (chapter 16). ``rope_scaling``, a dictionary as a released
    ``config.json`` writes it, rescales the rotary frequencies as Hugging
    Face's Llama attention does (chapter 15, "Beyond the trained length").
    """
    X = checks.input_rows(X, W)
    key_mask = checks.key_mask(key_mask, X.shape[:-1], of=f"X {X.shape}")
    rope_base = checks.rotary_base(rope_base, W)
    rope_scaling = checks.rope_scaling(rope_scaling, rope_base)
    window = checks.window(window, causal)
    Y = multi_head_attention_fast(
        X.astype(np.result_type(X, W.dtype), copy=False), W, causal,
        key_mask=key_mask, rope_base=rope_base, window=window,
        rope_scaling=rope_scaling)
    return Y.astype(X.dtype, copy=False)  # shape of X


def multi_head_attention_fast(X: np.ndarray, W: Weights,
                              causal: bool = True, *, key_mask=None,
                              rope_base=None, window=None,
                              block: int | None = None,
                              tile: int | None = None,
                              rope_scaling=None) -> np.ndarray:
    """Y = Concat(H_1, ..., H_h) W_O (+ b_O), computed fast. Book: ch. 12.

    X must already be checked and in the dtype to compute in (as
    ``multi_head_attention`` does). Padding is dropped first: the real
    tokens of all sequences are projected in one product, each sequence's
    real tokens attend among themselves, and padded output rows are 0.
    ``block`` and ``tile`` as in ``attend`` (None: ``choose_sizes``).
    """
    rows, spans = _real_rows(X, key_mask)  # (N, d_model)
    Q_T, K_T, V_T = project_heads(rows, W)  # (h, d_k, N), (h_kv, d, N)
    # 0, 1, ... within each sequence
    positions = np.concatenate([np.arange(s1 - s0) for s0, s1 in spans])
    if rope_base is not None:  # chapter 15: turned before any score
        # a "dynamic" rule reads the longest sequence's length
        length = max((s1 - s0 for s0, s1 in spans), default=0)
        rotate_heads(Q_T, positions, rope_base, rope_scaling, length)
        rotate_heads(K_T, positions, rope_base, rope_scaling, length)
    Q, K, V = (A.transpose(0, 2, 1) for A in (Q_T, K_T, V_T))  # (.., N, d)
    seen = masks.rule(causal, window)  # which keys a query sees
    concat = np.empty((len(rows), W.heads, W.d_v), rows.dtype)  # (N, h, d_v)
    for s0, s1 in spans:  # one sequence at a time: views, no copies
        b, t = choose_sizes(s1 - s0, s1 - s0, W, rows.itemsize, block, tile)
        p = positions[s0:s1]  # (n,)
        # chapter 14: each K/V head's query heads interleaved
        Qg, pg = group_queries(Q[:, s0:s1], p, W.kv_heads)
        # without groups, H is written straight into its rows of Concat
        into = concat[s0:s1].transpose(1, 0, 2) if W.group == 1 else None
        H = attend(Qg, K[:, s0:s1], V[:, s0:s1], pg, p, seen,
                   block=b * W.group, tile=t, out=into)  # (h_kv, n*g, d_v)
        if into is None:
            concat[s0:s1] = ungroup(H, W.heads).transpose(1, 0, 2)
    concat = concat.reshape(len(rows), W.heads * W.d_v)  # (N, h*d_v)
    Y = output_projection(concat, W)  # (N, d_model)
    return _padded_rows(Y, X, key_mask)  # shape of X


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
    """Y's rows (N, d_model) put back in X's shape; padded rows are 0."""
    if key_mask is None:
        return Y.reshape(X.shape)  # (n, d_model) or (B, n, d_model)
    out = np.zeros(X.shape, Y.dtype)  # (.., n, d_model)
    out[key_mask] = Y  # the real tokens' rows
    return out
