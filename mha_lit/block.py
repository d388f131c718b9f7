"""The GPT decoder block: layer norm, GELU, feed-forward network, residuals, assembled.

Book: Part I, chapter 8 "Closing: the GPT block".

Letters in shape comments (see ``mha_lit.shapes`` for the others):

    n       tokens (rows of X)                               3 in the running example
    d_model width of a token vector                          5
    d_ff    width of the feed-forward network's hidden layer 13 in the book (GPT: 4 * d_model)

Every function here except multi-head attention works on each row of X by itself; that is
why the block stays causal (row N of the output depends on rows 1..N of the input only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .attention import multi_head_attention
from .shapes import Dims, Weights, _frozen, as_float_array, init_weights

__all__ = [
    "layer_norm",
    "gelu",
    "feed_forward",
    "residual",
    "BlockWeights",
    "init_block_weights",
    "gpt_block",
]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.frompyfunc(math.erf, 1, 1)  # elementwise erf (NumPy has none)


def layer_norm(X, gamma, beta, eps: float = 1e-5) -> np.ndarray:
    """Layer norm, gamma (x - mean) / sqrt(var + eps) + beta per row. Book: chapter 8, "Layer norm".

    X is (n, d_model); gamma and beta are (d_model,). The mean and the (population) variance are
    taken over each row's d_model entries, never across rows, as in GPT-2 (eps = 1e-5).
    """
    X = as_float_array(X, "X", ndim=2)
    d_model = X.shape[1]
    gamma = as_float_array(gamma, "gamma", ndim=1)
    beta = as_float_array(beta, "beta", ndim=1)
    if gamma.shape != (d_model,) or beta.shape != (d_model,):
        raise ValueError(f"X is {X.shape} so gamma and beta must be ({d_model},), "
                         f"got gamma {gamma.shape} and beta {beta.shape}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    mu = X.mean(axis=1, keepdims=True)  # (n, 1) one mean per row
    var = ((X - mu) ** 2).mean(axis=1, keepdims=True)  # (n, 1) one variance per row
    X_hat = (X - mu) / np.sqrt(var + eps)  # (n, d_model) rows: mean 0, variance ~1
    return gamma * X_hat + beta  # (n, d_model)


def gelu(x, approximate: bool = True) -> np.ndarray:
    """GELU(x) = x * Phi(x), elementwise. Book: chapter 8, "GELU".

    ``approximate=True`` is the tanh formula GPT and GPT-2 use,
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); ``False`` is exact, 0.5 x (1 + erf(x/sqrt 2)).
    Same shape as x.
    """
    x = as_float_array(x, "x")
    if approximate:
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x**3)  # same shape as x
        return 0.5 * x * (1.0 + np.tanh(inner))  # same shape as x
    erf = np.asarray(_erf(x / math.sqrt(2.0)), dtype=x.dtype)  # same shape as x
    return 0.5 * x * (1.0 + erf)  # same shape as x


def feed_forward(X, W_1, b_1, W_2, b_2) -> np.ndarray:
    """FFN(X) = GELU(X W_1 + b_1) W_2 + b_2, per row. Book: chapter 8, "The feed-forward network".

    X is (n, d_model), W_1 (d_model, d_ff), b_1 (d_ff,), W_2 (d_ff, d_model), b_2 (d_model,);
    the result is (n, d_model).
    """
    X = as_float_array(X, "X", ndim=2)
    W_1, W_2 = as_float_array(W_1, "W_1", ndim=2), as_float_array(W_2, "W_2", ndim=2)
    b_1, b_2 = as_float_array(b_1, "b_1", ndim=1), as_float_array(b_2, "b_2", ndim=1)
    d_model, d_ff = W_1.shape
    if X.shape[1] != d_model:
        raise ValueError(f"X has {X.shape[1]} columns but W_1 is {W_1.shape}: X W_1 needs "
                         f"d_model = {d_model} columns (X is {X.shape})")
    if b_1.shape != (d_ff,) or W_2.shape != (d_ff, d_model) or b_2.shape != (d_model,):
        raise ValueError(f"W_1 is {W_1.shape} (d_model = {d_model}, d_ff = {d_ff}) so b_1, W_2, "
                         f"b_2 must be {(d_ff,)}, {(d_ff, d_model)}, {(d_model,)}; got "
                         f"{b_1.shape}, {W_2.shape}, {b_2.shape}")
    hidden = gelu(X @ W_1 + b_1)  # (n, d_model) @ (d_model, d_ff) -> (n, d_ff)
    return hidden @ W_2 + b_2  # (n, d_ff) @ (d_ff, d_model) -> (n, d_model)


def residual(X, sublayer) -> np.ndarray:
    """X + sublayer(X): a residual (skip) connection. Book: chapter 8, "Residual connections".

    ``sublayer`` must map an (n, d_model) array to one of the same shape.
    """
    X = as_float_array(X, "X", ndim=2)
    F = np.asarray(sublayer(X))  # (n, d_model)
    if F.shape != X.shape:
        raise ValueError(f"a residual connection adds sublayer(X) to X, but X is {X.shape} "
                         f"and sublayer(X) is {F.shape}")
    return X + F  # (n, d_model)


_VECTORS = ("gamma_1", "beta_1", "gamma_2", "beta_2", "b_1", "b_2")


@dataclass(frozen=True, eq=False)
class BlockWeights:
    """Every trainable array of one GPT block. Book: chapter 8, "The weights of a block".

        gamma_1, beta_1 : (d_model,)        layer norm next to attention      (5,)
        attn            : Weights           multi-head attention (chapter 4)  W_O is (22, 5)
        gamma_2, beta_2 : (d_model,)        layer norm next to the FFN        (5,)
        W_1, b_1        : (d_model, d_ff), (d_ff,)                            (5, 13), (13,)
        W_2, b_2        : (d_ff, d_model), (d_model,)                         (13, 5), (5,)

    Every shape is checked on construction; arrays become private read-only copies.
    """

    gamma_1: np.ndarray
    beta_1: np.ndarray
    attn: Weights
    gamma_2: np.ndarray
    beta_2: np.ndarray
    W_1: np.ndarray
    b_1: np.ndarray
    W_2: np.ndarray
    b_2: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.attn, Weights):
            raise TypeError(f"attn must be mha_lit.Weights, got {type(self.attn).__name__}")
        arrs = {name: as_float_array(getattr(self, name), name, ndim=1) for name in _VECTORS}
        arrs["W_1"] = as_float_array(self.W_1, "W_1", ndim=2)
        arrs["W_2"] = as_float_array(self.W_2, "W_2", ndim=2)
        d_model, d_ff = self.attn.d_model, arrs["W_1"].shape[1]
        expected = {"W_1": (d_model, d_ff), "b_1": (d_ff,), "W_2": (d_ff, d_model)}
        for name, arr in arrs.items():
            want = expected.get(name, (d_model,))
            if arr.shape != want:
                raise ValueError(f"{name} has shape {arr.shape} but must be {want}: attention "
                                 f"has d_model = {d_model} and W_1 is {arrs['W_1'].shape}")
        if d_ff == 0:
            raise ValueError("W_1 must have at least one column (d_ff > 0)")
        for name, arr in arrs.items():
            object.__setattr__(self, name, _frozen(arr, arr.dtype))

    @property
    def d_model(self) -> int:
        """Width of a token vector."""
        return self.attn.d_model

    @property
    def d_ff(self) -> int:
        """Width of the feed-forward network's hidden layer."""
        return self.W_1.shape[1]

    def arrays(self) -> dict[str, np.ndarray]:
        """Every trainable array by name, attention's four included (for counting parameters)."""
        names = ("gamma_1", "beta_1", "gamma_2", "beta_2", "W_1", "b_1", "W_2", "b_2")
        attn = {n: getattr(self.attn, n) for n in ("W_Q", "W_K", "W_V", "W_O")}
        return {**attn, **{n: getattr(self, n) for n in names}}

    def __repr__(self) -> str:
        return (f"BlockWeights(heads={self.attn.heads}, d_model={self.d_model}, "
                f"d_k={self.attn.d_k}, d_v={self.attn.d_v}, d_ff={self.d_ff})")


