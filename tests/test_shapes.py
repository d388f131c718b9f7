import numpy as np
import pytest

from mha_lit import Dims, Weights, init_weights
from tests.shapes_for_tests import PRIME_DIMS


def test_book_dims():
    d = Dims()
    assert (d.tokens, d.d_model, d.d_k, d.d_v, d.heads) == (3, 5, 7, 11, 2)
    assert d.concat == 22


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_init_weights_shapes(dims):
    W = init_weights(dims, seed=1)
    assert W.W_Q.shape == (dims.heads, dims.d_model, dims.d_k)
    assert W.W_K.shape == (dims.heads, dims.d_model, dims.d_k)
    assert W.W_V.shape == (dims.heads, dims.d_model, dims.d_v)
    assert W.W_O.shape == (dims.concat, dims.d_model)
    assert (W.heads, W.d_model, W.d_k, W.d_v) == (dims.heads, dims.d_model, dims.d_k, dims.d_v)
    assert W.dims(dims.tokens) == dims


def test_init_weights_deterministic_and_dtype():
    a, b = init_weights(seed=3), init_weights(seed=3)
    assert all(np.array_equal(getattr(a, n), getattr(b, n)) for n in ("W_Q", "W_K", "W_V", "W_O"))
    assert not np.array_equal(a.W_Q, init_weights(seed=4).W_Q)
    assert a.dtype == np.float64
    assert init_weights(seed=3, dtype=np.float32).dtype == np.float32
    with pytest.raises(TypeError, match="floating dtype"):
        init_weights(dtype=np.int64)
    with pytest.raises(TypeError, match="Dims"):
        init_weights((3, 5, 7, 11, 2))


@pytest.mark.parametrize("field", ["tokens", "d_model", "d_k", "d_v", "heads"])
@pytest.mark.parametrize("bad", [0, -3])
def test_dims_refuses_non_positive(field, bad):
    with pytest.raises(ValueError, match=f"Dims.{field}"):
        Dims(**{field: bad})


@pytest.mark.parametrize("bad", [2.5, "5", True, None])
def test_dims_refuses_non_integers(bad):
    with pytest.raises(TypeError, match="Dims.d_model"):
        Dims(d_model=bad)


def test_weights_are_private_read_only_copies():
    W = init_weights()
    W_Q = np.array(W.W_Q)
    W2 = Weights(W_Q, W.W_K, W.W_V, W.W_O)
    W_Q[0, 0, 0] = 99.0  # the caller changes its own array afterwards
    assert W2.W_Q[0, 0, 0] != 99.0
    with pytest.raises(ValueError):
        W2.W_Q[0, 0, 0] = 1.0


def test_weights_common_dtype():
    W = init_weights()
    W2 = Weights(W.W_Q.astype(np.float32), W.W_K, W.W_V, W.W_O)
    assert W2.dtype == np.float64
    assert init_weights().astype(np.float32).dtype == np.float32


def _parts():
    W = init_weights()
    return dict(W_Q=W.W_Q, W_K=W.W_K, W_V=W.W_V, W_O=W.W_O)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"W_K": np.zeros((3, 5, 7))}, r"W_K has shape \(3, 5, 7\) but W_Q has shape \(2, 5, 7\)"),
        ({"W_K": np.zeros((2, 5, 6))}, r"W_K has shape \(2, 5, 6\)"),
        ({"W_V": np.zeros((3, 5, 11))}, r"W_V has shape \(3, 5, 11\)"),
        ({"W_V": np.zeros((2, 4, 11))}, r"d_model = 5"),
        ({"W_O": np.zeros((21, 5))}, r"W_O has shape \(21, 5\).*\(22, 5\)"),
        ({"W_O": np.zeros((22, 4))}, r"W_O has shape \(22, 4\)"),
        ({"W_Q": np.zeros((5, 7))}, r"W_Q must be 3-D, got shape \(5, 7\)"),
        ({"W_O": np.zeros((2, 11, 5))}, r"W_O must be 2-D"),
    ],
)
def test_weights_refuse_mismatched_shapes(change, message):
    parts = _parts() | change
    with pytest.raises(ValueError, match=message):
        Weights(**parts)


def test_weights_refuse_non_numeric_and_non_finite():
    parts = _parts()
    with pytest.raises(TypeError, match="W_Q must hold real numbers"):
        Weights(**(parts | {"W_Q": parts["W_Q"].astype(str)}))
    bad = np.array(parts["W_O"])
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"W_O of shape \(22, 5\) holds 1 NaN"):
        Weights(**(parts | {"W_O": bad}))
