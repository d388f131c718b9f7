"""Quantized keys and values: the E4M3 grid exactly, errors within the derived bounds."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mha_lit import (
    Dims,
    counting,
    init_weights,
    masks,
    models,
    multi_head_attention,
)
from mha_lit import quantized as q
from mha_lit.attention import attention

SLACK = 1 + 1e-12  # the bounds are exact arithmetic's; float64 rounds A / scale


def _e4m3_by_hand(code: int):
    """The number of an E4M3 code, from the format's definition, as a Fraction (None: NaN)."""
    sign, exponent, mantissa = code >> 7, (code >> 3) & 0b1111, code & 0b111
    if exponent == 0b1111 and mantissa == 0b111:
        return None
    if exponent == 0:  # subnormal: 0.mmm x 2^(1 - bias)
        value = Fraction(mantissa, 8) * Fraction(1, 2**6)
    else:  # 1.mmm x 2^(e - bias), bias 7
        value = (1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7)
    return -value if sign else value


# --- the E4M3 grid ------------------------------------------------------------------------


def test_all_256_codes_are_the_formats_numbers():
    values = q.e4m3_values()
    by_hand = [_e4m3_by_hand(c) for c in range(256)]
    assert [c for c, v in enumerate(by_hand) if v is None] == [0x7F, 0xFF]
    assert np.isnan(values[[0x7F, 0xFF]]).all() and not np.isinf(values).any()
    for c, v in enumerate(by_hand):
        if v is not None:
            assert Fraction(values[c]) == v, c  # exact, as a binary fraction
    finite = values[~np.isnan(values)]
    assert finite.max() == q.E4M3_MAX == 448 == 1.75 * 2**8
    assert finite.min() == -448
    positive = np.sort(finite[finite > 0])
    assert len(positive) == 126 and len(np.unique(positive)) == 126
    assert positive[0] == 2.0**-9 and positive[7] == 2.0**-6  # subnormal, then normal
    assert np.signbit(values[0x80]) and values[0x80] == 0  # -0


def test_every_code_round_trips():
    codes = np.arange(256, dtype=np.uint8)
    values = q.e4m3_decode(codes)
    finite = ~np.isnan(values)
    assert np.array_equal(q.e4m3_encode(values[finite]), codes[finite])
    assert np.array_equal(q.round_to_e4m3(values[finite]), values[finite])


def test_midpoints_round_to_the_even_mantissa():
    grid = q.e4m3_values()[:127]  # 0 .. 448, increasing
    mid = (grid[:-1] + grid[1:]) / 2  # exact in float64
    codes = q.e4m3_encode(mid)
    lower = np.arange(126)
    assert np.array_equal(codes, np.where(lower % 2 == 0, lower, lower + 1))
    assert q.round_to_e4m3(464.0) == 448  # the midpoint to the NaN code rounds down
    with pytest.raises(ValueError, match="rounds beyond E4M3's largest number 448"):
        q.round_to_e4m3(np.array([1.0, 464.5]))


@given(arrays(np.float32, (40,), elements=st.floats(-460, 460, width=32)))
def test_rounding_is_to_the_nearest_grid_number(x):
    grid = q.e4m3_values()
    grid = grid[~np.isnan(grid)]
    r = q.round_to_e4m3(x)
    distance = np.abs(grid[None, :] - x.astype(np.float64)[:, None]).min(axis=1)
    assert np.array_equal(np.abs(r - x), distance)
    assert np.isin(r, grid).all()


# --- quantize, dequantize -------------------------------------------------------------------


@pytest.mark.parametrize("kind", q.KINDS)
@pytest.mark.parametrize("scales, shape", [("token", (3, 4, 1)), ("channel", (3, 1, 7))])
def test_codes_and_scales_have_the_documented_shapes(kind, scales, shape):
    A = np.random.default_rng(0).standard_normal((3, 4, 7))
    codes, scale = q.quantize(A, kind, scales)
    assert codes.shape == A.shape and scale.shape == shape and scale.dtype == np.float32
    assert codes.dtype == (np.int8 if kind == "int8" else np.uint8)
    top = np.abs(q.dequantize(codes, scale)).max(axis=q._AXIS[scales])
    assert np.allclose(top, np.abs(A).max(axis=q._AXIS[scales]), rtol=1e-6, atol=0)
    if kind == "int8":  # the largest entry gets the largest code
        assert np.abs(codes).max(axis=q._AXIS[scales]).min() == 127


