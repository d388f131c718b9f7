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


# --- chapter 8: attention biases ------------------------------------------------------------

@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_init_weights_biases_are_opt_in_and_leave_the_matrices_alone(dims):
    W, Wb = init_weights(dims, seed=2), init_weights(dims, seed=2, biases=True)
    assert (W.b_Q, W.b_K, W.b_V, W.b_O) == (None, None, None, None) and not W.has_biases
    assert Wb.has_biases
    assert Wb.b_Q.shape == Wb.b_K.shape == (dims.heads, dims.d_k)
    assert Wb.b_V.shape == (dims.heads, dims.d_v) and Wb.b_O.shape == (dims.d_model,)
    assert all(np.array_equal(getattr(W, n), getattr(Wb, n)) for n in ("W_Q", "W_K", "W_V", "W_O"))
    again = init_weights(dims, seed=2, biases=True)
    assert all(np.array_equal(a, b) for a, b in zip(Wb.arrays().values(), again.arrays().values()))
    assert list(W.arrays()) == ["W_Q", "W_K", "W_V", "W_O"]
    assert list(Wb.arrays()) == ["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"]


def test_biases_are_private_read_only_copies_in_the_common_dtype():
    W = init_weights(seed=3, dtype=np.float32)
    b_O = np.arange(5.0)  # float64
    W2 = Weights(W.W_Q, W.W_K, W.W_V, W.W_O, b_O=b_O)
    b_O[0] = 99.0
    assert W2.b_O[0] == 0.0 and W2.b_Q is None
    assert W2.dtype == W2.b_O.dtype == W2.W_Q.dtype == np.float64  # the widest input
    with pytest.raises(ValueError):
        W2.b_O[1] = 1.0
    W32 = W2.astype(np.float32)
    assert W32.b_O.dtype == np.float32 and W32.b_Q is None
    # integers become float64, as integer matrices do
    assert Weights(W.W_Q, W.W_K, W.W_V, W.W_O, b_V=np.ones((2, 11), int)).dtype == np.float64
    assert Weights(W.W_Q.astype(int), W.W_K, W.W_V, W.W_O).dtype == np.float64
    assert repr(W2).endswith("dtype=float64, biases=True)")
    assert repr(init_weights()) == "Weights(heads=2, d_model=5, d_k=7, d_v=11, dtype=float64)"


def test_bias_gives_zeros_for_a_missing_bias():
    W = Weights(**_parts(), b_K=np.ones((2, 7)))
    assert np.array_equal(W.bias("b_K"), np.ones((2, 7)))
    assert np.array_equal(W.bias("b_Q"), np.zeros((2, 7)))
    assert np.array_equal(W.bias("b_V"), np.zeros((2, 11)))
    assert np.array_equal(W.bias("b_O"), np.zeros(5))
    assert not W.bias("b_O").flags.writeable
    with pytest.raises(ValueError, match="no bias named 'b_1'"):
        W.bias("b_1")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"b_Q": np.zeros((2, 5))}, r"b_Q has shape \(2, 5\) but W_Q expects \(h, d_k\) = \(2, 7\)"),
        ({"b_K": np.zeros(14)}, r"b_K has shape \(14,\) but W_K expects \(h_kv, d_k\) = \(2, 7\)"),
        ({"b_V": np.zeros((2, 7))}, r"b_V has shape \(2, 7\) but W_V expects \(h_kv, d_v\) = \(2, 11\)"),
        ({"b_O": np.zeros((1, 5))}, r"b_O has shape \(1, 5\) but W_O expects \(d_model,\) = \(5,\)"),
        ({"b_O": np.zeros(22)}, r"b_O has shape \(22,\)"),
    ],
)
def test_weights_refuse_biases_of_the_wrong_shape(change, message):
    with pytest.raises(ValueError, match=message):
        Weights(**(_parts() | change))


def test_weights_refuse_non_numeric_and_non_finite_biases():
    with pytest.raises(TypeError, match="b_O must hold real numbers"):
        Weights(**_parts(), b_O=np.array(list("abcde")))
    bad = np.zeros((2, 11))
    bad[1, 3] = np.inf
    with pytest.raises(ValueError, match=r"b_V of shape \(2, 11\) holds 1 NaN or infinite"):
        Weights(**_parts(), b_V=bad)


def test_init_weights_draws_the_documented_distributions():
    """Entries are N(0, 1/fan_in): W_Q, W_K, W_V scaled by 1/sqrt(d_model), W_O by 1/sqrt(h d_v).

    Sizes are chosen so that the two fan-ins differ by a factor of 20: a scale applied to the
    wrong fan-in, or multiplied instead of divided, is far outside the tolerance.
    """
    dims = Dims(tokens=3, d_model=31, d_k=37, d_v=211, heads=3)
    W = init_weights(dims, seed=11)
    fan_in = {"W_Q": 31, "W_K": 31, "W_V": 31, "W_O": 3 * 211}
    for name, fan in fan_in.items():
        entries = getattr(W, name).ravel() * np.sqrt(fan)  # should be N(0, 1)
        assert abs(entries.mean()) < 0.05, name
        assert abs(entries.std() - 1) < 0.05, name
    b = init_weights(dims, seed=11, biases=True)
    for name in ("b_Q", "b_K", "b_V", "b_O"):
        entries = getattr(b, name).ravel()  # N(0, 0.1^2)
        assert abs(entries.mean()) < 0.05 and abs(entries.std() - 0.1) < 0.03, name


# --- mutation-test gaps (shared/reviews/mutation.md): frozen, identity equality, zero heads --

def test_weights_are_frozen():
    """Weights is frozen: fast.fused_weights caches W_QKV^T on the instance, which is
    only safe because no matrix can be replaced under the cached copy (shapes-41)."""
    import dataclasses

    W = init_weights(seed=0)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_O"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(W, name, getattr(W, name))


def test_weights_compare_and_hash_by_identity():
    """eq=False: == is identity and Weights is hashable; a field-wise __eq__ over ndarrays
    would raise (ambiguous truth value) and make the class unhashable (shapes-42)."""
    W, W2 = init_weights(seed=0), init_weights(seed=0)  # the same numbers, two objects
    assert W == W and W != W2 and not (W == W2)
    assert {W: 1}[W] == 1 and W2 not in {W: 1}
    assert W2 not in [W] and W in [W2, W]
    assert len({W, W2}) == 2


@pytest.mark.parametrize("change, message", [
    ({"W_K": np.zeros((0, 5, 7)), "W_V": np.zeros((0, 5, 11))},
     r"Weights need positive sizes, got heads=2, kv_heads=0, d_model=5, d_k=7, d_v=11"),
    ({"W_Q": np.zeros((0, 5, 7)), "W_K": np.zeros((0, 5, 7)), "W_V": np.zeros((0, 5, 11)),
      "W_O": np.zeros((0, 5))},
     r"Weights need positive sizes, got heads=0, kv_heads=0, d_model=5, d_k=7, d_v=11"),
])
def test_weights_refuse_zero_heads_with_a_value_error(change, message):
    """Zero (key/value) heads: the documented ValueError, not a ZeroDivisionError from
    h % h_kv (shapes-53)."""
    with pytest.raises(ValueError, match=message):
        Weights(**(_parts() | change))
