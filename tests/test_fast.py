"""The fast path (mha_lit.fast) computes exactly what the book's reference computes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mha_lit
import mha_lit.fast as fast
from mha_lit import (
    Dims,
    attention,
    init_weights,
    masks,
    multi_head_attention,
    trace,
)
from mha_lit.fast import (
    attend,
    attend_tiled,
    fused_weights,
    multi_head_attention_fast,
    project_heads,
)
from mha_lit.variants import reference
from tests.shapes_for_tests import PRIME_DIMS

MORE_DIMS = [
    Dims(tokens=29, d_model=13, d_k=5, d_v=3, heads=4),
    Dims(tokens=131, d_model=11, d_k=7, d_v=5, heads=3),  # more rows than one block of 128
    Dims(tokens=257, d_model=19, d_k=2, d_v=17, heads=1),  # 2 full blocks and 1 row
]
ALL_DIMS = PRIME_DIMS + MORE_DIMS
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def _case(dims, dtype, seed=0, scale=1.0):
    W = init_weights(dims, seed=seed, dtype=dtype)
    X = np.random.default_rng(seed + 1).standard_normal((dims.tokens, dims.d_model)) * scale
    return X.astype(dtype), W


def _close(Y, Y_ref, dtype):
    tol = TOL[dtype]
    return Y.shape == Y_ref.shape and np.allclose(Y, Y_ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("dims", ALL_DIMS, ids=str)
def test_public_function_equals_reference(dims, dtype, causal):
    X, W = _case(dims, dtype)
    Y = multi_head_attention(X, W, causal)
    assert Y.dtype == dtype
    assert _close(Y, reference(X, W, causal), dtype)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block, tile", [(1, None), (4, None), (5, 3), (13, 7), (128, 1), (2, 256)])
@pytest.mark.parametrize("dims", ALL_DIMS, ids=str)
def test_blocks_and_tiles_of_any_size_equal_reference(dims, block, tile, causal):
    X, W = _case(dims, np.float64, seed=3)
    Y = multi_head_attention_fast(X, W, causal, block=block, tile=tile)
    assert _close(Y, reference(X, W, causal), np.float64)


@pytest.mark.parametrize("tile", [1, 2, 5, 16])
def test_tiled_path_float32_with_tiles_that_do_not_divide_n(tile):
    dims = Dims(tokens=37, d_model=17, d_k=19, d_v=23, heads=2)
    X, W = _case(dims, np.float32, seed=5)
    assert dims.tokens % tile != 0 or tile == 1
    Y = multi_head_attention_fast(X, W, True, block=8, tile=tile)
    assert Y.dtype == np.float32
    assert _close(Y, reference(X, W), np.float32)


def test_long_input_takes_the_tiled_path_by_itself(monkeypatch):
    dims = Dims(tokens=67, d_model=7, d_k=3, d_v=5, heads=2)
    X, W = _case(dims, np.float64, seed=6)
    calls = []
    def spy(Q, K, V, mask_of, tile):  # record the tile
        calls.append(tile)
        return attend_tiled(Q, K, V, mask_of, tile)

    monkeypatch.setattr(fast, "attend_tiled", spy)
    multi_head_attention_fast(X, W)
    assert calls == []  # small scores: whole key rows
    monkeypatch.setattr(fast, "SCORES_LIMIT_BYTES", 1000)  # 2 * 16 * 67 * 8 bytes is more
    Y = multi_head_attention_fast(X, W, block=16)
    assert calls and set(calls) == {fast.TILE_KEYS}
    assert _close(Y, reference(X, W), np.float64)


def test_choose_sizes_switches_to_tiles_past_the_memory_limit():
    W = init_weights(Dims(d_model=8, d_k=4, d_v=4, heads=12))
    assert fast.choose_sizes(1024, 1024, W, 4) == (fast.BLOCK_ROWS, None)  # 6 MiB of scores
    assert fast.choose_sizes(8192, 8192, W, 4) == (fast.TILE_ROWS, fast.TILE_KEYS)
    assert fast.choose_sizes(8192, 8192, W, 4, 7, 3) == (7, 3)  # sizes given are kept


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_one_token(dtype):
    dims = Dims(tokens=1, d_model=5, d_k=7, d_v=11, heads=2)
    X, W = _case(dims, dtype, seed=7)
    for causal in (True, False):
        Y = multi_head_attention(X, W, causal)
        assert Y.shape == (1, 5) and Y.dtype == dtype
        assert _close(Y, reference(X, W, causal), dtype)


def test_huge_logits_do_not_overflow_on_either_path():
    X, W = _case(Dims(tokens=19, d_model=5, d_k=7, d_v=11, heads=2), np.float64, scale=300.0)
    Y_ref = reference(X, W)
    assert np.all(np.isfinite(Y_ref))
    assert _close(multi_head_attention_fast(X, W, block=4), Y_ref, np.float64)
    assert _close(multi_head_attention_fast(X, W, block=4, tile=3), Y_ref, np.float64)


def test_float32_input_with_float64_weights_computes_in_float64():
    dims = Dims(tokens=11, d_model=5, d_k=7, d_v=3, heads=2)
    X, W = _case(dims, np.float32, seed=8)
    W64 = W.astype(np.float64)
    Y = multi_head_attention(X, W64)
    assert Y.dtype == np.float32
    assert _close(Y, reference(X, W64), np.float32)
    Y64 = multi_head_attention_fast(X.astype(np.float64), W64)
    assert _close(Y64, reference(X.astype(np.float64), W64), np.float64)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), block=st.integers(1, 12), tile=st.one_of(st.none(), st.integers(1, 9)),
       causal=st.booleans(), seed=st.integers(0, 1000))
def test_any_n_block_and_tile_agree_with_reference(n, block, tile, causal, seed):
    X, W = _case(Dims(tokens=n, d_model=7, d_k=5, d_v=3, heads=3), np.float64, seed=seed)
    Y = multi_head_attention_fast(X, W, causal, block=block, tile=tile)
    assert _close(Y, reference(X, W, causal), np.float64)


# --- the pieces ---------------------------------------------------------------------------

@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_fused_weights_hold_every_head_and_are_computed_once(dims):
    W = init_weights(dims, seed=9)
    W_QKV_T, W_O = fused_weights(W)
    h, dk, dv = dims.heads, dims.d_k, dims.d_v
    assert W_QKV_T.shape == (h * (2 * dk + dv), dims.d_model)
    assert np.allclose(W_QKV_T[:dk].T * np.sqrt(dk), W.W_Q[0])
    assert np.array_equal(W_QKV_T[(2 * h - 1) * dk: 2 * h * dk].T, W.W_K[h - 1])
    assert np.array_equal(W_QKV_T[2 * h * dk: 2 * h * dk + dv].T, W.W_V[0])
    assert W_O is W.W_O
    assert fused_weights(W)[0] is W_QKV_T  # cached on W
    assert not W_QKV_T.flags.writeable


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_project_heads_equals_the_per_head_products(dims):
    X, W = _case(dims, np.float64, seed=10)
    Q_T, K_T, V_T = project_heads(X, W)
    assert Q_T.shape == (dims.heads, dims.d_k, dims.tokens)
    assert V_T.shape == (dims.heads, dims.d_v, dims.tokens)
    for i in range(dims.heads):
        assert np.allclose(Q_T[i].T, X @ W.W_Q[i] / np.sqrt(dims.d_k), atol=1e-13)
        assert np.allclose(K_T[i].T, X @ W.W_K[i], atol=1e-13)
        assert np.allclose(V_T[i].T, X @ W.W_V[i], atol=1e-13)


def _heads(X, W):
    """Q (already scaled), K, V of every head, (heads, n, d), from the fused projection."""
    return tuple(A.transpose(0, 2, 1) for A in project_heads(X, W))


def test_the_kernel_on_a_block_and_attend_tiled_give_the_same_rows():
    X, W = _case(Dims(tokens=23, d_model=5, d_k=7, d_v=11, heads=2), np.float64, seed=11)
    Q, K, V = _heads(X, W)
    q_pos, k_pos = np.arange(5, 17), np.arange(23)  # query rows 5 .. 16 of 23
    for causal in (True, False):
        mask = masks.visible(q_pos, k_pos) if causal else None
        H = attention(Q[:, 5:17], K, V, None if mask is None else mask[None], scale=1.0)
        assert H.shape == (2, 12, 11)
        def mask_of(c0, c1, mask=mask):
            return None if mask is None else mask[:, c0:c1]

        assert np.allclose(H, attend_tiled(Q[:, 5:17], K, V, mask_of, 4), atol=1e-13)
        # chapter 3's kernel head by head (Q already carries 1/sqrt(d_k))
        for i in range(2):
            assert np.allclose(H[i], attention(Q[i, 5:17], K[i], V[i], mask, scale=1.0), atol=1e-13)


@pytest.mark.parametrize("window", [None, 1, 3, 30])
@pytest.mark.parametrize("tile", [None, 1, 4])
@pytest.mark.parametrize("block", [1, 5, 128])
def test_attend_equals_the_kernel_with_the_mask_of_the_positions(block, tile, window):
    X, W = _case(Dims(tokens=23, d_model=5, d_k=7, d_v=11, heads=2), np.float64, seed=12)
    Q, K, V = _heads(X, W)
    pos = np.arange(23)
    H = attend(Q, K, V, pos, pos, masks.rule(True, window), block=block, tile=tile)
    assert H.shape == (2, 23, 11)
    mask = masks.visible(pos, pos, window)  # (23, 23): causal, and the band
    assert np.allclose(H, attention(Q, K, V, mask, scale=1.0), rtol=0, atol=1e-13)
    H_all = attend(Q, K, V, pos, pos, None, block=block, tile=tile)  # no rule: every key
    assert np.allclose(H_all, attention(Q, K, V, scale=1.0), rtol=0, atol=1e-13)
    out = np.full((23, 2, 11), np.nan).transpose(1, 0, 2)  # a view, as Concat's rows
    assert attend(Q, K, V, pos, pos, masks.rule(True, window), block=block, tile=tile, out=out) is out
    assert np.array_equal(out, H)  # the same computation, written in place


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("tile", [None, 2])
def test_attend_on_slots_out_of_order_and_empty(tile, window):
    """in_order=False: keys held in any slot order, -1 for an empty slot (a ring buffer).
    The result is the kernel on the keys in position order, the empty slots left out."""
    X, W = _case(Dims(tokens=9, d_model=5, d_k=7, d_v=11, heads=2), np.float64, seed=13)
    Q, K, V = _heads(X, W)
    order = np.array([4, 7, 0, 2, 8, 1, 3, 6, 5])
    k_pos = np.concatenate([order, [-1, -1]])  # two empty slots at the end
    K_slots = np.concatenate([K[:, order], np.full((2, 2, 7), 1e3)], axis=1)  # junk in empty slots
    V_slots = np.concatenate([V[:, order], np.full((2, 2, 11), 1e3)], axis=1)
    q_pos = np.array([6, 7, 8])  # the last three queries
    H = attend(Q[:, 6:], K_slots, V_slots, q_pos, k_pos, masks.rule(True, window), in_order=False,
               block=2, tile=tile)
    want = attention(Q[:, 6:], K, V, masks.visible(q_pos, np.arange(9), window), scale=1.0)
    assert np.allclose(H, want, rtol=0, atol=1e-13)


def test_attend_takes_a_stack_of_sequences():
    """Leading axes (B, ..) are sequences, each with its own positions."""
    rng = np.random.default_rng(14)
    Q, K, V = rng.standard_normal((2, 4, 3, 5)), rng.standard_normal((2, 2, 6, 5)), rng.standard_normal((2, 2, 6, 7))
    q_pos = np.array([[3, 4, 5], [0, 1, 2]])  # (B, n)
    k_pos = np.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, -1, -1, -1]])  # (B, m)
    def grouped(Q, K, V, q_pos, k_pos):  # as the cache calls attend: query heads grouped first
        Qg, g_pos = fast.group_queries(Q, q_pos, 2)
        return fast.ungroup(attend(Qg, K, V, g_pos, k_pos, masks.visible, in_order=False), 4)

    H = grouped(Q, K, V, q_pos, k_pos)
    assert H.shape == (2, 4, 3, 7)
    for b in range(2):
        want = grouped(Q[b], K[b], V[b], q_pos[b], k_pos[b])
        assert np.allclose(H[b], want, rtol=0, atol=1e-14)
        for i in range(4):  # query head i uses K/V head i // 2
            mask = masks.visible(q_pos[b], k_pos[b])
            assert np.allclose(H[b, i], attention(Q[b, i], K[b, i // 2], V[b, i // 2], mask, scale=1.0),
                               rtol=0, atol=1e-14)


@pytest.mark.parametrize("lead", [(), (3,)])
def test_group_queries_lays_each_groups_queries_side_by_side_position_by_position(lead):
    rng = np.random.default_rng(15)
    Q = rng.standard_normal(lead + (6, 4, 5))  # (.., h = 6, n = 4, d_k = 5)
    q_pos = np.arange(10, 14) + np.zeros(lead + (1,), int)  # (.., 4)
    G, g_pos = fast.group_queries(Q, q_pos, 2)  # g = 3
    assert G.shape == lead + (2, 12, 5) and g_pos.shape == lead + (12,)
    for j in range(2):
        for t in range(4):
            for k in range(3):  # row 3t + k of group j: query head 3j + k at position t
                # exact: a reshape moves numbers, it does not compute them
                assert np.array_equal(G[..., j, 3 * t + k, :], Q[..., 3 * j + k, t, :])
                assert np.all(g_pos[..., 3 * t + k] == q_pos[..., t])
    # exact: ungroup undoes the move
    assert np.array_equal(fast.ungroup(G, 6), Q)
    same, same_pos = fast.group_queries(Q, q_pos, 6)
    assert same is Q and same_pos is q_pos  # no groups: as they are
    assert fast.ungroup(Q, 6) is Q


# --- bad input is refused exactly as the reference refuses it ----------------------------

@pytest.mark.parametrize(
    "X",
    [
        np.ones((3, 4)),
        np.ones((3, 5, 1)),
        np.ones(5),
        np.array([[1.0, np.nan, 0, 0, 0]]),
        np.array([[1.0, np.inf, 0, 0, 0]]),
        np.array([list("abcde")]),
        np.ones((3, 5), dtype=bool),
        np.ones((3, 5), dtype=complex),
    ],
    ids=["columns", "3-D", "1-D", "nan", "inf", "strings", "bool", "complex"],
)
def test_bad_input_is_refused_the_same_way(X):
    W = init_weights(seed=12)
    with pytest.raises((TypeError, ValueError)) as ref_error:
        reference(X, W)
    with pytest.raises(ref_error.type) as fast_error:
        multi_head_attention(X, W)
    assert str(fast_error.value) == str(ref_error.value)


def test_bad_weights_and_empty_input_are_refused():
    with pytest.raises(TypeError, match="needs mha_lit.Weights, got str"):
        multi_head_attention(np.ones((3, 5)), "weights")
    for f in (multi_head_attention, reference):
        with pytest.raises(ValueError, match=r"X has no rows \(shape \(0, 5\)\)"):
            f(np.ones((0, 5)), init_weights())


# --- chapter 8: biases, batches and key padding on the fast path ---------------------------

def _batch(dims, B, dtype, seed, biases=True, left=False):
    """X (B, n, d_model), W with biases, and a key_mask (B, n) whose sequences have lengths
    n, n - 1, ..., padded on the right (or left); a sequence keeps at least one token."""
    W = init_weights(dims, seed=seed, dtype=dtype, biases=biases)
    X = np.random.default_rng(seed + 1).standard_normal((B, dims.tokens, dims.d_model))
    n = dims.tokens
    lengths = [max(1, n - b) for b in range(B)]
    key_mask = np.array([[(n - 1 - t if left else t) < L for t in range(n)] for L in lengths])
    return X.astype(dtype), W, key_mask


@pytest.mark.parametrize("left", [False, True], ids=["right padding", "left padding"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("dims, B", list(zip(ALL_DIMS, [2, 3, 5, 2, 3, 2, 7, 3, 2])), ids=str)
def test_fast_path_equals_reference_for_batches_masks_and_biases(dims, B, dtype, causal, left):
    X, W, key_mask = _batch(dims, B, dtype, seed=20, left=left)
    for mask in (None, key_mask):
        Y = multi_head_attention(X, W, causal, key_mask=mask)
        assert Y.dtype == dtype and Y.shape == X.shape
        assert _close(Y, reference(X, W, causal, key_mask=mask), dtype)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block, tile", [(1, None), (4, None), (5, 3), (13, 7), (2, 1)])
@pytest.mark.parametrize("dims", [ALL_DIMS[2], ALL_DIMS[5], ALL_DIMS[7]], ids=str)
def test_blocks_and_tiles_with_batches_masks_and_biases(dims, block, tile, causal):
    X, W, key_mask = _batch(dims, 3, np.float64, seed=21, left=True)
    Y = multi_head_attention_fast(X, W, causal, key_mask=key_mask, block=block, tile=tile)
    assert _close(Y, reference(X, W, causal, key_mask=key_mask), np.float64)


def test_fast_path_computes_no_padded_token():
    """Padding is dropped before the products: one projection of the N real tokens, and each
    sequence's scores are (real tokens) x (real tokens)."""
    dims = Dims(tokens=7, d_model=5, d_k=3, d_v=2, heads=2)
    X, W, key_mask = _batch(dims, 3, np.float64, seed=22, left=True)  # lengths 7, 6, 5
    with trace.record_matmuls() as log:
        multi_head_attention_fast(log.track(X), W, key_mask=key_mask)
    assert log.records[0].b_shape == (5, 18)  # X^T of the 18 real tokens, one product
    scores = [r.out_shape for r in log.records if r.b_shape[-2] == dims.d_k]
    assert scores == [(2, 7, 7), (2, 6, 6), (2, 5, 5)]


