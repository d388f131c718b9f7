"""Counting a transformer's matmuls: by formula, and by watching them happen.

Book: chapter 9 "The transformer at a glance" (one_hot), chapter 10
"Counting the multiplications" (matmuls_per_attention_layer,
TransformerConfig, PRESETS, param_count, matmul_count, record_matmuls) and
chapter 11 "From counts to time" (forward_flops, attention_crossover,
non_embedding_params) and chapter 12 "Computing it efficiently"
(kv_cache_bytes).

Letters in shape comments and formulas:

    L        layers (decoder blocks)                 n_layers
    n        tokens in the sequence                  seq_len
    d_model  width of a token vector                 d_model
    h        heads per layer                         n_heads
    d_k=d_v  width of one head in GPT models         d_model / h
    d_ff     hidden width of the feed-forward net    4 * d_model in GPT models
    V        vocabulary size                         vocab_size

Counting rules of ``matmul_count`` (chapter 10 states them in words):

1. One matmul is one product of two matrices, whatever its size.
2. A forward pass processes a whole sequence at once (no KV cache).
3. Per layer, attention costs 5 products per head (X W_Q, X W_K, X W_V,
   Q K^T, S V) plus one (Concat W_O); the feed-forward network costs two
   (X W_1, G W_2 with G = GELU(X W_1 + b_1)).
4. The embedding lookup counts as one product (one-hot matrix times the
   embedding matrix), and so does the output layer (final hidden states
   times the transposed embedding).
5. Element-wise work (scaling, masking, softmax, biases, GELU, layer norm,
   residual additions) is not a matrix product and is not counted.
With ``fused=True`` each layer's projections are done as one product for
all heads (X W_QKV), and Q K^T and S V are each one batched product over
the heads.
"""

from __future__ import annotations

import numbers
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod

import numpy as np

from .shapes import Weights

__all__ = [
    "one_hot",
    "matmuls_per_attention_layer",
    "TransformerConfig",
    "PRESETS",
    "PUBLISHED_PARAMS",
    "param_breakdown",
    "param_count",
    "non_embedding_params",
    "kv_cache_bytes",
    "matmul_breakdown",
    "matmul_count",
    "flops_breakdown",
    "forward_flops",
    "attention_crossover",
    "MatmulRecord",
    "MatmulLog",
    "record_matmuls",
    "label_attention_products",
]


def _positive_int(name: str, value) -> int:
    """``value`` as an int, or an error that names it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def one_hot(token_ids, vocab_size: int) -> np.ndarray:
    """The one-hot matrix of ``token_ids``.

    Book: chapter 9, "The embedding as a product". Row i has a single 1, in
    column token_ids[i]; the result is (n, V), so one_hot(ids, V) @ E picks
    the rows E[ids] of an embedding matrix E (V, d_model).
    """
    V = _positive_int("vocab_size", vocab_size)
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError("token_ids must be a 1-D array of integers, "
                         f"got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        raise ValueError(f"token ids must lie in 0 .. {V - 1} for "
                         f"vocab_size = {V}, got {ids.min()} .. {ids.max()}")
    O = np.zeros((ids.size, V))  # (n, V)
    O[np.arange(ids.size), ids] = 1.0  # one 1 per row
    return O


def matmuls_per_attention_layer(heads: int) -> int:
    """5 h + 1: the matrix products of one multi-head attention layer.

    Book: chapter 10. Each head projects X three times (Q, K, V) and
    multiplies twice (Q K^T, S V); the concatenated heads are multiplied by
    W_O once.
    """
    return 5 * _positive_int("heads", heads) + 1


@dataclass(frozen=True)
class TransformerConfig:
    """The sizes of a GPT-style decoder-only transformer. Book: chapter 10.

    Every head has width d_model / n_heads for queries, keys and values (as
    in GPT-2 and GPT-3), so d_model must be divisible by n_heads.
    """

    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    vocab_size: int
    context_length: int

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size",
                     "context_length"):
            object.__setattr__(self, name,
                               _positive_int(name, getattr(self, name)))
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model = {self.d_model} is not divisible by n_heads = "
                f"{self.n_heads}: each head needs d_model / n_heads columns")

    @property
    def d_head(self) -> int:
        """Width of one head's query, key and value: d_model / n_heads."""
        return self.d_model // self.n_heads


