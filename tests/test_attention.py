import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import mha_lit
from mha_lit import (
    Dims,
    attention,
    attention_weights,
    causal_mask,
    init_weights,
    masks,
    multi_head_attention,
    multi_head_attention_reference,
    softmax,
    variants,
)
from tests.shapes_for_tests import PRIME_DIMS

finite = st.floats(-50, 50, allow_nan=False, allow_infinity=False)


# --- softmax ------------------------------------------------------------------------------

@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 9)), elements=finite))
def test_softmax_rows_sum_to_one_and_lie_in_unit_interval(x):
    s = softmax(x)
    assert s.shape == x.shape
    assert np.allclose(s.sum(axis=-1), 1.0)
    assert np.all((s >= 0) & (s <= 1))


@given(arrays(np.float64, (4, 7), elements=finite), finite)
def test_softmax_invariant_to_adding_a_constant(x, c):
    assert np.allclose(softmax(x + c), softmax(x), atol=1e-12)


def test_softmax_huge_logits_do_not_overflow():
    s = softmax(np.array([[1000.0, 1001.0, 1002.0], [-1e308, 0.0, 1e308]]))
    assert np.all(np.isfinite(s))
    assert np.allclose(s[0], softmax(np.array([0.0, 1.0, 2.0])))
    assert np.allclose(s[1], [0.0, 0.0, 1.0])


def test_softmax_of_minus_inf_is_exactly_zero_and_axis_works():
    s = softmax(np.array([[0.0, -np.inf], [1.0, 1.0]]))
    assert s[0, 1] == 0.0 and s[0, 0] == 1.0
    assert np.allclose(softmax(np.ones((3, 4)), axis=0).sum(axis=0), 1.0)