def test_an_all_padding_sequence_gives_zero_rows():
    X, W, _ = _batch(Dims(tokens=5, d_model=7, d_k=3, d_v=13, heads=3), 2, np.float64, seed=23)
    key_mask = np.array([[True, True, False, False, False], [False] * 5])
    for f in (multi_head_attention, reference):
        Y = f(X, W, key_mask=key_mask)
        assert np.all(Y[1] == 0.0) and np.all(Y[0, 2:] == 0.0)
        assert np.allclose(Y[0, :2], f(X[0, :2], W), rtol=0, atol=1e-12)
    nothing = np.zeros((2, 5), bool)
    assert np.all(multi_head_attention(X, W, key_mask=nothing) == 0.0)


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_fused_biases_hold_every_head_and_are_computed_once(dims):
    W = init_weights(dims, seed=24, biases=True)
    b_QKV, b_O = fast.fused_biases(W)
    h, dk, dv = dims.heads, dims.d_k, dims.d_v
    assert b_QKV.shape == (h * (2 * dk + dv),) and b_O is W.b_O
    assert np.allclose(b_QKV[:dk] * np.sqrt(dk), W.b_Q[0], rtol=0, atol=1e-15)
    assert np.array_equal(b_QKV[(2 * h - 1) * dk: 2 * h * dk], W.b_K[h - 1])
    assert np.array_equal(b_QKV[2 * h * dk: 2 * h * dk + dv], W.b_V[0])
    assert fast.fused_biases(W)[0] is b_QKV and not b_QKV.flags.writeable
    assert fast.fused_biases(init_weights(dims, seed=24)) == (None, None)


