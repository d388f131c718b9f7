"""Counting a transformer's matmuls: by formula, and by watching them happen.

Book: chapter 9 "The transformer at a glance" (one_hot), chapter 10
"Counting the multiplications" (matmuls_per_attention_layer,
TransformerConfig, PRESETS, param_count, matmul_count, record_matmuls) and
chapter 11 "From counts to time" (forward_flops, attention_crossover,
non_embedding_params), chapter 12 "Computing it efficiently"
(kv_cache_bytes) and Part III, chapter 18 "What the cache costs, model by
model" (DecoderConfig, LatentKV, MoE, MODELS, kv_values_per_token,
kv_ratio_to_mha, decoder_param_breakdown, active_param_count,
sequences_that_fit).

Letters in shape comments and formulas:

    L        layers (decoder blocks)                 n_layers
    n        tokens in the sequence                  seq_len
    d_model  width of a token vector                 d_model
    h        heads per layer                         n_heads
    d_k=d_v  width of one head in GPT models         d_model / h
    d_ff     hidden width of the feed-forward net    4 * d_model in GPT models
    V        vocabulary size                         vocab_size
    h_kv     key/value heads (chapter 14)            n_kv_heads
    d_c      width of MLA's cached latent (ch. 17)   LatentKV.d_c
    d_r      width of MLA's shared RoPE key          LatentKV.d_r
    s        bytes per number (2 in bf16)            bytes_per_value

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
from fractions import Fraction
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
    "LatentKV",
    "MoE",
    "DecoderConfig",
    "PublishedModel",
    "MODELS",
    "kv_values_per_token",
    "kv_ratio_to_mha",
    "decoder_param_breakdown",
    "active_param_count",
    "sequences_that_fit",
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
        self._check_sizes()
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model = {self.d_model} is not divisible by n_heads = "
                f"{self.n_heads}: each head needs d_model / n_heads columns")

    def _check_sizes(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size",
                     "context_length"):
            object.__setattr__(self, name,
                               _positive_int(name, getattr(self, name)))

    @property
    def d_head(self) -> int:
        """Width of one head's query, key and value: d_model / n_heads."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads h_kv: every head has its own (multi-head)."""
        return self.n_heads

    @property
    def attention_kind(self) -> str:
        """Multi-head attention, "MHA": one key and value per head."""
        return "MHA"

    @property
    def ffn_kind(self) -> str:
        """GPT's feed-forward net, "GELU": GELU(X W_1 + b_1) W_2 + b_2."""
        return "GELU"


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


def _check_gpt(cfg, what: str) -> TransformerConfig:
    """``cfg`` if it describes a GPT block; ``what`` names the caller."""
    c = _check_config(cfg)
    if isinstance(c, DecoderConfig):
        raise TypeError(
            f"{what} counts the GPT block of chapters 10-11 (every head "
            "d_model / n_heads wide, its own keys and values, a GELU "
            "feed-forward net); a DecoderConfig has another block")
    return c


def param_breakdown(cfg: TransformerConfig,
                    tied: bool | None = None) -> dict[str, int]:
    """Trainable parameters of a GPT-2/GPT-3 model by component.

    Book: chapter 10. Token embedding V x d_model, learned positions
    n_ctx x d_model; per layer W_Q, W_K, W_V, W_O with biases, W_1, b_1,
    W_2, b_2, and two layer norms; one final layer norm. With ``tied`` (as
    in GPT-2's released weights; None means True here) the output layer
    reuses the token embedding; ``tied=False`` adds an output matrix
    d_model x V of its own.
    """
    c = _check_config(cfg)
    if isinstance(c, DecoderConfig):  # another block: chapter 18
        return decoder_param_breakdown(c, bool(tied))
    tied = True if tied is None else tied
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


def param_count(cfg: TransformerConfig, tied: bool | None = None) -> int:
    """Total trainable parameters; ``tied``: output layer reuses the embedding.

    Book: chapter 10 (and chapter 18 for a ``DecoderConfig``). ``tied``
    None: as the configuration's kind of model is published, tied for GPT,
    untied for a DecoderConfig.
    """
    return sum(param_breakdown(cfg, tied).values())


