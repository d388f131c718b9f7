import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import mha_lit
from mha_lit import (
    BlockWeights,
    Dims,
    attention,
    feed_forward,
    gelu,
    gpt_block,
    init_block_weights,
    init_weights,
    layer_norm,
    multi_head_attention,
    residual,
)
from tests.shapes_for_tests import PRIME_DIMS

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
D_FFS = [13, 17, 19, 23, 29, 31]  # a prime d_ff distinct from each PRIME_DIMS entry
CONFIGS = list(zip(PRIME_DIMS, D_FFS))


def _X(dims: Dims, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((dims.tokens, dims.d_model))  # (n, d)


# --- layer norm ---------------------------------------------------------------------------

@given(arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(2, 9)), elements=finite))
def test_layer_norm_rows_have_mean_0_and_variance_1_before_gain_and_bias(X):
    d = X.shape[1]
    X = X + np.arange(d)  # rows never constant, so the variance is not swamped by eps
    Z = layer_norm(X, np.ones(d), np.zeros(d))
    var = X.var(axis=1, keepdims=True)
    assert Z.shape == X.shape
    assert np.allclose(Z.mean(axis=1), 0.0, atol=1e-9)
    assert np.allclose(Z.var(axis=1), (var / (var + 1e-5)).ravel(), atol=1e-9)


def test_layer_norm_applies_gain_and_bias_per_column():
    X = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, -3.0, 0.5, 7.0, 1.0]])  # (2, 5)
    gamma, beta = np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([0.5, 0.0, -1.0, 2.0, 0.0])
    X_hat = layer_norm(X, np.ones(5), np.zeros(5))
    assert np.allclose(layer_norm(X, gamma, beta), gamma * X_hat + beta)
    # the first row by hand: mean 3, population variance 2
    assert np.allclose(X_hat[0], (X[0] - 3.0) / math.sqrt(2.0 + 1e-5))


def test_layer_norm_works_on_each_row_alone():
    X = _X(Dims(tokens=7, d_model=11))
    Z = layer_norm(X, np.ones(11), np.zeros(11))
    for i in range(7):
        alone = layer_norm(X[i : i + 1], np.ones(11), np.zeros(11))[0]
        assert np.allclose(Z[i], alone, rtol=0, atol=1e-12)  # other shapes: to rounding


def test_layer_norm_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"X is \(3, 5\) so gamma and beta must be \(5,\)"):
        layer_norm(np.ones((3, 5)), np.ones(7), np.zeros(5))
    with pytest.raises(ValueError, match="eps must be positive"):
        layer_norm(np.ones((3, 5)), np.ones(5), np.zeros(5), eps=0.0)
    with pytest.raises(ValueError, match="2-D"):
        layer_norm(np.ones(5), np.ones(5), np.zeros(5))


# --- GELU ---------------------------------------------------------------------------------

def test_gelu_exact_against_known_values():
    # GELU(x) = x * Phi(x); Phi(1) = 0.841344746..., Phi(2) = 0.977249868...
    x = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    expected = [-2 * (1 - 0.9772498680518208), -(1 - 0.8413447460685429), 0.0,
                0.8413447460685429, 2 * 0.9772498680518208]
    assert np.allclose(gelu(x, approximate=False), expected, atol=1e-15)


def test_gelu_tanh_approximation_against_its_formula_and_the_exact_curve():
    x = np.linspace(-6, 6, 241)
    by_hand = [0.5 * t * (1 + math.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t**3)))
               for t in x]
    assert np.allclose(gelu(x), by_hand, atol=1e-15)
    assert np.abs(gelu(x) - gelu(x, approximate=False)).max() < 1e-3
    assert gelu(np.array([1.0]))[0] == pytest.approx(0.8411919906082768, abs=1e-15)


def test_gelu_keeps_shape_and_float32():
    x = np.ones((3, 13), np.float32)
    assert gelu(x).shape == (3, 13) and gelu(x).dtype == np.float32
    assert gelu(x, approximate=False).dtype == np.float32
    assert gelu(0.5, approximate=False).shape == ()


