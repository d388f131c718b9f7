"""Sliding-window attention (Part III, chapter 16): the band, stacked layers, the ring buffer.

Floats are compared with TOL = 1e-12 (rounding only): two computations of the same real
numbers by different code paths (fast path and reference, cache and full recomputation) may
add their terms in different orders. Masks, patterns and counts are compared exactly.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_lit import (
    Dims,
    KVCache,
    attention_weights,
    fast,
    init_weights,
    masks,
    multi_head_attention,
    trace,
)
from mha_lit.masks import window_reach
from mha_lit.plots import sliding_window_reach
from mha_lit.variants import reference
from tests.shapes_for_tests import PRIME_DIMS

TOL = 1e-12
# even d_k, as rotary positions need; grouped key/value heads
ROPE_DIMS = [
    Dims(tokens=11, d_model=5, d_k=2, d_v=7, heads=6, kv_heads=3),
    Dims(tokens=13, d_model=3, d_k=6, d_v=5, heads=4, kv_heads=1),
]


def _inputs(dims, seed, rows=None):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows or dims.tokens, dims.d_model))


def _band(n, w):
    t, u = np.indices((n, n))
    return (0 <= t - u) & (t - u <= w - 1)


def _moved(f, X, rng):
    """moved[t, u]: does output row t of f change when input row u does (beyond TOL)?"""
    Y = f(X)
    moved = np.zeros((len(X), len(X)), dtype=bool)
    for u in range(len(X)):
        X_changed = X.copy()
        X_changed[u] += rng.standard_normal(X.shape[1])
        change = np.abs(f(X_changed) - Y).max(axis=1)
        moved[:, u] = change > TOL
        # what moves, moves far beyond rounding
        assert np.all((change <= TOL) | (change > 1e-9)), change
    return moved


# --- the band ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_a_window_of_at_least_n_is_causal_attention(dims):
    # the same real numbers, but the window masks each block where causal attention masks the
    # diagonal square only: different code, so compared to rounding; the masks exactly
    n = dims.tokens
    W = init_weights(dims, seed=3, biases=True)
    X = _inputs(dims, 4)
    Q, K = X @ W.W_Q[0], X @ W.W_K[0]
    causal = attention_weights(Q, K, masks.causal(n))
    for w in (n, n + 1, 2 * n + 3):
        assert np.array_equal(masks.band(n, w), masks.causal(n))
        assert np.array_equal(attention_weights(Q, K, masks.band(n, w)) == 0, causal == 0)
        for f in (multi_head_attention, reference):
            assert np.allclose(f(X, W, window=w), f(X, W), rtol=0, atol=TOL)
    if n > 1:  # one key fewer: the last query loses the first key
        assert attention_weights(Q, K, masks.band(n, n - 1))[-1, 0] == 0 < causal[-1, 0]


@pytest.mark.parametrize("dims", PRIME_DIMS + ROPE_DIMS, ids=str)
@pytest.mark.parametrize("w", [1, 2, 3, 5])
def test_weights_are_exactly_zero_outside_the_band(dims, w):
    W = init_weights(dims, seed=5)
    X = _inputs(dims, 6)
    band = _band(dims.tokens, w)
    assert np.array_equal(masks.band(dims.tokens, w), band)
    S = attention_weights(X @ W.W_Q[0], X @ W.W_K[0], masks.band(dims.tokens, w))
    assert np.all(S[~band] == 0.0) and np.all(S[band] > 0)
    assert np.allclose(S.sum(axis=1), 1, rtol=0, atol=TOL)


@pytest.mark.parametrize("dims", PRIME_DIMS + ROPE_DIMS, ids=str)
def test_window_one_makes_each_output_its_own_value_row(dims):
    # S = I: head i's output is its own value row, X_t W_V[j] + b_V[j] with j = i // g
    W = init_weights(dims, seed=7, biases=True)
    X = _inputs(dims, 8)
    rope = 100.0 if dims.d_k % 2 == 0 else None
    heads = [X @ W.W_V[i // W.group] + W.bias("b_V")[i // W.group] for i in range(W.heads)]
    expected = np.concatenate(heads, axis=1) @ W.W_O + W.bias("b_O")  # (n, d_model)
    for f in (multi_head_attention, reference):
        assert np.allclose(f(X, W, window=1, rope_base=rope), expected, rtol=0, atol=TOL)
    moved = _moved(lambda Z: multi_head_attention(Z, W, window=1, rope_base=rope), X,
                   np.random.default_rng(9))
    assert np.array_equal(moved, np.eye(dims.tokens, dtype=bool))


@pytest.mark.parametrize("dims", PRIME_DIMS + ROPE_DIMS, ids=str)
@pytest.mark.parametrize("w", [1, 2, 3, 4, 7])
def test_each_output_depends_on_its_band_only(dims, w):
    W = init_weights(dims, seed=11, biases=True)
    X = _inputs(dims, 12)
    rope = 10000.0 if dims.d_k % 2 == 0 else None
    moved = _moved(lambda Z: multi_head_attention(Z, W, window=w, rope_base=rope), X,
                   np.random.default_rng(13))
    assert np.array_equal(moved, _band(dims.tokens, w))


# --- reference, fast path and its tiled variant -------------------------------------------------


@pytest.mark.parametrize("dims", PRIME_DIMS + ROPE_DIMS, ids=str)
@pytest.mark.parametrize("w", [1, 2, 3, 5, 11])
def test_reference_equals_the_fast_path_blocked_and_tiled(dims, w):
    W = init_weights(dims, seed=17, biases=True)
    X = _inputs(dims, 18)
    rope = 10000.0 if dims.d_k % 2 == 0 else None
    Y_ref = reference(X, W, window=w, rope_base=rope)
    assert np.allclose(multi_head_attention(X, W, window=w, rope_base=rope), Y_ref,
                       rtol=0, atol=TOL)
    # blocks of query rows smaller than, equal to and larger than the window; tiles of keys
    # that start inside, at and before a block's first key
    for block, tile in [(1, None), (2, None), (3, None), (128, None), (1, 1), (2, 3), (3, 2),
                        (5, 7), (4, 1)]:
        Y = fast.multi_head_attention_fast(X, W, True, window=w, rope_base=rope,
                                           block=block, tile=tile)
        assert np.allclose(Y, Y_ref, rtol=0, atol=TOL), (block, tile)


def test_the_fast_path_skips_keys_before_the_window():
    # a block of query rows r0 .. r1-1 multiplies against keys r0 - w + 1 .. r1 - 1 only
    dims = Dims(tokens=101, d_model=5, d_k=7, d_v=11, heads=2)
    W = init_weights(dims, seed=19)
    X = _inputs(dims, 20)
    w, block = 13, 17
    with trace.record_matmuls() as log:
        fast.multi_head_attention_fast(log.track(X), W, True, window=w, block=block)
    keys = [r.b_shape[-1] for r in log.records if r.b_shape[-2] == dims.d_k]  # Q K^T
    starts = range(0, dims.tokens, block)
    assert keys == [min(r0 + block, dims.tokens) - max(0, r0 - w + 1) for r0 in starts]


# --- stacked layers --------------------------------------------------------------------------


@pytest.mark.parametrize("n, w, layers", [(17, 3, 4), (13, 2, 5), (11, 4, 3)])
def test_stacked_layers_reach_L_times_w_minus_1_plus_1_positions(n, w, layers):
    dims = Dims(tokens=n, d_model=5, d_k=7, d_v=11, heads=2)
    Ws = [init_weights(dims, seed=s) for s in range(layers)]
    X = _inputs(dims, 21)
    for L in range(1, layers + 1):

        def stacked(Z, L=L):
            for W in Ws[:L]:
                Z = multi_head_attention(Z, W, window=w)
            return Z

        moved = _moved(stacked, X, np.random.default_rng(22 + L))
        assert np.array_equal(moved, window_reach(n, w, L))
        assert moved.sum(axis=1).tolist() == [min(t + 1, L * (w - 1) + 1) for t in range(n)]


@given(st.integers(1, 30), st.integers(1, 8), st.integers(1, 6))
def test_window_reach_is_the_band_of_width_L_times_w_minus_1(n, w, L):
    R = window_reach(n, w, L)
    assert R.dtype == bool and R.shape == (n, n)
    assert np.array_equal(R, _band(n, L * (w - 1) + 1))


# --- the KV cache as a ring buffer ---------------------------------------------------------------


def _check_steps(W, X, w, rope=None, capacity=16):
    cache = KVCache(W, capacity=capacity, window=w, rope_base=rope)
    for m, x in enumerate(X, start=1):
        y = cache.step(x)
        y_full = multi_head_attention(X[:m], W, window=w, rope_base=rope)[-1]
        assert np.allclose(y, y_full, rtol=0, atol=TOL), m
        assert len(cache) == m and cache.held == min(m, w) <= w
        assert cache.capacity <= w  # memory stops growing
        assert cache.keys.shape == (W.kv_heads, min(m, w), W.d_k)
        assert cache.values.shape == (W.kv_heads, min(m, w), W.d_v)
    return cache


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
@pytest.mark.parametrize("w", [1, 2, 3, 5])
@pytest.mark.parametrize("capacity", [1, 16])
def test_cache_steps_equal_full_recomputation_far_past_the_window(dims, w, capacity):
    W = init_weights(dims, seed=23, biases=True)
    X = _inputs(dims, 24, rows=4 * w + 13)
    cache = _check_steps(W, X, w, capacity=capacity)
    # the held rows are the last w keys and values, oldest first
    K = np.stack([X[-w:] @ W.W_K[j] + W.bias("b_K")[j] for j in range(W.kv_heads)])
    V = np.stack([X[-w:] @ W.W_V[j] + W.bias("b_V")[j] for j in range(W.kv_heads)])
    assert np.allclose(cache.keys, K, rtol=0, atol=TOL)
    assert np.allclose(cache.values, V, rtol=0, atol=TOL)


@pytest.mark.parametrize("dims", ROPE_DIMS, ids=str)
@pytest.mark.parametrize("w", [1, 3, 4])
def test_cache_with_grouped_heads_rope_and_window(dims, w):
    W = init_weights(dims, seed=25, biases=True)
    X = _inputs(dims, 26, rows=5 * w + 11)
    cache = _check_steps(W, X, w, rope=500.0, capacity=1)
    assert cache.keys.shape[0] == dims.kv_heads < dims.heads


@pytest.mark.parametrize("w", [1, 2, 3, 7])
@pytest.mark.parametrize("pieces", [[1] * 6, [4, 1, 9, 2], [13, 13], [2, 3, 5, 7, 11]])
def test_cache_extend_in_pieces_equals_full_recomputation(w, pieces):
    dims = ROPE_DIMS[0]
    W = init_weights(dims, seed=27, biases=True)
    X = _inputs(dims, 28, rows=sum(pieces))
    for rope in (None, 10000.0):
        cache = KVCache(W, window=w, rope_base=rope)
        edges = np.cumsum([0] + pieces)
        Y = np.vstack([cache.extend(X[a:b]) for a, b in zip(edges, edges[1:])])
        assert np.allclose(Y, multi_head_attention(X, W, window=w, rope_base=rope),
                           rtol=0, atol=TOL)
        assert len(cache) == len(X) and cache.held == min(len(X), w) and cache.capacity <= w
        y = cache.step(X[0])  # then one more token, one step
        Y_more = multi_head_attention(np.vstack([X, X[:1]]), W, window=w, rope_base=rope)
        assert np.allclose(y, Y_more[-1], rtol=0, atol=TOL)


@pytest.mark.parametrize("w", [1, 2, 5])
def test_batched_cache_with_padding_equals_each_sequence_alone(w):
    dims = ROPE_DIMS[0]
    W = init_weights(dims, seed=29, biases=True)
    rng = np.random.default_rng(30)
    B, m = 3, 9
    prompt = rng.standard_normal((B, m, dims.d_model))
    key_mask = np.ones((B, m), dtype=bool)
    key_mask[0, 6:] = False  # 6 real tokens, padded at the end
    key_mask[1, :8] = False  # 1 real token, padded at the start
    key_mask[2, [1, 4]] = False  # padding in between
    real = [prompt[b][key_mask[b]] for b in range(B)]  # each sequence's real rows
    for rope in (None, 10000.0):
        # without a cache: a batch with a key mask is each sequence's real rows on their own
        Y = multi_head_attention(prompt, W, key_mask=key_mask, window=w, rope_base=rope)
        for b in range(B):
            alone = multi_head_attention(real[b], W, window=w, rope_base=rope)
            assert np.allclose(Y[b][key_mask[b]], alone, rtol=0, atol=TOL)
            assert np.all(Y[b][~key_mask[b]] == 0.0)
        # with a cache: prefill, then steps far past the window
        cache = KVCache(W, batch=B, window=w, rope_base=rope)
        out = cache.extend(prompt, key_mask=key_mask)
        for b in range(B):
            alone = multi_head_attention(real[b], W, window=w, rope_base=rope)
            assert np.allclose(out[b][key_mask[b]], alone, rtol=0, atol=TOL)
        seqs = [r.copy() for r in real]
        for _ in range(3 * w + 4):
            x = rng.standard_normal((B, dims.d_model))
            y = cache.step(x)
            for b in range(B):
                seqs[b] = np.vstack([seqs[b], x[b]])
                y_full = multi_head_attention(seqs[b], W, window=w, rope_base=rope)[-1]
                assert np.allclose(y[b], y_full, rtol=0, atol=TOL)
        assert cache.lengths.tolist() == [len(s) for s in seqs]
        assert cache.held == min(len(cache), w) and cache.capacity <= w


@pytest.mark.parametrize("w", [1, 3, 5])
@pytest.mark.parametrize("pieces", [[7], [2, 6], [1, 1, 4, 3], [4, 4]])
def test_a_ring_takes_a_block_at_once_until_full_then_one_row_at_a_time(w, pieces, monkeypatch):
    """While the ring has room a block is appended at once; once it is full, one row at a time
    (a block's later keys would overwrite keys its earlier queries still need)."""
    dims = ROPE_DIMS[0]
    W = init_weights(dims, seed=36, biases=True)
    X = _inputs(dims, 37, rows=sum(pieces))
    appended = []
    real = KVCache._append

    def spy(self, rows, real_rows):
        appended.append(rows.shape[1])
        return real(self, rows, real_rows)

    monkeypatch.setattr(KVCache, "_append", spy)
    cache = KVCache(W, window=w)
    seen, want, out = 0, [], []
    for m, a in zip(pieces, np.cumsum([0] + pieces)):
        first = min(m, max(0, w - seen))  # the rows that still fit in the ring
        want += [first] * (first > 0) + [1] * (m - first)
        out.append(cache.extend(X[a:a + m]))
        seen += m
    assert appended == want
    assert np.allclose(np.vstack(out), multi_head_attention(X, W, window=w), rtol=0, atol=TOL)
    appended.clear()
    cache.step(X[0])
    assert appended == [1]  # a step is extend of one row


@pytest.mark.parametrize("w, n", [(3, 2), (3, 3), (3, 10), (4, 17), (1, 5)])
def test_ring_slots_hold_the_positions_of_their_keys(w, n):
    """Position p lives in slot p % w; a slot not yet written holds position -1."""
    dims = Dims(tokens=n, d_model=5, d_k=7, d_v=11, heads=2)
    W = init_weights(dims, seed=38)
    X = _inputs(dims, 39, rows=n)
    cache = KVCache(W, window=w)
    for x in X:
        cache.step(x)
    at = cache._at[0]  # (capacity,)
    assert len(at) == cache.capacity <= w
    for slot, p in enumerate(at):
        if p >= 0:
            assert p % w == slot and n - w <= p < n  # one of the last w positions
            assert np.allclose(cache._K[0, :, slot], X[p] @ W.W_K, rtol=0, atol=TOL)
    assert sorted(at[at >= 0].tolist()) == list(range(max(0, n - w), n))
    assert (at < 0).sum() == cache.capacity - min(n, w)


def test_truncating_a_ring_keeps_what_the_window_still_holds():
    dims = Dims(tokens=10, d_model=5, d_k=7, d_v=11, heads=2)
    W = init_weights(dims, seed=31)
    X = _inputs(dims, 32)
    w = 3
    cache = KVCache(W, window=w)
    cache.extend(X)  # positions 0 .. 9 seen, 7 .. 9 held
    with pytest.raises(ValueError, match="overwritten"):
        cache.truncate(8)  # would need position 6 again
    cache.truncate(9)  # needs positions 7 and 8: held
    x = _inputs(dims, 33, rows=1)[0]
    y = cache.step(x)
    assert np.allclose(y, multi_head_attention(np.vstack([X[:9], x]), W, window=w)[-1],
                       rtol=0, atol=TOL)


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("window, error", [(0, ValueError), (-1, ValueError), (-4096, ValueError),
                                           (2.5, TypeError), (3.0, TypeError), (True, TypeError),
                                           ("3", TypeError), ([3], TypeError)])
def test_bad_windows_are_refused_everywhere(window, error):
    W = init_weights(seed=0)
    X = _inputs(Dims(), 34)
    for call in (lambda: multi_head_attention(X, W, window=window),
                 lambda: reference(X, W, window=window),
                 lambda: KVCache(W, window=window)):
        with pytest.raises(error, match=r"window must be a positive integer, got "):
            call()


def test_a_window_without_the_causal_mask_is_refused():
    W = init_weights(seed=0)
    X = _inputs(Dims(), 35)
    for call in (lambda: multi_head_attention(X, W, causal=False, window=2),
                 lambda: reference(X, W, causal=False, window=2)):
        with pytest.raises(ValueError, match="needs causal=True"):
            call()
    # a NumPy integer is a number of keys like any other
    assert np.allclose(multi_head_attention(X, W, window=np.int64(2)),
                       multi_head_attention(X, W, window=2), rtol=0, atol=TOL)


# --- the figure ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n, w, layers, query", [(13, 3, (1, 2, 3), None), (7, 2, 4, 3),
                                                 (25, 5, [1, 6], 25), (1, 1, (1,), 1)])