def non_embedding_params(cfg: TransformerConfig) -> int:
    """N of Kaplan et al.: 12 L d_model^2, the weights outside the embeddings.

    Book: chapter 11. Biases and layer norms are left out, as in their
    approximation (they are under 0.1 % of N for GPT models).
    """
    c = _check_gpt(cfg, "non_embedding_params")
    return 2 * c.n_layers * c.d_model * (2 * c.d_model + c.d_ff)


def kv_cache_bytes(cfg: TransformerConfig, tokens: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Bytes of one sequence's KV cache: 2 L h d_head per token.

    Book: chapter 12, "Why a KV-cache step is bound by memory". Every layer
    keeps a key and a value row of width h d_head = d_model per token; the
    default of 2 bytes per value is fp16/bf16, as models are served.
    Chapter 18: in general ``kv_values_per_token(cfg)`` numbers per token
    (fewer with grouped or latent keys and values), and a sliding window of
    w keys holds at most w tokens, however many the sequence has.
    """
    c = _check_config(cfg)
    n = _positive_int("tokens", tokens)
    b = _positive_int("bytes_per_value", bytes_per_value)
    if isinstance(c, DecoderConfig):  # grouped or latent, a window: ch. 18
        return kv_values_per_token(c) * min(n, c.window or n) * b
    return 2 * c.n_layers * c.n_heads * c.d_head * n * b


def matmul_breakdown(cfg: TransformerConfig,
                     fused: bool = False) -> dict[str, int]:
    """Matrix products of one forward pass by component.

    Book: chapter 10. Counted by the module's rules 1-5. ``fused=False``
    counts one product per head as the book computes them; ``fused=True``
    counts X W_QKV once per layer and Q K^T, S V as one batched product
    each.
    """
    c = _check_gpt(cfg, "matmul_breakdown")
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
    c = _check_gpt(cfg, "flops_breakdown")
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
    c = _check_gpt(cfg, "attention_crossover")
    one = flops_breakdown(c, 1)
    quadratic = one["Q K^T"] + one["S V"]  # coefficient of n^2
    linear = (one["Q, K, V projections"]
              + one["output projection W_O"])  # coefficient of n
    if include_ffn:
        linear += one["feed-forward W_1, W_2"]
    return linear / quadratic


# --- Part III, chapter 18: what the cache costs, model by model -------------


@dataclass(frozen=True)
class LatentKV:
    """Sizes of multi-head latent attention (MLA). Book: chapters 17, 18.

    Per token and layer MLA caches one latent c (``d_c`` numbers), from
    which every head's key and value are recomputed, and one RoPE key
    (``d_r`` numbers) shared by all heads (DeepSeek-V2 and V3). Queries
    pass through a latent of their own, ``d_cq`` wide (d_c' in DeepSeek's
    papers; None: projected from X directly). Layer weights: W_DQ
    (d_model, d_cq), W_UQ (d_cq, h (d_head + d_r)), W_DKV (d_model, d_c),
    W_KR (d_model, d_r), W_UK and W_UV (d_c, h d_head), W_O (h d_head,
    d_model), and an RMSNorm scale on each latent.
    """

    d_c: int
    d_r: int
    d_cq: int | None = None

    def __post_init__(self) -> None:
        for name in ("d_c", "d_r"):
            object.__setattr__(self, name,
                               _positive_int(name, getattr(self, name)))
        if self.d_cq is not None:
            object.__setattr__(self, "d_cq", _positive_int("d_cq", self.d_cq))


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts feed-forward layout. Book: chapter 18.

    The first ``first_dense`` layers keep a dense feed-forward net of width
    d_ff; every later layer has ``n_shared`` experts that see every token
    and ``n_routed`` experts of which a router (a d_model x n_routed
    matrix) picks ``n_active`` per token. Every expert is a SwiGLU net of
    hidden width ``d_expert``. ``router_bias``: the router also holds one
    number per routed expert, added to the scores only to choose the
    experts (DeepSeek-V3's balancing without an auxiliary loss).
    """

    n_routed: int
    n_active: int
    d_expert: int
    n_shared: int = 0
    first_dense: int = 0
    router_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("n_routed", "n_active", "d_expert"):
            object.__setattr__(self, name,
                               _positive_int(name, getattr(self, name)))
        for name in ("n_shared", "first_dense"):  # may be 0
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value,
                                                         numbers.Integral):
                raise TypeError(f"{name} must be a whole number >= 0, "
                                f"got {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, "
                                 f"got {value}")
            object.__setattr__(self, name, int(value))
        if not isinstance(self.router_bias, bool):
            raise TypeError("router_bias must be True or False, got "
                            f"{self.router_bias!r}")
        if self.n_active > self.n_routed:
            raise ValueError(
                f"n_active = {self.n_active} experts per token exceeds "
                f"n_routed = {self.n_routed} routed experts")