def test_a_row_of_zeros_has_scale_zero_and_comes_back_zero():
    A = np.zeros((2, 5))
    A[1] = [1, -2, 0, 3, 0.5]
    for kind in q.KINDS:
        codes, scale = q.quantize(A, kind, "token")
        assert scale[0, 0] == 0 and not q.dequantize(codes, scale)[0].any()


def test_dequantize_is_exact_in_float64():
    """code x scale has at most 8 + 24 significant bits: the float64 product is exact."""
    A = np.random.default_rng(1).standard_normal((6, 9))
    for kind in q.KINDS:
        codes, scale = q.quantize(A, kind, "token")
        values = q.dequantize(codes, scale)
        codes_as = codes if kind == "int8" else q.e4m3_decode(codes)
        for (i, j), v in np.ndenumerate(values):
            assert Fraction(v) == Fraction(float(codes_as[i, j])) * Fraction(float(scale[i, 0]))


def test_bytes_per_value_is_what_the_arrays_take():
    A = np.random.default_rng(2).standard_normal((37, 64))
    for scales in q.SCALES:
        codes, scale = q.quantize(A, "int8", scales)
        assert Fraction(codes.nbytes + scale.nbytes, codes.size) == q.bytes_per_value(
            37, 64, scales)
    assert q.bytes_per_value(37, 64, "token") == Fraction(64 + 4, 64)
    assert q.bytes_per_value(37, 64, "channel") == Fraction(37 + 4, 37)


def test_bad_input_is_refused_by_name():
    A = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"kind must be one of \('int8', 'e4m3'\), got 'int4'"):
        q.quantize(A, "int4")
    with pytest.raises(ValueError, match="scales must be one of .* got 'row'"):
        q.quantize(A, "int8", "row")
    with pytest.raises(ValueError, match="A must be a matrix"):
        q.quantize(np.ones(3))
    with pytest.raises(ValueError, match="too large for a float32 scale"):
        q.quantize(np.full((2, 3), 1e300))
    with pytest.raises(TypeError, match="codes must be int8 .* got int16"):
        q.dequantize(np.ones((2, 3), np.int16), np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match=r"scale \(3, 1\) does not fit codes \(2, 3\)"):
        q.dequantize(np.ones((2, 3), np.int8), np.ones((3, 1), np.float32))
    with pytest.raises(TypeError, match="E4M3 codes are bytes"):
        q.e4m3_decode(np.ones(3, np.int8))


# --- the bounds ---------------------------------------------------------------------------

finite = st.floats(-1e6, 1e6)  # tiny entries too: their scale is float32's smallest


@pytest.mark.parametrize("kind", q.KINDS)
@pytest.mark.parametrize("scales", q.SCALES)
@given(A=arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 9)), elements=finite))
def test_the_element_error_is_within_its_bound(kind, scales, A):
    err = np.abs(A - q.dequantize(*q.quantize(A, kind, scales)))
    assert (err <= q.error_bound(A, kind, scales) * SLACK).all()


def test_the_int8_bound_is_reached_at_midpoints():
    """Entries halfway between two codes are off by exactly half a step: the bound is tight."""
    steps = np.arange(-126, 127) + 0.5  # k + 1/2 steps, and 127 for the scale
    A = np.append(steps, 127.0)[None, :] / 128  # one row; its scale 1/128, exact in float32
    err = np.abs(A - q.dequantize(*q.quantize(A, "int8", "token")))
    bound = q.error_bound(A, "int8", "token")
    # exact: multiples of 2^-8 in float64
    assert np.array_equal(err[0, :-1], bound[0, :-1]) and bound[0, 0] == 2.0**-8
    assert err[0, -1] == 0