def test_missing_biases_are_zero_in_the_fused_bias():
    W0 = init_weights(seed=25, biases=True)
    W = mha_lit.Weights(W0.W_Q, W0.W_K, W0.W_V, W0.W_O, b_K=W0.b_K)  # only b_K
    b_QKV, b_O = fast.fused_biases(W)
    assert np.all(b_QKV[:14] == 0.0) and np.all(b_QKV[28:] == 0.0) and np.all(b_O == 0.0)
    X = np.random.default_rng(25).standard_normal((3, 5))
    assert _close(multi_head_attention(X, W), reference(X, W), np.float64)


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_project_heads_adds_the_biases(dims):
    X, _ = _case(dims, np.float64, seed=26)
    W = init_weights(dims, seed=26, biases=True)
    Q_T, K_T, V_T = project_heads(X, W)
    for i in range(dims.heads):
        assert np.allclose(Q_T[i].T, (X @ W.W_Q[i] + W.b_Q[i]) / np.sqrt(dims.d_k), atol=1e-13)
        assert np.allclose(K_T[i].T, X @ W.W_K[i] + W.b_K[i], atol=1e-13)
        assert np.allclose(V_T[i].T, X @ W.W_V[i] + W.b_V[i], atol=1e-13)


@pytest.mark.parametrize(
    "X, key_mask",
    [
        (np.ones((2, 3, 5)), np.ones((3, 2), bool)),
        (np.ones((2, 3, 5)), np.ones((2, 3), np.int8)),
        (np.ones((3, 5)), np.ones((3, 1), bool)),
        (np.ones((2, 3, 5, 1)), None),
    ],
    ids=["mask transposed", "int mask", "mask (n, 1)", "4-D"],
)
def test_bad_batches_and_masks_are_refused_the_same_way(X, key_mask):
    W = init_weights(seed=27)
    with pytest.raises((TypeError, ValueError)) as ref_error:
        reference(X, W, key_mask=key_mask)
    with pytest.raises(ref_error.type) as fast_error:
        multi_head_attention(X, W, key_mask=key_mask)
    assert str(fast_error.value) == str(ref_error.value)


