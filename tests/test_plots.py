"""Every figure function returns a Figure that draws what it claims to."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mha_lit import plots  # noqa: E402,F401

# --- Part I, chapters 1-3 -----------------------------------------------------------------

# --- end of Part I, chapters 1-3 ------------------------------------------------------------

# --- Part I, chapters 4-7 -----------------------------------------------------------------

# --- end of Part I, chapters 4-7 --------------------------------------------------------------

# --- Part I, chapter 8 -------------------------------------------------------------------

# --- end of Part I, chapter 8 ------------------------------------------------------------------

# --- Part II ----------------------------------------------------------------------------

# --- end of Part II --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")