def init_block_weights(dims: Dims | None = None, d_ff: int = 13, seed: int = 0) -> BlockWeights:
    """Random weights of one GPT block. Book: chapter 8, "The weights of a block".

    Attention gets exactly ``init_weights(dims, seed)``, the W of the earlier chapters. A new
    GPT starts with gains 1 and biases 0; here gains are 1 + N(0, 0.1^2) and biases N(0, 0.1^2)
    so that every parameter visibly changes the output. W_1, W_2 are N(0, 1/fan_in).
    """
    dims = Dims() if dims is None else dims
    if isinstance(d_ff, bool) or not isinstance(d_ff, int) or d_ff <= 0:
        raise ValueError(f"d_ff must be a positive integer, got {d_ff!r}")
    attn = init_weights(dims, seed=seed)
    rng = np.random.default_rng([seed, 8])  # chapter 8's own stream, independent of attn
    d = dims.d_model
    gamma_1, gamma_2 = 1 + 0.1 * rng.standard_normal((2, d))  # (d_model,) each
    beta_1, beta_2 = 0.1 * rng.standard_normal((2, d))  # (d_model,) each
    W_1 = rng.standard_normal((d, d_ff)) / np.sqrt(d)  # (d_model, d_ff)
    b_1 = 0.1 * rng.standard_normal(d_ff)  # (d_ff,)
    W_2 = rng.standard_normal((d_ff, d)) / np.sqrt(d_ff)  # (d_ff, d_model)
    b_2 = 0.1 * rng.standard_normal(d)  # (d_model,)
    return BlockWeights(gamma_1=gamma_1, beta_1=beta_1, attn=attn, gamma_2=gamma_2,
                        beta_2=beta_2, W_1=W_1, b_1=b_1, W_2=W_2, b_2=b_2)


