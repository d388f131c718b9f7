"""Input checks at the door of mha_lit's public functions.

Book: none; the chapters print the functions these checks guard. A public
function checks its arguments once, here, with a message that names the
argument and its shape; the helpers it calls trust what it passes them.
Nothing here is in ``mha_lit.__all__``.

Letters: n tokens (rows), d_model the width of a token vector, B
sequences in a batch, V the vocabulary size.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["positive_int", "float_array", "token_rows", "key_mask",
           "token_ids", "groups"]

_SHAPES = {2: "(n tokens, d_model = {d})",
           3: "(B sequences, n tokens, d_model = {d})"}


def positive_int(value, name: str) -> int:
    """``value`` as an int >= 1, or an error naming ``name``.

    Python and NumPy integers are accepted; ``bool``, floats and anything
    else are refused with ``TypeError``, zero and negatives with
    ``ValueError``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def whole_number(value, name: str) -> int:
    """``value`` as an int >= 0 (a count that may be zero), or an error.

    The types of ``positive_int``; negatives are refused with ``ValueError``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value}")
    return int(value)


def float_array(a, name: str, *, ndim: int | None = None) -> np.ndarray:
    """``a`` as a finite float array, or an error naming ``name``.

    Integers become float64; float16/32/64 keep their dtype. Booleans,
    complex numbers, strings and objects are refused with ``TypeError``;
    another number of axes than ``ndim``, NaN and +-inf with ``ValueError``.
    """
    arr = np.asanyarray(a)  # keeps ndarray subclasses (Part II counts)
    kind = arr.dtype.kind  # "i"/"u" integer, "f" floating
    if kind not in "iuf":
        raise TypeError(
            f"{name} must hold real numbers, got dtype {arr.dtype}")
    if kind != "f":
        arr = arr.astype(np.float64)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} of shape {arr.shape} holds {bad} NaN or "
                         "infinite entries")
    return arr


def token_rows(X, d_model: int, name: str = "X", *, ndims=(2,),
               against: str = "the weights", also: str = "") -> np.ndarray:
    """X (n, d_model), or (B, n, d_model) if 3 is in ``ndims``, as floats.

    Refuses, naming the shapes: another number of axes, a column count
    other than ``d_model`` (which ``against`` expects; ``also`` adds a
    shape to the message, "W_Q is (2, 5, 7)"), no rows or no sequences;
    and whatever ``float_array`` refuses.
    """
    X = float_array(X, name)
    if X.ndim not in ndims:
        want = " or ".join(f"{k}-D {_SHAPES[k]}" for k in ndims)
        raise ValueError(f"{name} must be {want.format(d=d_model)}, got "
                         f"shape {X.shape}")
    if X.shape[-1] != d_model:
        shown = f"{name} is {X.shape}" + (f", {also}" if also else "")
        raise ValueError(f"{name} has {X.shape[-1]} columns but {against} "
                         f"expects d_model = {d_model} ({shown})")
    if X.shape[-2] == 0:
        raise ValueError(f"{name} has no rows (shape {X.shape}): it needs "
                         "at least one token")
    if X.shape[0] == 0:
        raise ValueError(f"{name} holds no sequences (shape {X.shape}): a "
                         "batch needs at least one")
    return X


def key_mask(mask, shape: tuple[int, ...], name: str = "key_mask", *,
             of: str = "") -> np.ndarray | None:
    """``mask`` as a boolean array of ``shape``; None stays None.

    Book: chapter 8, "Batches of sequences": True where a token is real,
    False where it is padding. ``of`` says where ``shape`` comes from
    ("X (2, 3, 5)"), for the message. A mask that is not boolean is refused
    with ``TypeError``; ragged rows or another shape with ``ValueError``.
    """
    if mask is None:
        return None
    where = f" of {of}" if of else ""
    try:
        arr = np.asarray(mask)  # shape, if it is right
    except ValueError:  # ragged nested lists
        raise ValueError(f"{name} must be an array of shape {shape}, one "
                         f"entry per token{where}; got rows of different "
                         "lengths") from None
    if arr.dtype != np.bool_:
        raise TypeError(f"{name} must be boolean (True where the token is "
                        f"real), got dtype {arr.dtype} (shape {arr.shape})")
    if arr.shape != tuple(shape):
        raise ValueError(f"{name} has shape {arr.shape} but needs one entry "
                         f"per token{where}, shape {tuple(shape)}")
    return arr


def token_ids(ids, vocab_size: int, name: str = "tokens", *,
              ndim: int | None = None) -> np.ndarray:
    """``ids`` as an integer array of ids in 0 .. vocab_size - 1.

    Refuses ids that are not integers (``TypeError``), another number of
    axes than ``ndim`` and ids out of range (``ValueError``, naming the
    smallest and largest id given).
    """
    V = positive_int(vocab_size, "vocab_size")
    t = np.asarray(ids)
    if t.dtype == np.bool_ or not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"{name} must be integer token ids, got dtype "
                        f"{t.dtype} (shape {t.shape})")
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {t.shape}")
    if t.size and (t.min() < 0 or t.max() >= V):
        lo, hi = t.min(), t.max()
        got = f"id {lo}" if lo == hi else f"ids {lo} .. {hi}"
        raise ValueError(f"{name} must lie in 0 .. {V - 1} (vocab_size = "
                         f"{V}), got {got}")
    return t


def groups(heads: int, kv_heads: int, *, names=("heads", "kv_heads"),
           of: str = "") -> None:
    """Refuse a number of key/value heads that does not divide ``heads``.

    Book: Part III, chapter 14 "Grouped-query attention": query head i
    uses key/value head i // (heads / kv_heads), so every group must have
    the same size. ``names`` are the arguments' names, ``of`` says where
    the counts come from ("W_Q (6, 5, 7) and W_K (4, 5, 7)").
    """
    if heads % kv_heads:
        h, h_kv = names
        where = f" ({of})" if of else ""
        raise ValueError(
            f"{heads} query heads cannot be split into {kv_heads} equal "
            f"groups{where}: {h_kv} must divide {h} (got {h} = {heads}, "
            f"{h_kv} = {kv_heads})")


# --- attention's door: chapters 3, 5, 12 and Part III ---------------------


def matrix_shape(a, name: str) -> tuple[int, int]:
    """The last two axes (n, m) of ``a``, or an error if it has fewer."""
    shape = np.shape(a)
    if len(shape) < 2:
        raise ValueError(f"{name} must be a matrix (its last two axes), got "
                         f"shape {shape}")
    return shape[-2], shape[-1]


def attention_operands(Q, K, V, mask=None):
    """Q (.., n, d_k), K (.., m, d_k), V (.., m, d_v) and the mask, checked.

    Book: chapter 3. Refuses, naming the shapes: Q and K of different
    widths, a V without one row per key, a mask that is not boolean or
    does not broadcast to the scores (.., n, m).
    """
    Q, K, V = np.asanyarray(Q), np.asanyarray(K), np.asanyarray(V)
    if min(Q.ndim, K.ndim, V.ndim) < 2:
        for a, name in ((Q, "Q"), (K, "K"), (V, "V")):
            matrix_shape(a, name)  # names the first that is not a matrix
    n, d_k = Q.shape[-2:]
    m, d_k2 = K.shape[-2:]
    if d_k != d_k2:
        raise ValueError(f"Q is {Q.shape} and K is {K.shape}: Q K^T needs "
                         "both to have d_k columns")
    if V.shape[-2] != m:
        raise ValueError(f"V has {V.shape[-2]} rows but K has {m}; S V "
                         f"needs one value row per key (V is {V.shape})")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_ or mask.ndim < 2:
            raise TypeError(
                f"mask must be a boolean matrix (n, m), True where a query "
                f"may look at a key (masks.causal(n) for the causal mask); "
                f"got {mask.dtype} of shape {mask.shape}")
        try:
            np.broadcast_shapes(mask.shape, Q.shape[:-2] + (n, m))
        except ValueError:
            raise ValueError(f"mask of shape {mask.shape} does not fit the "
                             f"scores ({n} queries, {m} keys) of Q "
                             f"{Q.shape} and K {K.shape}") from None
    return Q, K, V, mask


def weights(W, who: str):
    """``W`` if it is ``mha_lit.Weights``, else a ``TypeError``."""
    from .shapes import Weights  # shapes imports this module
    if not isinstance(W, Weights):
        raise TypeError(f"{who} needs mha_lit.Weights, got "
                        f"{type(W).__name__}")
    return W


def input_rows(X, W) -> np.ndarray:
    """X (n, d_model) or (B, n, d_model) against the weights W, as floats.

    Book: chapter 2, "From input to output", and chapter 8, "Batches of
    sequences".
    """
    weights(W, "multi-head attention")
    return token_rows(X, W.d_model, ndims=(2, 3), against="W_Q",
                      also=f"W_Q is {W.W_Q.shape}")


def plain_rows(X, W) -> np.ndarray:
    """X (n, d_model) for chapter 5's reference: W without biases or groups.

    Weights with biases (chapter 8) or shared key/value heads (chapter 14)
    are refused with the function that computes them.
    """
    weights(W, "multi_head_attention_reference")
    if W.has_biases or W.kv_heads != W.heads:
        raise ValueError(
            f"multi_head_attention_reference computes chapter 5's heads: W "
            f"has {'biases' if W.has_biases else 'grouped key/value heads'}"
            f" ({W!r}); mha_lit.variants.reference computes every variant")
    return token_rows(X, W.d_model, against="W_Q",
                      also=f"W_Q is {W.W_Q.shape}")


def window(window, causal: bool = True) -> int | None:
    """A sliding window w as an int >= 1 (or None); causal attention only.

    Book: Part III, chapter 16.
    """
    if window is None:
        return None
    w = positive_int(window, "window")
    if not causal:
        raise ValueError(f"a sliding window looks back over the last {w} "
                         "positions, so it needs causal=True")
    return w


def rotary_base(base, W) -> float | None:
    """RoPE's base (> 1, or None) for the weights W, whose d_k must be even.

    Book: Part III, chapter 15: RoPE turns pairs of coordinates.
    """
    if base is None:
        return None
    from .rope import check_base  # rope imports this module
    base = check_base(base)
    if W.d_k % 2:
        raise ValueError(f"RoPE rotates pairs of coordinates, so d_k must be "
                         f"even; W_Q is {W.W_Q.shape} (d_k = {W.d_k})")
    return base


def rope_scaling(rope_scaling, rope_base) -> dict | None:
    """``rope_scaling`` checked (``rope.scaling_config``), or None.

    Book: Part III, chapter 15, "Beyond the trained length". A rule rescales
    RoPE's frequencies, so it needs ``rope_base``.
    """
    if rope_scaling is None:
        return None
    if rope_base is None:
        raise ValueError("rope_scaling rescales rotary positions: it needs "
                         "rope_base as well")
    from .rope import scaling_config  # rope imports this module
    return scaling_config(rope_scaling)


def mask_sizes(n, m=None) -> tuple[int, int]:
    """(n, m): n >= 1 queries, the last n of m >= n positions (m = n if None).

    Book: chapter 3, "The causal mask".
    """
    n = positive_int(n, "n")
    m = n if m is None else positive_int(m, "m")
    if m < n:
        raise ValueError(f"{n} queries cannot be the last of only {m} "
                         "positions: a causal mask needs m >= n keys")
    return n, m