def test_sliding_window_reach_draws_each_pattern_and_highlights_the_query_row(n, w, layers, query):
    fig = sliding_window_reach(n, w, layers, query)
    depths = [layers] if isinstance(layers, int) else list(layers)
    assert len(fig.axes) == len(depths)
    q = n if query is None else query
    for ax, L in zip(fig.axes, depths):
        kinds = np.asarray(ax.collections[0].get_array()).reshape(n, n)
        R = _band(n, L * (w - 1) + 1)
        assert np.array_equal(kinds > 0, R)  # filled exactly where output t can depend on u
        assert np.array_equal(np.flatnonzero(kinds == 2) // n, np.full(R[q - 1].sum(), q - 1))
        count = min(q, L * (w - 1) + 1)
        title = ax.get_title()
        assert (f"query {q} sees {count} keys" if L == 1
                else f"{L} layers of window {w}\noutput {q} reaches {count} inputs") in title


@pytest.mark.parametrize("args, error, message", [
    ((13, 0), ValueError, "window must be a positive integer, got 0"),
    ((0, 3), ValueError, "n must be a positive integer, got 0"),
    ((13, 3, (1, 0)), ValueError, "layers must be a positive integer, got 0"),
    ((13, 3, ()), ValueError, "layers must name at least one depth"),
    ((13, 3, (1,), 14), ValueError, r"query must be a position 1 \.\. 13, got 14"),
    ((13, 3, (1,), 0), ValueError, r"query must be a position 1 \.\. 13, got 0"),
    ((13, 2.5), TypeError, "window must be a positive integer, got 2.5"),
])
def test_sliding_window_reach_refuses_bad_sizes(args, error, message):
    with pytest.raises(error, match=message):
        sliding_window_reach(*args)


# --- mutation-test gaps (shared/reviews/mutation.md): the axis labels of one layer and of L ---

@pytest.mark.parametrize("layers", [(1, 2), (1,), (3, 1)])
def test_sliding_window_reach_names_the_axes_of_the_mask_and_of_stacked_layers(layers):
    """L = 1 is the mask itself: queries t down the side, keys u along the top; L > 1 maps
    input rows u to output rows t (plots.part3-231)."""
    fig = sliding_window_reach(9, 3, layers)
    for ax, L in zip(fig.axes, layers, strict=True):
        assert (ax.get_ylabel(), ax.get_xlabel()) == (
            ("query t", "key u") if L == 1 else ("output row t", "input row u"))
    import matplotlib.pyplot as plt

    plt.close(fig)
