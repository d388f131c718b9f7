"""The sizes of whole models: GPT's, today's decoders', and published ones.

Book: chapter 10 "Counting the multiplications" (TransformerConfig,
PRESETS, PUBLISHED_PARAMS), Part III, chapter 16 "Sliding-window
attention" (LocalGlobal, LOCAL_GLOBAL: stacks of local and global layers)
and chapter 18 "What the cache costs, model by model" (DecoderConfig,
LatentKV, MoE, PublishedModel, MODELS).
This module holds sizes and published data only; ``counting`` computes
from them.

Two kinds of model share one base of sizes, ``ModelSizes``; a count that
holds for one kind only takes that kind, and ``check_config`` refuses the
other with a ``TypeError``. The sizes have the names of ``shapes.Dims``
and ``latent.LatentDims``, in the letters of the book:

    layers          L       decoder blocks
    d_model         d_model width of a token vector
    heads           h       query heads per layer
    kv_heads        h_kv    key/value heads (chapter 14); h without grouping
    d_k             d_k     width of one head's query and key, and of its
                            value (d_v = d_k in these models)
    d_ff            d_ff    hidden width of the feed-forward net
    vocab_size      V       tokens in the vocabulary (the book's n_vocab)
    context_length  n_ctx   the longest sequence the model was trained on
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import groups, positive_int, whole_number
from .masks import layer_kinds

__all__ = [
    "ModelSizes",
    "TransformerConfig",
    "PRESETS",
    "PUBLISHED_PARAMS",
    "LatentKV",
    "MoE",
    "DecoderConfig",
    "PublishedModel",
    "MODELS",
    "LocalGlobal",
    "LOCAL_GLOBAL",
]


@dataclass(frozen=True)
class ModelSizes:
    """The sizes every decoder-only transformer of the book has.

    Book: chapters 10 and 18. Not a model of its own: a GPT model is a
    ``TransformerConfig``, a decoder of today's kind a ``DecoderConfig``.
    Both also give ``d_k`` (the width of one head), ``kv_heads``,
    ``attention_kind`` and ``ffn_kind``.
    """

    layers: int
    d_model: int
    heads: int
    d_ff: int
    vocab_size: int
    context_length: int

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "d_ff", "vocab_size",
                     "context_length"):
            object.__setattr__(self, name,
                               positive_int(getattr(self, name), name))


@dataclass(frozen=True)
class TransformerConfig(ModelSizes):
    """The sizes of a GPT-style decoder-only transformer. Book: chapter 10.

    Every head has width d_model / heads for queries, keys and values (as
    in GPT-2 and GPT-3), so d_model must be divisible by heads.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_model % self.heads:
            raise ValueError(
                f"d_model = {self.d_model} is not divisible by heads = "
                f"{self.heads}: each head needs d_model / heads columns")

    @property
    def d_k(self) -> int:
        """Width of one head's query, key and value: d_model / heads."""
        return self.d_model // self.heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads h_kv: every head has its own (multi-head)."""
        return self.heads

    @property
    def attention_kind(self) -> str:
        """Multi-head attention, "MHA": one key and value per head."""
        return "MHA"

    @property
    def ffn_kind(self) -> str:
        """GPT's feed-forward net, "GELU": GELU(X W_1 + b_1) W_2 + b_2."""
        return "GELU"


def _gpt(layers: int, d_model: int, heads: int,
         context_length: int) -> TransformerConfig:
    return TransformerConfig(layers, d_model, heads, 4 * d_model, 50257,
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


# --- Part III, chapter 18: decoders of today's kind -------------------------


@dataclass(frozen=True)
class LatentKV:
    """Sizes of multi-head latent attention (MLA). Book: chapters 17, 18.

    Per token and layer MLA caches one latent c (``d_c`` numbers), from
    which every head's key and value are recomputed, and one RoPE key
    (``d_r`` numbers) shared by all heads (DeepSeek-V2 and V3). Queries
    pass through a latent of their own, ``d_cq`` wide (d_c' in DeepSeek's
    papers; None: projected from X directly). Layer weights: W_DQ
    (d_model, d_cq), W_UQ (d_cq, h (d_k + d_r)), W_DKV (d_model, d_c),
    W_KR (d_model, d_r), W_UK and W_UV (d_c, h d_k), W_O (h d_k,
    d_model), and an RMSNorm scale on each latent.
    """

    d_c: int
    d_r: int
    d_cq: int | None = None

    def __post_init__(self) -> None:
        for name in ("d_c", "d_r"):
            object.__setattr__(self, name,
                               positive_int(getattr(self, name), name))
        if self.d_cq is not None:
            object.__setattr__(self, "d_cq", positive_int(self.d_cq, "d_cq"))


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
                               positive_int(getattr(self, name), name))
        for name in ("n_shared", "first_dense"):  # may be 0
            object.__setattr__(self, name,
                               whole_number(getattr(self, name), name))
        if not isinstance(self.router_bias, bool):
            raise TypeError("router_bias must be True or False, got "
                            f"{self.router_bias!r}")
        if self.n_active > self.n_routed:
            raise ValueError(
                f"n_active = {self.n_active} experts per token exceeds "
                f"n_routed = {self.n_routed} routed experts")