@dataclass(frozen=True)
class DecoderConfig(TransformerConfig):
    """The sizes of a decoder of today's kind. Book: Part III, chapter 18.

    The block of Llama 2 and 3, Mistral 7B and DeepSeek-V3: RMSNorm (a scale
    only) before attention and before the feed-forward net, rotary
    positions (no position parameters), no biases, a SwiGLU feed-forward
    net with three matrices, (SiLU(X W_gate) * X W_up) W_down, each
    d_model x d_ff or d_ff x d_model, and an output layer of its own.
    Beyond TransformerConfig's sizes:

    ``n_kv_heads``: key/value heads h_kv (None: as many as query heads),
    dividing n_heads (chapter 14); ``head_dim``: width of one head (None:
    d_model / n_heads); ``window``: a sliding window of w keys
    (chapter 16), so the cache never holds more than w tokens; ``latent``:
    MLA's sizes instead of key/value heads (chapter 17); ``moe``: a mixture
    of experts in place of the dense feed-forward net.
    """

    n_kv_heads: int | None = None
    head_dim: int | None = None
    window: int | None = None
    latent: LatentKV | None = None
    moe: MoE | None = None

    def __post_init__(self) -> None:
        self._check_sizes()
        for name in ("n_kv_heads", "head_dim", "window"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name,
                                   _positive_int(name, getattr(self, name)))
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model = {self.d_model} is not divisible by n_heads = "
                f"{self.n_heads}: give head_dim, the width of one head")
        h, h_kv = self.n_heads, self.n_kv_heads
        if h_kv is not None and h % h_kv:
            raise ValueError(
                f"{h} query heads cannot be split into {h_kv} equal groups: "
                f"n_kv_heads must divide n_heads (got n_heads = {h}, "
                f"n_kv_heads = {h_kv})")
        self._check_parts()

    def _check_parts(self) -> None:
        if self.latent is not None and not isinstance(self.latent, LatentKV):
            raise TypeError("latent must be a LatentKV, got "
                            f"{type(self.latent).__name__}")
        if self.latent is not None and self.n_kv_heads is not None:
            raise ValueError(
                f"n_kv_heads = {self.n_kv_heads} with a latent: MLA caches "
                "one latent per token and layer, not key/value heads")
        if self.moe is not None and not isinstance(self.moe, MoE):
            raise TypeError(
                f"moe must be a MoE, got {type(self.moe).__name__}")
        if self.moe is not None and self.moe.first_dense >= self.n_layers:
            raise ValueError(
                f"first_dense = {self.moe.first_dense} dense layers leave "
                f"no expert layer among n_layers = {self.n_layers}")

    @property
    def d_head(self) -> int:
        """Width of one head: head_dim, or d_model / n_heads."""
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads h_kv (n_heads without grouping)."""
        return self.n_kv_heads or self.n_heads

    @property
    def attention_kind(self) -> str:
        """The kind of attention: MLA, MQA (h_kv = 1), GQA or MHA."""
        if self.latent is not None:
            return "MLA"
        if self.kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    @property
    def ffn_kind(self) -> str:
        """The feed-forward net: SwiGLU, or SwiGLU experts (with moe)."""
        return "SwiGLU" if self.moe is None else "SwiGLU experts"


def kv_values_per_token(cfg: TransformerConfig) -> int:
    """Numbers one token adds to the KV cache, all layers together.

    Book: chapter 18, equation (eq-kv-per-token). Multi-head and grouped
    attention keep a key and a value row per key/value head:
    2 L h_kv d_head (h_kv = h without grouping). MLA keeps its latent and
    the shared RoPE key: L (d_c + d_r).
    """
    c = _check_config(cfg)
    latent = getattr(c, "latent", None)
    if latent is not None:
        return c.n_layers * (latent.d_c + latent.d_r)
    return 2 * c.n_layers * c.kv_heads * c.d_head


def kv_ratio_to_mha(cfg: TransformerConfig) -> Fraction:
    """Cache per token over that of multi-head attention of the same width.

    Book: chapter 18. The same model with h key/value heads of width
    d_head (2 L h d_head per token): h_kv / h for grouped heads,
    (d_c + d_r) / (2 h d_head) for MLA, 1 for multi-head attention. An
    exact fraction.
    """
    c = _check_config(cfg)
    return Fraction(kv_values_per_token(c),
                    2 * c.n_layers * c.n_heads * c.d_head)


def decoder_param_breakdown(cfg: DecoderConfig, tied: bool = False,
                            active: bool = False) -> dict[str, int]:
    """Parameters of a DecoderConfig by component. Book: chapter 18.

    Token embedding, attention (``_attention_params``), the dense SwiGLU
    nets (3 d_model d_ff each), the experts and routers of a mixture of
    experts, two RMSNorm scales per layer and a final one, and an output
    layer unless ``tied``. ``active``: only what one token multiplies by:
    the shared experts and ``n_active`` routed ones, every router, and no
    embedding table (a token reads one row of it) unless the output layer
    is tied to it.
    """
    if not isinstance(cfg, DecoderConfig):
        raise TypeError("decoder_param_breakdown needs a DecoderConfig, got "
                        f"{type(cfg).__name__}")
    c = cfg
    L, d, V = c.n_layers, c.d_model, c.vocab_size
    parts = {} if active and not tied else {"token embedding": V * d}
    parts["attention"] = L * _attention_params(c)
    moe = c.moe
    dense = L if moe is None else moe.first_dense
    swiglu = 3 * d * c.d_ff  # W_gate, W_up (d, d_ff); W_down (d_ff, d)
    parts["feed-forward (SwiGLU)"] = dense * swiglu
    if moe is not None:
        experts = moe.n_shared + (moe.n_active if active else moe.n_routed)
        expert_layers = L - moe.first_dense
        parts["experts (SwiGLU)"] = expert_layers * experts * 3 * d * \
            moe.d_expert
        parts["routers"] = expert_layers * (d + moe.router_bias) * \
            moe.n_routed  # (d_model, n_routed), and a bias if any
    parts["norms (RMSNorm)"] = L * 2 * d + d
    if not tied:
        parts["output layer"] = d * V
    return {name: n for name, n in parts.items() if n}


def _attention_params(c: DecoderConfig) -> int:
    """Weights of one attention layer: grouped heads or MLA (no biases)."""
    d, h, dh = c.d_model, c.n_heads, c.d_head
    latent = c.latent
    if latent is None:  # W_Q, W_O (h d_head wide), W_K, W_V (h_kv d_head)
        return 2 * d * h * dh + 2 * d * c.kv_heads * dh
    q_width = h * (dh + latent.d_r)  # each head's query: d_head + d_r
    if latent.d_cq:  # W_DQ, its norm, W_UQ
        queries = d * latent.d_cq + latent.d_cq + latent.d_cq * q_width
    else:
        queries = d * q_width
    keys_values = (d * (latent.d_c + latent.d_r)  # W_DKV, W_KR
                   + latent.d_c  # the latent's norm
                   + latent.d_c * 2 * h * dh)  # W_UK, W_UV
    return queries + keys_values + h * dh * d  # ... + W_O


def active_param_count(cfg: DecoderConfig, tied: bool = False) -> int:
    """Parameters one token's forward pass multiplies by. Book: chapter 18.

    Everything but the routed experts a token is not sent to, and the
    token embedding, a table from which each token reads one row. For a
    model without experts it is ``param_count`` less the embedding table
    (unless the output layer is ``tied`` to it).
    """
    return sum(decoder_param_breakdown(cfg, tied, active=True).values())


def sequences_that_fit(cfg: TransformerConfig, memory: float,
                       tokens: int | None = None,
                       bytes_per_value: int = 2) -> int:
    """Full sequences whose KV caches fit in memory beside the weights.

    Book: chapter 18. ``memory`` in bytes (all devices together, the
    weights stored once); weights and cache both at ``bytes_per_value``;
    sequences of ``tokens`` tokens (default: the context length).
    Activations and working memory are not counted, so this is an upper
    bound.
    """
    c = _check_config(cfg)
    n = c.context_length if tokens is None else tokens
    b = _positive_int("bytes_per_value", bytes_per_value)
    weights = param_count(c) * b
    if not weights < memory:
        raise ValueError(
            f"the weights take {weights / 1e9:,.1f} GB at {b} bytes per "
            f"parameter, more than the {memory / 1e9:,.1f} GB of memory")
    return int((memory - weights) // kv_cache_bytes(c, n, b))


@dataclass(frozen=True)
class PublishedModel:
    """A published model: its configuration and its stated sizes (data).

    Book: chapter 18. ``params`` and ``active_params`` are the sizes its
    source states (rounded there); ``source`` is the source's key in the
    book's bibliography.
    """

    name: str
    config: TransformerConfig
    params: float
    source: str
    active_params: float | None = None


# Published configurations (data). Sizes that a paper does not print are
# taken from the weights its authors released (config.json / params.json).
MODELS: dict[str, PublishedModel] = {
    # Brown et al. 2020, Table 2.1 (see PRESETS).
    "gpt3-175b": PublishedModel("GPT-3 175B", PRESETS["gpt3-175b"],
                                175e9, "brown2020language"),
    # Touvron et al. 2023b: 4k context and GQA for 70B (Table 1); 80 layers,
    # d_model 8192, 64 heads, 8 key/value heads, d_ff 28672, vocabulary
    # 32000 from the released configuration.
    "llama2-70b": PublishedModel(
        "Llama 2 70B",
        DecoderConfig(80, 8192, 64, 28672, 32000, 4096, n_kv_heads=8),
        70e9, "touvron2023llama2"),
    # Grattafiori et al. 2024, Table 3 (32 layers, d_model 4096, d_ff 14336,
    # 32 heads, 8 key/value heads, SwiGLU) and 128K = 131,072 tokens of
    # context; the table rounds the vocabulary to 128,000, the released one
    # has 128,256. The paper's model was released as Llama 3.1 8B; the
    # first Llama 3 8B release had a context of 8,192 tokens.
    "llama3-8b": PublishedModel(
        "Llama 3 8B",
        DecoderConfig(32, 4096, 32, 14336, 128256, 131072, n_kv_heads=8),
        8e9, "grattafiori2024llama3"),
    # Jiang et al. 2023, Table 1: dim 4096, 32 layers, head_dim 128,
    # hidden_dim 14336, 32 heads, 8 kv heads, window 4096, context 8192,
    # vocabulary 32000 (the first release; later ones dropped the window).
    "mistral-7b": PublishedModel(
        "Mistral 7B",
        DecoderConfig(32, 4096, 32, 14336, 32000, 8192, n_kv_heads=8,
                      head_dim=128, window=4096),
        7e9, "jiang2023mistral"),
    # DeepSeek-AI 2024, section 4.2: 61 layers, d_model 7168, 128 heads of
    # d_h = 128, d_c = 512, d_c' = 1536, d_h^R = 64; all but the first 3
    # feed-forward nets are MoE layers of 1 shared and 256 routed experts
    # of width 2048, 8 routed per token, and a router bias per expert
    # (section 2.1.2); 128K = 131,072 tokens of context (section 4.3). The
    # dense width 18432 and vocabulary 129280 from the released
    # configuration. 671B total, 37B activated; both leave out the
    # multi-token-prediction module (14B more in the released weights),
    # which inference can discard.
    "deepseek-v3": PublishedModel(
        "DeepSeek-V3",
        DecoderConfig(61, 7168, 128, 18432, 129280, 131072, head_dim=128,
                      latent=LatentKV(d_c=512, d_r=64, d_cq=1536),
                      moe=MoE(n_routed=256, n_active=8, d_expert=2048,
                              n_shared=1, first_dense=3, router_bias=True)),
        671e9, "deepseek2024v3", active_params=37e9),
}


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