@pytest.mark.parametrize("tile", [1, 64])
def test_float16_inputs_accumulate_in_float32(tile):
    """4099 equal scores: the running sum reaches 4099, past float16's exact integers (2048).

    In float16 the sum would stall near 2048 and the output would be far off; kept in float32,
    as FlashAttention keeps it, the output is the mean of the values to float16 rounding.
    """
    rng = np.random.default_rng(16)
    n = 4099
    Q = np.zeros((1, 1, 2), np.float16)  # (h, 1 query, d_k): every score is 0
    K = rng.standard_normal((1, n, 2)).astype(np.float16)  # (h, n, d_k)
    V = rng.standard_normal((1, n, 3)).astype(np.float16)  # (h, n, d_v)
    H = attend_tiled(Q, K, V, lambda c0, c1: None, tile)  # (h, 1, d_v)
    assert H.dtype == np.float16 and H.shape == (1, 1, 3)
    expected = V.astype(np.float64).mean(axis=-2)  # (h, d_v): equal weights
    assert np.allclose(H[:, 0].astype(np.float64), expected, rtol=0, atol=2e-3)


@pytest.mark.parametrize("B", [1, 2, 5, 16])
def test_few_rows_product_is_the_plain_product(B):
    rng = np.random.default_rng(B)
    W_T = rng.standard_normal((fast.PANEL_ROWS * 2 + 37, 11))  # panels that do not divide
    X = rng.standard_normal((B, 11))
    out = fast.few_rows_product(W_T, X)
    assert out.shape == (B, W_T.shape[0])
    assert np.allclose(out, X @ W_T.T, rtol=0, atol=1e-12)