# --- feed-forward network -----------------------------------------------------------------

@pytest.mark.parametrize("dims, d_ff", CONFIGS)
def test_feed_forward_shapes_and_formula(dims, d_ff):
    B = init_block_weights(dims, d_ff=d_ff, seed=3)
    X = _X(dims)
    hidden = gelu(X @ B.W_1 + B.b_1)
    assert hidden.shape == (dims.tokens, d_ff)
    out = feed_forward(X, B.W_1, B.b_1, B.W_2, B.b_2)
    assert out.shape == (dims.tokens, dims.d_model)
    assert np.allclose(out, hidden @ B.W_2 + B.b_2)


def test_feed_forward_errors_name_the_shapes():
    B = init_block_weights(d_ff=13)
    with pytest.raises(ValueError, match=r"X has 7 columns but W_1 is \(5, 13\)"):
        feed_forward(np.ones((3, 7)), B.W_1, B.b_1, B.W_2, B.b_2)
    with pytest.raises(ValueError, match=r"b_1, W_2, b_2 must be \(13,\), \(13, 5\), \(5,\)"):
        feed_forward(np.ones((3, 5)), B.W_1, B.b_1, B.W_2.T, B.b_2)


# --- residual -----------------------------------------------------------------------------

def test_residual_adds_the_input_and_checks_the_shape():
    X = _X(Dims())
    assert np.array_equal(residual(X, lambda x: 2 * x), 3 * X)
    with pytest.raises(ValueError, match=r"X is \(3, 5\) and sublayer\(X\) is \(3, 7\)"):
        residual(X, lambda x: np.ones((3, 7)))


# --- BlockWeights -------------------------------------------------------------------------

@pytest.mark.parametrize("dims, d_ff", CONFIGS)
def test_init_block_weights_shapes_and_attention_weights(dims, d_ff):
    B = init_block_weights(dims, d_ff=d_ff, seed=5)
    d = dims.d_model
    assert (B.d_model, B.d_ff) == (d, d_ff)
    assert B.W_1.shape == (d, d_ff) and B.b_1.shape == (d_ff,)
    assert B.W_2.shape == (d_ff, d) and B.b_2.shape == (d,)
    assert all(getattr(B, n).shape == (d,) for n in ("gamma_1", "beta_1", "gamma_2", "beta_2"))
    assert np.array_equal(B.attn.W_O, init_weights(dims, seed=5).W_O)
    assert not B.W_1.flags.writeable
    again = init_block_weights(dims, d_ff=d_ff, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(B.arrays().values(), again.arrays().values()))


def test_block_weights_arrays_count_the_parameters():
    B = init_block_weights(Dims(), d_ff=13)
    n_params = sum(a.size for a in B.arrays().values())
    attention = 2 * 5 * (7 + 7 + 11) + 22 * 5
    assert n_params == attention + (5 * 13 + 13) + (13 * 5 + 5) + 4 * 5
    assert repr(B) == "BlockWeights(heads=2, d_model=5, d_k=7, d_v=11, d_ff=13)"


def test_block_weights_refuse_wrong_shapes_with_the_shapes_named():
    good = init_block_weights(Dims(), d_ff=13)
    fields = {n: getattr(good, n) for n in ("gamma_1", "beta_1", "attn", "gamma_2", "beta_2",
                                            "W_1", "b_1", "W_2", "b_2")}
    with pytest.raises(ValueError, match=r"W_2 has shape \(5, 13\) but must be \(13, 5\)"):
        BlockWeights(**{**fields, "W_2": good.W_2.T})
    with pytest.raises(ValueError, match=r"gamma_2 has shape \(7,\) but must be \(5,\)"):
        BlockWeights(**{**fields, "gamma_2": np.ones(7)})
    with pytest.raises(ValueError, match=r"b_1 has shape \(5,\) but must be \(13,\)"):
        BlockWeights(**{**fields, "b_1": np.ones(5)})
    with pytest.raises(TypeError, match="attn must be mha_lit.Weights"):
        BlockWeights(**{**fields, "attn": np.ones((22, 5))})
    with pytest.raises(ValueError, match="d_ff must be a positive integer"):
        init_block_weights(Dims(), d_ff=0)


