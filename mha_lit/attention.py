"""Scaled dot-product attention, one head and many, written to be read.

Book: chapter 3 "Q, K, V" (softmax, causal_mask, attention_weights,
attention), chapter 4 "Multi-head attention" and chapter 5 "Output"
(multi_head_attention_reference, multi_head_attention); chapter 8
"Batches of sequences" (check_key_mask, the ``key_mask`` arguments and
inputs with a batch axis) and "GPT-2's block, exactly" (biases); Part
III: grouped key/value heads (chapter 14), rotary positions (``rope_base``,
chapter 15) and sliding windows (``window``, chapter 16).

Letters in shape comments (see ``mha_lit.shapes``): n tokens (queries),
m keys (m = n except when a KV cache supplies earlier keys), d_model, d_k,
d_v, h heads, B sequences in a batch.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import rope
from .fast import multi_head_attention_fast
from .shapes import Weights, as_float_array

__all__ = [
    "softmax",
    "causal_mask",
    "attention_weights",
    "attention",
    "check_input",
    "check_key_mask",
    "check_variants",
    "multi_head_attention",
    "multi_head_attention_reference",
]


def softmax(x, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, numerically stable. Book: chapter 3, "Softmax".

    Subtracting each row's maximum changes nothing mathematically (softmax
    is invariant to adding a constant) but keeps every exponent <= 0, so
    huge logits cannot overflow. Entries equal to -inf (masked scores)
    become exactly 0. A row that is entirely -inf has no distribution and
    is refused, as are NaN and +inf.
    """
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = as_float_array(x, "softmax input")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError(
            f"softmax input of shape {x.shape} holds NaN or +inf")
    m = np.max(x, axis=axis, keepdims=True)  # row maxima, same ndim as x
    if np.isneginf(m).any():
        raise ValueError(
            f"softmax input of shape {x.shape} has a slice along axis "
            f"{axis} that is entirely -inf (every score masked)")
    with np.errstate(over="ignore"):  # x - m may round to -inf: exp is 0
        e = np.exp(x - m)  # every exponent <= 0, exp(-inf) = 0
    return e / np.sum(e, axis=axis, keepdims=True)


def causal_mask(scores) -> np.ndarray:
    """Copy of ``scores``, strictly upper triangle set to -inf.

    Book: chapter 3, "The causal mask". Works on the last two axes, so a
    stack of per-head score matrices (h, n, n) is masked head by head.
    Entry (t, u) with u > t is a query looking at a later token.
    """
    s = np.asarray(scores)
    if np.issubdtype(s.dtype, np.floating):
        s = s.copy()
    else:
        s = s.astype(np.float64)
    if s.ndim < 2:
        raise ValueError(
            f"causal_mask needs a matrix (last two axes), got shape {s.shape}")
    n, m = s.shape[-2:]
    upper = np.triu(np.ones((n, m), dtype=bool), k=1)  # (n, m): u > t
    s[..., upper] = -np.inf
    return s


