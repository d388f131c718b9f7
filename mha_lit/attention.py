"""Scaled dot-product attention, one head and many, written to be read.

Book: chapter 3 "Q, K, V" (softmax, causal_mask, attention_weights,
attention), chapter 4 "Multi-head attention" and chapter 5 "Output"
(multi_head_attention_reference, multi_head_attention).

Letters in shape comments (see ``mha_lit.shapes``): n tokens (queries),
m keys (m = n except when a KV cache supplies earlier keys), d_model, d_k,
d_v, h heads.
"""

from __future__ import annotations

import math

import numpy as np

from .fast import multi_head_attention_fast
from .shapes import Weights, as_float_array

__all__ = [
    "softmax",
    "causal_mask",
    "attention_weights",
    "attention",
    "check_input",
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
    Entry (i, j) with j > i is a query looking at a later token.
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
    upper = np.triu(np.ones((n, m), dtype=bool), k=1)  # (n, m): j > i
    s[..., upper] = -np.inf
    return s


def attention_weights(Q, K, causal: bool = True) -> np.ndarray:
    """S = softmax(mask(Q K^T / sqrt(d_k))) for one head. Book: chapter 3.

    Q is (n, d_k), K is (m, d_k); S is (n, m) and each row sums to 1.
    With ``causal`` the n queries are the last n of the m positions
    (n = m in the book, n < m when a KV cache supplies earlier keys), and
    query i may look at keys 0 .. i + (m - n) only.
    """
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
        i = np.arange(n)[:, None] + (m - n)  # (n, 1): position of query
        later = np.arange(m)[None, :] > i  # (n, m): key j after query i
        scores = np.where(later, -np.inf, scores)  # (n, m)
    return softmax(scores, axis=-1)  # (n, m), rows sum to 1


def attention(Q, K, V, causal: bool = True) -> np.ndarray:
    """One head: H = softmax(mask(Q K^T / sqrt(d_k))) V. Book: chapter 3.

    Q is (n, d_k), K is (m, d_k), V is (m, d_v); H is (n, d_v).
    """
    V = as_float_array(V, "V", ndim=2)
    S = attention_weights(Q, K, causal)  # (n, m)
    if V.shape[0] != S.shape[1]:
        raise ValueError(
            f"V has {V.shape[0]} rows but K has {S.shape[1]}; S V needs "
            f"one value row per key (V is {V.shape})")
    return S @ V  # (n, m) @ (m, d_v) -> (n, d_v)


def check_input(X, W: Weights) -> np.ndarray:
    """Validate the input X against the weights; return it as a float array.

    Book: chapter 2, "From input to output". Refuses, naming the shapes: a
    ``W`` that is not Weights, X that is not 2-D or has no rows, X whose
    column count is not W's d_model, non-numeric X, NaN or +-inf in X.
    """
    if not isinstance(W, Weights):
        raise TypeError(f"W must be mha_lit.Weights, got {type(W).__name__}")
    X = as_float_array(X, "X")
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n tokens, d_model = {W.d_model}), "
                         f"got shape {X.shape}")
    if X.shape[1] != W.d_model:
        raise ValueError(
            f"X has {X.shape[1]} columns but W_Q expects d_model = "
            f"{W.d_model} (X is {X.shape}, W_Q is {W.W_Q.shape})")
    if X.shape[0] == 0:
        raise ValueError(f"X has no rows (shape {X.shape}): attention "
                         "needs at least one token")
    return X


def multi_head_attention_reference(X, W: Weights,
                                   causal: bool = True) -> np.ndarray:
    """Y = Concat(H_1, ..., H_h) W_O, one head at a time. Book: chapter 5.

    The book's computation, step by step: X is (n, d_model), Y is
    (n, d_model) in X's floating dtype.
    """
    X = check_input(X, W)
    out_dtype = X.dtype
    X = X.astype(np.result_type(X.dtype, W.dtype), copy=False)
    H = []
    for i in range(W.heads):
        Q = X @ W.W_Q[i]  # (n, d_model) @ (d_model, d_k) -> (n, d_k)
        K = X @ W.W_K[i]  # (n, d_k)
        V = X @ W.W_V[i]  # (n, d_v)
        H.append(attention(Q, K, V, causal))  # (n, d_v)
    concat = np.concatenate(H, axis=1)  # (n, h*d_v)
    Y = concat @ W.W_O  # (n, h*d_v) @ (h*d_v, d_model) -> (n, d_model)
    return Y.astype(out_dtype, copy=False)


def multi_head_attention(X, W: Weights, causal: bool = True) -> np.ndarray:
    """Multi-head attention: X (n, d_model) -> Y (n, d_model).

    Book: chapters 4 and 5; computed by the fast path of chapter 12
    ("Computing it efficiently"), which equals the reference up to
    rounding. The output has X's floating dtype (float32 in, float32 out).
    """
    X = check_input(X, W)
    out_dtype = X.dtype
    X = X.astype(np.result_type(X.dtype, W.dtype), copy=False)
    Y = multi_head_attention_fast(X, W, causal)  # (n, d_model)
    return Y.astype(out_dtype, copy=False)