@dataclass(frozen=True)
class DecoderConfig(ModelSizes):
    """The sizes of a decoder of today's kind. Book: Part III, chapter 18.

    The block of Llama 2 and 3, Mistral 7B and DeepSeek-V3: RMSNorm (a scale
    only) before attention and before the feed-forward net, rotary
    positions (no position parameters), no biases, a SwiGLU feed-forward
    net with three matrices, (SiLU(X W_gate) * X W_up) W_down, each
    d_model x d_ff or d_ff x d_model, and an output layer of its own.
    Beyond the sizes of ``ModelSizes``:

    ``kv_heads``: key/value heads h_kv, dividing heads (chapter 14; None:
    as many as query heads); ``d_k``: width of one head (None:
    d_model / heads); ``window``: a sliding window of w keys (chapter 16),
    so the cache never holds more than w tokens; ``latent``: MLA's sizes
    instead of key/value heads (chapter 17; ``kv_heads`` stays None);
    ``moe``: a mixture of experts in place of the dense feed-forward net.
    """

    kv_heads: int | None = None
    d_k: int | None = None
    window: int | None = None
    latent: LatentKV | None = None
    moe: MoE | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_parts()
        if self.d_k is None and self.d_model % self.heads:
            raise ValueError(
                f"d_model = {self.d_model} is not divisible by heads = "
                f"{self.heads}: give d_k, the width of one head")
        if self.d_k is None:
            object.__setattr__(self, "d_k", self.d_model // self.heads)
        if self.kv_heads is None and self.latent is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("kv_heads", "d_k", "window"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name,
                                   positive_int(getattr(self, name), name))
        if self.kv_heads is not None:
            groups(self.heads, self.kv_heads)

    def _check_parts(self) -> None:
        if self.latent is not None and not isinstance(self.latent, LatentKV):
            raise TypeError("latent must be a LatentKV, got "
                            f"{type(self.latent).__name__}")
        if self.latent is not None and self.kv_heads is not None:
            raise ValueError(
                f"kv_heads = {self.kv_heads} with a latent: MLA caches "
                "one latent per token and layer, not key/value heads")
        if self.moe is not None and not isinstance(self.moe, MoE):
            raise TypeError(
                f"moe must be a MoE, got {type(self.moe).__name__}")
        if self.moe is not None and self.moe.first_dense >= self.layers:
            raise ValueError(
                f"first_dense = {self.moe.first_dense} dense layers leave "
                f"no expert layer among layers = {self.layers}")

    @property
    def attention_kind(self) -> str:
        """The kind of attention: MLA, MQA (h_kv = 1), GQA or MHA."""
        if self.latent is not None:
            return "MLA"
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    @property
    def ffn_kind(self) -> str:
        """The feed-forward net: SwiGLU, or SwiGLU experts (with moe)."""
        return "SwiGLU" if self.moe is None else "SwiGLU experts"


_NEEDS = {
    TransformerConfig: (
        " (the GPT block of chapters 10-13: every head d_model / heads "
        "wide, its own keys and values, a GELU feed-forward net)"),
    DecoderConfig: " (a decoder of today's kind, chapter 18)",
}


def check_config(cfg, kind: type = ModelSizes, what: str = "this count"):
    """``cfg`` if it is a ``kind`` of configuration, else a ``TypeError``.

    ``what`` names the function that needs it. A count that holds for GPT
    models only takes a TransformerConfig; one for any model ModelSizes.
    """
    if not isinstance(cfg, kind):
        raise TypeError(f"{what} needs a {kind.__name__}"
                        f"{_NEEDS.get(kind, '')}, got {type(cfg).__name__}")
    return cfg


@dataclass(frozen=True)
class PublishedModel:
    """A published model: its configuration and its stated sizes (data).

    Book: chapter 18. ``params`` and ``active_params`` are the sizes its
    source states (rounded there); ``source`` is the source's key in the
    book's bibliography.
    """

    name: str
    config: ModelSizes
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
        DecoderConfig(80, 8192, 64, 28672, 32000, 4096, kv_heads=8),
        70e9, "touvron2023llama2"),
    # Grattafiori et al. 2024, Table 3 (32 layers, d_model 4096, d_ff 14336,
    # 32 heads, 8 key/value heads, SwiGLU) and 128K = 131,072 tokens of
    # context; the table rounds the vocabulary to 128,000, the released one
    # has 128,256. The paper's model was released as Llama 3.1 8B; the
    # first Llama 3 8B release had a context of 8,192 tokens.
    "llama3-8b": PublishedModel(
        "Llama 3 8B",
        DecoderConfig(32, 4096, 32, 14336, 128256, 131072, kv_heads=8),
        8e9, "grattafiori2024llama3"),
    # Jiang et al. 2023, Table 1: dim 4096, 32 layers, head_dim 128,
    # hidden_dim 14336, 32 heads, 8 kv heads, window 4096, context 8192,
    # vocabulary 32000 (the first release; later ones dropped the window).
    "mistral-7b": PublishedModel(
        "Mistral 7B",
        DecoderConfig(32, 4096, 32, 14336, 32000, 8192, kv_heads=8,
                      d_k=128, window=4096),
        7e9, "jiang2023mistral"),
    # DeepSeek-AI 2024, section 4.2: 61 layers, d_model 7168, 128 heads of
    # d_h = 128, d_c = 512, d_c' = 1536, d_h^R = 64; all but the first 3
    # feed-forward nets are MoE layers of 1 shared and 256 routed experts
    # of width 2048, 8 routed per token, and a router bias per expert
    # (section 2.1.2); 128K = 131,072 tokens of context (section 4.3). The
    # dense width 18432 and vocabulary 129280 from the released
    # configuration. 671B total, 37B activated; both leave out the
    # multi-token-prediction module (14B more in the released weights),
    # which inference can discard. latent.PUBLISHED reads its sizes here.
    "deepseek-v3": PublishedModel(
        "DeepSeek-V3",
        DecoderConfig(61, 7168, 128, 18432, 129280, 131072, d_k=128,
                      latent=LatentKV(d_c=512, d_r=64, d_cq=1536),
                      moe=MoE(n_routed=256, n_active=8, d_expert=2048,
                              n_shared=1, first_dense=3, router_bias=True)),
        671e9, "deepseek2024v3", active_params=37e9),
}