def test_the_e4m3_bound_is_reached_in_every_binade():
    """x = 2^e (1 + 1/16) lies halfway between 2^e and 2^e (1 + 1/8): off by 2^(e-4)."""
    x = np.exp2(np.arange(-6, 8.0)) * (1 + 1 / 16)
    A = np.append(x, 448.0)[None, :]  # the scale is exactly 1
    back = q.dequantize(*q.quantize(A, "e4m3", "token"))
    assert np.array_equal(np.abs(A - back)[0, :-1], np.exp2(np.arange(-6, 8.0) - 4))
    assert (np.abs(A - back) <= q.error_bound(A, "e4m3", "token")).all()


def test_an_outlier_channel_widens_int8_per_token_errors_far_more_than_e4m3s():
    """Keys with one large channel: per-token scales grow with it, per-channel ones do not.
    int8's step is the scale, so every other entry loses; E4M3's error is relative to the
    entry itself (2^-4 |a|) while a / scale stays normal, so it hardly changes."""
    K = np.random.default_rng(3).standard_normal((64, 32))
    K[:, 5] *= 50  # an outlier channel
    others = np.arange(32) != 5
    worst = {(kind, scales): np.abs(K - q.dequantize(*q.quantize(K, kind, scales)))[
        :, others].max() for kind in q.KINDS for scales in q.SCALES}
    assert worst["int8", "token"] > 20 * worst["int8", "channel"]
    assert worst["e4m3", "token"] < 2 * worst["e4m3", "channel"]


def _attention_case(rng, n, m, d_k, d_v, spread):
    Q = spread * rng.standard_normal((2, n, d_k))
    K = rng.standard_normal((2, m, d_k))
    V = rng.standard_normal((2, m, d_v))
    return Q, K, V


@pytest.mark.parametrize("kind", q.KINDS)
@pytest.mark.parametrize("key_scales, value_scales", [("token", "token"), ("channel", "token"),
                                                      ("channel", "channel")])
@given(seed=st.integers(0, 2**16), n=st.integers(1, 6), m=st.integers(1, 9),
       spread=st.sampled_from([0.1, 1.0, 8.0]), causal=st.booleans())
def test_scores_and_outputs_stay_within_their_bounds(kind, key_scales, value_scales, seed, n,
                                                     m, spread, causal):
    rng = np.random.default_rng(seed)
    m = max(m, n)  # the causal mask needs the n queries to be the last of m positions
    Q, K, V = _attention_case(rng, n, m, 7, 11, spread)
    mask = masks.causal(n, m) if causal else None
    K_q = q.dequantize(*q.quantize(K, kind, key_scales))
    Z, Z_q = (Q @ A.swapaxes(-1, -2) / np.sqrt(7) for A in (K, K_q))
    assert (np.abs(Z - Z_q) <= q.score_bound(Q, K, kind, key_scales) * SLACK).all()
    H = attention(Q, K, V, mask)
    H_q = q.quantized_attention(Q, K, V, mask, kind=kind, key_scales=key_scales,
                                value_scales=value_scales)
    bound = q.output_bound(Q, K, V, mask, kind=kind, key_scales=key_scales,
                           value_scales=value_scales)
    assert (np.abs(H - H_q) <= bound * SLACK + 1e-13).all()


def test_adversarial_scores_stay_within_the_bound():
    """Queries aligned with the quantization errors push every score as far as it goes."""
    rng = np.random.default_rng(4)
    # every entry halfway between two codes (steps of 1/32), and one entry 127 steps
    K = (rng.integers(-126, 126, (1, 12, 16)) + 0.5) / 32
    K[..., 0] = 127 / 32
    V = rng.standard_normal((1, 12, 5))
    E = K - q.dequantize(*q.quantize(K, "int8", "token"))  # the errors themselves
    Q = 40 * np.sign(E[:, :1])  # (1, 1, 16): q . (k - k~) = 40 |k - k~|_1 for key 1
    bound = q.score_bound(Q, K, "int8", "token")
    moved = np.abs(Q @ E.swapaxes(-1, -2)) / 4
    assert (moved <= bound * SLACK).all()
    # reached: 15 entries off by half a step, all pushing one way (exact: binary fractions)
    assert moved[0, 0, 0] == bound[0, 0, 0] == 40 * 15 / 64 / 4
    H, H_q = attention(Q, K, V), q.quantized_attention(Q, K, V, key_scales="token")
    assert (np.abs(H - H_q) <= q.output_bound(Q, K, V, key_scales="token") * SLACK).all()


