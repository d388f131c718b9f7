"""FlashAttention's tiled forward and backward (chapter 20) against the plain ones."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_lit import attention, flash, grad, masks

TOL = 1e-12  # float64: two orders of summation of the same real numbers


def _qkv(rng, lead, n, d_k, d_v):
    Q = rng.standard_normal(lead + (n, d_k))  # (.., n, d_k)
    K = rng.standard_normal(lead + (n, d_k))  # (.., n, d_k)
    V = rng.standard_normal(lead + (n, d_v))  # (.., n, d_v)
    dH = rng.standard_normal(lead + (n, d_v))  # (.., n, d_v)
    return Q, K, V, dH


# n not a multiple of the blocks, blocks of one row, blocks longer than n
CASES = [(3, 1, 1), (3, 2, 2), (17, 5, 7), (23, 7, 5), (31, 64, 64),
         (37, 8, 37), (41, 41, 3), (64, 16, 16)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n, block_rows, block_keys", CASES)
def test_tiled_passes_equal_the_plain_ones(n, block_rows, block_keys, causal):
    rng = np.random.default_rng(n * block_rows + block_keys)
    Q, K, V, dH = _qkv(rng, (2,), n, 7, 11)  # two heads of the book's widths
    H, lse = flash.flash_forward(Q, K, V, causal, block_rows=block_rows,
                                 block_keys=block_keys)
    assert H.shape == (2, n, 11) and lse.shape == (2, n)
    mask = masks.causal(n) if causal else None
    assert np.allclose(H, attention(Q, K, V, mask), rtol=0, atol=TOL)
    # lambda_t = log sum_u exp(Z_tu) over the keys row t sees
    Z = np.where(mask if causal else True, Q @ K.swapaxes(-1, -2) / np.sqrt(7),
                 -np.inf)  # (2, n, n)
    assert np.allclose(lse, np.log(np.exp(Z).sum(axis=-1)), rtol=0, atol=TOL)
    tiled = flash.flash_backward(Q, K, V, H, dH, lse, causal,
                                 block_rows=block_rows, block_keys=block_keys)
    plain = grad.attention_backward(Q, K, V, dH, causal)
    for name, a, b in zip(("dQ", "dK", "dV"), tiled, plain, strict=True):
        assert a.shape == b.shape, name
        assert np.allclose(a, b, rtol=0, atol=TOL), name


@given(n=st.integers(1, 40), b=st.integers(1, 12), c=st.integers(1, 12),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_any_block_sizes_give_the_plain_backward(n, b, c, causal, seed):
    rng = np.random.default_rng(seed)
    Q, K, V, dH = _qkv(rng, (), n, 3, 5)  # one head, no stack
    H, lse = flash.flash_forward(Q, K, V, causal, block_rows=b, block_keys=c)
    tiled = flash.flash_backward(Q, K, V, H, dH, lse, causal, block_rows=b,
                                 block_keys=c)
    for a, p in zip(tiled, grad.attention_backward(Q, K, V, dH, causal),
                    strict=True):
        assert np.allclose(a, p, rtol=0, atol=1e-11)


def test_a_stack_of_sequences_and_heads_and_a_given_scale():
    rng = np.random.default_rng(5)
    Q, K, V, dH = _qkv(rng, (3, 2), 13, 5, 2)  # (B, h, n, d)
    H, lse = flash.flash_forward(Q, K, V, scale=0.3, block_rows=4,
                                 block_keys=3)
    tiled = flash.flash_backward(Q, K, V, H, dH, lse, scale=0.3,
                                 block_rows=4, block_keys=3)
    plain = grad.attention_backward(Q, K, V, dH, scale=0.3)
    for a, p in zip(tiled, plain, strict=True):
        assert a.shape == p.shape and np.allclose(a, p, rtol=0, atol=TOL)
    # each sequence and head on its own gives the same rows
    H_11, _ = flash.flash_forward(Q[1, 1], K[1, 1], V[1, 1], scale=0.3)
    assert np.allclose(H_11, H[1, 1], rtol=0, atol=TOL)


def test_masked_keys_get_no_gradient_from_later_queries():
    rng = np.random.default_rng(11)
    Q, K, V, _ = _qkv(rng, (), 9, 3, 5)
    dH = np.zeros((9, 5))
    dH[4] = rng.standard_normal(5)  # only query 4's output (0-based) counts
    H, lse = flash.flash_forward(Q, K, V, block_rows=2, block_keys=3)
    dQ, dK, dV = flash.flash_backward(Q, K, V, H, dH, lse, block_rows=2,
                                      block_keys=3)
    # keys after position 4 are hidden from query 4: exactly 0 gradient
    assert np.all(dK[5:] == 0.0) and np.all(dV[5:] == 0.0)
    assert np.all(dQ[np.arange(9) != 4] == 0.0)


def test_float32_inputs_compute_in_float32():
    rng = np.random.default_rng(2)
    Q, K, V, dH = (a.astype(np.float32) for a in _qkv(rng, (2,), 50, 16, 16))
    H, lse = flash.flash_forward(Q, K, V, block_rows=16, block_keys=16)
    assert H.dtype == lse.dtype == np.float32
    dQ, dK, dV = flash.flash_backward(Q, K, V, H, dH, lse, block_rows=16,
                                      block_keys=16)
    assert dQ.dtype == dK.dtype == dV.dtype == np.float32
    plain = grad.attention_backward(*(a.astype(np.float64)
                                      for a in (Q, K, V, dH)))
    for a, p in zip((dQ, dK, dV), plain, strict=True):
        assert np.allclose(a, p, rtol=1e-4, atol=1e-4)


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_linearly_not_as_n_squared():
    """Doubling n: the tiled backward's peak about doubles, the plain one's
    quadruples with its n x n arrays (d_k = 16, float64)."""
    rng = np.random.default_rng(0)
    tiled, plain = {}, {}
    for n in (1024, 2048):
        Q, K, V, dH = _qkv(rng, (), n, 16, 16)
        H, lse = flash.flash_forward(Q, K, V)
        tiled[n] = _peak(lambda: flash.flash_backward(Q, K, V, H, dH, lse))
        plain[n] = _peak(lambda: grad.attention_backward(Q, K, V, dH))
        # the tiled peak: the three gradients and a few blocks, no n x n
        assert tiled[n] < 3 * Q.nbytes + 64 * flash.BLOCK_KEYS * n
        assert plain[n] > 2 * n * n * 8  # at least two n x n float64 arrays
    assert tiled[2048] < 2.3 * tiled[1024]
    assert plain[2048] > 3.5 * plain[1024]


def test_bad_shapes_are_refused_with_the_shapes_named():
    rng = np.random.default_rng(1)
    Q, K, V, dH = _qkv(rng, (2,), 5, 3, 4)
    with pytest.raises(ValueError, match=r"Q \(2, 5, 3\), K \(2, 6, 3\)"):
        flash.flash_forward(Q, np.zeros((2, 6, 3)), V)
    with pytest.raises(ValueError, match=r"V \(2, 5\) do not fit"):
        flash.flash_forward(Q, K, np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"V \(3, 5, 4\)"):
        flash.flash_forward(Q, K, np.zeros((3, 5, 4)))
    H, lse = flash.flash_forward(Q, K, V)
    with pytest.raises(ValueError, match=r"dO \(2, 5, 3\).*\(2, 5, 4\)"):
        flash.flash_backward(Q, K, V, H, dH[..., :3], lse)
    with pytest.raises(ValueError, match=r"lse \(2, 4\).*\(2, 5\)"):
        flash.flash_backward(Q, K, V, H, dH, lse[:, :4])
    with pytest.raises(ValueError, match="block_rows must be a positive"):
        flash.flash_forward(Q, K, V, block_rows=0)
    with pytest.raises(TypeError, match="block_keys must be a positive"):
        flash.flash_backward(Q, K, V, H, dH, lse, block_keys=2.0)
    with pytest.raises(ValueError, match="at least one token"):
        flash.flash_forward(*(np.zeros((0, 3)) for _ in range(3)))
