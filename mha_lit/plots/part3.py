"""Figures of Part III, "Attention in today's models" (chapters 14-18).

Each function's docstring names the chapter that draws it. Every
function returns its matplotlib Figure and does not show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401
import numpy as np  # noqa: F401

# --- chapter 14: grouped-query and multi-query attention --------------------


# --- chapter 15: rotary positions ---------------------------------------------


# --- chapter 16: sliding-window attention -------------------------------------


# --- chapter 17: latent KV ----------------------------------------------------


# --- chapter 18: what the cache costs, model by model ---------------------------


# every public figure function defined above, for ``from .part3 import *``
__all__ = sorted(name for name, obj in list(globals().items())
                 if callable(obj) and not name.startswith("_")
                 and getattr(obj, "__module__", None) == __name__)
