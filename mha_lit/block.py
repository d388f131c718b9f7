"""The GPT decoder block: layer norm, GELU, feed-forward network, residuals.

Book: Part I, chapter 8 "Closing: the GPT block". Lines stay under 77
characters so that the book can show them whole.

Letters in shape comments (see ``mha_lit.shapes`` for the others):

    n        tokens (rows of X)                         3 in the book
    d_model  width of a token vector                    5
    d_ff     hidden width of the feed-forward network   17 (GPT: 4 d_model)

Every function here except multi-head attention works on each row of X
by itself; that is why the block stays causal (row t of the output
depends on rows 1..t of the input only).

With attention biases (``init_block_weights(..., attn_biases=True)``, or
GPT-2's own arrays through ``gpt2_attention_weights``) the pre-LN block
is GPT-2's block at inference, up to rounding: chapter 8, "GPT-2's
block, exactly". In training GPT-2 also applies ``dropout``, which at
inference is the identity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .checks import float_array, positive_int, token_rows
from .fast import multi_head_attention
from .shapes import Dims, Weights, init_weights, read_only_copy

__all__ = [
    "layer_norm",
    "gelu",
    "feed_forward",
    "residual",
    "dropout",
    "BlockWeights",
    "init_block_weights",
    "gpt_block",
    "gpt2_attention_weights",
]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# NumPy has no erf: the standard library's, entry by entry (float64).
_erf = np.vectorize(math.erf, otypes=[np.float64])


def layer_norm(X, gamma, beta, eps: float = 1e-5) -> np.ndarray:
    """Layer norm of each row of X. Book: chapter 8, "Layer norm".

    LN(x) = gamma (x - mean) / sqrt(var + eps) + beta. X is (n, d_model);
    gamma and beta are (d_model,). Mean and (population) variance are
    taken over each row's d_model entries, never across rows; GPT-2 uses
    eps = 1e-5.
    """
    X = float_array(X, "X", ndim=2)
    d_model = X.shape[1]
    gamma = float_array(gamma, "gamma", ndim=1)
    beta = float_array(beta, "beta", ndim=1)
    if gamma.shape != (d_model,) or beta.shape != (d_model,):
        raise ValueError(
            f"X is {X.shape} so gamma and beta must be ({d_model},), "
            f"got gamma {gamma.shape} and beta {beta.shape}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return layer_norm_rows(X, gamma, beta, eps)


def layer_norm_rows(X, gamma, beta, eps: float = 1e-5) -> np.ndarray:
    """LN(x) of each row of X, the formula. Book: chapter 8, "Layer norm".

    ``layer_norm`` checks its arguments and then calls this; callers
    whose arrays are already checked (the decoder) call it directly.
    """
    mu = X.mean(axis=1, keepdims=True)  # (n, 1) one mean per row
    var = ((X - mu) ** 2).mean(axis=1, keepdims=True)  # (n, 1)
    X_hat = (X - mu) / np.sqrt(var + eps)  # (n, d_model) mean 0, var ~1
    return gamma * X_hat + beta  # (n, d_model)


def gelu(x, approximate: bool = True) -> np.ndarray:
    """GELU(x) = x Phi(x), elementwise. Book: chapter 8, "GELU".

    ``approximate=True``: the tanh formula GPT and GPT-2 use,
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    ``approximate=False``: exact, 0.5 x (1 + erf(x / sqrt(2))).
    """
    x = float_array(x, "x")
    return gelu_values(x, approximate)


def gelu_values(x: np.ndarray, approximate: bool = True) -> np.ndarray:
    """GELU of every entry of x, the formula. Book: chapter 8, "GELU".

    ``gelu`` checks x and then calls this. The tanh form is built in one
    buffer, one operation per line: no temporary array per step.
    """
    if approximate:
        # zeta = sqrt(2/pi) (x + 0.044715 x^3), as x (1 + 0.044715 x^2)
        inner = np.multiply(x, x, out=np.empty_like(x))  # x^2, shape of x
        inner *= 0.044715  # 0.044715 x^2
        inner += 1.0  # 1 + 0.044715 x^2
        inner *= x  # x + 0.044715 x^3
        inner *= _SQRT_2_OVER_PI  # zeta
        np.tanh(inner, out=inner)  # tanh(zeta)
        inner += 1.0  # 1 + tanh(zeta)
        inner *= x  # x (1 + tanh(zeta))
        inner *= 0.5  # 0.5 x (1 + tanh(zeta))
        return inner
    erf = _erf(x / math.sqrt(2.0)).astype(x.dtype)  # shape of x
    return 0.5 * x * (1.0 + erf)  # shape of x


def feed_forward(X, W_1, b_1, W_2, b_2) -> np.ndarray:
    """FFN(X) = GELU(X W_1 + b_1) W_2 + b_2, row by row.

    Book: chapter 8, "The feed-forward network".

    X (n, d_model), W_1 (d_model, d_ff), b_1 (d_ff,), W_2 (d_ff, d_model),
    b_2 (d_model,); the result is (n, d_model).
    """
    X = float_array(X, "X", ndim=2)
    W_1 = float_array(W_1, "W_1", ndim=2)
    W_2 = float_array(W_2, "W_2", ndim=2)
    b_1 = float_array(b_1, "b_1", ndim=1)
    b_2 = float_array(b_2, "b_2", ndim=1)
    d_model, d_ff = W_1.shape
    if X.shape[1] != d_model:
        raise ValueError(
            f"X has {X.shape[1]} columns but W_1 is {W_1.shape}: X W_1 "
            f"needs d_model = {d_model} columns (X is {X.shape})")
    want = [(d_ff,), (d_ff, d_model), (d_model,)]
    if [b_1.shape, W_2.shape, b_2.shape] != want:
        raise ValueError(
            f"W_1 is {W_1.shape} (d_model = {d_model}, d_ff = {d_ff}) so "
            f"b_1, W_2, b_2 must be {want[0]}, {want[1]}, {want[2]}; "
            f"got {b_1.shape}, {W_2.shape}, {b_2.shape}")
    return feed_forward_rows(X, W_1, b_1, W_2, b_2)


def feed_forward_rows(X, W_1, b_1, W_2, b_2) -> np.ndarray:
    """FFN of each row of X, the formula. Book: chapter 8.

    ``feed_forward`` checks the shapes and then calls this; the decoder,
    whose arrays are checked once, calls it directly.
    """
    hidden = gelu_values(X @ W_1 + b_1)  # X W_1 is (n, d_ff)
    return hidden @ W_2 + b_2  # (n, d_ff) @ (d_ff, d_model) -> (n, d_model)


def residual(X, sublayer) -> np.ndarray:
    """X + sublayer(X). Book: chapter 8, "Residual connections".

    ``sublayer`` must map an (n, d_model) array to one of the same shape.
    """
    X = float_array(X, "X", ndim=2)
    F = np.asarray(sublayer(X))  # (n, d_model)
    if F.shape != X.shape:
        raise ValueError(
            f"a residual connection adds sublayer(X) to X, but X is "
            f"{X.shape} and sublayer(X) is {F.shape}")
    return X + F  # (n, d_model)


def dropout(X, p: float, rng: np.random.Generator) -> np.ndarray:
    """Inverted dropout of X, for training.

    Book: chapter 8, "Dropout: in training only".

    Each entry is kept with probability 1 - p and then divided by 1 - p,
    or set to 0 with probability p, independently; so every entry keeps
    its expected value. p = 0 returns a copy of X. At inference a model
    does not call this at all: there dropout is the identity.
    """
    X = float_array(X, "X")
    if isinstance(p, bool) or not isinstance(p, int | float | np.floating):
        raise TypeError(f"p must be a number in [0, 1), got {p!r}")
    if not 0 <= p < 1:  # p = 1 would divide by 0; NaN fails too
        raise ValueError(f"p must be in [0, 1) (the probability of "
                         f"dropping an entry), got {p}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator, got "
                        f"{type(rng).__name__}")
    if p == 0:
        return X.copy()  # nothing dropped, nothing rescaled
    keep = rng.random(X.shape) >= p  # shape of X: True with prob. 1 - p
    return X * keep / (1 - p)  # shape of X, dtype of X


_VECTORS = ("gamma_1", "beta_1", "gamma_2", "beta_2", "b_1", "b_2")


@dataclass(frozen=True, eq=False)
class BlockWeights:
    """Every trainable array of one GPT block.

    Book: chapter 8, "The weights of a block". Shapes (book's sizes):

        gamma_1, beta_1  (d_model,)         layer norm 1, at attention  (5,)
        attn             Weights            chapter 4; W_O is (22, 5)
        gamma_2, beta_2  (d_model,)         layer norm 2, at the FFN    (5,)
        W_1, b_1         (d_model, d_ff), (d_ff,)           (5, 17), (17,)
        W_2, b_2         (d_ff, d_model), (d_model,)        (17, 5), (5,)

    ``attn`` may carry attention biases b_Q, b_K, b_V, b_O, as GPT-2's
    block does (chapter 8, "GPT-2's block, exactly"). Every shape is
    checked on construction; arrays become private read-only copies.
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
            raise TypeError("attn must be mha_lit.Weights, got "
                            f"{type(self.attn).__name__}")
        arrs = {name: float_array(getattr(self, name), name, ndim=1)
                for name in _VECTORS}
        arrs["W_1"] = float_array(self.W_1, "W_1", ndim=2)
        arrs["W_2"] = float_array(self.W_2, "W_2", ndim=2)
        d_model, d_ff = self.attn.d_model, arrs["W_1"].shape[1]
        expected = {"W_1": (d_model, d_ff), "b_1": (d_ff,),
                    "W_2": (d_ff, d_model)}
        for name, arr in arrs.items():
            want = expected.get(name, (d_model,))
            if arr.shape != want:
                raise ValueError(
                    f"{name} has shape {arr.shape} but must be {want}: "
                    f"attention has d_model = {d_model} and W_1 is "
                    f"{arrs['W_1'].shape}")
        if d_ff == 0:
            raise ValueError("W_1 needs at least one column (d_ff > 0)")
        for name, arr in arrs.items():
            object.__setattr__(self, name, read_only_copy(arr, arr.dtype))

    @property
    def d_model(self) -> int:
        """Width of a token vector."""
        return self.attn.d_model

    @property
    def d_ff(self) -> int:
        """Hidden width of the feed-forward network."""
        return self.W_1.shape[1]

    def arrays(self) -> dict[str, np.ndarray]:
        """Every trainable array by name, attention's included.

        Attention's are W_Q, W_K, W_V, W_O and, if it has them, its
        biases b_Q, b_K, b_V, b_O (chapter 8, "GPT-2's block, exactly").
        """
        names = ("gamma_1", "beta_1", "gamma_2", "beta_2",
                 "W_1", "b_1", "W_2", "b_2")
        return {**self.attn.arrays(),
                **{n: getattr(self, n) for n in names}}

    @cached_property
    def transposed_ffn(self) -> tuple[np.ndarray, np.ndarray]:
        """W_1^T (d_ff, d_model) and W_2^T (d_model, d_ff), C-contiguous.

        Book: chapter 12, "Prefill, then one token at a time": the layout
        ``fast.few_rows_product`` reads a decoding step's weights in. Made
        once and kept on the block (its arrays are read-only).
        """
        kept = (np.ascontiguousarray(self.W_1.T),  # (d_ff, d_model)
                np.ascontiguousarray(self.W_2.T))  # (d_model, d_ff)
        for a in kept:
            a.flags.writeable = False
        return kept

    def __repr__(self) -> str:
        a = self.attn
        return (f"BlockWeights(heads={a.heads}, d_model={self.d_model}, "
                f"d_k={a.d_k}, d_v={a.d_v}, d_ff={self.d_ff})")


def init_block_weights(dims: Dims | None = None, d_ff: int = 17,
                       seed: int = 0, *, attn_biases: bool = False,
                       dtype=np.float64) -> BlockWeights:
    """Random weights of one GPT block.

    Book: chapter 8, "The weights of a block".

    Attention gets exactly ``init_weights(dims, seed)``, the W of the
    earlier chapters; every other array comes from
    ``default_rng([seed, 8])``, a second stream derived from the seed.
    A new GPT starts with gains 1 and biases 0; here gains are
    1 + N(0, 0.1^2) and biases N(0, 0.1^2), so that every parameter
    changes the output. W_1 and W_2 are N(0, 1/fan_in).
    ``attn_biases=True`` gives attention GPT-2's biases too (chapter 8,
    "GPT-2's block, exactly"); nothing else changes. ``dtype`` is the
    float type of every array (float32 for the benchmarks of chapter 12).
    """
    dims = Dims() if dims is None else dims
    d_ff = positive_int(d_ff, "d_ff")
    attn = init_weights(dims, seed=seed, biases=attn_biases, dtype=dtype)
    rng = np.random.default_rng([seed, 8])  # independent of attn's stream
    d = dims.d_model
    gamma_1, gamma_2 = 1 + 0.1 * rng.standard_normal((2, d))  # (d,) each
    beta_1, beta_2 = 0.1 * rng.standard_normal((2, d))  # (d,) each
    W_1 = rng.standard_normal((d, d_ff)) / np.sqrt(d)  # (d_model, d_ff)
    b_1 = 0.1 * rng.standard_normal(d_ff)  # (d_ff,)
    W_2 = rng.standard_normal((d_ff, d)) / np.sqrt(d_ff)  # (d_ff, d_model)
    b_2 = 0.1 * rng.standard_normal(d)  # (d_model,)
    arrays = {"gamma_1": gamma_1, "beta_1": beta_1, "gamma_2": gamma_2,
              "beta_2": beta_2, "W_1": W_1, "b_1": b_1, "W_2": W_2,
              "b_2": b_2}
    return BlockWeights(attn=attn, **{k: v.astype(dtype)
                                      for k, v in arrays.items()})


def gpt_block(X, theta: BlockWeights, pre_ln: bool = True) -> np.ndarray:
    """One GPT decoder block, (n, d_model) -> (n, d_model).

    Book: chapter 8, "The block". ``pre_ln=True``, GPT-2's arrangement:
        X' = X + MHA(LN_1(X)),     X'' = X' + FFN(LN_2(X')).
    ``pre_ln=False``, GPT's (and the original transformer's):
        X' = LN_1(X + MHA(X)),     X'' = LN_2(X' + FFN(X')).
    ``theta`` holds every weight of the block (the book's theta).
    With attention biases in ``theta.attn``, ``pre_ln=True`` is GPT-2's
    block at inference, up to rounding: no dropout, which at inference is
    the identity (chapter 8, "GPT-2's block, exactly").
    """
    if not isinstance(theta, BlockWeights):
        raise TypeError("theta must be mha_lit.BlockWeights, got "
                        f"{type(theta).__name__}")
    X = token_rows(X, theta.d_model, against="the block",
                   also=f"W_1 is {theta.W_1.shape}")

    def mha(x):  # (n, d_model), mixes rows, causally
        return multi_head_attention(x, theta.attn, causal=True)

    def ffn(x):  # (n, d_model), row by row
        return feed_forward(x, theta.W_1, theta.b_1, theta.W_2, theta.b_2)

    def ln_1(x):  # (n, d_model), row by row
        return layer_norm(x, theta.gamma_1, theta.beta_1)

    def ln_2(x):  # (n, d_model), row by row
        return layer_norm(x, theta.gamma_2, theta.beta_2)

    if pre_ln:
        X_mid = residual(X, lambda x: mha(ln_1(x)))  # (n, d_model)
        return residual(X_mid, lambda x: ffn(ln_2(x)))  # (n, d_model)
    X_mid = ln_1(residual(X, mha))  # (n, d_model)
    return ln_2(residual(X_mid, ffn))  # (n, d_model)


def gpt2_attention_weights(c_attn_w, c_attn_b, c_proj_w, c_proj_b,
                           heads: int) -> Weights:
    """GPT-2's fused attention arrays as Weights, biases included.

    Book: chapter 8, "GPT-2's block, exactly". GPT-2 computes
    x @ c_attn_w + c_attn_b, (d_model,) -> (3 d_model,), splits it into
    q, k, v of d_model columns each, and each of those into ``heads``
    heads of d_head = d_model / heads consecutive columns. Counting heads
    and columns from 0, as Python does, head i of q is columns
    i d_head .. (i+1) d_head - 1, so W_Q[i] is those columns of
    c_attn_w and b_Q[i] those entries of c_attn_b (k, v: shifted by
    d_model, 2 d_model). The merged heads are Concat; c_proj_w (d_model,
    d_model) is W_O and c_proj_b is b_O.
    """
    c_attn_w, c_attn_b, c_proj_w, c_proj_b = _check_gpt2_attention(
        c_attn_w, c_attn_b, c_proj_w, c_proj_b, heads)
    d = c_attn_w.shape[0]  # d_model
    d_head = d // heads
    # column s d + i d_head + j: part s (q, k, v), head i, entry j
    W = c_attn_w.reshape(d, 3, heads, d_head)  # (d_model, 3, h, d_head)
    W = W.transpose(1, 2, 0, 3)  # (3, h, d_model, d_head)
    b = c_attn_b.reshape(3, heads, d_head)  # (3, h, d_head)
    return Weights(W_Q=W[0], W_K=W[1], W_V=W[2], W_O=c_proj_w,
                   b_Q=b[0], b_K=b[1], b_V=b[2], b_O=c_proj_b)


def _check_gpt2_attention(c_attn_w, c_attn_b, c_proj_w, c_proj_b,
                          heads) -> tuple[np.ndarray, ...]:
    """The four GPT-2 arrays as float arrays, or an error naming shapes.

    Book: chapter 8, "GPT-2's block, exactly".
    """
    heads = positive_int(heads, "heads")
    c_attn_w = float_array(c_attn_w, "c_attn_w", ndim=2)
    d = c_attn_w.shape[0]  # d_model
    if c_attn_w.shape != (d, 3 * d):
        raise ValueError(
            f"c_attn_w has shape {c_attn_w.shape} but must be (d_model, "
            f"3 * d_model) = {(d, 3 * d)}: q, k, v side by side")
    if d % heads:
        raise ValueError(
            f"d_model = {d} is not divisible by heads = {heads}: each "
            "head needs d_model / heads columns")
    out = [c_attn_w]
    for name, a, want in (("c_attn_b", c_attn_b, (3 * d,)),
                          ("c_proj_w", c_proj_w, (d, d)),
                          ("c_proj_b", c_proj_b, (d,))):
        a = float_array(a, name)  # should be want
        if a.shape != want:
            raise ValueError(f"{name} has shape {a.shape} but must be "
                             f"{want}: c_attn_w is {c_attn_w.shape}, so "
                             f"d_model = {d}")
        out.append(a)
    return tuple(out)