def _gpt(n_layers: int, d_model: int, n_heads: int,
         context_length: int) -> TransformerConfig:
    return TransformerConfig(n_layers, d_model, n_heads, 4 * d_model, 50257,
                             context_length)


PRESETS: dict[str, TransformerConfig] = {
    # GPT-2 (Radford et al. 2019, Table 2; heads from the released models):
    # d_ff = 4 d_model.
    "gpt2-small": _gpt(12, 768, 12, 1024),
    "gpt2-medium": _gpt(24, 1024, 16, 1024),
    "gpt2-large": _gpt(36, 1280, 20, 1024),
    "gpt2-xl": _gpt(48, 1600, 25, 1024),
    # GPT-3 (Brown et al. 2020, Table 2.1). Two rows of that table do not fit
    # together: XL has d_model 2048 but 24 heads of 128 (= 3072), and 13B
    # prints d_model 5140 for 40 heads of 128 (= 5120). Here XL keeps
    # d_model 2048 with 16 heads of 128, and 13B uses d_model 5120.
    "gpt3-small": _gpt(12, 768, 12, 2048),
    "gpt3-medium": _gpt(24, 1024, 16, 2048),
    "gpt3-large": _gpt(24, 1536, 16, 2048),
    "gpt3-xl": _gpt(24, 2048, 16, 2048),
    "gpt3-2.7b": _gpt(32, 2560, 32, 2048),
    "gpt3-6.7b": _gpt(32, 4096, 32, 2048),
    "gpt3-13b": _gpt(40, 5120, 40, 2048),
    "gpt3-175b": _gpt(96, 12288, 96, 2048),
}

# Published parameter counts: GPT-2 from its model card (the paper's Table 2
# gives smaller figures, 117M ... 1542M), GPT-3 from Brown et al. 2020,
# Table 2.1.
PUBLISHED_PARAMS: dict[str, float] = {
    "gpt2-small": 124e6, "gpt2-medium": 355e6,
    "gpt2-large": 774e6, "gpt2-xl": 1.5e9,
    "gpt3-small": 125e6, "gpt3-medium": 350e6,
    "gpt3-large": 760e6, "gpt3-xl": 1.3e9,
    "gpt3-2.7b": 2.7e9, "gpt3-6.7b": 6.7e9,
    "gpt3-13b": 13.0e9, "gpt3-175b": 175.0e9,
}


def _check_config(cfg) -> TransformerConfig:
    if not isinstance(cfg, TransformerConfig):
        raise TypeError(
            f"expected a TransformerConfig, got {type(cfg).__name__}")
    return cfg


def param_breakdown(cfg: TransformerConfig,
                    tied: bool = True) -> dict[str, int]:
    """Trainable parameters of a GPT-2/GPT-3 model by component.

    Book: chapter 10. Token embedding V x d_model, learned positions
    n_ctx x d_model; per layer W_Q, W_K, W_V, W_O with biases, W_1, b_1,
    W_2, b_2, and two layer norms; one final layer norm. With ``tied`` (as
    in GPT-2's released weights) the output layer reuses the token
    embedding; ``tied=False`` adds an output matrix d_model x V of its own.
    """
    c = _check_config(cfg)
    L, d, f = c.n_layers, c.d_model, c.d_ff
    untied = {} if tied else {"output layer (untied)": d * c.vocab_size}
    return {
        "token embedding": c.vocab_size * d,
        "position embedding": c.context_length * d,
        "attention (W_Q, W_K, W_V, W_O, biases)": L * (4 * d * d + 4 * d),
        "feed-forward (W_1, b_1, W_2, b_2)": L * (2 * d * f + f + d),
        "layer norms": L * 4 * d + 2 * d,
        **untied,
    }


def param_count(cfg: TransformerConfig, tied: bool = True) -> int:
    """Total trainable parameters; ``tied``: output layer reuses the embedding.

    Book: chapter 10.
    """
    return sum(param_breakdown(cfg, tied).values())


def non_embedding_params(cfg: TransformerConfig) -> int:
    """N of Kaplan et al.: 12 L d_model^2, the weights outside the embeddings.

    Book: chapter 11. Biases and layer norms are left out, as in their
    approximation (they are under 0.1 % of N for GPT models).
    """
    c = _check_config(cfg)
    return 2 * c.n_layers * c.d_model * (2 * c.d_model + c.d_ff)


