import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mha_lit import (
    Dims,
    attention,
    attention_weights,
    causal_mask,
    init_weights,
    multi_head_attention,
    multi_head_attention_reference,
    softmax,
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


# --- one head -----------------------------------------------------------------------------

def test_attention_weights_are_lower_triangular_with_unit_rows():
    rng = np.random.default_rng(0)
    S = attention_weights(rng.standard_normal((3, 7)), rng.standard_normal((3, 7)))
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
    H = attention(Q, K, V)
    assert H.shape == (3, 11)
    assert np.allclose(H, expected, atol=1e-14)
    assert not np.allclose(attention(Q, K, V, causal=False), expected)


def test_attention_with_fewer_queries_sees_all_earlier_keys():
    rng = np.random.default_rng(2)
    Q, K, V = rng.standard_normal((5, 3)), rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    assert np.allclose(attention(Q[-2:], K, V), attention(Q, K, V)[-2:])


def test_attention_refuses_mismatched_shapes():
    Q, K, V = np.ones((3, 7)), np.ones((3, 6)), np.ones((3, 11))
    with pytest.raises(ValueError, match=r"Q is \(3, 7\) and K is \(3, 6\)"):
        attention(Q, K, V)
    with pytest.raises(ValueError, match=r"V has 4 rows but K has 3"):
        attention(Q, np.ones((3, 7)), np.ones((4, 11)))
    with pytest.raises(ValueError, match=r"Q is \(4, 7\), K is \(3, 7\)"):
        attention(np.ones((4, 7)), np.ones((3, 7)), V)


# --- many heads ---------------------------------------------------------------------------

def _per_head_by_hand(X, W, causal=True):
    H = [attention(X @ W.W_Q[i], X @ W.W_K[i], X @ W.W_V[i], causal) for i in range(W.heads)]
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

    Compared in every bit, which is fair: X and X2 have the same shape, so each entry is
    computed by the same operations in the same order, and row k reaches earlier rows only
    through masked scores and exact-zero weights.
    """
    k = k % n
    W = init_weights(Dims(tokens=n), seed=n)
    X = np.random.default_rng(k).standard_normal((n, 5))
    X2 = X.copy()
    X2[k] += delta
    Y, Y2 = multi_head_attention(X, W), multi_head_attention(X2, W)
    assert np.array_equal(Y[:k], Y2[:k])


@pytest.mark.parametrize(
    "X, error, message",
    [
        (np.ones((3, 4)), ValueError, r"X has 4 columns but W_Q expects d_model = 5"),
        (np.ones((3, 5, 1)), ValueError, r"X must be 2-D .* got shape \(3, 5, 1\)"),
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
    with pytest.raises(TypeError, match="W must be mha_lit.Weights"):
        multi_head_attention(np.ones((3, 5)), (1, 2, 3))


def test_multi_head_attention_does_not_modify_its_input():
    X = np.random.default_rng(0).standard_normal((3, 5))
    before = X.copy()
    multi_head_attention(X, init_weights())
    assert np.array_equal(X, before)
