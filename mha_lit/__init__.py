"""mha_lit: multi-head attention, computed, as the book teaches it.

The book: "Multi-Head Attention, Computed". Read the modules in the
book's order: ``shapes`` (Dims, Weights), ``encoding`` (the input X),
``masks`` and ``attention`` (softmax, the causal mask, the one
attention kernel, many heads), ``kv_cache``, ``block`` (the GPT block)
and ``variants`` (biases and padded batches, chapter 8; then Part III's
grouped heads, rotary positions and windows), ``symbolic`` (SymPy); then
Part II's ``trace`` (recording products), ``counting``, ``models``,
``fast`` (the fast path of ``multi_head_attention``), ``decoder`` (a
small GPT that generates) and ``roofline`` (from CPU to GPU); then Part
III's ``rope`` (rotary positions), ``latent`` (multi-head latent
attention and its cache), ``paged`` (a paged cache, blocks from one
pool) and ``quantized`` (8-bit keys and values); then Part IV's
``grad`` (the backward pass), ``flash`` (FlashAttention's backward)
and ``train`` (a model that learns); then Part V's ``parallel`` (the
program of one MPI rank: heads split, the sequence split, gradients
summed, and what the talking costs) and ``ranks`` (the programs real
ranks run, and ``launch``, which starts them). ``plots`` draws the figures of
every part; ``checks`` holds the checks at the door of the public
functions.

``import mha_lit`` needs NumPy only (``mpi4py`` is imported by the ranks
``ranks.launch`` starts): ``plots`` (matplotlib) and
``symbolic`` (SymPy) are imported the first time they are used, as
``mha_lit.plots`` or ``from mha_lit import symbolic``.
"""

import importlib

from . import (
    counting,
    flash,
    grad,
    latent,
    masks,
    models,
    paged,
    parallel,
    quantized,
    ranks,
    roofline,
    rope,
    trace,
    train,
    variants,
)
from .attention import (
    attention,
    attention_weights,
    causal_mask,
    multi_head_attention_reference,
    softmax,
)
from .block import (
    BlockWeights,
    dropout,
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
from .fast import multi_head_attention
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
    "dropout",
    "BlockWeights",
    "init_block_weights",
    "gpt_block",
    "gpt2_attention_weights",
    "symbolic",
    "counting",
    "plots",
    "roofline",
    "rope",
    "latent",
    "paged",
    "parallel",
    "quantized",
    "ranks",
    "grad",
    "flash",
    "train",
    "masks",
    "models",
    "trace",
    "variants",
]

__version__ = "0.1.0"

# Imported on first use, so that ``import mha_lit`` loads neither
# matplotlib nor SymPy (PEP 562).
_LAZY_MODULES = ("plots", "symbolic")


def __getattr__(name: str):
    """Import ``plots`` or ``symbolic`` the first time it is asked for."""
    if name in _LAZY_MODULES:
        # importing binds the module here, so this runs once per module
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
