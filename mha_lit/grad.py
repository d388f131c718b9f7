"""The backward pass: gradients of attention, of a block and of a GPT.

Book: Part IV. Chapter 19 "The backward pass of attention"
(attention_backward, multi_head_attention_backward); chapter 21 "A model
that learns" (layer_norm_backward, gelu_backward, feed_forward_backward,
cross_entropy, loss_and_grads, gpt_loss); chapter 20 counts their products.

For a scalar loss L and any array A of the forward pass, dA is the array
of A's shape holding dL/dA entry by entry. Each function takes the
gradient of its output (dY) and returns those of its inputs. For a
product C = A B of an (a, b) and a (b, c) matrix:

    dA = dC B^T   (a, c) @ (c, b)        dB = A^T dC   (b, a) @ (a, c)

two products of a b c multiply-adds each, where the forward had one.

``attention_backward`` is the package's one backward kernel, as
``attention`` is its one forward kernel: the layer's and the GPT's
backward passes call it with a stack of heads. It recomputes the weights
S from Q and K instead of keeping them, as FlashAttention does (chapter
20, ``mha_lit.flash``). Everything is written with ``@`` and plain
expressions, so that ``trace.record_matmuls`` sees every product.

Letters in shape comments (see ``mha_lit.shapes``): n tokens, d_model,
d_k, d_v, h heads, h_kv key/value heads, g = h / h_kv, B sequences,
d_ff, n_vocab, N = B n positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import checks, masks
from .attention import attention, softmax
from .block import BlockWeights, gelu_values, layer_norm_rows
from .decoder import GPTWeights, gpt_forward
from .shapes import Weights

__all__ = ["attention_backward", "multi_head_attention_backward",
           "layer_norm_backward", "gelu_backward", "feed_forward_backward",
           "cross_entropy", "loss_and_grads", "gpt_loss"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# --- chapter 19: one head, then the layer ---------------------------------


def attention_backward(Q, K, V, dY, causal: bool = True, *,
                       scale: float | None = None):
    """dQ, dK, dV of H = softmax(mask(Q K^T scale)) V, given dY = dH.

    Book: chapter 19, "The backward pass of one head". Q (.., n, d_k),
    K (.., n, d_k), V (.., n, d_v), dY (.., n, d_v): n queries against the
    same n keys; leading axes are a stack of heads. ``scale`` is
    1/sqrt(d_k) if None. Row by row, the softmax's backward is
    dZ_t = S_t * (dS_t - (dS_t . S_t)): a masked weight is exactly 0, so
    its entry of dZ is 0 and a key after query t gets nothing from it.
    """
    Q, K, V, dY = _head_operands(Q, K, V, dY)
    if scale is None:
        scale = 1 / math.sqrt(Q.shape[-1])
    n = Q.shape[-2]
    Z = (Q @ np.swapaxes(K, -1, -2)) * scale  # (.., n, n): recomputed
    if causal:
        Z = np.where(masks.causal(n), Z, -np.inf)  # later keys hidden
    S = softmax(Z)  # (.., n, n), masked weights exactly 0
    dV = np.swapaxes(S, -1, -2) @ dY  # (.., n, n) @ (.., n, d_v)
    dS = dY @ np.swapaxes(V, -1, -2)  # (.., n, d_v) @ (.., d_v, n)
    dZ = S * (dS - (dS * S).sum(axis=-1, keepdims=True))  # (.., n, n)
    dQ = (dZ @ K) * scale  # (.., n, n) @ (.., n, d_k)
    dK = (np.swapaxes(dZ, -1, -2) @ Q) * scale  # (.., n, n) @ (.., n, d_k)
    return dQ, dK, dV


def _head_operands(Q, K, V, dY):
    """Q, K, V, dY as float arrays of one sequence's heads, or an error."""
    Q, K, V = (checks.float_array(a, name) for a, name in
               ((Q, "Q"), (K, "K"), (V, "V")))
    Q, K, V, _ = checks.attention_operands(Q, K, V)
    dY = checks.float_array(dY, "dY")
    if Q.shape[-2] != K.shape[-2]:
        raise ValueError(f"Q is {Q.shape} and K is {K.shape}: the backward "
                         "pass takes n queries against the same n keys")
    want = Q.shape[:-1] + V.shape[-1:]
    if dY.shape != want or Q.shape[:-2] != K.shape[:-2] or (
            K.shape[:-2] != V.shape[:-2]):
        raise ValueError(
            f"Q {Q.shape}, K {K.shape}, V {V.shape} and dY {dY.shape} do "
            f"not fit: dY must have H's shape (.., n, d_v) = {want}, and "
            "Q, K, V the same leading axes")
    return Q, K, V, dY