# --- the block ----------------------------------------------------------------------------


def _block_by_its_equations(X, B, pre_ln, mha):
    """The block's equations written out: pre-LN or post-LN, with the attention given."""
    def ffn(x):
        return feed_forward(x, B.W_1, B.b_1, B.W_2, B.b_2)

    if pre_ln:
        mid = X + mha(layer_norm(X, B.gamma_1, B.beta_1))
        return mid + ffn(layer_norm(mid, B.gamma_2, B.beta_2))
    mid = layer_norm(X + mha(X), B.gamma_1, B.beta_1)
    return layer_norm(mid + ffn(mid), B.gamma_2, B.beta_2)


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("dims, d_ff", CONFIGS)
def test_gpt_block_matches_its_equations(dims, d_ff, pre_ln):
    B = init_block_weights(dims, d_ff=d_ff, seed=2)
    X = _X(dims)
    expected = _block_by_its_equations(
        X, B, pre_ln, lambda x: multi_head_attention(x, B.attn))
    Z = gpt_block(X, B, pre_ln=pre_ln)
    assert Z.shape == X.shape == (dims.tokens, dims.d_model)
    assert np.allclose(Z, expected, atol=1e-12)


def test_pre_ln_and_post_ln_differ_and_only_post_ln_ends_normalised():
    B = init_block_weights(Dims(), d_ff=13)
    X = 3.0 * _X(Dims())
    pre, post = gpt_block(X, B, pre_ln=True), gpt_block(X, B, pre_ln=False)
    assert not np.allclose(pre, post)
    post_hat = (post - B.beta_2) / B.gamma_2  # undo the last gain and bias
    assert np.allclose(post_hat.mean(axis=1), 0.0, atol=1e-12)
    assert np.allclose(post_hat.var(axis=1), 1.0, atol=1e-3)
    pre_hat = (pre - B.beta_2) / B.gamma_2
    assert not np.allclose(pre_hat.var(axis=1), 1.0, atol=1e-3)


@given(
    config=st.sampled_from(CONFIGS),
    seed=st.integers(0, 2**16),
    pre_ln=st.booleans(),
    data=st.data(),
)
def test_gpt_block_is_causal(config, seed, pre_ln, data):
    """Output row N depends only on input rows 1..N: change rows after N, rows up to N stay.

    To rounding: two runs are two computations (see
    test_changing_row_k_moves_no_earlier_output).
    """
    dims, d_ff = config
    B = init_block_weights(dims, d_ff=d_ff, seed=seed)
    X = data.draw(arrays(np.float64, (dims.tokens, dims.d_model), elements=finite), label="X")
    N = data.draw(st.integers(0, dims.tokens - 1), label="rows kept")
    later = data.draw(arrays(np.float64, (dims.tokens - N, dims.d_model), elements=finite),
                      label="new later rows")
    X2 = X.copy()
    X2[N:] = later
    # inputs up to 10, and layer norm's 1/sqrt(var + 1e-5) can amplify rounding ~300-fold
    assert np.allclose(gpt_block(X, B, pre_ln)[:N], gpt_block(X2, B, pre_ln)[:N], rtol=0, atol=1e-10)


def test_gpt_block_errors_name_the_shapes():
    B = init_block_weights(Dims(), d_ff=13)
    with pytest.raises(ValueError, match=r"X has 7 columns but the block expects d_model = 5"):
        gpt_block(np.ones((3, 7)), B)
    with pytest.raises(ValueError, match=r"W_1 is \(5, 13\)"):
        gpt_block(np.ones((3, 7)), B)
    with pytest.raises(TypeError, match="theta must be mha_lit.BlockWeights"):
        gpt_block(np.ones((3, 5)), init_weights())
    with pytest.raises(ValueError, match="NaN or infinite"):
        gpt_block(np.full((3, 5), np.nan), B)