def attention_weights(Q, K, causal: bool = True, *,
                      key_mask=None, window: int | None = None) -> np.ndarray:
    """S = softmax(mask(Q K^T / sqrt(d_k))) for one head. Book: chapter 3.

    Q is (n, d_k), K is (m, d_k); S is (n, m) and each row sums to 1.
    With ``causal`` the n queries are the last n of the m positions
    (n = m in the book, n < m when a KV cache supplies earlier keys), and
    query t may look at keys 1 .. t + (m - n) only (counted from 1).

    ``key_mask`` (m,) booleans, True where key u is a real token, False
    where it is padding: a padded key's score is -inf, so it gets weight 0
    from every query. A query left with no key to look at attends to
    nothing: its row of S is all 0. Book: chapter 8, "Batches of
    sequences".

    ``window`` w (causal only): query t sees keys t - w + 1 .. t, the last
    w positions; earlier keys' scores are -inf. Book: Part III, chapter 16
    "Sliding-window attention".
    """
    window = _checked_window(window, causal)
    Q = as_float_array(Q, "Q", ndim=2)
    K = as_float_array(K, "K", ndim=2)
    (n, d_k), (m, d_k2) = Q.shape, K.shape
    if d_k != d_k2:
        raise ValueError(f"Q is {Q.shape} and K is {K.shape}: "
                         "Q K^T needs both to have d_k columns")
    if causal and n > m:
        raise ValueError("causal attention needs at least as many keys as "
                         f"queries; Q is {Q.shape}, K is {K.shape}")
    scores = Q @ K.T / math.sqrt(d_k)  # (n, d_k) @ (d_k, m) -> (n, m)
    if causal:
        t = np.arange(n)[:, None] + (m - n)  # (n, 1): position of query t
        later = np.arange(m)[None, :] > t  # (n, m): key u after query t
        if window is not None:  # chapter 16: or more than w - 1 before it
            later |= np.arange(m)[None, :] <= t - window  # (n, m)
        scores = np.where(later, -np.inf, scores)  # (n, m)
    if key_mask is not None:
        return _padded_softmax(scores, check_key_mask(key_mask, K, "K"))
    return softmax(scores, axis=-1)  # (n, m), rows sum to 1


def _padded_softmax(scores: np.ndarray, key_mask: np.ndarray) -> np.ndarray:
    """Row softmax of ``scores`` (n, m) with padded keys' scores -inf.

    Book: chapter 8, "Batches of sequences". A row left entirely -inf (a
    query that may look at padding only) becomes a row of zeros.
    """
    scores = np.where(key_mask[None, :], scores, -np.inf)  # (n, m)
    blind = np.isneginf(scores).all(axis=1)  # (n,): sees no key at all
    # any finite row will do for a blind query; its weights become 0
    S = softmax(np.where(blind[:, None], 0.0, scores), axis=-1)  # (n, m)
    S[blind] = 0.0  # (n, m), rows sum to 1 or (blind) to 0
    return S


def attention(Q, K, V, causal: bool = True, *,
              key_mask=None, window: int | None = None) -> np.ndarray:
    """One head: H = softmax(mask(Q K^T / sqrt(d_k))) V. Book: chapter 3.

    Q is (n, d_k), K is (m, d_k), V is (m, d_v); H is (n, d_v).
    ``key_mask`` (m,): see ``attention_weights`` (chapter 8); ``window``:
    the same (Part III, chapter 16).
    """
    V = as_float_array(V, "V", ndim=2)
    S = attention_weights(Q, K, causal, key_mask=key_mask,
                          window=window)  # (n, m)
    if V.shape[0] != S.shape[1]:
        raise ValueError(
            f"V has {V.shape[0]} rows but K has {S.shape[1]}; S V needs "
            f"one value row per key (V is {V.shape})")
    return S @ V  # (n, m) @ (m, d_v) -> (n, d_v)


def check_input(X, W: Weights) -> np.ndarray:
    """Validate the input X against the weights; return it as a float array.

    Book: chapter 2, "From input to output". X is (n, d_model), or
    (B, n, d_model) for a batch of B sequences (chapter 8, "Batches of
    sequences"). Refuses, naming the shapes: a ``W`` that is not Weights,
    X that is neither 2-D nor 3-D or has no rows (or no sequences), X whose
    column count is not W's d_model, non-numeric X, NaN or +-inf in X.
    """
    if not isinstance(W, Weights):
        raise TypeError(f"W must be mha_lit.Weights, got {type(W).__name__}")
    X = as_float_array(X, "X")
    if X.ndim not in (2, 3):
        raise ValueError(f"X must be 2-D (n tokens, d_model = {W.d_model}) "
                         f"or 3-D (B sequences, n tokens, d_model = "
                         f"{W.d_model}), got shape {X.shape}")
    if X.shape[-1] != W.d_model:
        raise ValueError(
            f"X has {X.shape[-1]} columns but W_Q expects d_model = "
            f"{W.d_model} (X is {X.shape}, W_Q is {W.W_Q.shape})")
    if X.shape[-2] == 0:
        raise ValueError(f"X has no rows (shape {X.shape}): attention "
                         "needs at least one token")
    if X.shape[0] == 0:
        raise ValueError(f"X holds no sequences (shape {X.shape}): a "
                         "batch needs at least one")
    return X


