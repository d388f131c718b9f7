"""Tests of mha_lit.checks: what each door check accepts and refuses."""

import numpy as np
import pytest

import mha_lit
from mha_lit import checks


def test_checks_are_not_exported():
    assert "checks" not in mha_lit.__all__
    assert not set(checks.__all__) & set(mha_lit.__all__)


# positive_int

@pytest.mark.parametrize("value", [1, 3, 97, np.int64(5), np.int8(2),
                                   np.uint16(11)])
def test_positive_int_accepts_python_and_numpy_integers(value):
    out = checks.positive_int(value, "heads")
    assert out == value
    assert type(out) is int


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 2.0, 3.5,
                                   "3", None, np.float64(2.0)])
def test_positive_int_refuses_other_types(value):
    with pytest.raises(TypeError, match="d_k must be a positive integer"):
        checks.positive_int(value, "d_k")


@pytest.mark.parametrize("value", [0, -1, np.int64(-7)])
def test_positive_int_refuses_zero_and_negatives(value):
    with pytest.raises(ValueError,
                       match=f"tokens must be a positive integer, got {value}"):
        checks.positive_int(value, "tokens")


# float_array

def test_float_array_turns_integers_into_float64():
    out = checks.float_array([[1, 2], [3, 4]], "X")
    assert out.dtype == np.float64
    assert np.array_equal(out, [[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_array_keeps_float_dtypes(dtype):
    a = np.ones((3, 5), dtype=dtype)
    out = checks.float_array(a, "X", ndim=2)
    assert out.dtype == dtype
    assert out is a


def test_float_array_keeps_ndarray_subclasses():
    class Recorded(np.ndarray):
        pass

    a = np.zeros((2, 3)).view(Recorded)
    assert isinstance(checks.float_array(a, "X"), Recorded)


@pytest.mark.parametrize("a", [np.ones(3, dtype=bool), np.ones(3) + 1j,
                               np.array(["a", "b"]),
                               np.array([1, None], dtype=object)])
def test_float_array_refuses_non_real_numbers(a):
    with pytest.raises(TypeError, match="W_Q must hold real numbers"):
        checks.float_array(a, "W_Q")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_float_array_refuses_nan_and_inf(bad):
    a = np.ones((3, 5))
    a[1, 2] = bad
    with pytest.raises(ValueError, match=r"X of shape \(3, 5\) holds 1 NaN"):
        checks.float_array(a, "X")


def test_float_array_refuses_wrong_ndim():
    with pytest.raises(ValueError, match=r"W_O must be 2-D, got shape \(3,\)"):
        checks.float_array(np.ones(3), "W_O", ndim=2)


# token_rows

def test_token_rows_accepts_rows_of_d_model():
    X = checks.token_rows(np.ones((3, 5), dtype=int), 5)
    assert X.shape == (3, 5)
    assert X.dtype == np.float64
    assert checks.token_rows(np.ones((2, 3, 5)), 5, ndims=(2, 3)).ndim == 3


def test_token_rows_names_both_widths():
    with pytest.raises(ValueError, match=r"X has 4 columns but W_Q expects "
                       r"d_model = 5 \(X is \(3, 4\)\)"):
        checks.token_rows(np.ones((3, 4)), 5, against="W_Q")
    with pytest.raises(ValueError, match=r"X has 4 columns but W_Q expects "
                       r"d_model = 5 \(X is \(3, 4\), W_Q is \(2, 5, 7\)\)"):
        checks.token_rows(np.ones((3, 4)), 5, against="W_Q",
                          also="W_Q is (2, 5, 7)")


@pytest.mark.parametrize("shape", [(5,), (2, 3, 5)])
def test_token_rows_refuses_other_ndims(shape):
    with pytest.raises(ValueError, match=r"Z must be 2-D \(n tokens, "
                       r"d_model = 5\), got shape"):
        checks.token_rows(np.ones(shape), 5, "Z")


@pytest.mark.parametrize("shape", [(0, 5), (2, 0, 5)])
def test_token_rows_refuses_no_rows(shape):
    with pytest.raises(ValueError, match="X has no rows"):
        checks.token_rows(np.ones(shape), 5, ndims=(2, 3))


def test_token_rows_refuses_no_sequences():
    with pytest.raises(ValueError, match="X holds no sequences"):
        checks.token_rows(np.ones((0, 3, 5)), 5, ndims=(2, 3))


def test_token_rows_names_both_ndims():
    with pytest.raises(ValueError, match=r"X must be 2-D \(n tokens, d_model "
                       r"= 5\) or 3-D \(B sequences, n tokens, d_model = 5\)"):
        checks.token_rows(np.ones(5), 5, ndims=(2, 3))


def test_token_rows_refuses_what_float_array_refuses():
    with pytest.raises(TypeError, match="X must hold real numbers"):
        checks.token_rows(np.ones((3, 5), dtype=bool), 5)


# key_mask

def test_key_mask_none_stays_none():
    assert checks.key_mask(None, (2, 3)) is None


def test_key_mask_accepts_booleans_of_the_shape():
    mask = checks.key_mask([[True, False, True], [True, True, True]], (2, 3))
    assert mask.dtype == np.bool_
    assert mask.shape == (2, 3)


def test_key_mask_refuses_non_booleans():
    with pytest.raises(TypeError, match="key_mask must be boolean"):
        checks.key_mask(np.ones((2, 3)), (2, 3))


def test_key_mask_names_both_shapes():
    with pytest.raises(ValueError, match=r"key_mask has shape \(3,\) but "
                       r"needs one entry per token of X \(2, 3, 5\), shape "
                       r"\(2, 3\)"):
        checks.key_mask(np.ones(3, dtype=bool), (2, 3), of="X (2, 3, 5)")


def test_key_mask_refuses_ragged_rows():
    with pytest.raises(ValueError, match="mask must be an array of shape "
                       r"\(2, 3\).*different lengths"):
        checks.key_mask([[True, False, True], [True]], (2, 3), "mask")


# token_ids

@pytest.mark.parametrize("ids", [[0, 12, 3], np.array([4, 4], np.int8),
                                 np.zeros(0, dtype=int)])
def test_token_ids_accepts_integers_in_range(ids):
    t = checks.token_ids(ids, 13)
    assert np.array_equal(t, ids)


@pytest.mark.parametrize("ids", [[1.0, 2.0], [True, False], ["a"]])
def test_token_ids_refuses_non_integers(ids):
    with pytest.raises(TypeError, match="token_ids must be integer"):
        checks.token_ids(ids, 13, "token_ids")


def test_token_ids_names_the_smallest_and_largest_id():
    with pytest.raises(ValueError, match=r"tokens must lie in 0 \.\. 12 "
                       r"\(vocab_size = 13\), got ids -2 \.\. 40"):
        checks.token_ids([3, 40, -2, 14], 13)
    with pytest.raises(ValueError, match=r"got id 13$"):
        checks.token_ids(np.int64(13), 13)


def test_token_ids_refuses_wrong_ndim():
    with pytest.raises(ValueError, match=r"tokens must be 1-D, got shape "
                       r"\(1, 2\)"):
        checks.token_ids([[1, 2]], 13, ndim=1)


@pytest.mark.parametrize("V", [0, 2.0, True])
def test_token_ids_checks_vocab_size(V):
    with pytest.raises((TypeError, ValueError), match="vocab_size"):
        checks.token_ids([0], V)


# groups

@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 3), (5, 1), (7, 7)])
def test_groups_accepts_divisors(heads, kv_heads):
    assert checks.groups(heads, kv_heads) is None


def test_groups_refuses_a_non_divisor():
    with pytest.raises(ValueError, match="6 query heads cannot be split "
                       "into 4 equal groups"):
        checks.groups(6, 4)


def test_groups_names_the_arguments_and_where_they_come_from():
    with pytest.raises(ValueError, match=r"8 query heads cannot be split "
                       r"into 3 equal groups \(W_Q \(8, 5, 7\)\): "
                       r"n_kv_heads must divide n_heads \(got n_heads = 8, "
                       r"n_kv_heads = 3\)"):
        checks.groups(8, 3, names=("n_heads", "n_kv_heads"), of="W_Q (8, 5, 7)")