@dataclass(frozen=True)
class _LayerCache:
    """What a layer's forward keeps for its backward. Book: chapter 19."""

    X: np.ndarray  # (B, n, d_model)
    Q: np.ndarray  # (B, h, n, d_k), biases added
    K: np.ndarray  # (B, h, n, d_k), each K/V head repeated g times
    V: np.ndarray  # (B, h, n, d_v)
    concat: np.ndarray  # (B, n, h*d_v)


def _layer_forward(X, W: Weights, causal: bool):
    """Y (B, n, d_model) of multi-head attention, and what it keeps.

    Book: chapter 19. The forward of ``variants.reference``, for every
    head and sequence at once: X (B, n, d_model).
    """
    B, n, _ = X.shape
    g = W.group  # query heads per K/V head (chapter 14)
    X4 = X[:, None]  # (B, 1, n, d_model): the same rows for every head
    Q = X4 @ W.W_Q + W.bias("b_Q")[:, None, :]  # (B, h, n, d_k)
    K = X4 @ W.W_K + W.bias("b_K")[:, None, :]  # (B, h_kv, n, d_k)
    V = X4 @ W.W_V + W.bias("b_V")[:, None, :]  # (B, h_kv, n, d_v)
    K, V = np.repeat(K, g, axis=1), np.repeat(V, g, axis=1)  # h heads
    H = attention(Q, K, V, masks.causal(n) if causal else None)
    concat = H.transpose(0, 2, 1, 3).reshape(B, n, W.heads * W.d_v)
    Y = concat @ W.W_O + W.bias("b_O")  # (B, n, d_model)
    return Y, _LayerCache(X, Q, K, V, concat)


def _layer_backward(dY, W: Weights, c: _LayerCache, causal: bool):
    """dX (B, n, d_model) and the gradients of W's arrays, by name.

    Book: chapter 19, "The whole layer". dY (B, n, d_model).
    """
    B, n, d = dY.shape
    h, h_kv, d_v = W.heads, W.kv_heads, W.d_v
    rows = c.X.reshape(B * n, d)  # every token of every sequence
    grads = {"W_O": c.concat.reshape(B * n, h * d_v).T  # (h*d_v, N)
             @ dY.reshape(B * n, d)}  # (N, d_model) -> (h*d_v, d_model)
    dconcat = dY @ W.W_O.T  # (B, n, d_model) @ (d_model, h*d_v)
    dH = dconcat.reshape(B, n, h, d_v).transpose(0, 2, 1, 3)  # head split
    dQ, dK, dV = attention_backward(c.Q, c.K, c.V, dH, causal)
    # a K/V head's gradient is the sum over the g query heads that use it
    dK = dK.reshape(B, h_kv, W.group, n, W.d_k).sum(axis=2)  # (B, h_kv, ..)
    dV = dV.reshape(B, h_kv, W.group, n, d_v).sum(axis=2)
    dX = []  # X's three uses, Q, K and V, each summed over its heads
    for name, dA in (("Q", dQ), ("K", dK), ("V", dV)):
        heads_first = dA.transpose(1, 0, 2, 3)  # (heads, B, n, width)
        flat = heads_first.reshape(len(heads_first), B * n, -1)  # (.., N, w)
        grads[f"W_{name}"] = rows.T @ flat  # (d_model, N) @ (.., N, w)
        grads[f"b_{name}"] = flat.sum(axis=1)  # (heads, width)
        W_T = np.swapaxes(getattr(W, f"W_{name}"), -1, -2)  # (.., w, d)
        dX.append((dA @ W_T).sum(axis=1))  # (B, heads, n, d) -> (B, n, d)
    grads["b_O"] = dY.reshape(B * n, d).sum(axis=0)  # (d_model,)
    return dX[0] + dX[1] + dX[2], grads


def _gradient_weights(W: Weights, grads: dict) -> Weights:
    """The gradients as a Weights: a bias's only where W has that bias."""
    return Weights(**{name: grads[name] for name in W.arrays()})