# --- chapter 8: GPT-2's block, exactly --------------------------------------------------------

GPT2_SMALL = dict(d_model=768, heads=12, d_ff=3072)
GPT2_TOL = 1e-10  # float64; outputs are of order 1-10, different products differ by ~1e-13


def _gpt2_params(d_model, d_ff, seed):
    """Random arrays with the names and shapes of one block of GPT-2's checkpoint.

    Weights N(0, 0.05^2) (GPT-2 initialises with 0.02; larger here so that attention is far
    from uniform), biases N(0, 0.1^2), layer-norm gains 1 + N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    d, f = d_model, d_ff
    shapes = {"ln_1.g": (d,), "ln_1.b": (d,), "attn.c_attn.w": (d, 3 * d), "attn.c_attn.b": (3 * d,),
              "attn.c_proj.w": (d, d), "attn.c_proj.b": (d,), "ln_2.g": (d,), "ln_2.b": (d,),
              "mlp.c_fc.w": (d, f), "mlp.c_fc.b": (f,), "mlp.c_proj.w": (f, d), "mlp.c_proj.b": (d,)}
    p = {}
    for name, shape in shapes.items():
        scale = 0.05 if name.endswith(".w") else 0.1
        p[name] = scale * rng.standard_normal(shape)
    p["ln_1.g"] += 1.0
    p["ln_2.g"] += 1.0
    return p


def _gpt2_block_as_gpt2_computes_it(x, p, n_head):
    """GPT-2's block in plain NumPy, following the structure of its model.py: ln_1, c_attn,
    split heads by reshape and transpose, causal softmax scaled by 1/sqrt(d_head) (masked as
    GPT-2 masks: w * b - 1e10 * (1 - b)), merge heads, c_proj, residual; ln_2, c_fc, tanh GELU,
    c_proj, residual. Shares no code with mha_lit."""

    def norm(x, g, b, epsilon=1e-5):
        u = x.mean(axis=-1, keepdims=True)
        s = np.square(x - u).mean(axis=-1, keepdims=True)
        return (x - u) / np.sqrt(s + epsilon) * g + b

    def gelu_tanh(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * np.power(x, 3))))

    def conv1d(x, name):
        return x @ p[name + ".w"] + p[name + ".b"]

    def split_heads(t):  # (n, d) -> (h, n, d_head)
        return t.reshape(t.shape[0], n_head, -1).transpose(1, 0, 2)

    def merge_heads(t):  # (h, n, d_head) -> (n, d)
        return t.transpose(1, 0, 2).reshape(t.shape[1], -1)

    def attn(x):
        q, k, v = np.split(conv1d(x, "attn.c_attn"), 3, axis=-1)
        q, k, v = split_heads(q), split_heads(k), split_heads(v)
        w = q @ k.transpose(0, 2, 1) / np.sqrt(v.shape[-1])  # (h, n, n)
        nd = w.shape[-1]
        b = np.tril(np.ones((nd, nd)))  # attention_mask
        w = w * b - 1e10 * (1 - b)
        w = np.exp(w - w.max(axis=-1, keepdims=True))
        w = w / w.sum(axis=-1, keepdims=True)
        return conv1d(merge_heads(w @ v), "attn.c_proj")

    def mlp(x):
        return conv1d(gelu_tanh(conv1d(x, "mlp.c_fc")), "mlp.c_proj")

    x = x + attn(norm(x, p["ln_1.g"], p["ln_1.b"]))
    return x + mlp(norm(x, p["ln_2.g"], p["ln_2.b"]))


def _block_weights_from_gpt2(p, heads):
    attn = mha_lit.gpt2_attention_weights(p["attn.c_attn.w"], p["attn.c_attn.b"],
                                          p["attn.c_proj.w"], p["attn.c_proj.b"], heads)
    return BlockWeights(gamma_1=p["ln_1.g"], beta_1=p["ln_1.b"], attn=attn,
                        gamma_2=p["ln_2.g"], beta_2=p["ln_2.b"],
                        W_1=p["mlp.c_fc.w"], b_1=p["mlp.c_fc.b"],
                        W_2=p["mlp.c_proj.w"], b_2=p["mlp.c_proj.b"])


@pytest.mark.parametrize("tokens, seed", [(1, 0), (5, 1), (7, 2)])
def test_gpt_block_computes_gpt2_small_block(tokens, seed):
    p = _gpt2_params(GPT2_SMALL["d_model"], GPT2_SMALL["d_ff"], seed)
    B = _block_weights_from_gpt2(p, GPT2_SMALL["heads"])
    assert (B.attn.heads, B.attn.d_k, B.attn.d_v, B.d_ff) == (12, 64, 64, 3072)
    X = np.random.default_rng(seed + 100).standard_normal((tokens, 768))
    expected = _gpt2_block_as_gpt2_computes_it(X, p, n_head=12)
    Z = gpt_block(X, B, pre_ln=True)
    assert Z.shape == (tokens, 768)
    assert np.allclose(Z, expected, rtol=0, atol=GPT2_TOL)
    without_biases = mha_lit.Weights(**{n: getattr(B.attn, n) for n in ("W_Q", "W_K", "W_V", "W_O")})
    B0 = BlockWeights(**{**{n: getattr(B, n) for n in ("gamma_1", "beta_1", "gamma_2", "beta_2",
                                                       "W_1", "b_1", "W_2", "b_2")},
                         "attn": without_biases})
    assert not np.allclose(gpt_block(X, B0), expected, rtol=0, atol=1e-3)  # the biases matter


def test_gpt2_attention_weights_split_q_k_v_and_heads_by_columns():
    d, h = 12, 3  # d_head = 4
    c_attn_w = np.arange(d * 3 * d, dtype=float).reshape(d, 3 * d)
    c_attn_b = np.arange(3 * d, dtype=float) + 1000
    c_proj_w, c_proj_b = np.eye(d), np.arange(d, dtype=float)
    W = mha_lit.gpt2_attention_weights(c_attn_w, c_attn_b, c_proj_w, c_proj_b, h)
    assert (W.heads, W.d_model, W.d_k, W.d_v) == (3, 12, 4, 4)
    for i in range(h):
        for part, (W_s, b_s) in enumerate([(W.W_Q, W.b_Q), (W.W_K, W.b_K), (W.W_V, W.b_V)]):
            cols = slice(part * d + i * 4, part * d + (i + 1) * 4)
            assert np.array_equal(W_s[i], c_attn_w[:, cols])
            assert np.array_equal(b_s[i], c_attn_b[cols])
    assert np.array_equal(W.W_O, c_proj_w) and np.array_equal(W.b_O, c_proj_b)


def test_gpt2_attention_equals_its_fused_computation():
    """Attention of the mapped Weights = GPT-2's attention alone (c_attn, heads, c_proj)."""
    d, h, n = 15, 3, 7
    p = _gpt2_params(d, 4 * d, seed=5)
    W = mha_lit.gpt2_attention_weights(p["attn.c_attn.w"], p["attn.c_attn.b"],
                                       p["attn.c_proj.w"], p["attn.c_proj.b"], h)
    X = np.random.default_rng(5).standard_normal((n, d))
    q, k, v = np.split(X @ p["attn.c_attn.w"] + p["attn.c_attn.b"], 3, axis=1)
    heads = []
    for i in range(h):
        cols = slice(i * 5, (i + 1) * 5)
        heads.append(attention(q[:, cols], k[:, cols], v[:, cols], mha_lit.masks.causal(n)))
    expected = np.concatenate(heads, axis=1) @ p["attn.c_proj.w"] + p["attn.c_proj.b"]
    for f in (multi_head_attention, mha_lit.variants.reference):
        assert np.allclose(f(X, W), expected, rtol=0, atol=1e-12)


