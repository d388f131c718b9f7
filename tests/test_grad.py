"""The backward pass (mha_lit.grad) against central finite differences.

Every gradient is checked in float64 against (f(a + eps) - f(a - eps)) /
(2 eps), whose error is O(eps^2) from the third derivative plus the
rounding of f divided by eps; with eps = 1e-6 and losses of order 1 both
stay below 1e-7, far below the gradients' own size.
"""

import numpy as np
import pytest
from shapes_for_tests import PRIME_DIMS

from mha_lit import (
    BlockWeights,
    Dims,
    GPTWeights,
    Weights,
    attention,
    gpt_forward,
    grad,
    init_gpt_weights,
    init_weights,
    layer_norm,
    masks,
    trace,
    variants,
)
from mha_lit.block import feed_forward, gelu

EPS = 1e-6
TOL = 1e-7  # see the module docstring


def numeric_gradient(f, A, entries=None):
    """Central differences of the scalar f() in the entries of A (in place)."""
    g = np.zeros_like(A)
    for idx in (np.ndindex(A.shape) if entries is None else entries):
        old = A[idx]
        A[idx] = old + EPS
        up = f()
        A[idx] = old - EPS
        down = f()
        A[idx] = old
        g[idx] = (up - down) / (2 * EPS)
    return g


@pytest.mark.parametrize("dims", PRIME_DIMS[:5], ids=repr)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_backward_is_the_derivative(dims, causal):
    rng = np.random.default_rng(dims.tokens + 10 * causal)
    n, d_k, d_v = dims.tokens, dims.d_k, dims.d_v
    Q, K = rng.standard_normal((2, dims.heads, n, d_k))
    V, dY = rng.standard_normal((2, dims.heads, n, d_v))
    mask = masks.causal(n) if causal else None

    def loss():
        return float((attention(Q, K, V, mask) * dY).sum())

    dQ, dK, dV = grad.attention_backward(Q, K, V, dY, causal)
    for got, A in ((dQ, Q), (dK, K), (dV, V)):
        assert got.shape == A.shape
        assert np.allclose(got, numeric_gradient(loss, A), rtol=0, atol=TOL)


def test_attention_backward_scale_and_masked_keys():
    rng = np.random.default_rng(3)
    Q, K = rng.standard_normal((2, 4, 7))
    V, dY = rng.standard_normal((2, 4, 11))

    def loss():
        return float((attention(Q, K, V, masks.causal(4), scale=0.3)
                      * dY).sum())

    dQ, dK, dV = grad.attention_backward(Q, K, V, dY, scale=0.3)
    assert np.allclose(dQ, numeric_gradient(loss, Q), rtol=0, atol=TOL)
    # query 1 sees key 1 only: its weight is 1 whatever the scores, so
    # its query gets no gradient at all (exactly: S * (dS - dS) = 0)
    assert not dQ[0].any()
    # the last key is seen by the last query only: dV_4 = S_44 dY_4
    S = grad.softmax(np.where(masks.causal(4), 0.3 * Q @ K.T, -np.inf))
    assert np.allclose(dV[3], S[3, 3] * dY[3], rtol=0, atol=1e-15)


def test_attention_backward_refuses_bad_shapes():
    Q, K = np.zeros((3, 7)), np.zeros((3, 7))
    V, dY = np.zeros((3, 11)), np.zeros((3, 11))
    with pytest.raises(ValueError, match=r"dY \(3, 5\)"):
        grad.attention_backward(Q, K, V, np.zeros((3, 5)))
    with pytest.raises(ValueError, match=r"Q is \(3, 7\) and K is \(4, 7\)"):
        grad.attention_backward(Q, np.zeros((4, 7)), np.zeros((4, 11)), dY)
    with pytest.raises(ValueError, match=r"Q K\^T needs"):
        grad.attention_backward(Q, np.zeros((3, 5)), V, dY)
    with pytest.raises(ValueError, match="NaN"):
        grad.attention_backward(Q, K, V, np.full((3, 11), np.nan))


LAYERS = [(Dims(), False), (Dims(), True),
          (Dims(tokens=5, d_model=5, d_k=7, d_v=3, heads=6, kv_heads=2),
           True),
          (Dims(tokens=4, d_model=3, d_k=5, d_v=2, heads=3, kv_heads=1),
           False)]


