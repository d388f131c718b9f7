"""mha_lit: multi-head attention, computed, as the book teaches it.

The book: "Multi-Head Attention, Computed". Read the modules in the
book's order: ``shapes`` (Dims, Weights), ``encoding`` (the input X),
``attention`` (softmax, causal mask, one head, many heads), ``kv_cache``,
``block`` (the GPT block; GPT-2's exactly, with attention biases),
``symbolic`` (SymPy); then Part II's ``counting``, ``fast`` and
``decoder`` (a small GPT that generates) and ``roofline`` (from CPU
to GPU).
"""

from . import counting, plots, roofline, symbolic
from .attention import (
    attention,
    attention_weights,
    causal_mask,
    multi_head_attention,
    multi_head_attention_reference,
    softmax,
)
from .block import (
    BlockWeights,
    feed_forward,
    gelu,
    gpt2_attention_weights,
    gpt_block,
    init_block_weights,
    layer_norm,
    residual,
)
from .decoder import Decoder, GPTWeights, gpt_forward, init_gpt_weights
from .encoding import (
    VOCABULARY,
    embed,
    example_table,
    sentence,
    sinusoidal_encoding,
)
from .kv_cache import KVCache, recompute_multiply_adds, step_multiply_adds
from .shapes import Dims, Weights, init_weights

__all__ = [
    "Dims",
    "Weights",
    "init_weights",
    "sinusoidal_encoding",
    "embed",
    "VOCABULARY",
    "example_table",
    "sentence",
    "softmax",
    "causal_mask",
    "attention_weights",
    "attention",
    "multi_head_attention",
    "multi_head_attention_reference",
    "KVCache",
    "GPTWeights",
    "init_gpt_weights",
    "gpt_forward",
    "Decoder",
    "step_multiply_adds",
    "recompute_multiply_adds",
    "layer_norm",
    "gelu",
    "feed_forward",
    "residual",
    "BlockWeights",
    "init_block_weights",
    "gpt_block",
    "gpt2_attention_weights",
    "symbolic",
    "counting",
    "plots",
    "roofline",
]

__version__ = "0.1.0"
