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

Letters in shape comments: n positions, d the width of a row (d_k),
P = d/2 planes.
"""

from __future__ import annotations

import numbers

import numpy as np

from .checks import float_array, positive_int

__all__ = ["frequencies", "angles", "rotate", "half_split_permutation"]


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


def frequencies(d: int, base: float = 10000.0) -> np.ndarray:
    """omega_i = base^(-2i/d) for the d/2 planes, i = 0 .. d/2 - 1.

    Book: chapter 15, "The frequencies". Plane 0 turns by one radian per
    position; the last turns slowest, by base^(-(d-2)/d) radians.
    Returns (d/2,) float64.
    """
    d = _check_width(d)
    base = check_base(base)
    return base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (P,)


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
    shape are refused. The pair (a, b) of plane i in a row at position p
    becomes (a cos t - b sin t, a sin t + b cos t), t = p omega_i.
    ``interleaved=False`` pairs column i with column i + d/2 (GPT-NeoX);
    ``True`` pairs columns 2i and 2i+1 (RoFormer). Returns a new
    array of x's floating dtype (integers become float64); position 0
    leaves a row exactly as it was.
    """
    x = float_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"rotate needs rows x (..., n, d), got shape "
                         f"{x.shape}")
    n, d = x.shape[-2:]
    t = angles(positions, d, base)  # (.., n, P); refuses an odd d
    try:
        fits = (np.broadcast_shapes(t.shape[:-1], x.shape[:-1])
                == x.shape[:-1])
    except ValueError:
        fits = False
    if not fits:  # e.g. (n, 1) positions would turn x into (n, n, d)
        raise ValueError(
            f"positions of shape {np.shape(positions)} do not fit rows x of "
            f"shape {x.shape}: they need one position per row, shape ({n},) "
            f"or broadcastable to {x.shape[:-1]}")
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
