"""Figures of Part V, "Attention on many devices" (chapters 22-24).

Each function's docstring names the chapter that draws it. Every
function returns its matplotlib Figure and does not show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401
import numpy as np  # noqa: F401

from ._style import HIGHLIGHT, annotate  # noqa: F401

__all__: list[str] = []

# --- chapter 22: splitting the heads ---

# --- chapter 23: splitting the sequence ---

# --- chapter 24: the cost of talking ---