def gpt_block(X, B: BlockWeights, pre_ln: bool = True) -> np.ndarray:
    """One GPT decoder block; X is (n, d_model), so is the result. Book: chapter 8, "The block".

    ``pre_ln=True`` is GPT-2's arrangement, layer norm before each sub-layer:
        X' = X + MHA(LN_1(X)),  Z = X' + FFN(LN_2(X')).
    ``pre_ln=False`` is GPT's (and the original transformer's), layer norm after each addition:
        X' = LN_1(X + MHA(X)),  Z = LN_2(X' + FFN(X')).
    """
    if not isinstance(B, BlockWeights):
        raise TypeError(f"B must be mha_lit.BlockWeights, got {type(B).__name__}")
    X = as_float_array(X, "X", ndim=2)
    if X.shape[1] != B.d_model:
        raise ValueError(f"X has {X.shape[1]} columns but the block expects d_model = "
                         f"{B.d_model} (X is {X.shape}, W_1 is {B.W_1.shape})")

    def mha(x):
        return multi_head_attention(x, B.attn, causal=True)  # (n, d_model), mixes rows causally

    def ffn(x):
        return feed_forward(x, B.W_1, B.b_1, B.W_2, B.b_2)  # (n, d_model), row by row

    def ln_1(x):
        return layer_norm(x, B.gamma_1, B.beta_1)  # (n, d_model), row by row

    def ln_2(x):
        return layer_norm(x, B.gamma_2, B.beta_2)  # (n, d_model), row by row

    if pre_ln:
        X_mid = residual(X, lambda x: mha(ln_1(x)))  # (n, d_model)
        return residual(X_mid, lambda x: ffn(ln_2(x)))  # (n, d_model)
    X_mid = ln_1(residual(X, mha))  # (n, d_model)
    return ln_2(residual(X_mid, ffn))  # (n, d_model)
