"""Quantized keys and values: int8 and fp8 (E4M3) numbers with scales.

Book: Part III, chapter 18, "A quantized cache".

A cache can hold each key and value entry in one byte instead of two: an
8-bit code and, for a whole row or a whole column of a head's K or V, one
*scale* (a float32). The number a code stands for is the code's own
number (the integer itself for int8, the E4M3 number its byte encodes)
times the scale.

- int8, symmetric: codes -127 .. 127, scale = max |entries| / 127, and a
  code is the entry over the scale rounded to the nearest integer.
- fp8 E4M3 (Micikevicius et al. 2022, "FP8 Formats for Deep Learning"):
  1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, subnormals, no
  infinities, NaN only at S.1111.111, largest number 448. The scale is
  max |entries| / 448 and the code the entry over the scale rounded to
  the nearest E4M3 number, ties to an even mantissa. NumPy has no E4M3
  type: ``round_to_e4m3`` rounds float64 numbers onto E4M3's grid
  exactly, and a code is the byte of that number.

Scales are per token (one per row of a head's K or V, over its d
columns) or per channel (one per column, over the n rows). Dequantized
numbers are computed in float64, where that product is exact: a code's
number has at most 8 significant bits, a float32 scale 24.

Letters in shape comments: n rows (tokens), d columns (channels) of one
head's K (d = d_k) or V (d = d_v), m keys, h heads, h_kv key/value
heads.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from . import checks, counting, fast, masks
from .attention import attention
from .models import ModelSizes, check_config
from .shapes import Weights

__all__ = ["KINDS", "SCALES", "INT8_MAX", "E4M3_MAX", "e4m3_values",
           "round_to_e4m3", "e4m3_encode", "e4m3_decode", "quantize",
           "dequantize", "bytes_per_value", "error_bound", "score_bound",
           "output_bound", "quantized_attention",
           "multi_head_attention_quantized", "layer_bound",
           "quantized_cache_bytes",
           "sequences_that_fit_quantized"]

KINDS = ("int8", "e4m3")
SCALES = ("token", "channel")
INT8_MAX = 127  # the largest int8 code used: -127 .. 127, symmetric
E4M3_MAX = 448.0  # S.1111.110 = 1.75 x 2^8
_QMAX = {"int8": INT8_MAX, "e4m3": E4M3_MAX}
_AXIS = {"token": -1, "channel": -2}  # the axis one scale runs over
_F32 = np.finfo(np.float32)


# --- fp8 E4M3, exactly ------------------------------------------------------


def e4m3_values() -> np.ndarray:
    """The number each of the 256 E4M3 codes stands for, (256,) float64.

    Book: chapter 18. Code c has sign bit c >> 7, exponent bits
    e = (c >> 3) & 15 and mantissa bits m = c & 7: (1 + m/8) 2^(e - 7)
    when e > 0, the subnormal (m/8) 2^-6 when e = 0, NaN for e = 15 and
    m = 7; negative when the sign bit is set (code 128 is -0).
    """
    c = np.arange(256)  # (256,)
    e, m = (c >> 3) & 15, (c & 7).astype(np.float64)  # (256,) each
    value = np.where(e > 0, (1 + m / 8) * np.exp2(e - 7.0),
                     m / 8 * 2.0**-6)  # (256,): exact powers of two
    value[(e == 15) & (m == 7)] = np.nan
    return np.where(c >> 7 == 1, -value, value)  # (256,)


_E4M3 = e4m3_values()  # the table, made once
_E4M3_POSITIVE = _E4M3[:127]  # codes 0 .. 126: 0 up to 448, increasing


def round_to_e4m3(x) -> np.ndarray:
    """x rounded to the nearest E4M3 number, ties to even, as float64.

    Book: chapter 18. A positive x in [2^(e-1), 2^e) with e - 1 >= -6
    (a normal number) lies between E4M3 numbers 2^(e-4) apart; below
    2^-6 (subnormals) they are 2^-9 apart. x / spacing is exact (a power
    of two), ``np.rint`` rounds it to the nearest integer, ties to even,
    and an even integer is an even mantissa. Magnitudes that round
    beyond 448 (above 464) are refused: E4M3 has no infinity.
    """
    x = checks.float_array(x, "x").astype(np.float64)
    mag = np.abs(x)
    _, e = np.frexp(mag)  # mag = f 2^e, f in [0.5, 1)
    spacing = np.exp2(np.maximum(e - 4, -9).astype(np.float64))
    r = np.rint(mag / spacing) * spacing  # exact: powers of two
    if (r > E4M3_MAX).any():
        worst = float(mag[r > E4M3_MAX].max())
        raise ValueError(f"{worst!r} rounds beyond E4M3's largest number "
                         f"{E4M3_MAX:g}; scale the values first")
    return np.copysign(r, x)  # the sign of x, -0 included


def e4m3_encode(x) -> np.ndarray:
    """The E4M3 codes (uint8) of x, rounded as ``round_to_e4m3`` rounds.

    Book: chapter 18. The codes 0 .. 126 are the numbers 0 .. 448 in
    increasing order, so a magnitude's code is its rank among them; the
    sign bit is 128.
    """
    r = round_to_e4m3(x)
    code = np.searchsorted(_E4M3_POSITIVE, np.abs(r))  # exact matches
    return (code + 128 * np.signbit(r)).astype(np.uint8)


def e4m3_decode(codes) -> np.ndarray:
    """The numbers (float64) that E4M3 codes (uint8) stand for.

    Book: chapter 18, "A quantized cache". A lookup in ``e4m3_values``.
    """
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"E4M3 codes are bytes (uint8), got {codes.dtype}")
    return _E4M3[codes]


# --- quantize and dequantize ----------------------------------------------


def _kind_and_axis(kind: str, scales: str) -> int:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if scales not in SCALES:
        raise ValueError(f"scales must be one of {SCALES}, got {scales!r}")
    return _AXIS[scales]


def quantize(A, kind: str = "int8", scales: str = "token"):
    """(codes, scale): A (.., n, d) as 8-bit codes and float32 scales.

    Book: chapter 18, "A quantized cache". ``scales`` "token": one scale
    per row, (.., n, 1); "channel": one per column, (.., 1, d). The scale
    is the largest |entry| it covers over 127 (int8) or 448 (E4M3), so the
    largest entry gets the largest code; a row or column of zeros gets
    scale 0 and codes 0. Codes are int8 for "int8", E4M3 bytes (uint8) for
    "e4m3". A scale is a float32 number; one below float32's smallest
    normal number (about 1.2e-38) is raised to it.
    """
    axis = _kind_and_axis(kind, scales)
    A = checks.float_array(A, "A").astype(np.float64)
    checks.matrix_shape(A, "A")
    qmax = _QMAX[kind]
    top = np.abs(A).max(axis=axis, keepdims=True)  # (.., n, 1) or (.., 1, d)
    if (top / qmax > float(_F32.max)).any():
        raise ValueError(f"A holds {float(top.max())!r}, too large for a "
                         f"float32 scale (at most {float(_F32.max):.4g})")
    # float32, and for a row (column) that is not all 0, at least float32's
    # smallest normal number: an entry then needs a code of at most qmax
    scale = np.where(top > 0, np.maximum((top / qmax).astype(np.float32),
                                         _F32.tiny), np.float32(0))
    x = np.divide(A, scale, out=np.zeros_like(A),
                  where=scale > 0)  # (.., n, d): entries in code units
    if kind == "int8":  # |x| <= 127 up to the rounding of the scale
        return np.rint(x).clip(-INT8_MAX, INT8_MAX).astype(np.int8), scale
    return e4m3_encode(x), scale


def dequantize(codes, scale) -> np.ndarray:
    """The numbers the codes stand for, (.., n, d) float64.

    Book: chapter 18. Each code's own number times its scale: an int8
    code is the integer itself; a uint8 code is an E4M3 byte, which
    stands for the E4M3 number it encodes (byte 0x7E: 448, not 126).
    Exact in float64: a code's number has at most 8 significant bits and a
    float32 scale 24, so their product has at most 32.
    """
    codes, scale = np.asarray(codes), np.asarray(scale)
    if codes.dtype == np.int8:
        values = codes.astype(np.float64)
    elif codes.dtype == np.uint8:
        values = e4m3_decode(codes)
    else:
        raise TypeError(f"codes must be int8 (for int8) or uint8 (E4M3 "
                        f"bytes), got {codes.dtype}")
    try:
        return values * scale.astype(np.float64)  # (.., n, d)
    except ValueError:
        raise ValueError(f"scale {scale.shape} does not fit codes "
                         f"{codes.shape}: one per row (.., n, 1) or per "
                         "column (.., 1, d)") from None


def bytes_per_value(n: int, d: int, scales: str = "token",
                    scale_bytes: int = 4) -> Fraction:
    """Bytes per cached number of an n x d block: 1 + its scales' share.

    Book: chapter 18. n d one-byte codes and n (per token) or d (per
    channel) scales of ``scale_bytes`` each (float32: 4), over n d.
    """
    n, d = checks.positive_int(n, "n"), checks.positive_int(d, "d")
    _kind_and_axis("int8", scales)
    count = n if scales == "token" else d
    return Fraction(n * d + count * scale_bytes, n * d)


# --- how large the error can be ---------------------------------------------


def error_bound(A, kind: str = "int8", scales: str = "token") -> np.ndarray:
    """A bound (.., n, d) on |A - dequantize(*quantize(A))|, entry by entry.

    Book: chapter 18, equation (eq-quant-element). int8: half a step,
    scale / 2. E4M3: 2^-4 |a| where a / scale is a normal number (half a
    step of a 3-bit mantissa, relative to the number), 2^-10 scale among
    the subnormals (half their step 2^-9); the larger of the two covers
    both. The bound is exact arithmetic's; computed in float64, the
    error may pass it by float64 rounding (a relative 1e-15).
    """
    A = checks.float_array(A, "A").astype(np.float64)
    _, scale = quantize(A, kind, scales)
    s = scale.astype(np.float64)  # (.., n, 1) or (.., 1, d)
    if kind == "int8":
        return np.broadcast_to(s / 2, A.shape).copy()  # (.., n, d)
    return np.maximum(2.0**-4 * np.abs(A), 2.0**-10 * s)  # (.., n, d)


def score_bound(Q, K, kind: str = "int8", scales: str = "token",
                scale: float | None = None) -> np.ndarray:
    """A bound (.., n, m) on how much quantizing K moves each score.

    Book: chapter 18, equation (eq-quant-score). Z_tu = scale q_t . k_u,
    so |Z_tu - Z~_tu| <= scale sum_i |q_ti| |k_ui - k~_ui|, with each
    |k_ui - k~_ui| bounded by ``error_bound``; ``scale`` is 1/sqrt(d_k)
    if None, as in ``attention``.
    """
    Q = checks.float_array(Q, "Q").astype(np.float64)
    E = error_bound(K, kind, scales)  # (.., m, d_k)
    scale = 1 / np.sqrt(Q.shape[-1]) if scale is None else scale
    return scale * np.abs(Q) @ np.swapaxes(E, -1, -2)  # (.., n, m)


def output_bound(Q, K, V, mask=None, *, kind: str = "int8",
                 key_scales: str = "channel", value_scales: str = "token",
                 scale: float | None = None) -> np.ndarray:
    """A bound (.., n, d_v) on how much quantizing K and V moves H.

    Book: chapter 18, equation (eq-quant-output). If no score of query t
    moves by more than delta_t (the largest ``score_bound`` over the keys
    it sees), each weight changes by a factor between exp(-2 delta_t) and
    exp(2 delta_t), so |S~ - S| sums to at most exp(2 delta_t) - 1; then
    |H~_tc - H_tc| <= (exp(2 delta_t) - 1) max_u |V_uc|
    + max_u |V_uc - V~_uc|, the maxima over all keys.
    """
    Z = score_bound(Q, K, kind, key_scales, scale)  # (.., n, m)
    if mask is not None:  # hidden keys have weight 0 either way
        Z = np.where(np.asarray(mask), Z, 0.0)
    delta = Z.max(axis=-1, keepdims=True)  # (.., n, 1)
    V = checks.float_array(V, "V").astype(np.float64)
    V_top = np.abs(V).max(axis=-2, keepdims=True)  # (.., 1, d_v)
    V_err = error_bound(V, kind, value_scales).max(axis=-2, keepdims=True)
    return np.expm1(2 * delta) * V_top + V_err  # (.., n, d_v)


# --- attention on quantized keys and values ----------------------------------


def quantized_attention(Q, K, V, mask=None, *, kind: str = "int8",
                        key_scales: str = "channel",
                        value_scales: str = "token",
                        scale: float | None = None) -> np.ndarray:
    """H from keys and values that went through the quantized cache.

    Book: chapter 18. K and V are quantized and dequantized
    (``key_scales`` per channel and ``value_scales`` per token by default,
    the layout of KIVI, Liu et al. 2024, which itself quantizes to 2 bits,
    and to 4 in some of its experiments, with a scale and a zero point per
    small group), then chapter 3's
    kernel ``attention`` computes H (.., n, d_v) from them, in float64.
    """
    K_q = dequantize(*quantize(K, kind, key_scales))  # (.., m, d_k)
    V_q = dequantize(*quantize(V, kind, value_scales))  # (.., m, d_v)
    Q = checks.float_array(Q, "Q").astype(np.float64)
    return attention(Q, K_q, V_q, mask, scale=scale)  # (.., n, d_v)


def multi_head_attention_quantized(X, W: Weights, causal: bool = True, *,
                                   kind: str = "int8",
                                   key_scales: str = "channel",
                                   value_scales: str = "token"
                                   ) -> np.ndarray:
    """Y (n, d_model) of a layer whose cached K and V are quantized.

    Book: chapter 18. X (n, d_model) is projected as the fast path
    projects it (``fast.project_heads``, the scale folded into Q); each
    key/value head's K (n, d_k) and V (n, d_v) are quantized and
    dequantized, a scale per channel taken over all n rows at once (the
    whole sequence, as after a prefill); each K/V head's query heads
    attend through the kernel (chapter 14's grouping); Concat W_O.
    Computed in float64.
    """
    X = checks.input_rows(X, W)
    if X.ndim != 2:
        raise ValueError(f"X must be (n, d_model), got shape {X.shape}")
    X = X.astype(np.float64)
    Q_T, K_T, V_T = fast.project_heads(X, W)  # (h, d_k, n), (h_kv, .., n)
    K = dequantize(*quantize(K_T.transpose(0, 2, 1), kind, key_scales))
    V = dequantize(*quantize(V_T.transpose(0, 2, 1), kind, value_scales))
    at = np.arange(len(X))  # (n,): positions
    Qg, at_g = fast.group_queries(Q_T.transpose(0, 2, 1), at, W.kv_heads)
    mask = masks.visible(at_g, at) if causal else None  # (n*g, n)
    H = fast.ungroup(attention(Qg, K, V, mask, scale=1.0),
                     W.heads)  # (h, n, d_v)
    concat = H.transpose(1, 0, 2).reshape(len(X), -1)  # (n, h*d_v)
    return fast.output_projection(concat, W)  # (n, d_model)


def layer_bound(X, W: Weights, causal: bool = True, *, kind: str = "int8",
                key_scales: str = "channel",
                value_scales: str = "token") -> np.ndarray:
    """A bound (n, d_model) on |Y~ - Y| for ``multi_head_attention_quantized``.

    Book: chapter 18. ``output_bound`` for every head, on the rows the
    layer projects (each query head with its K/V head), then through W_O:
    |Y~_c - Y_c| <= sum_r |Concat~_r - Concat_r| |(W_O)_rc|.
    """
    X = checks.input_rows(X, W).astype(np.float64)
    Q_T, K_T, V_T = fast.project_heads(X, W)  # (h, d_k, n), (h_kv, .., n)
    K, V = (np.repeat(A.transpose(0, 2, 1), W.group, axis=0)
            for A in (K_T, V_T))  # (h, n, d): query head i's K/V head
    mask = masks.causal(len(X)) if causal else None  # (n, n)
    H = output_bound(Q_T.transpose(0, 2, 1), K, V, mask, kind=kind,
                     key_scales=key_scales, value_scales=value_scales,
                     scale=1.0)  # (h, n, d_v): Q is already scaled
    concat = H.transpose(1, 0, 2).reshape(len(X), -1)  # (n, h*d_v)
    return concat @ np.abs(W.W_O)  # (n, d_model)


# --- what it saves: chapter 18's counts with 8-bit caches ------------------


def quantized_cache_bytes(cfg: ModelSizes, tokens: int = 1,
                          value_bytes: int = 1,
                          scale_bytes: int = 4) -> int:
    """Bytes of one sequence's cache with 8-bit numbers and token scales.

    Book: chapter 18, "A quantized cache". Per token and layer, each of
    the 2 h_kv cached rows (a key and a value per key/value head; with
    MLA the latent and the rotary key, 2 rows) holds its numbers at
    ``value_bytes`` and one scale of ``scale_bytes``; for the tokens the
    cache holds (``counting.tokens_held``).
    """
    c = check_config(cfg, ModelSizes, "quantized_cache_bytes")
    n = checks.positive_int(tokens, "tokens")
    b = checks.positive_int(value_bytes, "value_bytes")
    s = checks.whole_number(scale_bytes, "scale_bytes")
    rows = 2 * c.layers * (1 if c.attention_kind == "MLA" else c.kv_heads)
    per_token = counting.kv_values_per_token(c) * b + rows * s
    return per_token * counting.tokens_held(c, n)


def sequences_that_fit_quantized(cfg: ModelSizes, memory: float,
                                 tokens: int | None = None,
                                 value_bytes: int = 1,
                                 scale_bytes: int = 4,
                                 weight_bytes: int = 2) -> int:
    """Full sequences whose 8-bit caches fit in memory beside the weights.

    Book: chapter 18. ``counting.sequences_that_fit`` with the weights at
    ``weight_bytes`` per parameter (bf16: 2) and each sequence's cache
    counted by ``quantized_cache_bytes``. An upper bound, as there.
    """
    c = check_config(cfg, ModelSizes, "sequences_that_fit_quantized")
    n = c.context_length if tokens is None else tokens
    weights = counting.param_count(c) * checks.positive_int(
        weight_bytes, "weight_bytes")
    if not weights < memory:
        raise ValueError(
            f"the weights take {weights / 1e9:,.1f} GB at {weight_bytes} "
            f"bytes per parameter, more than the {memory / 1e9:,.1f} GB "
            "of memory")
    per_sequence = quantized_cache_bytes(c, n, value_bytes, scale_bytes)
    return int((memory - weights) // per_sequence)