def test_quantized_attention_is_the_kernel_on_dequantized_rows():
    rng = np.random.default_rng(5)
    Q, K, V = _attention_case(rng, 3, 3, 7, 11, 1.0)
    K_q = q.dequantize(*q.quantize(K, "e4m3", "channel"))
    V_q = q.dequantize(*q.quantize(V, "e4m3", "token"))
    mask = masks.causal(3)
    assert np.array_equal(q.quantized_attention(Q, K, V, mask, kind="e4m3"),
                          attention(Q, K_q, V_q, mask))


@pytest.mark.parametrize("dims, biases", [
    (Dims(), False), (Dims(d_model=11, d_k=6, d_v=5, heads=6, kv_heads=2), True)])
@pytest.mark.parametrize("kind", q.KINDS)
def test_a_quantized_layer_is_within_the_bound_carried_through_W_O(dims, biases, kind):
    W = init_weights(dims, seed=6, biases=biases)
    X = np.random.default_rng(6).standard_normal((9, dims.d_model))
    Y, Y_q = multi_head_attention(X, W), q.multi_head_attention_quantized(X, W, kind=kind)
    assert Y_q.shape == Y.shape and not np.allclose(Y, Y_q, rtol=0, atol=1e-12)
    from mha_lit import fast

    Q_T, K_T, V_T = fast.project_heads(X, W)  # Q already scaled
    g = dims.heads // dims.kv_heads
    K, V = (np.repeat(A.transpose(0, 2, 1), g, axis=0) for A in (K_T, V_T))
    bound_H = q.output_bound(Q_T.transpose(0, 2, 1), K, V, masks.causal(9), kind=kind,
                             scale=1.0)  # (h, n, d_v)
    bound_Y = bound_H.transpose(1, 0, 2).reshape(9, -1) @ np.abs(W.W_O)
    assert (np.abs(Y - Y_q) <= bound_Y * SLACK + 1e-13).all()
    layer = q.layer_bound(X, W, kind=kind)
    assert np.allclose(layer, bound_Y, rtol=1e-12, atol=0)


# --- the bytes ----------------------------------------------------------------------------


def test_cache_bytes_by_hand():
    llama3 = models.MODELS["llama3-8b"].config
    deepseek = models.MODELS["deepseek-v3"].config
    mistral = models.MODELS["mistral-7b"].config
    # per token: 2 L h_kv d_k one-byte numbers and 2 L h_kv float32 scales
    assert q.quantized_cache_bytes(llama3) == 2 * 32 * 8 * 128 + 2 * 32 * 8 * 4
    assert q.quantized_cache_bytes(deepseek) == 61 * (512 + 64) + 2 * 61 * 4
    assert q.quantized_cache_bytes(mistral, 10**6) == q.quantized_cache_bytes(mistral, 4096)
    for cfg in (llama3, deepseek, mistral):  # 2 bytes and no scales: chapter 18's count
        assert q.quantized_cache_bytes(cfg, 1000, 2, 0) == counting.kv_cache_bytes(cfg, 1000)
        memory = 16 * 141 * 10**9
        assert (q.sequences_that_fit_quantized(cfg, memory, value_bytes=2, scale_bytes=0)
                == counting.sequences_that_fit(cfg, memory))
        assert (q.sequences_that_fit_quantized(cfg, memory)
                > 1.9 * counting.sequences_that_fit(cfg, memory))


def test_weights_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="the weights take 1,342.1 GB at 2 bytes"):
        q.sequences_that_fit_quantized(models.MODELS["deepseek-v3"].config, 141e9)