def multi_head_attention_backward(X, W: Weights, dY, causal: bool = True):
    """dX and dW of Y = multi-head attention of X, given dY.

    Book: chapter 19, "The whole layer". X (n, d_model) or (B, n,
    d_model), dY of X's shape. Returns dX (X's shape) and dW, a Weights
    holding dW_Q, dW_K, dW_V, dW_O and, where W has biases, their
    gradients (None where W has none). With grouped key/value heads
    (chapter 14) a K/V head's gradient sums those of its g query heads.
    Computed in the widest of X's, dY's and W's float dtypes (integer
    inputs count as float64).
    """
    X = checks.input_rows(X, W)
    dY = checks.float_array(dY, "dY")
    if dY.shape != X.shape:
        raise ValueError(f"dY has shape {dY.shape} but must have Y's shape, "
                         f"which is X's: {X.shape}")
    dtype = np.result_type(X, dY, W.dtype)
    X3 = X.reshape((-1,) + X.shape[-2:]).astype(dtype, copy=False)
    dY3 = dY.reshape(X3.shape).astype(dtype, copy=False)
    _, cache = _layer_forward(X3, W, causal)
    dX, grads = _layer_backward(dY3, W, cache, causal)
    return dX.reshape(X.shape), _gradient_weights(W, grads)


# --- chapter 21: the rest of a GPT ----------------------------------------


def layer_norm_backward(X, gamma, dY, eps: float = 1e-5):
    """dX, dgamma, dbeta of Y = LN(X) row by row, given dY.

    Book: chapter 21, "Layer norm, GELU and the feed-forward network".
    X (.., d_model), gamma (d_model,), dY of X's shape. With
    X_hat = (x - mean) / sigma and G = dY * gamma, row by row
    dx = (G - mean(G) - X_hat mean(G * X_hat)) / sigma.
    """
    X = checks.float_array(X, "X")
    gamma = checks.float_array(gamma, "gamma", ndim=1)
    dY = checks.float_array(dY, "dY")
    if X.ndim < 1 or gamma.shape != X.shape[-1:] or dY.shape != X.shape:
        raise ValueError(f"X {X.shape}, gamma {gamma.shape} and dY "
                         f"{dY.shape} do not fit: gamma needs one entry per "
                         "column of X, dY X's shape")
    return _layer_norm_backward(X, gamma, dY, eps)


