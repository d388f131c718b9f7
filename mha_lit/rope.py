"""Rotary position embeddings (RoPE): positions as rotations of Q and K.

Book: Part III, chapter 15 "Rotary positions".

A query or key row of even width d is read as d/2 points in a plane. The
point of plane i at position p is turned by the angle p * omega_i, where
omega_i = base^(-2i/d), i = 0 .. d/2 - 1 counted from 0 as Python counts
(Su et al. 2021 count from 1 and write theta_i = base^(-2(i-1)/d); the
book writes omega_j, j = i + 1, and keeps theta for a block's weights).
Because a rotation by an angle a and then by -b is a rotation by a - b,
the score of a query at position p_t and a key at position p_u depends on
p_t - p_u only.

Two conventions pair the coordinates differently:

* ``interleaved=True``: adjacent pairs (x_0, x_1), (x_2, x_3), ... as
  RoFormer writes it (Su et al. 2021) and LLaMA's reference code computes
  it (each pair one complex number);
* ``interleaved=False`` (the default): the half split (x_i, x_{i+d/2}),
  as GPT-NeoX computes it, and much code that runs Llama-family weights
  after permuting the columns of their W_Q and W_K once.

They are the same computation up to one fixed permutation of the columns
(``half_split_permutation``), which can be moved into W_Q and W_K.

Beyond the trained length (chapter 15, "Beyond the trained length"):
a released model that reads longer texts than it was trained on changes
its frequencies by a rule written in its ``config.json`` as a
``rope_scaling`` dictionary. ``frequencies(d, base, rope_scaling)``
computes four of the rules in use -- "linear" (position interpolation,
Chen et al. 2023), "dynamic" (NTK-aware scaling of the base, recomputed
from the current length), "yarn" (Peng et al. 2023) and "llama3" (Llama
3.1) -- with the formulas of recent releases of Hugging Face
transformers' ``modeling_rope_utils``, in float64 where Hugging Face
computes in float32. (Hugging Face also has "longrope", Phi-3's, with two
lists of one factor per plane, short_factor and long_factor, chosen by the
length, which is not here. Earlier releases differ for "yarn":
some ignored mscale and mscale_all_dim, some took L_0 from the config's
max_position_embeddings, some replaced factor by max_position_embeddings
/ original_max_position_embeddings.) For "dynamic" Hugging Face reads
L_0 from the model config's max_position_embeddings, not from the
dictionary; here the dictionary must carry it, see ``scaling_config``.
``attention_factor`` is the factor a rule puts on the scores, and
``rotate_scaled`` turns rows with the scaled frequencies.

Letters in shape comments: n positions, d the width of a row (d_k),
P = d/2 planes.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .checks import float_array, positive_int

__all__ = ["frequencies", "angles", "rotate", "half_split_permutation",
           "SCALING_KEYS", "scaling_config", "attention_factor",
           "yarn_mscale", "rotate_scaled", "turn"]


def check_base(base) -> float:
    """``base`` as a finite float > 1, or a clear error.

    Book: chapter 15, "The frequencies": with base <= 1 the planes would
    not slow down from the first to the last.
    """
    if (isinstance(base, bool) or not isinstance(base, numbers.Real)
            or not np.isfinite(base) or base <= 1):
        raise ValueError(f"the RoPE base must be a real number > 1, "
                         f"got {base!r}")
    return float(base)


def _check_width(d: int) -> int:
    d = positive_int(d, "the RoPE width d")
    if d % 2:
        raise ValueError(f"RoPE rotates pairs of coordinates, so the width "
                         f"must be even; got d = {d} (odd)")
    return d


def frequencies(d: int, base: float = 10000.0, rope_scaling=None, *,
                length=None) -> np.ndarray:
    """omega_i = base^(-2i/d) for the d/2 planes, i = 0 .. d/2 - 1.

    Book: chapter 15, "The frequencies". Plane 0 turns by one radian per
    position; the last turns slowest, by base^(-(d-2)/d) radians.
    Returns (d/2,) float64.

    ``rope_scaling``, a dictionary as a released ``config.json`` writes it
    (chapter 15, "Beyond the trained length"), rescales them by its rule;
    "dynamic" needs ``length``, the current sequence length.
    """
    d = _check_width(d)
    base = check_base(base)
    omega = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (P,)
    if rope_scaling is None:
        return omega
    cfg = scaling_config(rope_scaling)
    return _SCALED[cfg["rope_type"]](omega, d, base, cfg, length)


def angles(positions, d: int, base: float = 10000.0) -> np.ndarray:
    """The angle p * omega_i of every position p and plane i: (..., n, d/2).

    Book: chapter 15, "The frequencies". ``positions`` (..., n), integers
    or reals; the angles are computed in float64 whatever the rows' dtype.
    """
    p = float_array(positions, "positions").astype(np.float64)  # (.., n)
    return p[..., None] * frequencies(d, base)  # (.., n, P)


def half_split_permutation(d: int) -> np.ndarray:
    """Columns that turn the adjacent-pairs layout into the half split.

    Book: chapter 15, "Two conventions, one computation". With
    ``perm = half_split_permutation(d)``, for every x and position,
    ``rotate(x[..., perm], p) == rotate(x, p, interleaved=True)[..., perm]``
    (exactly: the same products and sums of the same numbers).
    ``perm`` lists the even columns 0, 2, 4, ... then the odd ones.
    """
    d = _check_width(d)
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # (d,)


def rotate(x, positions, base: float = 10000.0,
           interleaved: bool = False) -> np.ndarray:
    """Rotate every row of x by its position: RoPE.

    Book: chapter 15, "Every plane at once".

    x is (..., n, d) with d even, positions (n,) or broadcastable to
    x.shape[:-1] (for example (B, 1, n) for x (B, h, n, d): a batch of
    sequences at different offsets); positions that would enlarge x's
    shape are refused. The angles p omega_i of ``angles`` are handed to
    ``turn``. Returns a new array of x's floating dtype (integers become
    float64); position 0 leaves a row exactly as it was.
    """
    x = _rows(x, "rotate")
    t = angles(positions, x.shape[-1], base)  # (.., n, P); refuses odd d
    _check_fit(t, x, f"positions of shape {np.shape(positions)}")
    return turn(x, t, interleaved)


def _rows(x, what: str) -> np.ndarray:
    x = float_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"{what} needs rows x (..., n, d), got shape "
                         f"{x.shape}")
    return x


def _check_fit(t: np.ndarray, x: np.ndarray, given: str) -> None:
    """Refuse angles t that are not one row of d/2 per row of x."""
    n, d = x.shape[-2:]
    try:
        fits = (d % 2 == 0 and t.shape[-1:] == (d // 2,)
                and np.broadcast_shapes(t.shape[:-1], x.shape[:-1])
                == x.shape[:-1])
    except ValueError:
        fits = False
    if not fits:  # e.g. (n, 1) positions would turn x into (n, n, d)
        raise ValueError(
            f"{given} do not fit rows x of shape {x.shape}: they need one "
            f"position per row, shape ({n},) or broadcastable to "
            f"{x.shape[:-1]}")


def turn(x, t, interleaved: bool = False) -> np.ndarray:
    """Turn plane i of every row of x by its angle t: the rotation itself.

    Book: chapter 15, "Every plane at once". x (..., n, d), t (..., n,
    d/2) broadcastable to x's rows. The pair (a, b) of plane i becomes
    (a cos t - b sin t, a sin t + b cos t).
    ``interleaved=False`` pairs column i with column i + d/2 (GPT-NeoX);
    ``True`` pairs columns 2i and 2i+1 (RoFormer).
    """
    x = _rows(x, "turn")
    n, d = x.shape[-2:]
    t = np.asarray(t, dtype=np.float64)
    _check_fit(t, x, f"angles of shape {t.shape}")
    cos = np.cos(t).astype(x.dtype)  # (.., n, P)
    sin = np.sin(t).astype(x.dtype)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]  # (.., n, P) each
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
    ra = a * cos - b * sin  # (.., n, P)
    rb = a * sin + b * cos
    out = np.empty(np.broadcast_shapes(x.shape, ra.shape[:-1] + (d,)),
                   x.dtype)  # (.., n, d)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : d // 2], out[..., d // 2:] = ra, rb
    return out


# --- chapter 15, "Beyond the trained length": rope_scaling -----------------

# the keys each rule reads from the dictionary: required, then optional
SCALING_KEYS = {
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("beta_fast", "beta_slow", "mscale", "mscale_all_dim",
              "attention_factor", "truncate")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"), ()),
}


def scaling_config(rope_scaling) -> dict:
    """``rope_scaling`` checked, as a dict with its rule under "rope_type".

    Book: chapter 15, "Beyond the trained length". The rule's name may be
    written "rope_type" or, in older configurations, "type". Every number
    the rule needs must be there and make sense (factor >= 1, lengths
    positive integers); an unknown rule or key is refused with its name.

    "dynamic" needs "original_max_position_embeddings", the trained length
    L_0, in the dictionary. Hugging Face does not read that key for
    "dynamic": it takes L_0 from the model config's
    max_position_embeddings, and a released "dynamic" dictionary may carry
    only "factor". Whoever copies one adds the config's
    max_position_embeddings to it under "original_max_position_embeddings";
    the two computations then agree.
    """
    if not isinstance(rope_scaling, dict):
        raise TypeError(f"rope_scaling must be a dict as config.json writes "
                        f"it, got {type(rope_scaling).__name__}")
    cfg = dict(rope_scaling)
    kind = cfg.pop("rope_type", None)
    old = cfg.pop("type", None)
    if kind is not None and old is not None and kind != old:
        raise ValueError(f"rope_scaling names two rules: rope_type {kind!r} "
                         f"and type {old!r}")
    kind = kind if kind is not None else old
    if kind not in SCALING_KEYS:
        raise ValueError(f"rope_scaling's rope_type must be one of "
                         f"{sorted(SCALING_KEYS)}, got {kind!r}")
    required, optional = SCALING_KEYS[kind]
    for key in required:
        if cfg.get(key) is None:
            hint = ""
            if kind == "dynamic" and key == "original_max_position_embeddings":
                hint = ("; Hugging Face reads this L_0 from the model "
                        "config's max_position_embeddings, not from "
                        "rope_scaling: copy that number into the dictionary "
                        "under 'original_max_position_embeddings'")
            raise ValueError(f"rope_scaling of type {kind!r} needs the key "
                             f"{key!r}; it has {sorted(rope_scaling)}{hint}")
    unknown = set(cfg) - set(required) - set(optional)
    if unknown:
        raise ValueError(f"rope_scaling of type {kind!r} does not use the "
                         f"key(s) {sorted(unknown)}")
    for key, value in cfg.items():
        if key == "truncate":
            if not isinstance(value, bool):
                raise ValueError(f"rope_scaling's 'truncate' must be true or "
                                 f"false, got {value!r}")
            continue
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not np.isfinite(value) or value <= 0):
            raise ValueError(f"rope_scaling's {key!r} must be a positive "
                             f"number, got {value!r}")
    if cfg["factor"] < 1:
        raise ValueError(f"rope_scaling's 'factor' stretches the context, "
                         f"so it must be >= 1, got {cfg['factor']!r}")
    orig = cfg.get("original_max_position_embeddings")
    if orig is not None and (not float(orig).is_integer()):
        raise ValueError(f"rope_scaling's 'original_max_position_embeddings' "
                         f"must be a whole number of positions, got {orig!r}")
    if kind == "llama3" and not (cfg["high_freq_factor"]
                                 > cfg["low_freq_factor"]):
        raise ValueError(
            f"rope_scaling of type 'llama3' needs high_freq_factor > "
            f"low_freq_factor, got {cfg['high_freq_factor']!r} and "
            f"{cfg['low_freq_factor']!r}")
    cfg["rope_type"] = kind
    return cfg


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """0.1 * mscale * ln(factor) + 1, and 1 for factor <= 1.

    Book: chapter 15, "YaRN". Peng et al. (2023) choose the temperature t
    of the scores by sqrt(1/t) = 0.1 ln(s) + 1 for a stretch s; DeepSeek's
    released code also weights ln(s) by ``mscale``.
    """
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(rope_scaling) -> float:
    """The factor a rule puts on the scores (the softmax scale), Llama-style.

    Book: chapter 15, "YaRN". 1 for "linear", "dynamic" and "llama3" (and
    None). For "yarn", Hugging Face multiplies cos and sin by a number m,
    so q and k each grow by m and every score by m^2, which is returned:
    m is the dictionary's "attention_factor" if given, else
    ``yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim)`` if both are
    given (1 for DeepSeek-V3, which scales its scores in its attention
    instead, chapter 17), else ``yarn_mscale(s)``: the paper's 1/t.
    """
    if rope_scaling is None:
        return 1.0
    cfg = scaling_config(rope_scaling)
    if cfg["rope_type"] != "yarn":
        return 1.0
    return _yarn_magnitude(cfg) ** 2


def _yarn_magnitude(cfg: dict) -> float:
    """m, the number yarn multiplies cos and sin by (HF's attention_factor)."""
    if cfg.get("attention_factor") is not None:
        return float(cfg["attention_factor"])
    s, ms, ms_all = (cfg["factor"], cfg.get("mscale"),
                     cfg.get("mscale_all_dim"))
    if ms and ms_all:
        return yarn_mscale(s, ms) / yarn_mscale(s, ms_all)
    return yarn_mscale(s)


def _linear(omega, d, base, cfg, length):
    """Position interpolation: every frequency divided by the factor."""
    return omega / cfg["factor"]


def _dynamic(omega, d, base, cfg, length):
    """NTK-aware: a larger base, computed from the current length L.

    base' = base (s L / L_0 - (s - 1))^(d / (d - 2)), L = max(length, L_0):
    the last plane's wavelength grows by s L / L_0 - (s - 1) and the first
    plane keeps 1 radian per position. L_0 is the dictionary's
    "original_max_position_embeddings"; Hugging Face's
    _compute_dynamic_ntk_parameters takes it from the model config's
    max_position_embeddings instead and never reads that key, so the two
    agree when the dictionary carries the config's max_position_embeddings.
    """
    if length is None:
        raise ValueError("rope_scaling of type 'dynamic' recomputes the "
                         "frequencies from the sequence's length: pass "
                         "length=")
    L0 = cfg["original_max_position_embeddings"]
    if (isinstance(length, bool) or not isinstance(length, numbers.Integral)
            or length < 0):
        raise ValueError(f"length must be a whole number of positions >= 0, "
                         f"got {length!r}")
    L = max(int(length), L0)  # shorter than L_0: the trained frequencies
    s = cfg["factor"]
    if d == 2:  # one plane: the exponent d / (d - 2) has no value
        raise ValueError("rope_scaling of type 'dynamic' needs a RoPE width "
                         "d > 2 (it raises the base to d / (d - 2))")
    new_base = base * (s * L / L0 - (s - 1)) ** (d / (d - 2))
    return new_base ** (-np.arange(0, d, 2, dtype=np.float64) / d)


def _yarn(omega, d, base, cfg, length):
    """YaRN's frequencies, as the released code computes them.

    Planes that turn more than beta_fast times over the trained length L_0
    keep their frequency, planes that turn fewer than beta_slow times are
    divided by the factor s, and between them a linear ramp over the
    plane index (Peng et al. 2023 ramp over the number of turns r(i); the
    released code -- the authors' jquesnelle/yarn and Hugging Face's, which
    copies it -- ramps over i between the two boundary planes, rounded
    outward (in Hugging Face's, unless the dictionary sets "truncate":
    false), the lower clamped at 0 and the upper at d - 1, with 0.001
    added to the upper when the two coincide).
    """
    s, L0 = cfg["factor"], cfg["original_max_position_embeddings"]
    fast = cfg.get("beta_fast") or 32
    slow = cfg.get("beta_slow") or 1

    def plane(turns):  # the (real) plane index that turns `turns` times
        return d * math.log(L0 / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = plane(fast), plane(slow)
    if cfg.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # as released: no division by zero
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)  # (P,)
    keep = 1 - ramp  # 1: the trained frequency, 0: divided by s
    return omega / s * (1 - keep) + omega * keep


def _llama3(omega, d, base, cfg, length):
    """Llama 3.1's rule: by wavelength, keep, divide by s, or blend.

    Wavelengths 2 pi / omega shorter than L_0 / high_freq_factor keep
    their frequency; longer than L_0 / low_freq_factor are divided by s;
    between them omega ((1 - a) / s + a), a = (L_0 / lambda - low) /
    (high - low).
    """
    s, L0 = cfg["factor"], cfg["original_max_position_embeddings"]
    lo, hi = cfg["low_freq_factor"], cfg["high_freq_factor"]
    wavelength = 2 * math.pi / omega  # (P,)
    a = (L0 / wavelength - lo) / (hi - lo)  # (P,)
    blended = (1 - a) * omega / s + a * omega
    out = np.where(wavelength > L0 / lo, omega / s, omega)
    middle = (wavelength >= L0 / hi) & (wavelength <= L0 / lo)
    return np.where(middle, blended, out)


_SCALED = {"linear": _linear, "dynamic": _dynamic, "yarn": _yarn,
           "llama3": _llama3}


def rotate_scaled(x, positions, base: float, rope_scaling, *, length=None,
                  interleaved: bool = False) -> np.ndarray:
    """``rotate`` with the frequencies of a ``rope_scaling`` rule.

    Book: chapter 15, "Beyond the trained length". Each row is turned by
    position p times ``frequencies(d, base, rope_scaling, length=length)``
    and, for "yarn", multiplied by sqrt(``attention_factor``), as Hugging
    Face multiplies cos and sin: a score of a turned query and key then
    carries the whole factor. ``rope_scaling=None`` is ``rotate``.
    """
    x = _rows(x, "rotate_scaled")
    if rope_scaling is None:
        return rotate(x, positions, base, interleaved)
    omega = frequencies(x.shape[-1], base, rope_scaling,
                        length=length)  # (P,)
    p = float_array(positions, "positions").astype(np.float64)  # (.., n)
    t = p[..., None] * omega  # (.., n, P)
    _check_fit(t, x, f"positions of shape {np.shape(positions)}")
    out = turn(x, t, interleaved)  # (.., n, d)
    m = math.sqrt(attention_factor(rope_scaling))
    if m != 1.0:
        out *= np.asarray(m, dtype=out.dtype)
    return out
