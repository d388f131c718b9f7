"""Attention on many devices: heads split, sequences split, batches split.

Book: Part V. Chapter 22 "Splitting the heads" (``head_shares``,
``head_shard``, ``tensor_parallel_attention``, ``TensorParallelKVCache``,
``tensor_parallel_cache_bytes``), chapter 23 "Splitting the sequence"
(``sequence_blocks``, ``ring_attention``, ``_online_update``,
``ring_work``) and chapter 24 "The cost of talking" (``all_reduce_bytes``,
``all_reduce_time``, ``tensor_parallel_bytes``, ``ring_bytes``,
``layer_weights``, ``tensor_parallel_comm_ratio``, ``ring_hidden_block``,
``LINKS``, ``fit_alpha_beta``, ``alpha_beta_time``,
``data_parallel_grads``).

Every function here is the program of ONE rank: it is handed an MPI
communicator ``comm`` (``mpi4py.MPI.Comm``: ``comm.Get_rank()`` is this
rank's number r, ``comm.Get_size()`` the number of ranks p), calls the
book's own kernels on its share, and talks to the other ranks only
through ``comm``. ``mha_lit.ranks`` holds the programs that
``launch`` starts on p real processes (``mpiexec``). Nothing here
imports ``mpi4py``: the communicator's own methods are all it uses, so
``import mha_lit`` still needs NumPy only.

A refusal (heads that do not divide among the ranks, blocks of the wrong
size, an input that is bad on one rank) is raised on every rank alike:
from numbers every rank knows, or after the ranks have gathered each
other's checks, so no rank is left waiting for a partner that gave up.

Letters in shape comments (see ``mha_lit.shapes``): n tokens, d_model,
d_k, d_v, h heads, h_kv key/value heads, g = h / h_kv; p ranks, r this
rank; m rows of this rank's block of the sequence; c rows of another
rank's block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import checks, fast, grad, masks, train
from .kv_cache import KVCache
from .models import ModelSizes, check_config
from .shapes import Weights

__all__ = [
    "head_shares", "head_shard", "tensor_parallel_attention",
    "TensorParallelKVCache", "tensor_parallel_cache_bytes",
    "LAYOUTS", "sequence_blocks", "ring_attention", "ring_work",
    "data_parallel_grads",
    "all_reduce_bytes", "tensor_parallel_bytes", "ring_bytes",
    "ring_hidden_block", "layer_weights",
    "tensor_parallel_comm_ratio", "Link", "LINKS",
    "fit_alpha_beta", "alpha_beta_time", "all_reduce_time",
]


# --- chapter 22: splitting the heads ----------------------------------------


def head_shares(heads: int, kv_heads: int, ranks: int):
    """Which query heads and which K/V heads each of ``ranks`` ranks holds.

    Book: chapter 22, "Whose heads". Megatron-LM's split (Shoeybi et al.
    2019): rank r holds the query heads r h/p .. (r+1) h/p - 1, so heads
    must be divisible by ranks. With grouped K/V heads (chapter 14) a rank
    holds the K/V heads its query heads use: h_kv / p of them when p
    divides h_kv; when h_kv < p and h_kv divides p, every rank holds ONE
    K/V head, each held by p / h_kv ranks (replicated). Returns
    [(query heads, K/V heads)] per rank, as ranges.
    """
    h = checks.positive_int(heads, "heads")
    h_kv = checks.positive_int(kv_heads, "kv_heads")
    p = checks.positive_int(ranks, "ranks")
    checks.groups(h, h_kv)
    if h % p:
        raise ValueError(f"heads = {h} cannot be split among ranks = {p}: "
                         f"each rank takes whole heads, so ranks must "
                         f"divide heads")
    if h_kv % p and p % h_kv:
        raise ValueError(f"kv_heads = {h_kv} cannot be split among ranks = "
                         f"{p}: ranks must divide kv_heads, or kv_heads "
                         f"divide ranks (each K/V head then held by "
                         f"ranks / kv_heads ranks)")
    q_per, g = h // p, h // h_kv  # query heads per rank, per K/V head
    shares = []
    for r in range(p):
        q = range(r * q_per, (r + 1) * q_per)
        kv = range(q.start // g, (q.stop - 1) // g + 1)  # the K/V heads used
        shares.append((q, kv))
    return shares


def head_shard(W: Weights, rank: int, ranks: int) -> Weights:
    """The weights rank ``rank`` of ``ranks`` holds: its heads' columns.

    Book: chapter 22, "Whose heads". Column-parallel Q, K, V (its query
    heads' W_Q, the K/V heads they use, their biases) and row-parallel
    W_O (the rows that multiply its heads' part of Concat). b_O is left
    out: the ranks' outputs are summed, and b_O is added once, after.
    """
    W = checks.weights(W, "head_shard")
    p = checks.positive_int(ranks, "ranks")
    r = checks.whole_number(rank, "rank")
    if r >= p:
        raise ValueError(f"rank = {r} does not exist among ranks = {p}")
    q, kv = head_shares(W.heads, W.kv_heads, p)[r]
    d_v = W.d_v
    part = {"W_Q": W.W_Q[q.start:q.stop], "W_K": W.W_K[kv.start:kv.stop],
            "W_V": W.W_V[kv.start:kv.stop],
            "W_O": W.W_O[q.start * d_v:q.stop * d_v]}  # (h/p * d_v, d)
    for name, heads in (("b_Q", q), ("b_K", kv), ("b_V", kv)):
        if getattr(W, name) is not None:
            part[name] = getattr(W, name)[heads.start:heads.stop]
    return Weights(**part)


def _on_every_rank(comm, check):
    """check()'s result; if it raises on any rank, a refusal on all.

    A bad input on one rank would leave the others waiting for it in the
    next collective: every rank runs its check, the outcomes are
    gathered, and every rank raises the first rank's error, naming it.
    """
    try:
        result, error = check(), None
    except (TypeError, ValueError) as e:
        result, error = None, e
    errors = comm.allgather(None if error is None
                            else (type(error), str(error)))
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        r, (kind, words) = failed[0]
        others = [f for f, _ in failed[1:]]
        also = f" (and on ranks {others})" if others else ""
        raise kind(f"on rank {r}{also}: {words}")
    return result


def _same_on_every_rank(comm, what: str, value) -> None:
    """Refuse, on every rank, unless ``value`` is the same on all of them."""
    values = comm.allgather(value)
    if any(v != values[0] for v in values):
        raise ValueError(f"{what} differs between ranks: "
                         + ", ".join(f"rank {r}: {v}"
                                     for r, v in enumerate(values)))


def _summed(part: np.ndarray, comm) -> np.ndarray:
    """The sum over the ranks of ``part``, on every rank (one all-reduce)."""
    part = np.ascontiguousarray(part)
    total = np.empty_like(part)
    comm.Allreduce(part, total)  # the default operation is the sum
    return total


def tensor_parallel_attention(X, W: Weights, comm,
                              causal: bool = True) -> np.ndarray:
    """Multi-head attention with the heads split among the ranks.

    Book: chapter 22, "Megatron's split". Every rank is handed the whole
    X (n, d_model) (or a batch (B, n, d_model)) and the whole W (a
    deployment would load only its share, ``head_shard(W, r, p)``); it
    computes ``multi_head_attention`` with its own heads only: its part of
    Concat times its rows of W_O, (n, d_model). One all-reduce sums the
    parts; b_O is added once. Before it, two small all-gathers check that
    X is valid on every rank and has one shape on all of them. Every
    rank returns the whole Y, equal to ``multi_head_attention(X, W,
    causal)`` up to rounding (the parts are summed in another order).
    """
    W = checks.weights(W, "tensor_parallel_attention")
    X = _on_every_rank(comm, lambda: checks.input_rows(X, W))
    _same_on_every_rank(comm, "the shape of X", X.shape)
    shard = head_shard(W, comm.Get_rank(), comm.Get_size())
    Y = _summed(fast.multi_head_attention(X, shard, causal), comm)
    return Y if W.b_O is None else Y + W.b_O.astype(Y.dtype)


class TensorParallelKVCache:
    """A KV cache whose heads are split among the ranks.

    Book: chapter 22, "Decoding with split heads". Rank r keeps a
    ``KVCache`` of its own heads only (``head_shard``): the keys and values
    of its K/V heads, 1/p of the cache when p divides h_kv. ``step(x)``
    takes the new row x (d_model,) on every rank and returns its output
    row on every rank, equal to ``KVCache(W).step``: one small
    all-gather checks that x has one shape on all ranks, then one
    all-reduce sums the parts; ``extend(X)`` does the same for a block of
    rows (a prompt). Options as ``KVCache``'s (``batch``, ``rope_base``,
    ``window``).
    """

    def __init__(self, W: Weights, comm, capacity: int = 16, *,
                 batch: int | None = None, rope_base=None,
                 window: int | None = None):
        W = checks.weights(W, "TensorParallelKVCache")
        self.comm = comm
        self.rank, self.ranks = comm.Get_rank(), comm.Get_size()
        self.b_O = W.b_O
        self.cache = KVCache(head_shard(W, self.rank, self.ranks), capacity,
                             batch=batch, rope_base=rope_base, window=window)

    def __len__(self) -> int:
        return len(self.cache)

    def step(self, x) -> np.ndarray:
        """One new row on every rank -> its output row on every rank."""
        _same_on_every_rank(self.comm, "the shape of x", np.shape(x))
        return self._output(self.cache.step(x), None)

    def extend(self, X, key_mask=None) -> np.ndarray:
        """A block of new rows on every rank -> their outputs (prefill)."""
        _same_on_every_rank(self.comm, "the shape of X", np.shape(X))
        return self._output(self.cache.extend(X, key_mask), key_mask)

    def _output(self, part: np.ndarray, key_mask) -> np.ndarray:
        Y = _summed(part, self.comm)  # (.., d_model)
        if self.b_O is None:
            return Y
        b_O = self.b_O.astype(Y.dtype)
        if key_mask is None:
            return Y + b_O
        Y[np.asarray(key_mask, bool)] += b_O  # padded rows stay 0
        return Y


def tensor_parallel_cache_bytes(cfg: ModelSizes, tokens: int, ranks: int,
                                bytes_per_value: float = 2) -> float:
    """Bytes of KV cache ONE rank holds when heads are split p ways.

    Book: chapter 22, "What each rank caches". Grouped heads: the K/V heads
    of its query heads, h_kv / p when p divides h_kv, else one (each K/V
    head held by p / h_kv ranks). MLA (chapter 17): the latent and the
    shared RoPE key are made from the whole token and read by every head,
    so every rank holds all of them, as one device does.
    """
    c = check_config(cfg, ModelSizes, "tensor_parallel_cache_bytes")
    t = checks.positive_int(tokens, "tokens")
    p = checks.positive_int(ranks, "ranks")
    if c.attention_kind == "MLA":
        per_token = c.layers * (c.latent.d_c + c.latent.d_r)
    else:
        _, kv = head_shares(c.heads, c.kv_heads, p)[0]
        per_token = 2 * c.layers * len(kv) * c.d_k
    return per_token * t * bytes_per_value


# --- chapter 23: splitting the sequence --------------------------------------

LAYOUTS = ("contiguous", "zigzag")


def sequence_blocks(n: int, ranks: int, layout: str = "contiguous"):
    """The positions of the sequence's rows each rank holds, [(m_r,)].

    Book: chapter 23. "contiguous": rank r holds the r-th of p blocks in
    order, their sizes differing by at most one (``np.array_split``).
    "zigzag": the sequence is cut into 2p chunks (``np.array_split``) and
    rank r holds chunks r and 2p - 1 - r, an early one and a late one,
    so that causal attention gives every rank the same work (the
    context parallelism of the Llama 3 paper; Brandon et al. 2023 balance
    it by striping).
    """
    n = checks.positive_int(n, "n")
    p = checks.positive_int(ranks, "ranks")
    if layout not in LAYOUTS:
        raise ValueError(f"layout = {layout!r} is none of {LAYOUTS}")
    if layout == "contiguous":
        return np.array_split(np.arange(n), p)
    chunks = np.array_split(np.arange(n), 2 * p)
    return [np.concatenate([chunks[r], chunks[2 * p - 1 - r]])
            for r in range(p)]


def _runs(n: int, ranks: int, layout: str) -> list[list[tuple[int, int]]]:
    """Per rank, the (start, stop) rows of its block that are one chunk.

    One chunk, the whole block, for "contiguous"; the early chunk and the
    late chunk for "zigzag", even where they meet (rank p - 1's).
    """
    blocks = sequence_blocks(n, ranks, layout)
    if layout == "contiguous":
        return [[(0, len(b))] for b in blocks]
    first = [len(c) for c in np.array_split(np.arange(n), 2 * ranks)]
    return [[(0, first[r]), (first[r], len(b))]
            for r, b in enumerate(blocks)]


def _pieces(q_pos, q_runs, k_pos, k_runs, causal: bool):
    """The (query run, key run) pieces a rank computes, and their masks.

    Book: chapter 23, "Work per rank". A piece whose keys all come after
    all its queries is skipped (causal); a piece that straddles the
    diagonal is computed whole, then masked. Yields (qa, qb, ka, kb,
    mask or None).
    """
    for qa, qb in q_runs:
        for ka, kb in k_runs:
            if qb == qa or kb == ka:
                continue  # an empty chunk
            if causal and k_pos[ka] > q_pos[qb - 1]:
                continue  # every key after every query: nothing seen
            mask = None
            if causal and k_pos[kb - 1] > q_pos[qa]:  # straddles
                mask = masks.visible(q_pos[qa:qb], k_pos[ka:kb])
            yield qa, qb, ka, kb, mask


def ring_work(n: int, ranks: int, layout: str = "contiguous",
              causal: bool = True) -> np.ndarray:
    """(p, p) scores computed per head: rank r (row) at ring step j.

    Book: chapter 23, "Work per rank". At step j rank r holds the keys
    of rank (r - j) mod p; it computes the pieces ``ring_attention``
    computes (``_pieces``: skipped when every key is later, whole when
    straddling the diagonal). Step time is set by the busiest rank.
    """
    blocks = sequence_blocks(n, ranks, layout)
    runs = _runs(n, ranks, layout)
    p = len(blocks)
    work = np.zeros((p, p), dtype=np.int64)
    for r in range(p):
        for j in range(p):
            src = (r - j) % p  # the rank whose keys are held
            work[r, j] = sum((qb - qa) * (kb - ka) for qa, qb, ka, kb, _
                             in _pieces(blocks[r], runs[r], blocks[src],
                                        runs[src], causal))
    return work


def _online_update(state, Z: np.ndarray, V: np.ndarray) -> None:
    """Chapter 12's online softmax, one block of keys, in place.

    Book: chapter 23, "Merging what arrives". state = [mx, ell, acc]:
    running maximum (.., b, 1), running sum of exp(Z - mx) (.., b, 1),
    running sum of exp(Z - mx) V (.., b, d_v); Z (.., b, c) the block's
    scores (-inf where hidden), V (.., c, d_v) its values.
    """
    mx, ell, acc = state
    mx_new = np.maximum(mx, Z.max(axis=-1, keepdims=True))  # (.., b, 1)
    shift = np.where(np.isneginf(mx_new), 0.0, mx_new)  # finite
    alpha = np.exp(mx - shift)  # rescales what was summed so far
    E = np.exp(Z - shift)  # (.., b, c); a hidden key gives 0
    state[0] = mx_new
    state[1] = ell * alpha + E.sum(axis=-1, keepdims=True)
    state[2] = acc * alpha + E @ V  # (.., b, d_v)


def _ring_positions(comm, m: int, layout: str):
    """Every rank's positions and chunks, from the sizes the ranks hold."""
    lengths = comm.allgather(m)  # m_r of every rank, in rank order
    p, n = len(lengths), sum(lengths)
    if layout not in LAYOUTS:
        raise ValueError(f"layout = {layout!r} is none of {LAYOUTS}")
    if layout == "contiguous":  # blocks in rank order, any sizes
        ends = np.cumsum(lengths)
        starts = ends - np.asarray(lengths)
        return ([np.arange(a, e) for a, e in zip(starts, ends, strict=True)],
                [[(0, k)] for k in lengths])
    blocks = sequence_blocks(n, p, layout)
    want = [len(b) for b in blocks]
    if lengths != want:
        raise ValueError(f"the ranks hold {lengths} rows, but the {layout} "
                         f"layout of n = {n} rows over {p} ranks gives "
                         f"{want} (sequence_blocks)")
    return blocks, _runs(n, p, layout)


def ring_attention(X_block, W: Weights, comm, causal: bool = True, *,
                   layout: str = "contiguous") -> np.ndarray:
    """Multi-head attention with the sequence split among the ranks.

    Book: chapter 23, "Ring attention" (Liu et al. 2023). Rank r holds
    X_block (m_r, d_model), its rows of X: by default the r-th of p
    contiguous blocks (any sizes, in rank order; each rank learns where
    its block starts from the sizes the others hold), or with
    ``layout="zigzag"`` the rows ``sequence_blocks(n, p, "zigzag")[r]``.
    It projects its own rows to Q, K, V; then, p times, it merges the
    K/V block it holds into its queries' outputs with chapter 12's online
    softmax while passing that block on to rank r + 1 and receiving the
    next from rank r - 1 (the K/V heads only: h_kv of them). Returns its
    rows of Y (m_r, d_model), equal to those rows of
    ``multi_head_attention(X, W, causal)`` up to rounding.
    """
    W = checks.weights(W, "ring_attention")
    X = _on_every_rank(comm, lambda: checks.token_rows(
        X_block, W.d_model, "X_block", against="W_Q",
        also=f"W_Q is {W.W_Q.shape}"))
    X = X.astype(np.result_type(X, W.dtype), copy=False)
    r, p = comm.Get_rank(), comm.Get_size()
    positions, runs = _ring_positions(comm, len(X), layout)
    q_pos = positions[r]
    Q_T, K_T, V_T = fast.project_heads(X, W)  # Q already / sqrt(d_k)
    h_kv, g = W.kv_heads, W.group
    # (h_kv, g, m, d_k): the g query heads of each K/V head side by side
    Q = Q_T.transpose(0, 2, 1).reshape(h_kv, g, len(X), W.d_k)
    # what travels: K and V of the block, (h_kv, m, d_k + d_v)
    held = np.ascontiguousarray(np.concatenate([K_T, V_T], axis=1)
                                .transpose(0, 2, 1))
    mx = np.full((h_kv, g, len(X), 1), -np.inf, X.dtype)
    state = [mx, np.zeros_like(mx), np.zeros((h_kv, g, len(X), W.d_v),
                                             X.dtype)]
    for j in range(p):
        src = (r - j) % p  # the rank whose keys and values are held
        if j < p - 1:  # pass them on while computing with them
            nxt = np.empty((h_kv, len(positions[(src - 1) % p]),
                            W.d_k + W.d_v), X.dtype)
            recv = comm.Irecv(nxt, source=(r - 1) % p, tag=j)
            send = comm.Isend(held, dest=(r + 1) % p, tag=j)
        for qa, qb, ka, kb, mask in _pieces(q_pos, runs[r], positions[src],
                                            runs[src], causal):
            K = held[:, None, ka:kb, :W.d_k]  # (h_kv, 1, c, d_k)
            V = held[:, None, ka:kb, W.d_k:]  # (h_kv, 1, c, d_v)
            Z = Q[:, :, qa:qb] @ np.swapaxes(K, -1, -2)  # (h_kv, g, b, c)
            if mask is not None:
                Z = np.where(mask, Z, -np.inf)
            piece = [a[:, :, qa:qb] for a in state]
            _online_update(piece, Z, V)
            for a, new in zip(state, piece, strict=True):
                a[:, :, qa:qb] = new
        if j < p - 1:
            send.Wait()
            recv.Wait()
            held = nxt
    H = state[2] / state[1]  # (h_kv, g, m, d_v)
    concat = H.reshape(W.heads, len(X), W.d_v).transpose(1, 0, 2)
    return fast.output_projection(
        np.ascontiguousarray(concat).reshape(len(X), W.heads * W.d_v), W)


# --- chapter 24: data parallelism -------------------------------------------


def data_parallel_grads(G, tokens, targets, comm, counted=None):
    """The loss and gradients of the whole batch, from each rank's share.

    Book: chapter 24, "Data parallelism". Every rank holds the same
    weights G and its own sequences (tokens, targets (B_r, n), and
    ``counted`` as ``grad.loss_and_grads`` takes it). Each rank's loss is a
    mean over its |C_r| counted positions, so the whole batch's gradient
    is sum_r |C_r| dG_r / sum_r |C_r|: one all-reduce of one buffer that
    holds the weighted gradients, the weighted loss and |C_r|. Returns
    (loss, dG) on every rank, equal to ``loss_and_grads`` on all the
    sequences up to rounding.
    """
    loss, dG = grad.loss_and_grads(G, tokens, targets, counted)
    t = np.asarray(tokens)
    shape = t.reshape(-1, t.shape[-1]).shape  # (B_r, n)
    counts = (shape[0] * shape[1] if counted is None else
              int(np.broadcast_to(np.asarray(counted, bool), shape).sum()))
    arrays = train.parameters(dG)
    flat = np.concatenate([a.ravel() for a in arrays.values()] + [
        np.array([loss, 1.0])]) * counts  # last two: |C_r| loss, |C_r|
    total = _summed(flat, comm)
    counted_all = total[-1]  # |C|, the whole batch's counted positions
    out, at = {}, 0
    for name, a in arrays.items():
        out[name] = (total[at:at + a.size] / counted_all).reshape(a.shape)
        at += a.size
    return float(total[-2] / counted_all), train.with_parameters(G, out)


# --- chapter 24: the cost of talking -----------------------------------------


def all_reduce_bytes(nbytes: float, ranks: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce.

    Book: chapter 24, "What an all-reduce moves". A reduce-scatter
    (p - 1 steps, each passing 1/p of the array) and an all-gather (p - 1
    more): 2 (p - 1) / p of the array's ``nbytes``, whatever p.
    """
    p = checks.positive_int(ranks, "ranks")
    return 2 * (p - 1) / p * nbytes


def _splittable(c: ModelSizes, ranks: int) -> None:
    """Refuse a head split ``head_shares`` refuses (MLA: by query heads)."""
    kv = c.heads if c.attention_kind == "MLA" else c.kv_heads
    head_shares(c.heads, kv, ranks)


def tensor_parallel_bytes(cfg: ModelSizes, tokens: int, ranks: int,
                          bytes_per_value: float = 2) -> float:
    """Bytes one rank sends per layer, forward, with Megatron's split.

    Book: chapter 24. Two all-reduces of a (tokens, d_model) array per
    layer: after attention's W_O and after the feed-forward net's second
    matrix (Shoeybi et al. 2019, section 3). Ranks that cannot split the
    heads (``head_shares``) are refused.
    """
    c = check_config(cfg, ModelSizes, "tensor_parallel_bytes")
    t = checks.positive_int(tokens, "tokens")
    _splittable(c, ranks)
    return 2 * all_reduce_bytes(t * c.d_model * bytes_per_value, ranks)


def _heads_passed(c, who: str) -> int:
    """h_kv of a model whose ring passes key/value heads, or a refusal."""
    if c.attention_kind == "MLA":
        raise ValueError(f"{who} counts rings that pass key and value heads; "
                         "MLA's keys and values are rebuilt from a latent "
                         "(chapter 17), a different ring")
    return c.kv_heads


def ring_bytes(cfg: ModelSizes, tokens: int, ranks: int,
               bytes_per_value: float = 2) -> float:
    """Bytes one rank sends per layer, forward, in ring attention.

    Book: chapter 24. p - 1 blocks of tokens / p rows, each row the key
    and value of every K/V head of one token: 2 h_kv d_k values (keys and
    values as wide, d_v = d_k, in these models).
    """
    c = check_config(cfg, ModelSizes, "ring_bytes")
    t = checks.positive_int(tokens, "tokens")
    p = checks.positive_int(ranks, "ranks")
    per_row = 2 * _heads_passed(c, "ring_bytes") * c.d_k
    return (p - 1) * t / p * per_row * bytes_per_value


def ring_hidden_block(cfg: ModelSizes, peak_flops: float, bandwidth: float,
                      bytes_per_value: float = 2,
                      causal: bool = True) -> float:
    """Rows per block from which a ring step's transfer hides behind it.

    Book: chapter 24, "When talking hides behind computing". A step
    between two blocks of n_r rows computes n_r^2 scores and weighted
    sums for h heads, 2 n_r^2 h (d_k + d_v) FLOPs, half of it under a
    causal mask in a balanced (zigzag) layout, while it passes n_r rows
    of h_kv (d_k + d_v) values of s bytes. At ``peak_flops`` = peak and
    ``bandwidth`` = beta the transfer takes no longer when
    n_r >= h_kv s peak / (2 h beta), twice that for causal attention.
    Returns that n_r (a real number).
    """
    c = check_config(cfg, ModelSizes, "ring_hidden_block")
    h_kv = _heads_passed(c, "ring_hidden_block")
    work = 0.5 if causal else 1.0  # share of the n_r x n_r pairs
    return h_kv * bytes_per_value * peak_flops / (
        2 * work * c.heads * bandwidth)


def layer_weights(cfg: ModelSizes) -> int:
    """Weights one token multiplies by in one layer, outside embeddings.

    Book: chapter 24. A GPT block (chapter 10): 2 d_model (2 d_model +
    d_ff), 12 d_model^2 with d_ff = 4 d_model. A dense DecoderConfig
    (chapter 18): its attention's weights and 3 d_model d_ff of SwiGLU.
    A mixture of experts is refused: experts are split by other rules.
    """
    from .counting import _attention_params
    from .models import DecoderConfig, TransformerConfig
    c = check_config(cfg, ModelSizes, "layer_weights")
    if isinstance(c, TransformerConfig):
        return 2 * c.d_model * (2 * c.d_model + c.d_ff)
    if isinstance(c, DecoderConfig) and c.moe is None:
        return _attention_params(c) + 3 * c.d_model * c.d_ff
    raise ValueError("layer_weights counts dense models; a mixture of "
                     "experts sends tokens to experts split otherwise")


def tensor_parallel_comm_ratio(cfg: ModelSizes, ranks: int,
                               peak_flops: float, bandwidth: float,
                               bytes_per_value: float = 2) -> float:
    """Time of Megatron's all-reduces over the time of a rank's products.

    Book: chapter 24, "When talking hides behind computing". Per layer
    and token a rank does 2 P / p FLOPs (P = ``layer_weights``) and takes
    part in two all-reduces of d_model values, each sending
    2 (p - 1) / p d_model s bytes: at ``peak_flops`` = peak and
    ``bandwidth`` = beta the ratio is 2 (p - 1) d_model s peak /
    (P beta), whatever the number of tokens (latency left out: the
    4 (p - 1) alpha of a layer dominate at few tokens); (p - 1) s peak /
    (6 d_model beta) for a GPT block. Attention's own products (Q K^T,
    S V) are left out: they add work, so the ratio is an upper bound.
    Ranks that cannot split the heads (``head_shares``) are refused.
    """
    c = check_config(cfg, ModelSizes, "tensor_parallel_comm_ratio")
    p = checks.positive_int(ranks, "ranks")
    _splittable(c, p)
    return (2 * (p - 1) * c.d_model * bytes_per_value * peak_flops
            / (layer_weights(c) * bandwidth))


@dataclass(frozen=True)
class Link:
    """One link's published bandwidth, each direction (data).

    ``bandwidth``: bytes/s one device can send while it receives as much;
    ``source``: key of the datasheet in ``references.bib``.
    """

    name: str
    bandwidth: float
    source: str


# Published figures (data, not measurements). NVIDIA prints NVLink's
# 900 GB/s per H100/H200 as the total of both directions (18 links of
# 50 GB/s): 450 GB/s each way. An InfiniBand NDR port runs at 400 Gb/s
# each way: 50 GB/s.
LINKS: dict[str, Link] = {
    "NVLink (H100/H200)": Link("NVLink 4, H100 or H200 SXM", 450e9,
                               "nvidia2022h100"),
    "InfiniBand NDR": Link("InfiniBand NDR, one 400 Gb/s port", 50e9,
                           "nvidia2022ndr"),
}


def fit_alpha_beta(nbytes, seconds) -> tuple[float, float]:
    """alpha (s) and beta (bytes/s) of t = alpha + nbytes / beta.

    Book: chapter 24, "This machine's links". Least squares on the
    measured one-way times of messages of ``nbytes`` bytes (at least two
    sizes), each residual divided by its measured time: sizes that span
    many powers of two then count alike, and the few microseconds of the
    small messages set alpha instead of vanishing beside the large ones'
    milliseconds. alpha is the latency, beta the bandwidth.
    """
    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if x.ndim != 1 or x.shape != t.shape or len(np.unique(x)) < 2:
        raise ValueError(f"nbytes {x.shape} and seconds {t.shape} must be "
                         "two equally long lists with at least two sizes")
    if not np.all(t > 0):
        raise ValueError("every measured time must be > 0 seconds")
    slope, alpha = np.polyfit(x, t, 1, w=1 / t)  # relative residuals
    if not slope > 0:
        raise ValueError(f"the times do not grow with the size (slope "
                         f"{slope:.3g} s/byte): no bandwidth to fit")
    return float(alpha), float(1 / slope)


def alpha_beta_time(nbytes, alpha: float, beta: float):
    """alpha + nbytes / beta: one message. Book: chapter 24."""
    return alpha + np.asarray(nbytes, dtype=float) / beta


def all_reduce_time(nbytes, ranks: int, alpha: float, beta: float):
    """2 (p - 1) (alpha + nbytes / (p beta)): a ring all-reduce.

    Book: chapter 24, "What an all-reduce moves". 2 (p - 1) steps, each
    one message of nbytes / p per rank; 0 for one rank.
    """
    p = checks.positive_int(ranks, "ranks")
    return 2 * (p - 1) * (alpha + np.asarray(nbytes, dtype=float)
                          / (p * beta))