def test_gpt2_attention_weights_errors_name_the_shapes():
    d = 12
    good = dict(c_attn_w=np.zeros((d, 3 * d)), c_attn_b=np.zeros(3 * d),
                c_proj_w=np.zeros((d, d)), c_proj_b=np.zeros(d), heads=3)
    cases = [
        ({"c_attn_w": np.zeros((d, 2 * d))}, ValueError,
         r"c_attn_w has shape \(12, 24\) but must be \(d_model, 3 \* d_model\) = \(12, 36\)"),
        ({"heads": 5}, ValueError, r"d_model = 12 is not divisible by heads = 5"),
        ({"heads": 0}, ValueError, r"heads must be a positive integer, got 0"),
        ({"heads": 2.0}, TypeError, r"heads must be a positive integer, got 2.0"),
        ({"heads": True}, TypeError, r"heads must be a positive integer, got True"),
        ({"c_attn_b": np.zeros(d)}, ValueError,
         r"c_attn_b has shape \(12,\) but must be \(36,\): c_attn_w is \(12, 36\), so d_model = 12"),
        ({"c_proj_w": np.zeros((3 * d, d))}, ValueError, r"c_proj_w has shape \(36, 12\) but must be \(12, 12\)"),
        ({"c_proj_b": np.zeros(3 * d)}, ValueError, r"c_proj_b has shape \(36,\) but must be \(12,\)"),
        ({"c_attn_w": np.zeros(3 * d)}, ValueError, r"c_attn_w must be 2-D, got shape \(36,\)"),
    ]
    for change, error, message in cases:
        with pytest.raises(error, match=message):
            mha_lit.gpt2_attention_weights(**(good | change))


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("dims, d_ff", CONFIGS)
def test_block_weights_carry_attention_biases(dims, d_ff, pre_ln):
    B = init_block_weights(dims, d_ff=d_ff, seed=6)
    Bb = init_block_weights(dims, d_ff=d_ff, seed=6, attn_biases=True)
    assert not B.attn.has_biases and Bb.attn.has_biases
    extra = set(Bb.arrays()) - set(B.arrays())
    assert extra == {"b_Q", "b_K", "b_V", "b_O"}
    assert all(np.array_equal(B.arrays()[n], Bb.arrays()[n]) for n in B.arrays())
    X = _X(dims)

    expected = _block_by_its_equations(
        X, Bb, pre_ln, lambda x: mha_lit.variants.reference(x, Bb.attn))
    assert np.allclose(gpt_block(X, Bb, pre_ln=pre_ln), expected, rtol=0, atol=1e-12)