# --- Part III, chapter 16: stacks of local and global layers ----------------


@dataclass(frozen=True)
class LocalGlobal:
    """The attention sizes of a stack of local and global layers (data).

    Book: Part III, chapter 16, "Local and global layers". ``kinds`` has
    one entry per layer, the first layer first: "local" (a sliding window
    of ``window`` keys, the token's own included) or "global" (every
    earlier key). Every layer has ``heads`` query heads and ``kv_heads``
    key/value heads of width ``d_k``; ``context_length`` is the longest
    sequence the model was trained on; ``source`` the key of the source
    in the book's bibliography. Not a ``ModelSizes``: these models are not
    in ``MODELS`` (chapter 18).
    """

    name: str
    kinds: tuple[str, ...]
    d_model: int
    heads: int
    kv_heads: int
    d_k: int
    window: int
    context_length: int
    source: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", layer_kinds(self.kinds))
        for name in ("d_model", "heads", "kv_heads", "d_k", "window",
                     "context_length"):
            object.__setattr__(self, name,
                               positive_int(getattr(self, name), name))
        groups(self.heads, self.kv_heads)

    @property
    def layers(self) -> int:
        """L, the number of layers: one per entry of ``kinds``."""
        return len(self.kinds)

    def all_global(self) -> LocalGlobal:
        """The same sizes with every layer global (no window anywhere)."""
        return LocalGlobal(f"{self.name}, all global",
                           ("global",) * self.layers, self.d_model,
                           self.heads, self.kv_heads, self.d_k, self.window,
                           self.context_length, self.source)


def _gemma2(name: str, pairs: int, d_model: int, heads: int, kv_heads: int,
            d_k: int) -> LocalGlobal:
    # a local layer, then a global one, ``pairs`` times; window 4096, 8192
    # positions
    return LocalGlobal(name, ("local", "global") * pairs, d_model, heads,
                       kv_heads, d_k, 4096, 8192, "gemma2024gemma2")


# Published data. Gemma Team 2024 (arXiv:2408.00118): local sliding-window
# and global attention alternate, a window of 4096 tokens and a global span
# of 8192. The sizes as released: config.json of google/gemma-2-2b, -9b and
# -27b (num_hidden_layers, hidden_size, num_attention_heads,
# num_key_value_heads, head_dim; sliding_window 4096,
# max_position_embeddings 8192), and Google's reference implementation
# (gemma_pytorch, gemma/config.py: attn_types [LOCAL_SLIDING, GLOBAL] * 21
# for 9B, * 23 for 27B). Hugging Face's Gemma2Config makes layer i (from
# 0) "sliding_attention" when i is even: the first layer is local.
LOCAL_GLOBAL: dict[str, LocalGlobal] = {
    "gemma2-2b": _gemma2("Gemma 2 2B", 13, 2304, 8, 4, 256),
    "gemma2-9b": _gemma2("Gemma 2 9B", 21, 3584, 16, 8, 256),
    "gemma2-27b": _gemma2("Gemma 2 27B", 23, 4608, 32, 16, 128),
}
