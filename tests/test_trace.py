"""The matmul recorder: it sees every product, changes no value, and labels attention's."""

import numpy as np
import pytest
from shapes_for_tests import PRIME_DIMS

import mha_lit
from mha_lit import Dims, counting, init_weights, trace, variants


def _X(dims, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal((dims.tokens, dims.d_model)).astype(dtype)


# --- one attention layer, watched (chapter 10) -----------------------------------------------

@pytest.mark.parametrize("dims", PRIME_DIMS)
def test_instrumented_count_equals_closed_form(dims):
    W = init_weights(dims, seed=1)
    with trace.record_matmuls() as log:
        Y = mha_lit.multi_head_attention_reference(log.track(_X(dims)), W)
    assert len(log) == counting.matmuls_per_attention_layer(dims.heads)
    labels = trace.label_attention_products(log, W)
    for head in range(1, dims.heads + 1):
        assert [name for h, name in labels if h == head] == ["X W_Q", "X W_K", "X W_V",
                                                             "Q K^T", "S V"]
    assert labels[-1] == (0, "Concat W_O")
    assert Y.shape == (dims.tokens, dims.d_model)


@pytest.mark.parametrize("heads", [1, 2, 3, 5, 7, 12])
def test_instrumented_count_for_many_head_counts(heads):
    dims = Dims(tokens=3, d_model=5, d_k=7, d_v=11, heads=heads)
    W = init_weights(dims, seed=0)
    with trace.record_matmuls() as log:
        mha_lit.multi_head_attention_reference(log.track(_X(dims)), W)
    assert log.calls == log.products == 5 * heads + 1


@pytest.mark.parametrize("dims", PRIME_DIMS)
def test_instrumented_shapes_and_multiply_adds(dims):
    n, d, dk, dv, h = dims.tokens, dims.d_model, dims.d_k, dims.d_v, dims.heads
    W = init_weights(dims, seed=4)
    with trace.record_matmuls() as log:
        mha_lit.multi_head_attention_reference(log.track(_X(dims)), W)
    head = [((n, d), (d, dk)), ((n, d), (d, dk)), ((n, d), (d, dv)), ((n, dk), (dk, n)),
            ((n, n), (n, dv))]
    assert [(r.a_shape, r.b_shape) for r in log.records] == head * h + [((n, h * dv), (h * dv, d))]
    assert log.multiply_adds == h * (n * d * (2 * dk + dv) + n * n * (dk + dv)) + n * h * dv * d


@pytest.mark.parametrize("dims", PRIME_DIMS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tracking_changes_no_result(dims, causal, dtype):
    W = init_weights(dims, seed=5)
    X = _X(dims, dtype=dtype)
    plain = mha_lit.multi_head_attention_reference(X, W, causal)
    with trace.record_matmuls() as log:
        traced = mha_lit.multi_head_attention_reference(log.track(X), W, causal)
    assert traced.dtype == plain.dtype
    tol = 1e-12 if plain.dtype == np.float64 else 1e-5  # the same products, to rounding
    assert np.allclose(np.asarray(traced), plain, rtol=0, atol=tol)
    assert type(plain) is np.ndarray


# --- what the recorder sees, and what it refuses ---------------------------------------------

def test_track_is_a_view_and_leaves_input_untouched():
    X = _X(Dims())
    before = X.copy()
    with trace.record_matmuls() as log:
        T = log.track(X)
        assert np.shares_memory(T, X)
        T @ np.ones((5, 2))
    assert np.array_equal(X, before) and len(log) == 1


def test_recording_stops_after_the_block():
    X = _X(Dims())
    with trace.record_matmuls() as log:
        T = log.track(X)
        T @ np.ones((5, 2))
    T @ np.ones((5, 2))
    assert len(log) == 1


def test_batched_call_counts_once_with_all_products():
    rng = np.random.default_rng(0)
    Q = rng.standard_normal((3, 5, 7))  # (h, n, d_k)
    K = rng.standard_normal((3, 5, 7))
    with trace.record_matmuls() as log:
        S = log.track(Q) @ K.transpose(0, 2, 1)  # (h, n, n)
    assert S.shape == (3, 5, 5)
    assert log.calls == 1 and log.products == 3 and log.multiply_adds == 3 * 5 * 7 * 5


def test_vector_products_are_not_matrix_products():
    with trace.record_matmuls() as log:
        log.track(np.ones(5)) @ np.ones(5)
    assert len(log) == 0


@pytest.mark.parametrize("fn", [lambda a: np.dot(a, a.T), lambda a: np.einsum("ij,kj->ik", a, a),
                                lambda a: np.tensordot(a, a.T, 1)])
def test_other_product_functions_are_refused_not_silently_missed(fn):
    with trace.record_matmuls() as log:
        with pytest.raises(TypeError, match="np.matmul only"):
            fn(log.track(np.ones((3, 5))))


def test_feed_forward_is_counted_as_two_products():
    block = pytest.importorskip("mha_lit.block")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 5))  # (n, d_model)
    W_1, W_2 = rng.standard_normal((5, 17)), rng.standard_normal((17, 5))
    b_1, b_2 = rng.standard_normal(17), rng.standard_normal(5)
    plain = block.feed_forward(X, W_1, b_1, W_2, b_2)
    with trace.record_matmuls() as log:
        traced = block.feed_forward(log.track(X), W_1, b_1, W_2, b_2)
    assert np.allclose(np.asarray(traced), plain, rtol=0, atol=1e-12)  # the same products
    assert [(r.a_shape, r.b_shape) for r in log.records] == [((3, 5), (5, 17)), ((3, 17), (17, 5))]


# --- chapter 8: biases are parameters, but adding them is not a product ----------------------

@pytest.mark.parametrize("dims", PRIME_DIMS)
def test_biases_add_no_recorded_product(dims):
    W = init_weights(dims, seed=6)
    Wb = init_weights(dims, seed=6, biases=True)
    X = _X(dims)
    with trace.record_matmuls() as log:  # chapter 8's reference, which takes biases
        plain = variants.reference(log.track(X), W)
    with trace.record_matmuls() as log_b:
        biased = variants.reference(log_b.track(X), Wb)
    assert len(log_b) == counting.matmuls_per_attention_layer(dims.heads)
    assert [(r.a_shape, r.b_shape) for r in log_b.records] == [(r.a_shape, r.b_shape)
                                                               for r in log.records]
    assert log_b.multiply_adds == log.multiply_adds
    assert trace.label_attention_products(log_b, Wb) == trace.label_attention_products(log, W)
    assert not np.allclose(np.asarray(biased), np.asarray(plain), rtol=0, atol=1e-3)