def test_fused_weights_in_another_dtype_are_made_once():
    W = init_weights(Dims(), seed=8)
    first = fast.fused_weights(W, np.float32)
    assert first[0].dtype == first[1].dtype == np.float32
    assert fast.fused_weights(W, np.float32)[0] is first[0]  # kept, not copied again
    assert fast.fused_weights(W)[0].dtype == np.float64
    assert not first[0].flags.writeable
    Wb = init_weights(Dims(), seed=8, biases=True)
    b32 = fast.fused_biases(Wb, np.float32)
    assert b32[0].dtype == np.float32 and fast.fused_biases(Wb, np.float32)[0] is b32[0]


def test_few_rows_product_mixed_dtypes_and_layout():
    rng = np.random.default_rng(9)
    W_T = rng.standard_normal((300, 7)).astype(np.float32)
    X = rng.standard_normal((3, 7))  # float64 rows
    out = fast.few_rows_product(W_T, X)
    assert out.dtype == np.float64 and np.allclose(out, X @ W_T.T.astype(np.float64), atol=1e-6)
    # internal now: another layout is no longer refused, and the product is the same
    F = fast.few_rows_product(np.asfortranarray(W_T), X)
    assert F.dtype == np.float64 and np.allclose(F, out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dims", PRIME_DIMS + [Dims(tokens=5, d_model=7, d_k=3, d_v=13, heads=6, kv_heads=2)],
                         ids=str)