def test_softmax_preserves_float32_and_accepts_integers():
    assert softmax(np.ones(3, np.float32)).dtype == np.float32
    assert np.allclose(softmax([1, 2, 3]), softmax([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("bad", [[[np.nan, 1.0]], [[np.inf, 1.0]], [[-np.inf, -np.inf]]])
def test_softmax_refuses_rows_without_a_distribution(bad):
    with pytest.raises(ValueError, match=r"shape \(1, 2\)"):
        softmax(np.array(bad))


# --- causal mask --------------------------------------------------------------------------

def test_causal_mask_on_the_book_example():
    m = causal_mask(np.arange(1, 10).reshape(3, 3))
    inf = np.inf
    assert np.array_equal(m, [[1, -inf, -inf], [4, 5, -inf], [7, 8, 9]])


def test_causal_mask_returns_a_copy_and_works_per_head():
    s = np.ones((2, 4, 4))
    m = causal_mask(s)
    assert np.all(s == 1)
    assert np.all(np.isneginf(m[:, 0, 1:])) and np.all(np.isfinite(np.tril(m[1])))
    with pytest.raises(ValueError, match="shape \\(4,\\)"):
        causal_mask(np.ones(4))


def test_causal_mask_with_more_keys_puts_the_queries_last():
    m = causal_mask(np.zeros((2, 4)))  # queries at positions 2 and 3 of 4
    assert np.array_equal(np.isfinite(m), [[1, 1, 1, 0], [1, 1, 1, 1]])


# --- masks: which keys a query may see ------------------------------------------------------

def test_causal_is_the_lower_triangle_diagonal_included():
    assert masks.causal(4).dtype == np.bool_
    assert np.array_equal(masks.causal(4), np.tril(np.ones((4, 4), bool)))
    assert np.array_equal(masks.causal(1), [[True]])
    # a cache supplies m - n earlier keys: query t stands at position m - n + t
    assert np.array_equal(masks.causal(2, 5), np.tril(np.ones((5, 5), bool))[-2:])
    assert np.array_equal(masks.causal(5, 5), masks.causal(5))


@given(st.integers(1, 9), st.integers(0, 6), st.integers(1, 5))
def test_visible_is_the_rule_entry_by_entry(m, extra, window):
    """visible(t, u, w) is u <= t, u >= 0 and (with w) t - u < w, on any positions, in any order."""
    rng = np.random.default_rng(m * 100 + extra * 10 + window)
    t = rng.integers(0, m + extra, size=4)
    u = rng.permutation(np.concatenate([np.arange(m), -np.ones(extra, int)]))  # -1: empty slots
    for w in (None, window):
        V = masks.visible(t, u, w)
        assert V.shape == (4, m + extra) and V.dtype == np.bool_
        for i in range(4):
            for j in range(m + extra):
                want = u[j] >= 0 and u[j] <= t[i] and (w is None or t[i] - u[j] < w)
                assert V[i, j] == want


def test_visible_broadcasts_over_leading_axes():
    q = np.array([[0, 1], [3, 4]])  # (B=2, n=2)
    k = np.array([[0, 1, -1], [2, 3, 4]])  # (B=2, m=3)
    V = masks.visible(q, k)
    assert V.shape == (2, 2, 3)
    assert np.array_equal(V[0], [[1, 0, 0], [1, 1, 0]])
    assert np.array_equal(V[1], [[1, 1, 0], [1, 1, 1]])
    assert np.array_equal(masks.visible(q, k, 2)[1], [[1, 1, 0], [0, 1, 1]])


def test_band_is_causal_within_the_window():
    assert np.array_equal(masks.band(4, 2), [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    assert np.array_equal(masks.band(5, 5), masks.causal(5))  # a window of n is causal attention
    assert np.array_equal(masks.band(5, 99), masks.causal(5))
    assert np.array_equal(masks.band(5, 1), np.eye(5, dtype=bool))  # each token sees itself only
    assert np.array_equal(masks.band(2, 3, 6), masks.band(6, 3)[-2:])  # the last n of m positions


# --- one head -----------------------------------------------------------------------------

def test_attention_weights_are_lower_triangular_with_unit_rows():
    rng = np.random.default_rng(0)
    S = attention_weights(rng.standard_normal((3, 7)), rng.standard_normal((3, 7)), masks.causal(3))
    assert S.shape == (3, 3)
    assert np.all(np.triu(S, 1) == 0)
    assert np.allclose(S.sum(axis=1), 1)
    assert S[0, 0] == 1.0


def test_attention_matches_the_formula_written_out():
    rng = np.random.default_rng(1)
    Q, K, V = rng.standard_normal((3, 7)), rng.standard_normal((3, 7)), rng.standard_normal((3, 11))
    scores = causal_mask(Q @ K.T / np.sqrt(7))
    e = np.exp(scores)
    expected = (e / e.sum(axis=1, keepdims=True)) @ V
    H = attention(Q, K, V, masks.causal(3))
    assert H.shape == (3, 11)
    assert np.allclose(H, expected, atol=1e-14)
    assert not np.allclose(attention(Q, K, V), expected)  # no mask: every key


def test_attention_without_a_mask_looks_at_every_key():
    """mask=None is every key (not causal): the formula with no -inf at all."""
    rng = np.random.default_rng(1)
    Q, K, V = rng.standard_normal((3, 7)), rng.standard_normal((4, 7)), rng.standard_normal((4, 11))
    e = np.exp(Q @ K.T / np.sqrt(7))
    expected = (e / e.sum(axis=1, keepdims=True)) @ V
    assert np.allclose(attention(Q, K, V), expected, atol=1e-14)
    assert np.allclose(attention(Q, K, V, np.ones((3, 4), bool)), expected, atol=1e-14)
    S = attention_weights(Q, K)
    assert np.all(S > 0) and np.allclose(S, e / e.sum(axis=1, keepdims=True), atol=1e-14)


def test_attention_scale_multiplies_the_scores():
    rng = np.random.default_rng(3)
    Q, K, V = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    assert np.allclose(attention(Q, K, V, scale=0.5), attention(Q, K, V), atol=1e-15)  # 1/sqrt(4)
    e = np.exp(0.1 * (Q @ K.T))
    assert np.allclose(attention(Q, K, V, scale=0.1), (e / e.sum(axis=1, keepdims=True)) @ V,
                       atol=1e-14)
    assert np.allclose(attention(Q, K, V, scale=1.0), attention(2 * Q, K, V), atol=1e-14)


def test_attention_stacks_heads_on_leading_axes_and_broadcasts_the_mask():
    rng = np.random.default_rng(4)
    Q, K, V = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((2, 3, 6, 7))
    mask = masks.causal(4, 6)  # (4, 6), the same for every head
    H = attention(Q, K, V, mask)
    assert H.shape == (2, 3, 4, 7)
    for a in range(2):
        for i in range(3):
            assert np.allclose(H[a, i], attention(Q[a, i], K[a, i], V[a, i], mask), rtol=0, atol=1e-14)
    per_head = rng.random((2, 3, 4, 6)) < 0.5
    per_head[..., -1] = True  # every query sees at least one key
    H2 = attention(Q, K, V, per_head)
    assert np.allclose(H2[1, 2], attention(Q[1, 2], K[1, 2], V[1, 2], per_head[1, 2]), rtol=0, atol=1e-14)


def test_a_false_mask_entry_gets_weight_exactly_zero():
    rng = np.random.default_rng(5)
    Q, K = rng.standard_normal((4, 3)), rng.standard_normal((6, 3))
    mask = rng.random((4, 6)) < 0.5
    mask[:, 0] = True
    S = attention_weights(Q, K, mask)
    assert np.all(S[~mask] == 0.0) and np.all(S[mask] > 0)
    assert np.allclose(S.sum(axis=1), 1.0)


def test_a_query_that_sees_no_key_is_refused():
    """No visible key: no distribution; softmax refuses it rather than returning a zero row."""
    Q, K, V = np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 4))
    mask = masks.causal(3) & np.array([False, True, True])  # query 0 may look only at key 0
    with pytest.raises(ValueError, match="entirely -inf"):
        attention(Q, K, V, mask)
    with pytest.raises(ValueError, match="entirely -inf"):
        attention_weights(Q, K, mask)


@pytest.mark.parametrize("mask", [np.bool_(True), np.ones(3, bool), np.ones((3, 3)), np.ones((3, 3), int),
                                  [[1, 0, 0], [1, 1, 0], [1, 1, 1]]], ids=repr)
def test_a_mask_that_is_not_a_boolean_matrix_is_refused(mask):
    Q = np.ones((3, 2))
    with pytest.raises(TypeError, match=r"mask must be a boolean matrix \(n, m\)"):
        attention(Q, Q, Q, mask)
    with pytest.raises(TypeError, match=r"mask must be a boolean matrix \(n, m\)"):
        attention_weights(Q, Q, mask)


def test_a_mask_that_does_not_fit_the_scores_is_refused():
    Q, K = np.ones((3, 2)), np.ones((4, 2))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\) does not fit the scores \(3 queries, 4 keys\)"):
        attention(Q, K, K, masks.causal(3))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 4\) does not fit"):
        attention_weights(Q, K, np.ones((2, 4), bool))


def test_attention_with_fewer_queries_sees_all_earlier_keys():
    rng = np.random.default_rng(2)
    Q, K, V = rng.standard_normal((5, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    assert np.allclose(attention(Q[-2:], K, V, masks.causal(2, 5)), attention(Q, K, V, masks.causal(5))[-2:])


def test_attention_refuses_mismatched_shapes():
    Q, K, V = np.ones((3, 7)), np.ones((3, 6)), np.ones((3, 11))
    with pytest.raises(ValueError, match=r"Q is \(3, 7\) and K is \(3, 6\)"):
        attention(Q, K, V)
    with pytest.raises(ValueError, match=r"V has 4 rows but K has 3"):
        attention(Q, np.ones((3, 7)), np.ones((4, 11)))
    # more causal queries than keys: the first query would stand before every key
    with pytest.raises(ValueError, match=r"4 queries cannot be the last of only 3 positions"):
        attention(np.ones((4, 7)), np.ones((3, 7)), V, masks.causal(4, 3))
    # a mask of one's own in which a query sees no key: softmax has no distribution for it
    hidden = np.ones((3, 3), bool)
    hidden[0] = False
    with pytest.raises(ValueError, match=r"shape \(3, 3\) has a slice along axis -1 that is entirely -inf"):
        attention(np.ones((3, 7)), np.ones((3, 7)), V, hidden)


# --- many heads ---------------------------------------------------------------------------

def _per_head_by_hand(X, W, causal=True):
    mask = masks.causal(len(X)) if causal else None
    H = [attention(X @ W.W_Q[i], X @ W.W_K[i], X @ W.W_V[i], mask) for i in range(W.heads)]
    return np.concatenate(H, axis=1) @ W.W_O


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_attention_shapes_and_per_head_equality(dims, causal):
    W = init_weights(dims, seed=5)
    X = np.random.default_rng(6).standard_normal((dims.tokens, dims.d_model))
    Y = multi_head_attention(X, W, causal=causal)
    assert Y.shape == (dims.tokens, dims.d_model)
    assert np.allclose(Y, _per_head_by_hand(X, W, causal), atol=1e-12)
    assert np.allclose(Y, multi_head_attention_reference(X, W, causal), atol=1e-12)


def test_first_row_attends_only_to_itself():
    W = init_weights(seed=0)
    X = np.random.default_rng(0).standard_normal((3, 5))
    V_rows = np.concatenate([X[0] @ W.W_V[i] for i in range(W.heads)])  # (22,)
    assert np.allclose(multi_head_attention(X, W)[0], V_rows @ W.W_O)


@pytest.mark.parametrize("dims", PRIME_DIMS[:3], ids=str)
def test_float32_in_float32_out(dims):
    W32 = init_weights(dims, seed=2, dtype=np.float32)
    X = np.random.default_rng(3).standard_normal((dims.tokens, dims.d_model))
    Y32 = multi_head_attention(X.astype(np.float32), W32)
    assert Y32.dtype == np.float32
    assert np.allclose(Y32, multi_head_attention(X, W32.astype(np.float64)), atol=1e-5)
    assert multi_head_attention(X, W32).dtype == np.float64


@given(
    st.integers(2, 7),
    st.integers(0, 6),
    arrays(np.float64, 5, elements=st.floats(-3, 3)),
)
def test_changing_row_k_moves_no_earlier_output(n, k, delta):
    """Causality: output row i depends only on input rows 1..i.

    In exact arithmetic the earlier rows do not move at all (row k reaches them only through
    masked scores and zero weights); the two runs are two computations, which a BLAS may sum
    in different orders, so they are compared to rounding, while a moved row moves by far more
    (chapter 6 and its SymPy proof).
    """
    k = k % n
    W = init_weights(Dims(tokens=n), seed=n)
    X = np.random.default_rng(k).standard_normal((n, 5))
    X2 = X.copy()
    X2[k] += delta
    Y, Y2 = multi_head_attention(X, W), multi_head_attention(X2, W)
    assert np.allclose(Y[:k], Y2[:k], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "X, error, message",
    [
        (np.ones((3, 4)), ValueError, r"X has 4 columns but W_Q expects d_model = 5"),
        (np.ones((3, 5, 1)), ValueError, r"X has 1 columns but W_Q expects d_model = 5 \(X is \(3, 5, 1\)"),
        (np.ones((2, 3, 5, 1)), ValueError, r"X must be 2-D .* or 3-D .* got shape \(2, 3, 5, 1\)"),
        (np.ones((0, 3, 5)), ValueError, r"X holds no sequences \(shape \(0, 3, 5\)\)"),
        (np.ones((2, 0, 5)), ValueError, r"X has no rows \(shape \(2, 0, 5\)\)"),
        (np.ones(5), ValueError, r"X must be 2-D .* got shape \(5,\)"),
        (np.array([["a"] * 5] * 3), TypeError, r"X must hold real numbers"),
        (np.ones((3, 5), dtype=complex), TypeError, r"X must hold real numbers"),
        (np.ones((3, 5), dtype=bool), TypeError, r"X must hold real numbers"),
        (np.array([[1.0, 2, 3, 4, np.nan]] * 3), ValueError, r"X of shape \(3, 5\) holds 3 NaN"),
        (np.array([[1.0, 2, 3, 4, np.inf]]), ValueError, r"X of shape \(1, 5\) holds 1 NaN or inf"),
        (np.array([[1.0, 2, 3, 4, -np.inf]]), ValueError, r"holds 1 NaN or infinite"),
    ],
)
def test_multi_head_attention_refuses_bad_input(X, error, message):
    with pytest.raises(error, match=message):
        multi_head_attention(X, init_weights())


def test_multi_head_attention_refuses_non_weights():
    with pytest.raises(TypeError, match="needs mha_lit.Weights, got tuple"):
        multi_head_attention(np.ones((3, 5)), (1, 2, 3))
    with pytest.raises(TypeError, match="needs mha_lit.Weights, got tuple"):
        multi_head_attention_reference(np.ones((3, 5)), (1, 2, 3))
    with pytest.raises(TypeError, match="needs mha_lit.Weights, got tuple"):
        variants.reference(np.ones((3, 5)), (1, 2, 3))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_chapter_5_reference_equals_the_variants_reference_on_plain_weights(dims, causal):
    W = init_weights(dims, seed=7)
    X = np.random.default_rng(8).standard_normal((dims.tokens, dims.d_model))
    assert np.allclose(multi_head_attention_reference(X, W, causal), variants.reference(X, W, causal),
                       rtol=0, atol=1e-12)


@pytest.mark.parametrize("W, what", [
    (init_weights(seed=0, biases=True), "biases"),
    (init_weights(Dims(heads=4, kv_heads=2), seed=0), "grouped key/value heads"),
], ids=["biases", "grouped"])
def test_chapter_5_reference_refuses_the_variants_and_names_their_function(W, what):
    X = np.ones((3, W.d_model))
    with pytest.raises(ValueError, match=rf"W has {what} .*mha_lit\.variants\.reference"):
        multi_head_attention_reference(X, W)
    assert variants.reference(X, W).shape == X.shape  # which computes them


def test_chapter_5_reference_takes_one_sequence_only():
    with pytest.raises(ValueError, match=r"X must be 2-D .* got shape \(2, 3, 5\)"):
        multi_head_attention_reference(np.ones((2, 3, 5)), init_weights())


def test_multi_head_attention_does_not_modify_its_input():
    X = np.random.default_rng(0).standard_normal((3, 5))
    before = X.copy()
    multi_head_attention(X, init_weights())
    assert np.array_equal(X, before)


# --- chapter 8: biases, batches of sequences and key padding --------------------------------

BATCH_TOL = 1e-12  # float64: a batch and its sequences alone are different products, so to rounding
MHA_FUNCTIONS = [multi_head_attention, variants.reference]


def _padded_batch(d_model, lengths, n, left, seed):
    """X (B, n, d_model) holding sequences of the given lengths, padded to n on the right (or the
    left) with large random values; key_mask (B, n); the sequences alone."""
    rng = np.random.default_rng(seed)
    alone = [rng.standard_normal((L, d_model)) for L in lengths]
    X = 50.0 * rng.standard_normal((len(lengths), n, d_model))  # padding: anything finite
    key_mask = np.zeros((len(lengths), n), dtype=bool)
    for b, x in enumerate(alone):
        where = slice(n - len(x), n) if left else slice(0, len(x))
        X[b, where], key_mask[b, where] = x, True
    return X, key_mask, alone


@pytest.mark.parametrize("f", MHA_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("biases", [False, True])
@pytest.mark.parametrize("dims, B", list(zip(PRIME_DIMS, [2, 3, 5, 2, 7, 3])), ids=str)
def test_batch_equals_each_sequence_alone(dims, B, biases, causal, f):
    W = init_weights(dims, seed=11, biases=biases)
    X = np.random.default_rng(12).standard_normal((B, dims.tokens, dims.d_model))
    Y = f(X, W, causal)
    assert Y.shape == X.shape == (B, dims.tokens, dims.d_model)
    for b in range(B):
        assert np.allclose(Y[b], f(X[b], W, causal), rtol=0, atol=BATCH_TOL)
    everything_real = np.ones((B, dims.tokens), dtype=bool)
    assert np.allclose(f(X, W, causal, key_mask=everything_real), Y, rtol=0, atol=BATCH_TOL)


@pytest.mark.parametrize("f", MHA_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("left", [False, True], ids=["right padding", "left padding"])
@pytest.mark.parametrize("biases", [False, True])
@pytest.mark.parametrize("dims", PRIME_DIMS[:4], ids=str)
def test_padded_real_rows_equal_the_sequence_alone(dims, biases, left, causal, f):
    """Lengths 3 and 2 padded to 3 (B = 2): every real output row is the row of the
    sequence computed alone, every padded row is 0, nothing is NaN."""
    W = init_weights(dims, seed=13, biases=biases)
    X, key_mask, alone = _padded_batch(dims.d_model, [3, 2], 3, left, seed=14)
    Y = f(X, W, causal, key_mask=key_mask)
    assert Y.shape == (2, 3, dims.d_model) and np.all(np.isfinite(Y))
    for b, x in enumerate(alone):
        assert np.allclose(Y[b][key_mask[b]], f(x, W, causal), rtol=0, atol=BATCH_TOL)
        assert np.all(Y[b][~key_mask[b]] == 0.0)


@pytest.mark.parametrize("f", MHA_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("left", [False, True], ids=["right padding", "left padding"])
def test_values_at_padded_positions_change_no_real_output(left, causal, f):
    dims = Dims(tokens=3, d_model=7, d_k=5, d_v=11, heads=3)
    W = init_weights(dims, seed=15, biases=True)
    X, key_mask, _ = _padded_batch(7, [3, 2], 3, left, seed=16)
    X2 = X.copy()
    X2[~key_mask] = np.random.default_rng(17).standard_normal((1, 7)) * 1e3
    Y, Y2 = f(X, W, causal, key_mask=key_mask), f(X2, W, causal, key_mask=key_mask)
    assert np.allclose(Y, Y2, rtol=0, atol=BATCH_TOL)
    X2[key_mask] += 1.0  # a real token's value does change the output
    assert not np.allclose(f(X2, W, causal, key_mask=key_mask), Y, rtol=0, atol=1e-3)


def test_one_sequence_accepts_a_key_mask_of_shape_n():
    W = init_weights(Dims(tokens=5, d_model=5, d_k=7, d_v=11, heads=2), seed=18)
    X = np.random.default_rng(18).standard_normal((5, 5))
    real = np.array([False, True, True, False, True])  # holes anywhere, not only at the ends
    for f in MHA_FUNCTIONS:
        Y = f(X, W, key_mask=real)
        assert Y.shape == (5, 5) and np.all(Y[~real] == 0.0)
        assert np.allclose(Y[real], f(X[real], W), rtol=0, atol=BATCH_TOL)


@given(
    B=st.integers(1, 4),
    n=st.integers(1, 7),
    causal=st.booleans(),
    biases=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_any_key_mask_equals_the_real_tokens_computed_alone(B, n, causal, biases, seed, data):
    """Law: masking a key = deleting its token. Whatever the mask (padding at either end or
    holes inside, whole sequences of padding included), each sequence's real rows equal its
    real tokens computed alone, padded rows are 0, and reference = fast path."""
    key_mask = data.draw(arrays(bool, (B, n)), label="key_mask")
    W = init_weights(Dims(tokens=n, d_model=5, d_k=3, d_v=7, heads=2), seed=seed, biases=biases)
    X = np.random.default_rng(seed).standard_normal((B, n, 5))
    Y = multi_head_attention(X, W, causal, key_mask=key_mask)
    Y_ref = variants.reference(X, W, causal, key_mask=key_mask)
    assert np.allclose(Y, Y_ref, rtol=0, atol=BATCH_TOL)
    assert np.all(np.isfinite(Y)) and np.all(Y[~key_mask] == 0.0)
    for b in range(B):
        if key_mask[b].any():
            alone = variants.reference(X[b][key_mask[b]], W, causal)
            assert np.allclose(Y[b][key_mask[b]], alone, rtol=0, atol=BATCH_TOL)


def test_float32_batch_in_float32_out():
    W = init_weights(Dims(tokens=5, d_model=7, d_k=3, d_v=13, heads=3), seed=19, dtype=np.float32)
    X, key_mask, _ = _padded_batch(7, [5, 2, 3], 5, left=True, seed=19)
    for f in MHA_FUNCTIONS:
        Y = f(X.astype(np.float32), W, key_mask=key_mask)
        assert Y.dtype == np.float32
        Y64 = f(X, W.astype(np.float64), key_mask=key_mask)
        assert np.allclose(Y, Y64, rtol=0, atol=1e-5)


def test_biases_enter_every_projection_and_the_output():
    dims = Dims()
    W0 = init_weights(dims, seed=20)
    Wb = init_weights(dims, seed=20, biases=True)
    X = np.random.default_rng(20).standard_normal((3, 5))
    H = [attention(X @ Wb.W_Q[i] + Wb.b_Q[i], X @ Wb.W_K[i] + Wb.b_K[i],
                   X @ Wb.W_V[i] + Wb.b_V[i], masks.causal(3)) for i in range(2)]
    by_hand = np.concatenate(H, axis=1) @ Wb.W_O + Wb.b_O
    for f in MHA_FUNCTIONS:
        assert np.allclose(f(X, Wb), by_hand, rtol=0, atol=1e-12)
        assert not np.allclose(f(X, Wb), f(X, W0), rtol=0, atol=1e-3)
        zero = mha_lit.Weights(**W0.arrays(), b_O=np.zeros(5))  # zero biases change nothing
        assert np.allclose(f(X, zero), f(X, W0), rtol=0, atol=1e-15)


def test_attention_weights_with_a_padded_key():
    """A padded key is a False column of the mask: weight exactly 0 from every query. A query
    left with only padded keys is refused (it has no distribution); the real rows are the real
    tokens computed alone."""
    rng = np.random.default_rng(21)
    Q, K = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    left_padded = np.array([False, True, True])
    mask = masks.causal(3) & left_padded  # (3, 3): key 0 hidden from every query
    with pytest.raises(ValueError, match="entirely -inf"):
        attention_weights(Q, K, mask)  # query 0 may look only at the padded key 0
    S = attention_weights(Q[1:], K, mask[1:])  # the real queries
    assert np.all(S[:, 0] == 0.0)  # the padded key gets no weight
    assert np.allclose(S.sum(axis=1), 1.0)
    assert np.allclose(S[:, 1:], attention_weights(Q[1:], K[1:], masks.causal(2)), rtol=0, atol=1e-15)
    all_real = attention_weights(Q, K, masks.causal(3) & np.ones(3, bool))
    assert np.allclose(all_real, attention_weights(Q, K, masks.causal(3)), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 2\) does not fit the scores \(3 queries, 3 keys\)"):
        attention_weights(Q, K, masks.causal(3)[:, 1:])


def test_per_sequence_computes_the_real_rows_alone_and_zeroes_the_padding():
    rng = np.random.default_rng(22)
    X = rng.standard_normal((2, 4, 3))
    real = np.array([[True, False, True, True], [False, False, False, False]])
    seen = []

    def f(x):
        seen.append(x.copy())
        return 2 * x + x.sum(axis=0)  # every row depends on every row of its sequence

    Y = variants.per_sequence(f, X, real)
    assert Y.shape == X.shape and Y.dtype == X.dtype
    assert len(seen) == 1 and np.array_equal(seen[0], X[0][real[0]])  # no call on an all-padding row set
    assert np.array_equal(Y[0][real[0]], f(X[0][real[0]]))  # the same computation: exact
    assert np.all(Y[~real] == 0.0)
    assert np.array_equal(variants.per_sequence(f, X[0]), f(X[0]))  # no mask: f itself
    assert np.array_equal(variants.per_sequence(f, X), np.stack([f(X[0]), f(X[1])]))


@pytest.mark.parametrize(
    "X_shape, key_mask, error, message",
    [
        ((2, 3, 5), np.ones((2, 4), bool), ValueError,
         r"key_mask has shape \(2, 4\) but needs one entry per token of X \(2, 3, 5\), shape \(2, 3\)"),
        ((2, 3, 5), np.ones(3, bool), ValueError, r"key_mask has shape \(3,\) but .* of X \(2, 3, 5\)"),
        ((3, 5), np.ones((1, 3), bool), ValueError, r"key_mask has shape \(1, 3\) but .* of X \(3, 5\)"),
        ((2, 3, 5), np.ones((2, 3), int), TypeError, r"key_mask must be boolean .* got dtype int64"),
        ((3, 5), np.array([1.0, 0.0, 1.0]), TypeError, r"key_mask must be boolean"),
        ((2, 3, 5), [[True, True, True], [False, True]], ValueError,
         r"key_mask must be an array of shape \(2, 3\).*rows of different lengths"),
    ],
)
def test_bad_key_masks_are_refused_with_the_shapes_named(X_shape, key_mask, error, message):
    X = np.ones(X_shape)
    for f in MHA_FUNCTIONS:
        with pytest.raises(error, match=message):
            f(X, init_weights(), key_mask=key_mask)