def test_init_block_weights_draws_the_documented_distributions():
    """Gains 1 + N(0, 0.1^2), biases N(0, 0.1^2), W_1 and W_2 N(0, 1/fan_in).

    d_ff is 13 times d_model, so a scale taken from the wrong fan-in fails clearly.
    """
    dims = Dims(tokens=3, d_model=31, d_k=7, d_v=11, heads=2)
    B = init_block_weights(dims, d_ff=401, seed=4)
    for name in ("gamma_1", "gamma_2"):
        gains = getattr(B, name)
        assert abs(gains.mean() - 1) < 0.06 and abs(gains.std() - 0.1) < 0.04, name
    for name in ("beta_1", "beta_2", "b_1", "b_2"):
        biases = getattr(B, name)
        assert abs(biases.mean()) < 0.06 and abs(biases.std() - 0.1) < 0.04, name
    for name, fan in (("W_1", 31), ("W_2", 401)):
        entries = getattr(B, name).ravel() * np.sqrt(fan)  # should be N(0, 1)
        assert abs(entries.mean()) < 0.05 and abs(entries.std() - 1) < 0.05, name


def test_transposed_ffn_is_made_once_read_only_and_c_contiguous():
    B = init_block_weights(Dims(), 13, seed=3)
    W_1T, W_2T = B.transposed_ffn
    assert B.transposed_ffn is B.transposed_ffn  # kept on the block
    assert np.array_equal(W_1T, B.W_1.T) and np.array_equal(W_2T, B.W_2.T)
    for a in (W_1T, W_2T):
        assert a.flags.c_contiguous and not a.flags.writeable