@pytest.mark.parametrize("biases", [False, True])
def test_output_projection_is_concat_times_W_O_plus_b_O(dims, biases):
    W = init_weights(dims, seed=30, biases=biases)
    rng = np.random.default_rng(30)
    for N in (1, 3, fast.FEW_ROWS, fast.FEW_ROWS + 1):  # few rows and many
        concat = rng.standard_normal((N, dims.heads * dims.d_v))
        Y = fast.output_projection(concat, W)
        assert Y.shape == (N, dims.d_model)
        assert np.allclose(Y, concat @ W.W_O + W.bias("b_O"), rtol=0, atol=1e-12)
        Y32 = fast.output_projection(concat.astype(np.float32), W)
        assert Y32.dtype == np.float32 and np.allclose(Y32, Y, rtol=0, atol=1e-5)


@pytest.mark.parametrize("base", [10.0, 10000.0])
def test_rotate_heads_turns_every_head_in_place_by_its_positions(base):
    rng = np.random.default_rng(31)
    A_T = rng.standard_normal((3, 6, 5))  # (heads, d_k, n)
    before = A_T.copy()
    positions = np.array([0, 4, 1, 9, 2])
    assert fast.rotate_heads(A_T, positions, base) is None  # in place
    for i in range(3):
        assert np.allclose(A_T[i].T, mha_lit.rope.rotate(before[i].T, positions, base), rtol=0, atol=1e-14)
    assert np.array_equal(A_T[:, :, 0], before[:, :, 0])  # position 0: cos 0 = 1, sin 0 = 0


