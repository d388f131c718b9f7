"""Figures of Part IV, "Attention, learned" (chapters 19-21).

Each function's docstring names the chapter that draws it. Every
function returns its matplotlib Figure and does not show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401
import numpy as np  # noqa: F401

# --- chapter 19: the backward pass of attention ---

# --- chapter 20: what the backward pass costs ---

# --- chapter 21: a model that learns ---


# every public figure function defined above, for ``from .part4 import *``
__all__ = sorted(name for name, obj in list(globals().items())
                 if callable(obj) and not name.startswith("_")
                 and getattr(obj, "__module__", None) == __name__)
