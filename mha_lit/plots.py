"""Figures of the book. Every function draws with matplotlib and returns a Figure.

Book: each function's docstring names the chapter that shows it. Nothing here computes
attention itself; the figures draw what the other modules compute.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

# --- Part I, chapters 1-3: matrix products, attention weights ----------------------------

# --- end of Part I, chapters 1-3 ------------------------------------------------------------

# --- Part I, chapters 4-7: heads, output, dependence, KV cache --------------------------------

# --- end of Part I, chapters 4-7 --------------------------------------------------------------

# --- Part I, chapter 8: the GPT block ----------------------------------------------------

# --- end of Part I, chapter 8 ------------------------------------------------------------------

# --- Part II: counting matrix multiplications ------------------------------------------

# --- end of Part II --------------------------------------------------------------------------