def check_key_mask(key_mask, X, name: str = "X") -> np.ndarray | None:
    """Validate ``key_mask`` against ``X``; return it as a bool array or None.

    Book: chapter 8, "Batches of sequences". One boolean per token, True
    where the token is real and False where it is padding: shape (n,) for
    X (n, d_model), (B, n) for X (B, n, d_model); ``X.shape[:-1]`` in
    general. None stays None (every token is real). Refuses, naming the
    shapes, a mask of another shape (TypeError if it is not boolean).
    """
    if key_mask is None:
        return None
    want = X.shape[:-1]  # (n,) or (B, n): one entry per token
    try:
        mask = np.asarray(key_mask)  # want, if it is right
    except ValueError:  # ragged nested lists
        raise ValueError(f"key_mask must be an array of shape {want}, one "
                         f"entry per token of {name} {X.shape}; got rows "
                         "of different lengths") from None
    if mask.dtype != np.bool_:
        raise TypeError(
            f"key_mask must be boolean (True where the token is real), "
            f"got dtype {mask.dtype} (shape {mask.shape})")
    if mask.shape != want:
        raise ValueError(
            f"key_mask has shape {mask.shape} but {name} is {X.shape}: "
            f"it needs one entry per token, shape {want}")
    return mask


def _checked_window(window, causal: bool) -> int | None:
    """``window`` as a positive int (or None), or a clear error."""
    if window is None:
        return None
    if (isinstance(window, bool) or not isinstance(window, numbers.Integral)
            or window < 1):
        raise ValueError(f"window must be a positive number of keys, got "
                         f"{window!r}")
    if not causal:
        raise ValueError("a sliding window looks back over the last "
                         f"{window} positions, so it needs causal=True")
    return int(window)


def check_variants(W: Weights, causal: bool, rope_base,
                   window) -> tuple[float | None, int | None]:
    """Validate Part III's keywords against W; return (rope_base, window).

    Book: Part III, chapters 15 ("Rotary positions": ``rope_base`` > 1,
    and d_k even, since RoPE turns pairs of coordinates) and 16
    ("Sliding-window attention": ``window`` a positive int, causal only).
    """
    if rope_base is not None:
        rope_base = rope.check_base(rope_base)
        if W.d_k % 2:
            raise ValueError(
                f"RoPE rotates pairs of coordinates, so d_k must be even; "
                f"W_Q is {W.W_Q.shape} (d_k = {W.d_k})")
    return rope_base, _checked_window(window, causal)


