"""Scaled dot-product attention, one head and many, written to be read.

Book: chapter 3 "Q, K, V" (softmax, causal_mask, attention,
attention_weights) and chapter 5 "The output projection"
(multi_head_attention_reference).
``attention`` is the package's one kernel: the fast path of chapter 12,
the KV cache of chapter 7 and the latent attention of chapter 17 all call
it; what differs between them is what they hand it (a mask, a scale, a
stack of heads).

Letters in shape comments (see ``mha_lit.shapes``): n queries, m keys
(m = n except when a KV cache supplies earlier keys), d_model, d_k, d_v,
h heads.
"""

from __future__ import annotations

import math

import numpy as np

from . import checks, masks
from .shapes import Weights

__all__ = ["softmax", "causal_mask", "attention", "attention_weights",
           "multi_head_attention_reference"]


def row_max(x, axis: int = -1) -> np.ndarray:
    """Each slice's maximum along ``axis``; refuses one that is not finite.

    Book: chapter 3, "Softmax". A slice whose maximum is -inf has every
    score masked: it has no distribution. NaN or +inf anywhere in a slice
    makes its maximum NaN or +inf, so those are refused too.
    """
    top = np.asanyarray(x).max(axis=axis, keepdims=True)  # x's ndim
    if not np.isfinite(top).all():
        raise ValueError(
            f"softmax input of shape {np.shape(x)} has a slice along axis "
            f"{axis} that is entirely -inf (every score masked) or holds "
            "NaN or +inf")
    return top


def softmax(x, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, numerically stable. Book: chapter 3.

    Subtracting each slice's maximum changes nothing (softmax ignores a
    constant added to every entry) but keeps every exponent <= 0, so large
    scores cannot overflow; a score of -inf (masked) becomes exactly 0.
    """
    with np.errstate(over="ignore"):  # x - max may round to -inf: exp 0
        e = np.exp(x - row_max(x, axis))  # every exponent <= 0
    return e / e.sum(axis=axis, keepdims=True)


def causal_mask(scores) -> np.ndarray:
    """Copy of ``scores``, every score of a later key set to -inf.

    Book: chapter 3, "The causal mask". Works on the last two axes (n, m),
    so a stack of per-head score matrices (h, n, n) is masked head by head;
    ``masks.causal`` says which entries stay.
    """
    n, m = checks.matrix_shape(scores, "scores")
    return np.where(masks.causal(n, m), scores, -np.inf)  # (.., n, m)


def attention(Q, K, V, mask=None, *, scale: float | None = None):
    """H = softmax(Q K^T / sqrt(d_k)) V, each query over the keys it may see.

    Book: chapter 3, "Values and the output of the head". Q (n, d_k),
    K (m, d_k), V (m, d_v) -> H (n, d_v); leading axes are a stack of
    heads (chapter 4). ``mask`` (n, m) booleans, True where query t may
    look at key u (``masks``); None: every key. ``scale`` multiplies the
    scores, 1/sqrt(d_k) if None.

    Softmax's division by each row's sum is applied to H, not to S: row t
    of H is sum_u e_tu V_u / sum_u e_tu either way, where e_tu is the
    exponential of query t's score for key u less the row's maximum (0 for
    a masked key), and H has d_v columns where S has m.
    """
    Q, K, V, mask = checks.attention_operands(Q, K, V, mask)
    if scale is None:
        scale = 1 / math.sqrt(Q.shape[-1])
    Z = (Q * scale) @ np.swapaxes(K, -1, -2)  # (.., n, d_k) @ (.., d_k, m)
    if mask is not None:
        np.copyto(Z, -np.inf, where=~mask)  # (.., n, m): hidden keys -inf
    Z -= row_max(Z)  # scores less each row's maximum: exponents <= 0
    e = np.exp(Z, out=Z)  # e_tu, (.., n, m), in Z's memory; exp(-inf) = 0
    H = e @ V  # (.., n, m) @ (.., m, d_v) -> (.., n, d_v)
    H /= e.sum(axis=-1, keepdims=True)  # row t by its sum l_t of e_tu
    return H


def attention_weights(Q, K, mask=None, *, scale: float | None = None):
    """S = softmax(Q K^T / sqrt(d_k)), masked: the weights ``attention`` uses.

    Book: chapter 3. Q (n, d_k), K (m, d_k) -> S (n, m), each row summing
    to 1. It is ``attention`` with the identity as V: every value row is
    one-hot, so row t of H is row t of S (each product with I is exact).
    """
    m = np.shape(K)[-2]
    I = np.eye(m, dtype=np.result_type(Q, K, np.float16))  # (m, m)
    return attention(Q, K, I, mask, scale=scale)  # (.., n, m)


def multi_head_attention_reference(X, W: Weights,
                                   causal: bool = True) -> np.ndarray:
    """Y = Concat(H_1, ..., H_h) W_O, one head at a time. Book: chapter 5.

    X (n, d_model) -> Y (n, d_model): chapter 3's attention for each head,
    the heads side by side, times W_O. Weights with biases (chapter 8) or
    shared key/value heads (chapter 14) are computed by
    ``variants.reference``.
    """
    X = checks.plain_rows(X, W)
    mask = masks.causal(len(X)) if causal else None  # (n, n)
    H = [attention(X @ W.W_Q[i], X @ W.W_K[i], X @ W.W_V[i], mask)
         for i in range(W.heads)]  # h heads, each (n, d_v)
    # (n, h*d_v) @ (h*d_v, d_model) -> (n, d_model)
    return np.concatenate(H, axis=1) @ W.W_O
