import numpy as np
import pytest

from mha_lit import Dims, KVCache, init_weights, multi_head_attention
from tests.shapes_for_tests import PRIME_DIMS


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_steps_equal_full_recomputation(dims):
    W = init_weights(dims, seed=7)
    X = np.random.default_rng(8).standard_normal((dims.tokens + 20, dims.d_model))
    cache = KVCache(W, capacity=1)  # forces several buffer doublings
    Y_steps = np.stack([cache.step(x) for x in X])
    assert np.allclose(Y_steps, multi_head_attention(X, W), atol=1e-12)
    assert len(cache) == len(X)
    assert cache.keys.shape == (dims.heads, len(X), dims.d_k)
    assert cache.values.shape == (dims.heads, len(X), dims.d_v)


def test_cached_keys_and_values_are_the_rows_of_K_and_V():
    W = init_weights(seed=0)
    X = np.random.default_rng(0).standard_normal((4, 5))
    cache = KVCache(W)
    cache.extend(X)
    for i in range(W.heads):
        assert np.allclose(cache.keys[i], X @ W.W_K[i])
        assert np.allclose(cache.values[i], X @ W.W_V[i])
    with pytest.raises(ValueError):
        cache.keys[0, 0, 0] = 1.0  # read-only


def test_extend_equals_steps_and_appending_keeps_earlier_outputs():
    W = init_weights(seed=1)
    X = np.random.default_rng(1).standard_normal((4, 5))
    cache = KVCache(W)
    first = cache.extend(X[:3])
    y4 = cache.step(X[3])
    assert np.allclose(first, multi_head_attention(X[:3], W))
    assert np.allclose(y4, multi_head_attention(X, W)[3])
    assert cache.extend(np.empty((0, 5))).shape == (0, 5)


def test_float32_cache():
    W = init_weights(seed=2, dtype=np.float32)
    X = np.random.default_rng(2).standard_normal((6, 5)).astype(np.float32)
    cache = KVCache(W)
    Y = cache.extend(X)
    assert Y.dtype == np.float32 and cache.keys.dtype == np.float32
    assert np.allclose(Y, multi_head_attention(X, W), atol=1e-5)


@pytest.mark.parametrize(
    "x, error, message",
    [
        (np.ones(4), ValueError, r"shape \(d_model,\) = \(5,\), got shape \(4,\)"),
        (np.ones((1, 5)), ValueError, r"got shape \(1, 5\)"),
        (np.array([1.0, np.nan, 0, 0, 0]), ValueError, r"x of shape \(5,\) holds 1 NaN"),
        (np.array([1.0, np.inf, 0, 0, 0]), ValueError, r"holds 1 NaN or infinite"),
        (np.array(list("abcde")), TypeError, r"x must hold real numbers"),
    ],
)
def test_refused_step_leaves_the_cache_unchanged(x, error, message):
    W = init_weights(seed=3)
    X = np.random.default_rng(3).standard_normal((3, 5))
    cache = KVCache(W, capacity=3)  # full: a bad step must not even grow the buffers
    cache.extend(X)
    keys, values = cache.keys.copy(), cache.values.copy()
    with pytest.raises(error, match=message):
        cache.step(x)
    assert len(cache) == 3
    assert np.array_equal(cache.keys, keys) and np.array_equal(cache.values, values)
    x4 = np.random.default_rng(4).standard_normal(5)
    assert np.allclose(cache.step(x4), multi_head_attention(np.vstack([X, x4]), W)[3])


def test_extend_refuses_a_bad_block_whole():
    cache = KVCache(init_weights(seed=4))
    X = np.ones((3, 5))
    X[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"X of shape \(3, 5\) holds 1 NaN"):
        cache.extend(X)
    assert len(cache) == 0
    with pytest.raises(ValueError, match=r"d_model = 5\), got shape \(3, 4\)"):
        cache.extend(np.ones((3, 4)))


def test_cache_refuses_bad_construction():
    with pytest.raises(TypeError, match="KVCache needs mha_lit.Weights"):
        KVCache(Dims())
    with pytest.raises(ValueError, match="capacity"):
        KVCache(init_weights(), capacity=0)


def test_step_reads_the_cache_instead_of_recomputing_the_prefix():
    """The cache keeps no input rows, so a step cannot recompute the prefix: it must use the
    cached keys and values, and changing a cached value changes the next output."""
    W = init_weights(seed=5)
    rng = np.random.default_rng(5)
    X = rng.standard_normal((50, 5))
    x = rng.standard_normal(5)
    honest, tampered = KVCache(W), KVCache(W)
    honest.extend(X)
    tampered.extend(X)
    held = [a for a in vars(tampered).values() if isinstance(a, np.ndarray)]
    assert all(a.shape[-1] in (W.d_k, W.d_v) and a.shape[0] == W.heads for a in held)
    tampered._V[:, 0] += 1.0  # corrupt the cached value row of token 1 in every head
    assert not np.allclose(tampered.step(x), honest.step(x))
    assert np.allclose(honest.step(x), multi_head_attention(np.vstack([X, x, x]), W)[-1])