@pytest.mark.parametrize("dims, biases", LAYERS, ids=repr)
@pytest.mark.parametrize("causal", [True, False])
def test_multi_head_attention_backward_is_the_derivative(dims, biases,
                                                         causal):
    W = init_weights(dims, seed=2, biases=biases)
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2, dims.tokens, dims.d_model))  # a batch of 2
    dY = rng.standard_normal(X.shape)
    arrays = {k: v.copy() for k, v in W.arrays().items()}

    def loss():
        return float((variants.reference(X, Weights(**arrays), causal)
                      * dY).sum())

    dX, dW = grad.multi_head_attention_backward(X, W, dY, causal)
    assert dX.shape == X.shape and isinstance(dW, Weights)
    assert np.allclose(dX, numeric_gradient(loss, X), rtol=0, atol=TOL)
    assert set(dW.arrays()) == set(W.arrays())  # None where W has none
    for name, A in arrays.items():
        got = getattr(dW, name)
        assert got.shape == A.shape, name
        assert np.allclose(got, numeric_gradient(loss, A), rtol=0,
                           atol=TOL), name
    # one sequence at a time gives the same gradients, summed
    one = [grad.multi_head_attention_backward(x, W, dy, causal)
           for x, dy in zip(X, dY, strict=True)]
    assert np.allclose(dX, np.stack([o[0] for o in one]), rtol=0, atol=1e-12)
    assert np.allclose(dW.W_Q, one[0][1].W_Q + one[1][1].W_Q, rtol=0,
                       atol=1e-12)


def test_multi_head_attention_backward_refuses_bad_input():
    W = init_weights()
    X = np.zeros((3, 5))
    with pytest.raises(ValueError, match=r"dY has shape \(3, 4\).*\(3, 5\)"):
        grad.multi_head_attention_backward(X, W, np.zeros((3, 4)))
    with pytest.raises(ValueError, match="W_Q"):
        grad.multi_head_attention_backward(np.zeros((3, 4)), W,
                                           np.zeros((3, 4)))
    with pytest.raises(TypeError, match="Weights"):
        grad.multi_head_attention_backward(X, "W", X)


def test_the_backward_of_a_layer_costs_two_products_per_forward_product():
    """5h + 1 forward products; 2 (5h + 1) + h backward (S recomputed)."""
    dims = Dims()
    W = init_weights(dims)
    rng = np.random.default_rng(0)
    X, dY = rng.standard_normal((2, 3, 5))
    with trace.record_matmuls() as log:  # one log: the cache is tracked
        Y, cache = grad._layer_forward(log.track(X[None]), W, True)
        forward = log.products
        grad._layer_backward(log.track(dY[None]), W, cache, True)
    h = dims.heads
    assert forward == 5 * h + 1
    assert log.products - forward == 2 * (5 * h + 1) + h


def test_layer_norm_gelu_ffn_and_cross_entropy_backward():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((3, 5))
    gamma, beta = rng.standard_normal((2, 5))
    dY = rng.standard_normal((3, 5))
    dX, dgamma, dbeta = grad.layer_norm_backward(X, gamma, dY)

    def ln():
        return float((layer_norm(X, gamma, beta) * dY).sum())

    for got, A in ((dX, X), (dgamma, gamma), (dbeta, beta)):
        assert np.allclose(got, numeric_gradient(ln, A), rtol=0, atol=TOL)

    x = rng.standard_normal((4, 17)) * 2
    dy = rng.standard_normal(x.shape)
    assert np.allclose(grad.gelu_backward(x, dy),
                       numeric_gradient(lambda: float((gelu(x) * dy).sum()),
                                        x), rtol=0, atol=TOL)

    W_1, W_2 = rng.standard_normal((5, 17)), rng.standard_normal((17, 5))
    b_1, b_2 = rng.standard_normal(17), rng.standard_normal(5)
    got = grad.feed_forward_backward(X, W_1, b_1, W_2, dY)

    def ffn():
        return float((feed_forward(X, W_1, b_1, W_2, b_2) * dY).sum())

    for g, A in zip(got, (X, W_1, b_1, W_2, b_2), strict=True):
        assert np.allclose(g, numeric_gradient(ffn, A), rtol=0, atol=TOL)

    logits = rng.standard_normal((6, 13))
    targets = rng.integers(0, 13, 6)
    loss, dlogits = grad.cross_entropy(logits, targets)
    assert np.allclose(dlogits, numeric_gradient(
        lambda: grad.cross_entropy(logits, targets)[0], logits), rtol=0,
        atol=TOL)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert np.isclose(loss, -np.log(p[np.arange(6), targets]).mean(),
                      rtol=1e-14)