def test_project_heads_of_grouped_weights_has_h_kv_key_and_value_heads():
    dims = Dims(tokens=4, d_model=5, d_k=3, d_v=7, heads=6, kv_heads=2)
    X, W = _case(dims, np.float64, seed=32)
    Q_T, K_T, V_T = project_heads(X, W)
    assert (Q_T.shape, K_T.shape, V_T.shape) == ((6, 3, 4), (2, 3, 4), (2, 7, 4))
    for j in range(2):
        assert np.allclose(K_T[j].T, X @ W.W_K[j], rtol=0, atol=1e-13)
        assert np.allclose(V_T[j].T, X @ W.W_V[j], rtol=0, atol=1e-13)
    W_QKV_T, _ = fused_weights(W)
    assert W_QKV_T.shape == ((6 + 2) * 3 + 2 * 7, 5)


def test_fused_arrays_are_kept_per_weights_and_dropped_with_them():
    import gc
    import weakref

    W = init_weights(Dims(), seed=33, biases=True)
    first = fused_weights(W), fast.fused_biases(W)
    again = fused_weights(W), fast.fused_biases(W)
    assert all(a is b for a, b in zip(first[0] + first[1], again[0] + again[1]))
    other = init_weights(Dims(), seed=33, biases=True)  # equal weights, another Weights
    assert fused_weights(other)[0] is not first[0][0]
    assert np.array_equal(fused_weights(other)[0], first[0][0])
    gone = weakref.ref(W)
    del W, first, again
    gc.collect()
    assert gone() is None  # the kept arrays do not keep W alive


@pytest.mark.parametrize("n, block", [(1, 1), (5, 2), (8, 4), (9, 4), (300, 128), (7, 100)])
def test_causal_block_kinds_follow_the_blocks_attend_meets(n, block):
    kinds = fast.causal_block_kinds(n, block)
    k = -(-n // block)
    assert kinds.shape == (k, k)
    for i in range(k):
        for j in range(k):
            q = np.arange(i * block, min((i + 1) * block, n))  # the block's query rows
            u = np.arange(j * block, min((j + 1) * block, n))  # the key block's rows
            seen = masks.causal(n)[np.ix_(q, u)]
            want = fast.SKIPPED if j > i else fast.COMPUTED if seen.all() else fast.MASKED
            assert kinds[i, j] == want
    assert np.array_equal(fast.causal_block_kinds(n), fast.causal_block_kinds(n, fast.BLOCK_ROWS))


@pytest.mark.parametrize("n, block, error", [(0, 4, ValueError), (4, 0, ValueError), (2.0, 4, TypeError),
                                             (4, True, TypeError), (4, 2.5, TypeError)])
def test_causal_block_kinds_refuses_bad_sizes(n, block, error):
    with pytest.raises(error, match="must be a positive integer"):
        fast.causal_block_kinds(n, block)


def test_the_mask_rule_of_causal_attention_and_of_a_window():
    q, k = np.arange(3, 7), np.array([0, 5, 2, -1, 6, 3])
    assert masks.rule(False) is None and masks.rule(False, None) is None  # every key
    assert np.array_equal(masks.rule(True)(q, k), masks.visible(q, k))
    assert np.array_equal(masks.rule(True, 2)(q, k), masks.visible(q, k, 2))
    assert np.array_equal(masks.rule()(q, k), masks.visible(q, k))  # causal by default