def kv_cache_bytes(cfg: TransformerConfig, tokens: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Bytes of one sequence's KV cache: 2 L h d_head per token.

    Book: chapter 12, "Why a KV-cache step is bound by memory". Every layer
    keeps a key and a value row of width h d_head = d_model per token; the
    default of 2 bytes per value is fp16/bf16, as models are served.
    """
    c = _check_config(cfg)
    n = _positive_int("tokens", tokens)
    b = _positive_int("bytes_per_value", bytes_per_value)
    return 2 * c.n_layers * c.n_heads * c.d_head * n * b


def matmul_breakdown(cfg: TransformerConfig,
                     fused: bool = False) -> dict[str, int]:
    """Matrix products of one forward pass by component.

    Book: chapter 10. Counted by the module's rules 1-5. ``fused=False``
    counts one product per head as the book computes them; ``fused=True``
    counts X W_QKV once per layer and Q K^T, S V as one batched product
    each.
    """
    c = _check_config(cfg)
    L, h = c.n_layers, c.n_heads
    per_layer = {"Q, K, V projections": 1 if fused else 3 * h,
                 "Q K^T": 1 if fused else h, "S V": 1 if fused else h,
                 "output projection W_O": 1, "feed-forward W_1, W_2": 2}
    return {"embedding": 1, **{k: L * v for k, v in per_layer.items()},
            "output layer": 1}


def matmul_count(cfg: TransformerConfig, fused: bool = False) -> int:
    """Matrix products in one forward pass: L (5h + 3) + 2, or 6 L + 2 fused.

    Book: chapter 10.
    """
    return sum(matmul_breakdown(cfg, fused).values())


def flops_breakdown(cfg: TransformerConfig, seq_len: int) -> dict[str, int]:
    """Floating-point operations of one forward pass, by component.

    Book: chapter 11. A multiply-add counts as 2 operations. All n x n
    scores are computed (no causal skipping), the embedding is a lookup
    (0 FLOPs), element-wise work is not counted.
    """
    c = _check_config(cfg)
    n = _positive_int("seq_len", seq_len)
    L, d, h, dh, f = c.n_layers, c.d_model, c.n_heads, c.d_head, c.d_ff
    return {
        # 3h products (n, d) @ (d, d_head)
        "Q, K, V projections": L * 2 * n * d * 3 * h * dh,
        # h products (n, d_head) @ (d_head, n)
        "Q K^T": L * 2 * h * n * dh * n,
        # h products (n, n) @ (n, d_head)
        "S V": L * 2 * h * n * n * dh,
        # (n, h d_head) @ (h d_head, d)
        "output projection W_O": L * 2 * n * h * dh * d,
        # (n, d) @ (d, d_ff), (n, d_ff) @ (d_ff, d)
        "feed-forward W_1, W_2": L * 2 * 2 * n * d * f,
        # (n, d) @ (d, V)
        "output layer": 2 * n * d * c.vocab_size,
    }


def forward_flops(cfg: TransformerConfig, seq_len: int) -> int:
    """FLOPs of one forward pass over ``seq_len`` tokens. Book: chapter 11."""
    return sum(flops_breakdown(cfg, seq_len).values())


def attention_crossover(cfg: TransformerConfig,
                        include_ffn: bool = False) -> float:
    """Sequence length at which attention's n^2 FLOPs equal the projections'.

    Book: chapter 11. Q K^T and S V grow as n^2; the projections (and,
    with ``include_ffn``, the feed-forward network) grow as n; they are
    equal at n = linear / quadratic coefficient. For GPT shapes this is
    2 d_model (6 d_model with the FFN).
    """
    c = _check_config(cfg)
    one = flops_breakdown(c, 1)
    quadratic = one["Q K^T"] + one["S V"]  # coefficient of n^2
    linear = (one["Q, K, V projections"]
              + one["output projection W_O"])  # coefficient of n
    if include_ffn:
        linear += one["feed-forward W_1, W_2"]
    return linear / quadratic


# --- watching the products happen ------------------------------------------


@dataclass(frozen=True)
class MatmulRecord:
    """One observed matrix product.

    Its shapes, its multiply-adds and where its right operand lives.
    """

    a_shape: tuple
    b_shape: tuple
    out_shape: tuple
    # 2-D products in this call: the batch size of a batched matmul
    products: int
    multiply_adds: int
    b_address: int
    b_transposed: bool


@dataclass
class MatmulLog:
    """Every matrix product computed from a tracked array. Book: chapter 10.

    ``track(X)`` returns X as an array that records each ``@`` /
    ``np.matmul`` it takes part in, and passes the tracking on to every
    array computed from it. The values are computed by NumPy exactly as
    without tracking. Tracking follows values through expressions; a value
    written into an untracked buffer (``buf[...] = tracked``) leaves the
    log's sight, so count code that computes by expressions, as
    ``multi_head_attention_reference`` does.
    """

    records: list = field(default_factory=list)
    active: bool = True

    def track(self, a) -> np.ndarray:
        """``a`` as a tracked array whose products go into this log.

        The tracked array is a view, no copy.
        """
        t = np.asanyarray(a).view(_Tracked)
        t._log = self
        return t

    def __len__(self) -> int:
        return len(self.records)

    @property
    def calls(self) -> int:
        """Number of matmul calls."""
        return len(self.records)

    @property
    def products(self) -> int:
        """Number of 2-D matrix products.

        A batched call over h heads counts h.
        """
        return sum(r.products for r in self.records)

    @property
    def multiply_adds(self) -> int:
        """Total multiply-adds of all recorded products."""
        return sum(r.multiply_adds for r in self.records)

    def _add(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        if not self.active or a.ndim < 2 or b.ndim < 2:
            return  # vector products are not matrix products
        # heads, if batched
        batch = prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        transposed = b.strides[-2] < b.strides[-1]  # a K.T-like view
        self.records.append(MatmulRecord(
            a.shape, b.shape, out.shape, batch, batch * n * k * m,
            b.__array_interface__["data"][0], bool(transposed)))


def _plain(x):
    """Strip tracking from an array (or the arrays inside a list/tuple)."""
    if isinstance(x, _Tracked):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


class _Tracked(np.ndarray):
    """An ndarray that reports its matrix products to a MatmulLog.

    See MatmulLog.track.
    """

    _log: MatmulLog | None = None

    def __array_finalize__(self, obj) -> None:
        self._log = getattr(obj, "_log", None)

    def _wrap(self, result):
        if isinstance(result, np.ndarray) and not isinstance(result, _Tracked):
            result = result.view(_Tracked)
            result._log = self._log
        elif isinstance(result, tuple):
            result = tuple(self._wrap(r) for r in result)
        return result

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [_plain(x) for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = _plain(kwargs["out"])
        # the value NumPy computes anyway
        result = getattr(ufunc, method)(*plain, **kwargs)
        if (ufunc is np.matmul and method == "__call__"
                and self._log is not None):
            self._log._add(np.asarray(plain[0]), np.asarray(plain[1]),
                           np.asarray(result))
        return self._wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        if func in _UNWATCHED_PRODUCTS:
            raise TypeError(
                "record_matmuls watches @ and np.matmul only, but "
                f"np.{func.__name__} was called on a tracked array; "
                "its products would go uncounted")
        result = func(*_plain(list(args)),
                      **{k: _plain(v) for k, v in kwargs.items()})
        return self._wrap(result)  # e.g. np.concatenate, np.where


_UNWATCHED_PRODUCTS = (np.dot, np.einsum, np.tensordot, np.inner, np.vdot,
                       np.linalg.multi_dot)


@contextmanager
def record_matmuls():
    """Record the matrix products computed inside a ``with`` block.

    Book: chapter 10. ``with record_matmuls() as log: f(log.track(X), ...)``
    records f's matrix products. Recording stops when the block ends.
    """
    log = MatmulLog()
    try:
        yield log
    finally:
        log.active = False


def label_attention_products(log: MatmulLog,
                             W: Weights) -> list[tuple[int, str]]:
    """(head, name) of every product ``multi_head_attention_reference`` made.

    Book: chapter 10. A projection is recognised by its right operand being
    W_Q[i], W_K[i], W_V[i] (same memory), the output projection by W_O
    (head 0 means "all heads"); Q K^T by a transposed right operand and S V
    otherwise, both in the head of the latest projection.
    """
    weights = {W.W_O.__array_interface__["data"][0]: (0, "Concat W_O")}
    for i in range(W.heads):
        for letter, stack in (("Q", W.W_Q), ("K", W.W_K), ("V", W.W_V)):
            weights[stack[i].__array_interface__["data"][0]] = (
                i + 1, f"X W_{letter}")
    labels, head = [], 0
    for r in log.records:
        if r.b_address in weights:
            head, name = weights[r.b_address]
        else:
            name = "Q K^T" if r.b_transposed else "S V"
        labels.append((head, name))
    return labels