def test_backward_helpers_refuse_bad_shapes():
    with pytest.raises(ValueError, match=r"gamma \(4,\)"):
        grad.layer_norm_backward(np.zeros((3, 5)), np.ones(4),
                                 np.zeros((3, 5)))
    with pytest.raises(ValueError, match=r"dY has shape \(2,\)"):
        grad.gelu_backward(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match=r"W_2 \(5, 17\)"):
        grad.feed_forward_backward(np.zeros((3, 5)), np.zeros((5, 17)),
                                   np.zeros(17), np.zeros((5, 17)),
                                   np.zeros((3, 5)))
    with pytest.raises(ValueError, match=r"one target per row"):
        grad.cross_entropy(np.zeros((3, 13)), np.zeros(2, int))
    with pytest.raises(ValueError, match=r"0 \.\. 12"):
        grad.cross_entropy(np.zeros((3, 13)), np.array([0, 1, 13]))


def gpt_arrays(G: GPTWeights) -> dict:
    """Every array of G by a name, as writable copies."""
    out = {"E": G.E.copy(), "P": G.P.copy(), "gamma_f": G.gamma_f.copy(),
           "beta_f": G.beta_f.copy()}
    for layer, block in enumerate(G.blocks):
        for name, a in block.arrays().items():
            out[f"{layer}.{name}"] = a.copy()
    return out


def gpt_from(arrays: dict, like: GPTWeights) -> GPTWeights:
    """The GPTWeights of ``arrays`` (names of ``gpt_arrays``)."""
    blocks = []
    for layer, block in enumerate(like.blocks):
        mine = {k.split(".", 1)[1]: v for k, v in arrays.items()
                if k.startswith(f"{layer}.")}
        attn = Weights(**{k: mine.pop(k) for k in block.attn.arrays()})
        blocks.append(BlockWeights(attn=attn, **mine))
    return GPTWeights(E=arrays["E"], P=arrays["P"], blocks=tuple(blocks),
                      gamma_f=arrays["gamma_f"], beta_f=arrays["beta_f"])


def gradient_of(dG: GPTWeights, name: str) -> np.ndarray:
    if "." not in name:
        return getattr(dG, name)
    layer, key = name.split(".", 1)
    return dG.blocks[int(layer)].arrays()[key]


@pytest.mark.parametrize("biases, batch", [(True, None), (False, 3)])
def test_loss_and_grads_is_the_derivative_of_every_array(biases, batch):
    dims = Dims(d_model=5, d_k=7, d_v=3, heads=2)
    G = init_gpt_weights(dims, layers=2, vocab_size=11, context_length=9,
                         d_ff=13, seed=4, attn_biases=biases)
    rng = np.random.default_rng(11)
    shape = (7,) if batch is None else (batch, 7)
    tokens, targets = rng.integers(0, 11, (2,) + shape)
    loss, dG = grad.loss_and_grads(G, tokens, targets)
    assert isinstance(dG, GPTWeights)
    assert np.isclose(loss, grad.gpt_loss(G, tokens, targets), rtol=1e-13)
    arrays = gpt_arrays(G)
    assert set(gpt_arrays(dG)) == set(arrays)

    def f():
        return grad.gpt_loss(gpt_from(arrays, G), tokens, targets)

    for name, A in arrays.items():
        got = gradient_of(dG, name)
        assert got.shape == A.shape, name
        flat = rng.choice(A.size, size=min(A.size, 4), replace=False)
        entries = [np.unravel_index(i, A.shape) for i in flat]
        want = numeric_gradient(f, A, entries)
        for idx in entries:
            assert abs(got[idx] - want[idx]) < TOL, (name, idx)
    # positions past the sequence get no gradient, exactly
    assert not dG.P[7:].any()


def test_loss_and_grads_agrees_with_gpt_forward_and_refuses_bad_ids():
    G = init_gpt_weights()
    tokens = np.array([1, 5, 2, 12])
    logits = gpt_forward(tokens, G)
    targets = np.array([5, 2, 12, 0])
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss, _ = grad.loss_and_grads(G, tokens, targets)
    assert np.isclose(loss, -log_p[np.arange(4), targets].mean(), rtol=1e-13)
    with pytest.raises(ValueError, match="same shape"):
        grad.loss_and_grads(G, tokens, targets[:3])
    with pytest.raises(ValueError, match=r"0 \.\. 12"):
        grad.loss_and_grads(G, tokens, np.array([5, 2, 13, 0]))
    with pytest.raises(ValueError, match="context length"):
        grad.loss_and_grads(G, np.zeros(20, int), np.zeros(20, int))
    with pytest.raises(TypeError, match="GPTWeights"):
        grad.loss_and_grads(G.blocks[0], tokens, targets)
