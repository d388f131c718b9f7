"""Counting a transformer's matrix products, parameters and bytes, by formula.

Book: chapter 9 "The transformer at a glance" (one_hot), chapter 10
"Counting the multiplications" (matmuls_per_attention_layer, param_count,
matmul_count), chapter 11 "From counts to time" (forward_flops,
attention_crossover, non_embedding_params), chapter 12 "Computing it
efficiently" (kv_cache_bytes) and Part III, chapter 18 "What the cache
costs, model by model" (kv_values_per_token, kv_ratio_to_mha,
decoder_param_breakdown, active_param_count, sequences_that_fit) and Part
IV, chapter 20 "What the backward pass costs" (backward_activations,
activation_bytes, published_activation_bytes, training_state_bytes); at
the end, Part III, chapter 16 "Sliding-window attention" (sink_tokens_held,
stack_receptive_field, stack_tokens_held, stack_kv_cache_bytes). The
sizes come from ``models``; ``trace`` checks the counts by recording the
products as they happen.

Letters in shape comments and formulas (those of ``shapes`` and
``models``):

    L        layers (decoder blocks)                 layers
    n        tokens in the sequence                  tokens
    d_model  width of a token vector                 d_model
    h        heads per layer                         heads
    d_k=d_v  width of one head                       d_k (GPT: d_model / h)
    d_ff     hidden width of the feed-forward net    d_ff (GPT: 4 d_model)
    n_vocab  vocabulary size                         vocab_size
    h_kv     key/value heads (chapter 14)            kv_heads
    d_c      width of MLA's cached latent (ch. 17)   LatentKV.d_c
    d_r      width of MLA's shared RoPE key          LatentKV.d_r
    w        a sliding window, keys (chapter 16)     window
    n_sink   first tokens kept (chapter 16)          sinks
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

from fractions import Fraction

import numpy as np

from . import checks
from .masks import layer_kinds
from .models import (
    DecoderConfig,
    LocalGlobal,
    ModelSizes,
    TransformerConfig,
    check_config,
)

__all__ = [
    "one_hot",
    "matmuls_per_attention_layer",
    "param_breakdown",
    "param_count",
    "non_embedding_params",
    "kv_cache_bytes",
    "tokens_held",
    "matmul_breakdown",
    "matmul_count",
    "flops_breakdown",
    "forward_flops",
    "attention_crossover",
    "kv_values_per_token",
    "kv_ratio_to_mha",
    "decoder_param_breakdown",
    "active_param_count",
    "sequences_that_fit",
    "RECOMPUTE",
    "backward_activations",
    "activation_bytes",
    "published_activation_bytes",
    "training_state_bytes",
    "sink_tokens_held",
    "stack_receptive_field",
    "stack_tokens_held",
    "stack_kv_cache_bytes",
]


def one_hot(token_ids, vocab_size: int) -> np.ndarray:
    """The one-hot matrix of ``token_ids``.

    Book: chapter 9, "The embedding as a product". Row i has a single 1, in
    column token_ids[i] (ids count from 0, as a tokenizer numbers them);
    the result is (n, n_vocab), so one_hot(ids, n_vocab) @ E picks the rows
    E[ids] of an embedding matrix E (n_vocab, d_model).
    """
    ids = checks.token_ids(token_ids, vocab_size, "token_ids", ndim=1)
    O = np.zeros((ids.size, vocab_size))  # (n, n_vocab)
    O[np.arange(ids.size), ids] = 1.0  # one 1 per row
    return O


def matmuls_per_attention_layer(heads: int) -> int:
    """5 h + 1: the matrix products of one multi-head attention layer.

    Book: chapter 10. Each head projects X three times (Q, K, V) and
    multiplies twice (Q K^T, S V); the concatenated heads are multiplied by
    W_O once.
    """
    return 5 * checks.positive_int(heads, "heads") + 1


def param_breakdown(cfg: TransformerConfig,
                    tied: bool = True) -> dict[str, int]:
    """Trainable parameters of a GPT-2/GPT-3 model by component.

    Book: chapter 10. Token embedding n_vocab x d_model, learned positions
    n_ctx x d_model; per layer W_Q, W_K, W_V, W_O with biases, W_1, b_1,
    W_2, b_2, and two layer norms; one final layer norm. With ``tied`` (as
    in GPT-2's released weights) the output layer reuses the token
    embedding; ``tied=False`` adds an output matrix d_model x n_vocab of
    its own.
    """
    c = check_config(cfg, TransformerConfig, "param_breakdown")
    L, d, f = c.layers, c.d_model, c.d_ff
    untied = {} if tied else {"output layer (untied)": d * c.vocab_size}
    return {
        "token embedding": c.vocab_size * d,
        "position embedding": c.context_length * d,
        "attention (W_Q, W_K, W_V, W_O, biases)": L * (4 * d * d + 4 * d),
        "feed-forward (W_1, b_1, W_2, b_2)": L * (2 * d * f + f + d),
        "layer norms": L * 4 * d + 2 * d,
        **untied,
    }


def param_count(cfg: ModelSizes, tied: bool | None = None) -> int:
    """Total trainable parameters; ``tied``: output layer reuses the embedding.

    Book: chapter 10 (``param_breakdown``), and chapter 18 for a
    DecoderConfig (``decoder_param_breakdown``). ``tied`` None: as the
    kind of model is published, tied for GPT, untied for a DecoderConfig.
    """
    c = check_config(cfg, ModelSizes, "param_count")
    if isinstance(c, DecoderConfig):
        return sum(decoder_param_breakdown(c, bool(tied)).values())
    return sum(param_breakdown(c, True if tied is None else tied).values())


def non_embedding_params(cfg: TransformerConfig) -> int:
    """N of Kaplan et al.: 12 L d_model^2, the weights outside the embeddings.

    Book: chapter 11. Biases and layer norms are left out, as in their
    approximation. With d_ff = 4 d_model they are 13 d_model numbers per
    layer (biases 9 d_model, two layer norms 4 d_model) against 12
    d_model^2 weights, a share of 13 / (12 d_model): 0.14 % of N at
    d_model = 768 (GPT-2 small), 0.11 % at 1024, under 0.1 % only from
    d_model = 1084 on (GPT-2 large's 1280 and wider).
    """
    c = check_config(cfg, TransformerConfig, "non_embedding_params")
    return 2 * c.layers * c.d_model * (2 * c.d_model + c.d_ff)


def kv_cache_bytes(cfg: ModelSizes, tokens: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Bytes of one sequence's KV cache: 2 L h d_k numbers per token.

    Book: chapter 12, "Why a KV-cache step is bound by memory". Every layer
    keeps a key and a value row of width h d_k = d_model per token; the
    default of 2 bytes per value is fp16/bf16, as models are served.
    Chapter 18: in general ``kv_values_per_token(cfg)`` numbers per token
    (fewer with grouped or latent keys and values), for the tokens the
    cache holds (``tokens_held``: a sliding window keeps at most w).
    """
    c = check_config(cfg, ModelSizes, "kv_cache_bytes")
    n = checks.positive_int(tokens, "tokens")
    s = checks.positive_int(bytes_per_value, "bytes_per_value")
    return kv_values_per_token(c) * tokens_held(c, n) * s


def matmul_breakdown(cfg: TransformerConfig,
                     fused: bool = False) -> dict[str, int]:
    """Matrix products of one forward pass by component.

    Book: chapter 10. Counted by the module's rules 1-5. ``fused=False``
    counts one product per head as the book computes them; ``fused=True``
    counts X W_QKV once per layer and Q K^T, S V as one batched product
    each.
    """
    c = check_config(cfg, TransformerConfig, "matmul_breakdown")
    L, h = c.layers, c.heads
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


def flops_breakdown(cfg: TransformerConfig, tokens: int) -> dict[str, int]:
    """Floating-point operations of one forward pass, by component.

    Book: chapter 11. A multiply-add counts as 2 operations. All n x n
    scores are computed (no causal skipping), the embedding is a lookup
    (0 FLOPs), element-wise work is not counted.
    """
    c = check_config(cfg, TransformerConfig, "flops_breakdown")
    n = checks.positive_int(tokens, "tokens")
    L, d, h, d_k, f = c.layers, c.d_model, c.heads, c.d_k, c.d_ff
    return {
        # 3h products (n, d_model) @ (d_model, d_k)
        "Q, K, V projections": L * 2 * n * d * 3 * h * d_k,
        # h products (n, d_k) @ (d_k, n)
        "Q K^T": L * 2 * h * n * d_k * n,
        # h products (n, n) @ (n, d_k)
        "S V": L * 2 * h * n * n * d_k,
        # (n, h*d_k) @ (h*d_k, d_model)
        "output projection W_O": L * 2 * n * h * d_k * d,
        # (n, d_model) @ (d_model, d_ff), (n, d_ff) @ (d_ff, d_model)
        "feed-forward W_1, W_2": L * 2 * 2 * n * d * f,
        # (n, d_model) @ (d_model, n_vocab)
        "output layer": 2 * n * d * c.vocab_size,
    }


def forward_flops(cfg: TransformerConfig, tokens: int) -> int:
    """FLOPs of one forward pass over ``tokens`` tokens. Book: chapter 11."""
    return sum(flops_breakdown(cfg, tokens).values())


def attention_crossover(cfg: TransformerConfig,
                        include_ffn: bool = False) -> float:
    """Sequence length at which attention's n^2 FLOPs equal the projections'.

    Book: chapter 11. Q K^T and S V grow as n^2; the projections (and,
    with ``include_ffn``, the feed-forward network) grow as n; they are
    equal at n = linear / quadratic coefficient. For GPT shapes this is
    2 d_model (6 d_model with the FFN).
    """
    c = check_config(cfg, TransformerConfig, "attention_crossover")
    one = flops_breakdown(c, 1)
    quadratic = one["Q K^T"] + one["S V"]  # coefficient of n^2
    linear = (one["Q, K, V projections"]
              + one["output projection W_O"])  # coefficient of n
    if include_ffn:
        linear += one["feed-forward W_1, W_2"]
    return linear / quadratic


# --- Part III, chapter 18: what the cache costs, model by model -------------


def kv_values_per_token(cfg: ModelSizes) -> int:
    """Numbers one token adds to the KV cache, all layers together.

    Book: chapter 18, equation (eq-kv-per-token). Multi-head and grouped
    attention keep a key and a value row per key/value head:
    2 L h_kv d_k (h_kv = h without grouping). MLA keeps its latent and
    the shared RoPE key: L (d_c + d_r).
    """
    c = check_config(cfg, ModelSizes, "kv_values_per_token")
    if c.attention_kind == "MLA":
        return c.layers * (c.latent.d_c + c.latent.d_r)
    return 2 * c.layers * c.kv_heads * c.d_k


def tokens_held(cfg: ModelSizes, tokens: int) -> int:
    """Tokens whose keys and values a cache holds after ``tokens`` tokens.

    Book: chapter 18. All of them, except under a sliding window of w keys
    (chapter 16), which holds the last min(tokens, w).
    """
    window = getattr(cfg, "window", None)
    return tokens if window is None else min(tokens, window)


def kv_ratio_to_mha(cfg: ModelSizes) -> Fraction:
    """Cache per token over that of multi-head attention of the same width.

    Book: chapter 18. The same model with h key/value heads of width
    d_k (2 L h d_k per token): h_kv / h for grouped heads,
    (d_c + d_r) / (2 h d_k) for MLA, 1 for multi-head attention. An
    exact fraction.
    """
    c = check_config(cfg, ModelSizes, "kv_ratio_to_mha")
    return Fraction(kv_values_per_token(c), 2 * c.layers * c.heads * c.d_k)


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
    c = check_config(cfg, DecoderConfig, "decoder_param_breakdown")
    L, d, n_vocab = c.layers, c.d_model, c.vocab_size
    parts = {} if active and not tied else {"token embedding": n_vocab * d}
    parts["attention"] = L * _attention_params(c)
    moe = c.moe
    dense = L if moe is None else moe.first_dense
    # W_gate, W_up (d_model, d_ff); W_down (d_ff, d_model)
    swiglu = 3 * d * c.d_ff
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
        parts["output layer"] = d * n_vocab
    return {name: n for name, n in parts.items() if n}


def _attention_params(c: DecoderConfig) -> int:
    """Weights of one attention layer: grouped heads or MLA (no biases)."""
    d, h, d_k = c.d_model, c.heads, c.d_k
    latent = c.latent
    if latent is None:  # W_Q, W_O (h d_k wide), W_K, W_V (h_kv d_k)
        return 2 * d * h * d_k + 2 * d * c.kv_heads * d_k
    q_width = h * (d_k + latent.d_r)  # each head's query: d_k + d_r
    if latent.d_cq:  # W_DQ, its norm, W_UQ
        queries = d * latent.d_cq + latent.d_cq + latent.d_cq * q_width
    else:
        queries = d * q_width
    keys_values = (d * (latent.d_c + latent.d_r)  # W_DKV, W_KR
                   + latent.d_c  # the latent's norm
                   + latent.d_c * 2 * h * d_k)  # W_UK, W_UV
    return queries + keys_values + h * d_k * d  # ... + W_O


def active_param_count(cfg: DecoderConfig, tied: bool = False) -> int:
    """Parameters one token's forward pass multiplies by. Book: chapter 18.

    Everything but the routed experts a token is not sent to, and the
    token embedding, a table from which each token reads one row. For a
    model without experts it is ``param_count`` less the embedding table
    (unless the output layer is ``tied`` to it).
    """
    return sum(decoder_param_breakdown(cfg, tied, active=True).values())


def sequences_that_fit(cfg: ModelSizes, memory: float,
                       tokens: int | None = None,
                       bytes_per_value: int = 2) -> int:
    """Full sequences whose KV caches fit in memory beside the weights.

    Book: chapter 18. ``memory`` in bytes (all devices together, the
    weights stored once); weights and cache both at ``bytes_per_value``;
    sequences of ``tokens`` tokens (default: the context length).
    Activations and working memory are not counted, so this is an upper
    bound.
    """
    c = check_config(cfg, ModelSizes, "sequences_that_fit")
    n = c.context_length if tokens is None else tokens
    b = checks.positive_int(bytes_per_value, "bytes_per_value")
    weights = param_count(c) * b
    if not weights < memory:
        raise ValueError(
            f"the weights take {weights / 1e9:,.1f} GB at {b} bytes per "
            f"parameter, more than the {memory / 1e9:,.1f} GB of memory")
    return int((memory - weights) // kv_cache_bytes(c, n, b))


# --- Part IV, chapter 20: what the backward pass costs ----------------------

# what the backward keeps, from most to least: everything it reads; what
# grad.loss_and_grads keeps (S and G recomputed); the layer's input only
RECOMPUTE = ("none", "book", "full")
_RECOMPUTED_BY_BOOK = ("S (h rows of n weights)",
                       "G = GELU(U) (input of G W_2)")
_LAYER_INPUT = "X (input of layer norm 1)"


def backward_activations(cfg: TransformerConfig, tokens: int
                         ) -> dict[str, int]:
    """Numbers per token that one GPT layer's backward reads from its forward.

    Book: chapter 20, "What the backward pass keeps". A weight's gradient
    needs the input of its product (for R = A W, dW = A^T dR), an input's
    gradient the weight (not an activation); Q K^T needs Q and K, S V
    needs S and V; softmax's backward needs S, GELU's its input U, a layer
    norm its input. The block is GPT-2's (chapter 8):
    X' = X + MHA(LN_1(X)), then X' + FFN(LN_2(X')), with
    U = LN_2(X') W_1 + b_1 and G = GELU(U); each query row of S holds
    the ``tokens`` = n keys of the sequence (the masked ones included, as
    the book's kernel computes them). V and Concat count h d_k numbers: a
    TransformerConfig's heads have d_v = d_k = d_model / heads.
    """
    c = check_config(cfg, TransformerConfig, "backward_activations")
    n = checks.positive_int(tokens, "tokens")
    d, h, d_k, f = c.d_model, c.heads, c.d_k, c.d_ff
    return {
        _LAYER_INPUT: d,
        "LN_1(X) (input of the products with W_Q, W_K, W_V)": d,
        "Q": h * d_k,
        "K": h * d_k,
        "V": h * d_k,
        "S (h rows of n weights)": h * n,
        "Concat (input of Concat W_O)": h * d_k,
        "X' (input of layer norm 2)": d,
        "LN_2(X') (input of the product with W_1)": d,
        "U = LN_2(X') W_1 + b_1 (input of GELU)": f,
        "G = GELU(U) (input of G W_2)": f,
    }


def activation_bytes(cfg: TransformerConfig, tokens: int,
                     bytes_per_value: float = 2,
                     recompute: str = "book") -> float:
    """Bytes per token that one layer keeps for its backward pass.

    Book: chapter 20. ``recompute``: "none" keeps every array of
    ``backward_activations``; "book" keeps what ``grad.loss_and_grads``
    keeps, recomputing S from Q and K (as FlashAttention does) and G
    from U; "full" keeps only the layer's input X and runs the layer's
    forward again during the backward. ``bytes_per_value``: 2 for 16-bit
    activations, 8 for the book's float64.
    """
    kept = backward_activations(cfg, tokens)
    if recompute == "book":
        kept = {k: v for k, v in kept.items() if k not in _RECOMPUTED_BY_BOOK}
    elif recompute == "full":
        kept = {_LAYER_INPUT: kept[_LAYER_INPUT]}
    elif recompute != "none":
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got "
                         f"{recompute!r}")
    if not bytes_per_value > 0:
        raise ValueError(
            f"bytes_per_value must be positive, got {bytes_per_value}")
    return sum(kept.values()) * bytes_per_value


def published_activation_bytes(cfg: TransformerConfig, tokens: int,
                               batch: int = 1,
                               recompute: str = "none") -> int:
    """Korthikanti et al. (2022)'s bytes of one layer's activations (data).

    Book: chapter 20. Their section 4.1 and equation (1), in their letters
    s (tokens), b (batch), h (d_model), a (heads): s b h (34 + 5 a s / h)
    bytes, for 16-bit activations and 1-byte dropout masks, no
    parallelism. ``recompute``: "none"; "selective", their selective
    recomputation of the attention's Q K^T, softmax, dropout and product
    with V (their section 5, equation 6 and Table 2), 34 s b h; "full",
    their full recomputation (section 5), 2 s b h (the layer's input).
    The formula is the paper's; the sizes are ``cfg``'s.
    """
    c = check_config(cfg, TransformerConfig, "published_activation_bytes")
    s = checks.positive_int(tokens, "tokens")
    b = checks.positive_int(batch, "batch")
    h, a = c.d_model, c.heads
    formulas = {"none": 34 * s * b * h + 5 * a * s * s * b,
                "selective": 34 * s * b * h, "full": 2 * s * b * h}
    if recompute not in formulas:
        raise ValueError(f"recompute must be one of {tuple(formulas)}, got "
                         f"{recompute!r}")
    return formulas[recompute]


def training_state_bytes(cfg: ModelSizes) -> dict[str, int]:
    """Bytes of weights, gradients and Adam's state: 16 per parameter.

    Book: chapter 20, "The memory budget of training". Mixed-precision
    training with Adam as Rajbhandari et al. (2020, ZeRO, section 3.1)
    count it: 16-bit weights and gradients (2 + 2 bytes per parameter),
    and Adam's 32-bit copy of the weights and its two moments (4 + 4 + 4).
    Activations come on top (``activation_bytes``).
    """
    N = param_count(check_config(cfg, ModelSizes, "training_state_bytes"))
    return {"weights (16-bit)": 2 * N, "gradients (16-bit)": 2 * N,
            "Adam: weights (32-bit)": 4 * N,
            "Adam: first moment (32-bit)": 4 * N,
            "Adam: second moment (32-bit)": 4 * N}


# --- Part III, chapter 16: attention sinks, local and global layers ---------


def sink_tokens_held(tokens: int, window: int, sinks: int) -> int:
    """Tokens a cache with attention sinks holds after n tokens.

    Book: Part III, chapter 16, "Attention sinks". The first n_sink and
    the last w: min(n, n_sink + w), every token while n <= n_sink + w
    (the two runs meet or overlap).
    """
    n = checks.positive_int(tokens, "tokens")
    w = checks.positive_int(window, "window")
    k = checks.whole_number(sinks, "sinks")
    return min(n, k + w)


def stack_receptive_field(kinds, window: int, t: int) -> int:
    """Input positions that output t (from 1) of a stack can depend on.

    Book: Part III, chapter 16, "Local and global layers". A local layer
    reaches w - 1 positions further back, a global layer back to the
    first token: with a global layer anywhere in the stack, all t; with
    L local layers only, min(t, L (w - 1) + 1) (equation
    (eq-receptive-field)).
    """
    kinds = layer_kinds(kinds)
    w = checks.positive_int(window, "window")
    t = checks.positive_int(t, "t")
    if "global" in kinds:
        return t
    return min(t, len(kinds) * (w - 1) + 1)


def stack_tokens_held(kinds, window: int, tokens: int) -> list[int]:
    """Tokens each layer's cache holds after n tokens, the first layer first.

    Book: Part III, chapter 16, "Local and global layers". A local layer
    keeps the last min(n, w) (its ring buffer), a global layer all n.
    """
    kinds = layer_kinds(kinds)
    w = checks.positive_int(window, "window")
    n = checks.positive_int(tokens, "tokens")
    return [min(n, w) if kind == "local" else n for kind in kinds]


def stack_kv_cache_bytes(model: LocalGlobal, tokens: int,
                         bytes_per_value: int = 2) -> int:
    """Bytes of one sequence's KV cache in a stack of local, global layers.

    Book: Part III, chapter 16, "Local and global layers". Each layer keeps
    a key and a value row per key/value head, 2 h_kv d_k numbers per token
    it holds (``stack_tokens_held``), at ``bytes_per_value`` bytes each
    (2: 16-bit).
    """
    if not isinstance(model, LocalGlobal):
        raise TypeError("stack_kv_cache_bytes needs a LocalGlobal, got "
                        f"{type(model).__name__}")
    s = checks.positive_int(bytes_per_value, "bytes_per_value")
    held = stack_tokens_held(model.kinds, model.window, tokens)
    return sum(held) * 2 * model.kv_heads * model.d_k * s
