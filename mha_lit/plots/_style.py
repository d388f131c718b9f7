"""Colours and cell helpers that the figures of every part share.

``HIGHLIGHT`` marks what a figure points at (the shared axis of a product,
the entry being computed, masked blocks); ``annotate`` and ``cell_text``
write numbers into the cells of an ``imshow``, dark on light cells and
white on dark ones.
"""

from __future__ import annotations

import numpy as np

HIGHLIGHT = "#d95f02"  # the shared axis of a product, the entry being computed
CELL = "#e8eef7"  # an ordinary cell of a shape diagram


def annotate(ax, M, fmt, skip=lambda i, j: False):
    """Write each entry of M in its cell.

    Dark text on light cells and white on dark ones.
    """
    image = ax.images[0]
    for (i, j), v in np.ndenumerate(M):
        if not skip(i, j):
            r, g, b, _ = image.cmap(image.norm(v))
            # luminance of the cell colour
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
            ax.text(j, i, format(v, fmt), ha="center", va="center",
                    fontsize=9, color="white" if dark else "black")


def cell_text(ax, r: int, c: int, text: str, dark: bool,
               size: float = 10) -> None:
    """Write text in cell (r, c) of an imshow.

    White on dark cells and black on light ones.
    """
    ax.text(c, r, text, ha="center", va="center", fontsize=size,
            color="white" if dark else "black")