def test_exact_gelu_is_the_erf_formula_and_close_to_the_tanh_form():
    import math

    from mha_lit import gelu

    x = np.linspace(-6, 6, 1001)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    assert np.allclose(gelu(x, approximate=False), exact, rtol=0, atol=1e-15)
    assert np.max(np.abs(gelu(x) - exact)) < 1e-3  # the tanh form is an approximation
    x32 = x.astype(np.float32)
    assert gelu(x32).dtype == gelu(x32, approximate=False).dtype == np.float32


def test_gelu_of_a_scalar():
    from mha_lit import gelu

    for approximate in (True, False):
        y = gelu(1.0, approximate=approximate)
        assert np.shape(y) == () and abs(float(y) - 0.8413) < 1e-3
        assert gelu(np.float32(1), approximate=approximate).dtype == np.float32


# --- mutation-test gaps (shared/reviews/mutation.md): BlockWeights is frozen, == is identity --

def test_block_weights_are_frozen_and_compare_by_identity():
    """frozen=True, eq=False: transposed_ffn caches W_1^T, W_2^T on the block, and a
    field-wise __eq__ over ndarrays would raise and make BlockWeights unhashable (block-79)."""
    import dataclasses

    B, B2 = init_block_weights(Dims(), 13), init_block_weights(Dims(), 13)  # same numbers
    for name in ("attn", "W_1", "b_2", "gamma_1"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(B, name, getattr(B, name))
    assert B == B and B != B2 and not (B == B2)
    assert {B: 1}[B] == 1 and B2 not in {B: 1}
    assert B2 not in [B] and len({B, B2}) == 2


# --- chapter 8: dropout ---------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_the_mean_and_drops_a_fraction_p(p):
    """Kept entries are X / (1 - p), so the mean of X survives; the tolerance is 6 standard
    deviations of the sample mean (each entry of dropout(1) has variance p / (1 - p))."""
    n = 400_000
    X = np.full((n // 500, 500), 3.0)  # (800, 500), a constant input of mean 3
    Y = mha_lit.dropout(X, p, np.random.default_rng(7))
    assert Y.shape == X.shape and Y.dtype == X.dtype
    kept = Y != 0
    assert np.all(Y[kept] == 3.0 / (1 - p))  # the same division for every kept entry
    sd_mean = 3.0 * math.sqrt(p / (1 - p) / n)
    assert abs(Y.mean() - 3.0) < 6 * sd_mean
    assert abs((~kept).mean() - p) < 6 * math.sqrt(p * (1 - p) / n)


def test_dropout_with_p_0_is_the_identity_and_a_copy():
    X = _X(Dims())
    Y = mha_lit.dropout(X, 0.0, np.random.default_rng(0))
    assert np.array_equal(Y, X) and Y is not X  # nothing dropped: the very same numbers


def test_dropout_is_reproducible_from_the_generator_and_keeps_float32():
    X = np.ones((3, 17), np.float32)
    a = mha_lit.dropout(X, 0.25, np.random.default_rng(11))
    b = mha_lit.dropout(X, 0.25, np.random.default_rng(11))
    assert np.array_equal(a, b) and a.dtype == np.float32
    assert set(np.unique(a).tolist()) <= {0.0, np.float32(1 / 0.75)}


def test_dropout_refuses_a_bad_p_or_rng():
    X, rng = np.ones((3, 5)), np.random.default_rng(0)
    for p in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
            mha_lit.dropout(X, p, rng)
    for p in (True, "0.1", None):
        with pytest.raises(TypeError, match="p must be a number"):
            mha_lit.dropout(X, p, rng)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        mha_lit.dropout(X, 0.1, 0)
    with pytest.raises(ValueError, match="NaN or infinite"):
        mha_lit.dropout(np.array([1.0, np.inf]), 0.1, rng)
