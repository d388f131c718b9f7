"""Figures of the book, one module per part.

- ``part1``: the first look and Part I, chapters 1-8 (``product_shapes``,
  ``matrix_panels``, ``attention_heatmap``, ``head_heatmaps``,
  ``concat_output``, ``dependency_grid``, ``kv_cost_curves``,
  ``gpt_block_diagram``);
- ``interactive``: ``interactive_heatmaps``, the heatmaps of the first look
  and chapters 3 and 4 that a web page lets the reader hover (its style and
  script are the package files ``interactive.css`` and ``interactive.js``);
- ``part2``: Part II, chapters 9-13 (``one_hot_product``,
  ``matmul_count_bars``, ``flops_vs_length``, ``causal_block_kinds``,
  ``causal_block_grid``, ``roofline``);
- ``part3``: Part III, chapters 14-18;
- ``part4``: Part IV, chapters 19-21;
- ``part5``: Part V, chapters 22-24;
- ``_style``: the colours and cell helpers they share.

Every function draws with matplotlib and returns a Figure, except
``interactive_heatmaps``, whose object holds the same figure as a PNG and an
HTML version of it for web pages. Each function's docstring names the
chapter that shows it. Nothing here computes attention itself; the figures
draw what the other modules compute. Every figure is importable from here:
``plots.roofline`` is ``plots.part2.roofline``.
"""

from . import part3, part4, part5
from ._style import HIGHLIGHT
from .interactive import InteractiveHeatmaps, interactive_heatmaps
from .part1 import (
    attention_heatmap,
    concat_output,
    dependency_grid,
    gpt_block_diagram,
    head_heatmaps,
    kv_cost_curves,
    matrix_panels,
    product_shapes,
)
from .part2 import (
    causal_block_grid,
    flops_vs_length,
    matmul_count_bars,
    one_hot_product,
    roofline,
)

__all__ = [
    "HIGHLIGHT",
    "product_shapes",
    "matrix_panels",
    "attention_heatmap",
    "head_heatmaps",
    "InteractiveHeatmaps",
    "interactive_heatmaps",
    "concat_output",
    "dependency_grid",
    "kv_cost_curves",
    "gpt_block_diagram",
    "one_hot_product",
    "matmul_count_bars",
    "flops_vs_length",
    "causal_block_grid",
    "roofline",
] + part3.__all__ + part4.__all__ + part5.__all__  # parts 3-5 list theirs

from .part3 import *  # noqa: E402,F401,F403  (Part III, chapters 14-18)
from .part4 import *  # noqa: E402,F401,F403  (Part IV, chapters 19-21)
from .part5 import *  # noqa: E402,F401,F403  (Part V, chapters 22-24)
