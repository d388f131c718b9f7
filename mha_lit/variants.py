"""Every variant of multi-head attention, computed by its definition.

Book: chapter 8 "The GPT block" (biases; batches of padded sequences) and
Part III: chapter 14 (grouped key/value heads), chapter 15 (rotary
positions) and chapter 16 (sliding windows). Each variant is an input to
chapter 3's ``attention`` or a step before it, never a branch inside it:

* biases are added to the projections and to the output;
* grouped heads are multi-head attention with each key/value head
  repeated for its g query heads (``repeat_kv``);
* RoPE turns Q and K by their positions before the scores;
* a window is a mask (``masks.band``);
* a batch is one sequence at a time, and a padded sequence is its real
  tokens alone (``per_sequence``).

``reference`` composes them, one head at a time, as readably as chapter
5's ``multi_head_attention_reference``; the tests hold the fast path of
chapter 12 (``mha_lit.multi_head_attention``) and the KV cache to it.

Letters in shape comments (see ``mha_lit.shapes``): n tokens, d_model,
d_k, d_v, h heads, h_kv key/value heads, g = h / h_kv, B sequences.
"""

from __future__ import annotations

import numpy as np

from . import checks, masks, rope
from .attention import attention
from .shapes import Weights

__all__ = ["repeat_kv", "per_sequence", "reference"]


def repeat_kv(W: Weights) -> Weights:
    """The same layer with every key/value head repeated for its group.

    Book: Part III, chapter 14. Query head i uses K/V head i // g; after
    the repeat it uses K/V head i, as in the book's multi-head attention.
    Weights without groups are returned as they are.
    """
    if W.kv_heads == W.heads:
        return W
    g = W.group
    arrays = W.arrays()
    for name in ("W_K", "W_V", "b_K", "b_V"):
        if name in arrays:  # (h_kv, ..) -> (h, ..): head j becomes g heads
            arrays[name] = np.repeat(arrays[name], g, axis=0)
    return Weights(**arrays)


def per_sequence(f, X, key_mask=None) -> np.ndarray:
    """f on each sequence's real rows; padded rows of the result are 0.

    Book: chapter 8, "Batches of sequences". X is (n, d_model) or
    (B, n, d_model), ``key_mask`` (n,) or (B, n), True for real tokens.
    Computing on the real rows alone is the masked computation: a padded
    key would get weight exp(-inf) = 0 from every query.
    """
    if X.ndim == 3:  # (B, n, d_model): one sequence at a time
        masks_ = [None] * len(X) if key_mask is None else key_mask
        return np.stack([per_sequence(f, x, m)
                         for x, m in zip(X, masks_, strict=True)])
    if key_mask is None:
        return f(X)  # (n, d_model)
    Y = np.zeros(X.shape, X.dtype)  # (n, d_model), padded rows 0
    if key_mask.any():
        Y[key_mask] = f(X[key_mask])  # the real rows, among themselves
    return Y


def reference(X, W: Weights, causal: bool = True, *, key_mask=None,
              rope_base=None, window=None,
              rope_scaling=None) -> np.ndarray:
    """Multi-head attention with every variant, one head at a time.

    Book: chapters 8 and 14-16. X (n, d_model) or (B, n, d_model) -> Y of
    X's shape and floating dtype, computed in the wider of X's and W's.
    ``key_mask``: padded tokens (chapter 8); ``rope_base``: rotary
    positions 0, 1, ... of each sequence's real tokens (chapter 15);
    ``window`` w: query t sees keys t - w + 1 .. t (chapter 16);
    ``rope_scaling``: a config.json rule for the rotary frequencies
    (chapter 15, "Beyond the trained length"; a "dynamic" rule reads the
    longest sequence's length, as Hugging Face reads its largest position).
    """
    X = checks.input_rows(X, W)
    key_mask = checks.key_mask(key_mask, X.shape[:-1], of=f"X {X.shape}")
    rope_base = checks.rotary_base(rope_base, W)
    rope = (rope_base, checks.rope_scaling(rope_scaling, rope_base),
            X.shape[-2] if key_mask is None else int(key_mask.sum(-1).max()))
    window = checks.window(window, causal)
    Xc = X.astype(np.result_type(X, W.dtype), copy=False)
    Y = per_sequence(lambda x: _heads(x, repeat_kv(W), causal, rope,
                                      window), Xc, key_mask)
    return Y.astype(X.dtype, copy=False)


def _heads(X, W: Weights, causal: bool, rotary, window) -> np.ndarray:
    """Y of one sequence X (n, d_model); W has as many K/V heads as Q.

    ``rotary``: (base or None, rope_scaling or None, the length a
    "dynamic" rule reads).
    """
    rope_base, rope_scaling, length = rotary
    n = len(X)
    mask = (masks.band(n, window) if window is not None
            else masks.causal(n) if causal else None)  # (n, n) or None
    positions = np.arange(n)  # (n,): RoPE's positions 0 .. n-1
    b_Q, b_K, b_V = W.bias("b_Q"), W.bias("b_K"), W.bias("b_V")
    H = []
    for i in range(W.heads):
        Q = X @ W.W_Q[i] + b_Q[i]  # (n, d_model) @ (d_model, d_k) + (d_k,)
        K = X @ W.W_K[i] + b_K[i]  # (n, d_k)
        V = X @ W.W_V[i] + b_V[i]  # (n, d_v)
        if rope_base is not None:  # turned by position, before the scores
            Q = rope.rotate_scaled(Q, positions, rope_base, rope_scaling,
                                   length=length)  # (n, d_k)
            K = rope.rotate_scaled(K, positions, rope_base, rope_scaling,
                                   length=length)  # (n, d_k)
        H.append(attention(Q, K, V, mask))  # (n, d_v)
    # (n, h*d_v) @ (h*d_v, d_model) -> (n, d_model)
    return np.concatenate(H, axis=1) @ W.W_O + W.bias("b_O")