def _layer_norm_backward(X, gamma, dY, eps: float = 1e-5):
    mu = X.mean(axis=-1, keepdims=True)  # (.., 1)
    sigma = np.sqrt(((X - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    X_hat = (X - mu) / sigma  # (.., d_model)
    G = dY * gamma  # (.., d_model): the gradient of X_hat
    dX = (G - G.mean(axis=-1, keepdims=True)
          - X_hat * (G * X_hat).mean(axis=-1, keepdims=True)) / sigma
    axes = tuple(range(X.ndim - 1))  # every row
    return dX, (dY * X_hat).sum(axis=axes), dY.sum(axis=axes)


def gelu_backward(x, dY):
    """dx of GELU(x) in its tanh form (chapter 8), given dY.

    Book: chapter 21. With zeta = sqrt(2/pi) (x + 0.044715 x^3),
    GELU'(x) = (1 + tanh zeta) / 2
               + x (1 - tanh^2 zeta) sqrt(2/pi) (1 + 3 * 0.044715 x^2) / 2.
    """
    x = checks.float_array(x, "x")
    dY = checks.float_array(dY, "dY")
    if dY.shape != x.shape:
        raise ValueError(f"dY has shape {dY.shape} but x has {x.shape}: "
                         "GELU acts entry by entry")
    return _gelu_backward(x, dY)


def _gelu_backward(x, dY):
    t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))  # x's shape
    slope = (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI
             * (1 + 3 * 0.044715 * x * x))  # GELU'(x)
    return dY * slope


def feed_forward_backward(X, W_1, b_1, W_2, dY):
    """dX, dW_1, db_1, dW_2, db_2 of FFN(X) = GELU(X W_1 + b_1) W_2 + b_2.

    Book: chapter 21. X (N, d_model), W_1 (d_model, d_ff), b_1 (d_ff,),
    W_2 (d_ff, d_model), dY (N, d_model). The forward's U = X W_1 + b_1 is
    computed first; then four products, two per forward product, with
    GELU's slope in between.
    """
    X = checks.float_array(X, "X", ndim=2)
    W_1 = checks.float_array(W_1, "W_1", ndim=2)
    b_1 = checks.float_array(b_1, "b_1", ndim=1)
    W_2 = checks.float_array(W_2, "W_2", ndim=2)
    dY = checks.float_array(dY, "dY", ndim=2)
    d_model, d_ff = W_1.shape
    if (X.shape[1] != d_model or b_1.shape != (d_ff,)
            or W_2.shape != (d_ff, d_model) or dY.shape != X.shape):
        raise ValueError(
            f"X {X.shape}, W_1 {W_1.shape}, b_1 {b_1.shape}, W_2 "
            f"{W_2.shape} and dY {dY.shape} do not fit: W_1 is (d_model, "
            f"d_ff) = ({d_model}, {d_ff}), so X and dY need (N, {d_model}),"
            f" b_1 ({d_ff},) and W_2 ({d_ff}, {d_model})")
    return _feed_forward_backward(X, X @ W_1 + b_1, W_1, W_2, dY)


def _feed_forward_backward(X, U, W_1, W_2, dY):
    """The FFN's backward, given its input X and U = X W_1 + b_1 (N, d_ff)."""
    dhidden = dY @ W_2.T  # (N, d_model) @ (d_model, d_ff)
    dW_2 = gelu_values(U).T @ dY  # (d_ff, N) @ (N, d_model)
    dU = _gelu_backward(U, dhidden)  # (N, d_ff)
    return dU @ W_1.T, X.T @ dU, dU.sum(axis=0), dW_2, dY.sum(axis=0)


def cross_entropy(logits, targets):
    """Mean of -log softmax(logits)[target] over the rows, and dlogits.

    Book: chapter 21, "The loss". logits (N, n_vocab), targets (N,) ids.
    dlogits = (softmax(logits) - onehot(targets)) / N.
    """
    logits = checks.float_array(logits, "logits", ndim=2)
    targets = checks.token_ids(targets, logits.shape[1], "targets", ndim=1)
    if len(targets) != len(logits):
        raise ValueError(f"targets has shape {targets.shape} but logits has "
                         f"{logits.shape}: one target per row")
    N = len(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)  # (N, n_vocab)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_p[np.arange(N), targets].mean()
    dlogits = np.exp(log_p)  # softmax, (N, n_vocab)
    dlogits[np.arange(N), targets] -= 1.0
    return float(loss), dlogits / N


def _sequences(G: GPTWeights, tokens, targets):
    """tokens and targets as (B, n) ids of G's vocabulary, or an error."""
    if not isinstance(G, GPTWeights):
        raise TypeError(
            f"G must be mha_lit.GPTWeights, got {type(G).__name__}")
    t = checks.token_ids(tokens, G.vocab_size, "tokens")
    y = checks.token_ids(targets, G.vocab_size, "targets")
    if t.ndim not in (1, 2) or y.shape != t.shape:
        raise ValueError(f"tokens {t.shape} and targets {y.shape} must be "
                         "one sequence (n,) or a batch (B, n) of the same "
                         "shape: one target per token")
    t, y = t.reshape(-1, t.shape[-1]), y.reshape(-1, t.shape[-1])  # (B, n)
    if not 1 <= t.shape[1] <= G.context_length:
        raise ValueError(f"sequences of {t.shape[1]} tokens do not fit: "
                         f"they need 1 .. {G.context_length} (the context "
                         "length)")
    return t, y


def _counted_rows(counted, shape: tuple[int, int]) -> np.ndarray:
    """(N,) booleans: the positions a loss averages over (None: all)."""
    if counted is None:
        return np.ones(shape[0] * shape[1], bool)
    c = np.asarray(counted)
    if c.dtype != np.bool_ or c.shape not in (shape, shape[1:]):
        raise ValueError(f"counted must be booleans of the tokens' shape "
                         f"{shape} or ({shape[1]},), got {c.dtype} "
                         f"{c.shape}")
    if not c.any():
        raise ValueError("counted must count at least one position")
    return np.broadcast_to(c, shape).reshape(-1)


def gpt_loss(G: GPTWeights, tokens, targets, counted=None) -> float:
    """The mean cross-entropy of ``gpt_forward``'s logits, one sequence at a
    time. Book: chapter 21; the reference that ``loss_and_grads`` is checked
    against. tokens and targets (n,) or (B, n); ``counted`` as there.
    """
    t, y = _sequences(G, tokens, targets)
    rows = _counted_rows(counted, t.shape)  # (N,)
    logits = np.concatenate([gpt_forward(row, G) for row in t])  # (N, ..)
    return cross_entropy(logits[rows], y.reshape(-1)[rows])[0]


def loss_and_grads(G: GPTWeights, tokens, targets, counted=None):
    """The mean cross-entropy loss of G on the targets, and its gradients.

    Book: chapter 21, "The whole GPT". tokens and targets (n,) ids, or a
    batch (B, n); the loss is the mean over all positions, or over those
    where ``counted`` (booleans of the tokens' shape, or (n,) for every
    sequence) is True; the others get no gradient. Returns
    (loss, dG), dG a GPTWeights of the gradients of every array of G
    (attention biases only where G's blocks have them). The forward pass
    is ``gpt_forward``'s (pre-LN blocks, tied output layer), batched, and
    keeps what the backward needs.
    """
    t, y = _sequences(G, tokens, targets)
    B, n = t.shape
    N, d = B * n, G.d_model
    rows = _counted_rows(counted, (B, n))  # (N,) positions in the mean
    X = G.E[t] + G.P[:n]  # (B, n, d_model)
    kept = []
    for block in G.blocks:  # X' = X + MHA(LN_1(X)), X'' = X' + FFN(LN_2(X'))
        a = layer_norm_rows(X.reshape(N, d), block.gamma_1, block.beta_1)
        Y, cache = _layer_forward(a.reshape(B, n, d), block.attn, True)
        X_mid = X + Y  # (B, n, d_model)
        f = layer_norm_rows(X_mid.reshape(N, d), block.gamma_2,
                            block.beta_2)  # (N, d_model)
        U = f @ block.W_1 + block.b_1  # (N, d_ff)
        kept.append((X, cache, X_mid, f, U))
        X = X_mid + (gelu_values(U) @ block.W_2 + block.b_2).reshape(X.shape)
    x_f = layer_norm_rows(X.reshape(N, d), G.gamma_f, G.beta_f)  # (N, d)
    logits = x_f @ G.E.T  # (N, d_model) @ (d_model, n_vocab)
    loss, d_counted = cross_entropy(logits[rows], y.reshape(N)[rows])
    dlogits = np.zeros_like(logits)  # (N, n_vocab): 0 where not counted
    dlogits[rows] = d_counted

    dE = dlogits.T @ x_f  # (n_vocab, N) @ (N, d): the output layer's use
    dx_f = dlogits @ G.E  # (N, n_vocab) @ (n_vocab, d_model)
    dX, dgamma_f, dbeta_f = _layer_norm_backward(X.reshape(N, d), G.gamma_f,
                                                 dx_f)  # dX (N, d_model)
    blocks = []
    for block, (X_in, cache, X_mid, f, U) in zip(G.blocks[::-1], kept[::-1],
                                                  strict=True):
        # a residual passes the gradient on unchanged and adds the branch's
        df, dW_1, db_1, dW_2, db_2 = _feed_forward_backward(
            f, U, block.W_1, block.W_2, dX)
        dX_ln2, dgamma_2, dbeta_2 = _layer_norm_backward(
            X_mid.reshape(N, d), block.gamma_2, df)
        dX_mid = dX + dX_ln2  # (N, d_model)
        da, attn = _layer_backward(dX_mid.reshape(B, n, d), block.attn,
                                   cache, causal=True)
        dX_ln1, dgamma_1, dbeta_1 = _layer_norm_backward(
            X_in.reshape(N, d), block.gamma_1, da.reshape(N, d))
        dX = dX_mid + dX_ln1  # (N, d_model)
        blocks.append(BlockWeights(
            gamma_1=dgamma_1, beta_1=dbeta_1,
            attn=_gradient_weights(block.attn, attn), gamma_2=dgamma_2,
            beta_2=dbeta_2, W_1=dW_1, b_1=db_1, W_2=dW_2, b_2=db_2))
    np.add.at(dE, t.reshape(N), dX)  # the input's use: row id gets dX_t
    dP = np.zeros(G.P.shape, dX.dtype)  # (n_ctx, d_model)
    dP[:n] = dX.reshape(B, n, d).sum(axis=0)  # position p, every sequence
    return loss, GPTWeights(E=dE, P=dP, blocks=tuple(blocks[::-1]),
                            gamma_f=dgamma_f, beta_f=dbeta_f)