def multi_head_attention_reference(X, W: Weights, causal: bool = True, *,
                                   key_mask=None, rope_base=None,
                                   window: int | None = None) -> np.ndarray:
    """Y = Concat(H_1, ..., H_h) W_O, one head at a time. Book: chapter 5.

    The book's computation, step by step: X is (n, d_model), Y is
    (n, d_model) in X's floating dtype. Biases of W, if any, are added:
    Q_i = X W_Qi + b_Qi (likewise K_i, V_i) and Y = Concat W_O + b_O
    (Book: chapter 8, "GPT-2's block, exactly").

    A batch X (B, n, d_model) gives Y (B, n, d_model), one sequence at a
    time. ``key_mask`` ((n,) or (B, n), True = real token): padded keys
    get score -inf, and the output row of a padded query is set to 0, so
    it is never NaN (Book: chapter 8, "Batches of sequences").

    Part III: W may have fewer key/value heads than query heads; query
    head i uses K/V head i // g (chapter 14). ``rope_base`` rotates every
    head's Q and K by their positions 0 .. n-1 (half-split convention,
    ``rope.rotate``; chapter 15); ``window`` w lets query t see keys
    t - w + 1 .. t only (chapter 16). With a ``key_mask`` a token's
    position is the number of real tokens before it: the sequence's real
    rows are computed on their own, which equals masking the padding
    (chapter 8).
    """
    X = check_input(X, W)
    key_mask = check_key_mask(key_mask, X)
    rope_base, window = check_variants(W, causal, rope_base, window)
    if X.ndim == 3:  # (B, n, d_model): one sequence at a time
        masks = [None] * len(X) if key_mask is None else key_mask
        return np.stack([  # (B, n, d_model)
            multi_head_attention_reference(x, W, causal, key_mask=m,
                                           rope_base=rope_base, window=window)
            for x, m in zip(X, masks, strict=True)])
    if key_mask is not None and (rope_base is not None or window is not None):
        # positions count real tokens: compute on the real rows alone
        Y = np.zeros(X.shape, X.dtype)  # (n, d_model), padded rows 0
        if key_mask.any():
            Y[key_mask] = multi_head_attention_reference(
                X[key_mask], W, causal, rope_base=rope_base, window=window)
        return Y
    out_dtype = X.dtype
    X = X.astype(np.result_type(X.dtype, W.dtype), copy=False)
    positions = np.arange(X.shape[0])  # (n,): 0 .. n-1
    H = []
    for i in range(W.heads):
        Q = X @ W.W_Q[i]  # (n, d_model) @ (d_model, d_k) -> (n, d_k)
        if W.has_biases:  # chapter 8: one bias row added to every row
            Q = Q + W.bias("b_Q")[i]  # (n, d_k) + (d_k,)
        if rope_base is not None:  # chapter 15: rotate by position
            Q = rope.rotate(Q, positions, rope_base)  # (n, d_k)
        j = i // W.group  # chapter 14: the K/V head of query head i
        if i % W.group == 0:  # the first query head of its group
            K = X @ W.W_K[j]  # (n, d_k)
            V = X @ W.W_V[j]  # (n, d_v)
            if W.has_biases:
                K = K + W.bias("b_K")[j]  # (n, d_k) + (d_k,)
                V = V + W.bias("b_V")[j]  # (n, d_v)
            if rope_base is not None:
                K = rope.rotate(K, positions, rope_base)  # (n, d_k)
        H.append(attention(Q, K, V, causal, key_mask=key_mask,
                           window=window))  # (n, d_v)
    concat = np.concatenate(H, axis=1)  # (n, h*d_v)
    Y = concat @ W.W_O  # (n, h*d_v) @ (h*d_v, d_model) -> (n, d_model)
    if W.has_biases:
        Y = Y + W.bias("b_O")  # (n, d_model) + (d_model,)
    if key_mask is not None:
        Y[~key_mask] = 0.0  # (n, d_model): padded queries output 0
    return Y.astype(out_dtype, copy=False)


def multi_head_attention(X, W: Weights, causal: bool = True, *,
                         key_mask=None, rope_base=None,
                         window: int | None = None) -> np.ndarray:
    """Multi-head attention: X (n, d_model) -> Y (n, d_model).

    Book: chapters 4 and 5; computed by the fast path of chapter 12
    ("Computing it efficiently"), which equals the reference up to
    rounding. The output has X's floating dtype (float32 in, float32 out).
    Biases of W are added as GPT-2 adds them (chapter 8, "GPT-2's block,
    exactly"). X may be a batch (B, n, d_model), and ``key_mask`` ((n,)
    or (B, n), True = real token) hides padded keys; a padded query's
    output row is 0 (chapter 8, "Batches of sequences").

    Part III: grouped key/value heads (W.kv_heads < W.heads, chapter 14),
    ``rope_base`` for rotary positions (chapter 15) and ``window`` for a
    sliding window (chapter 16), as in ``multi_head_attention_reference``.
    """
    X = check_input(X, W)
    key_mask = check_key_mask(key_mask, X)
    rope_base, window = check_variants(W, causal, rope_base, window)
    out_dtype = X.dtype
    X = X.astype(np.result_type(X.dtype, W.dtype), copy=False)
    Y = multi_head_attention_fast(X, W, causal, key_mask=key_mask,
                                  rope_base=rope_base,
                                  window=window)  # shape of X
    return Y.astype(out_dtype, copy=False)
