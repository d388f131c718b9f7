"""The interactive attention heatmaps of the HTML book (first look, ch. 3, 4).

Book: the first look, chapters 3 and 4. ``interactive_heatmaps`` draws
attention weights as an SVG with one <rect> per weight, which a reader
can hover, focus or tap, with buttons that switch between heads; a PDF or
a static viewer gets a PNG of the same weights instead. The page's style
and behaviour are two files of this package, ``interactive.css`` and
``interactive.js``, written inline into every figure so that a figure
works on its own (in a notebook, on a page) and nothing is fetched from
the network; the script installs its listeners once per page and they
serve every figure of the page, later ones included.
"""

from __future__ import annotations

import io
from functools import cache
from html import escape
from importlib.resources import files

import matplotlib.pyplot as plt
import numpy as np

from ..masks import causal as causal_mask_of
from .part1 import attention_heatmap, head_heatmaps

__all__ = ["InteractiveHeatmaps", "interactive_heatmaps"]

_SUBSCRIPT = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
_CELL_PX = 64  # side of one weight's square in the SVG, in CSS pixels


@cache
def _page_file(name: str) -> str:
    """The text of ``interactive.css`` or ``interactive.js``, read once."""
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


class InteractiveHeatmaps:
    """Attention weights for a web page (hover, switch heads) and as a PNG.

    Made by ``interactive_heatmaps``. A notebook front end or MyST-NB shows
    the representation its output can hold: a web page the HTML
    (``_repr_html_``), a PDF or a static viewer the PNG (``_repr_png_``).
    ``weights[i][r][c]`` is the weight of head i, query r, key c (from 0),
    formatted as the HTML shows it.
    """

    def __init__(self, html: str, png: bytes, weights: list, shape: tuple):
        self.html, self.png = html, png
        self.weights, self.shape = weights, shape

    def _repr_html_(self) -> str:
        return self.html

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        h, n, m = self.shape
        return (f"<interactive attention heatmaps: {h} head(s), {n} queries "
                f"x {m} keys>")


def _hex(rgba) -> str:
    return "#" + "".join(f"{round(255 * v):02x}" for v in rgba[:3])


def _svg_text(x, y, text, size, anchor="middle", extra="") -> str:
    return (f'<text x="{x:g}" y="{y:g}" font-size="{size}" '
            f'text-anchor="{anchor}"{extra}>{text}</text>')


def _panel_svg(weights, masked, tokens, title) -> str:
    """One head's weights as an SVG: a <rect> per weight, labels, title."""
    n, m = len(weights), len(weights[0])
    side = _CELL_PX
    x0 = 30 + 9 * max(len(t) for t in tokens)  # the grid's left edge
    y0 = 30  # and its top
    width, height = x0 + m * side + 10, y0 + n * side + 46
    cmap = plt.get_cmap("Blues")
    rects, labels = [], []
    for r in range(n):
        for c in range(m):
            x, y = x0 + c * side, y0 + r * side
            mid_x, mid_y = x + side / 2, y + side / 2 + 4
            rect = (f'<rect x="{x}" y="{y}" width="{side}" height="{side}" '
                    f'data-i="{r}" data-j="{c}" '
                    f'data-q="{escape(tokens[m - n + r])}" '
                    f'data-k="{escape(tokens[c])}" data-w="{weights[r][c]}" '
                    'tabindex="0"')
            if masked[r][c]:
                rects.append(rect + ' fill="#dddddd" data-masked="true"/>')
                half = side // 2
                labels.append(
                    f'<path d="M{x} {y + side}L{x + side} {y}'
                    f'M{x} {y + half}L{x + half} {y}'
                    f'M{x + half} {y + side}L{x + side} {y + half}" '
                    'stroke="#999999"/>'
                    + _svg_text(mid_x, mid_y, "masked", 10,
                                extra=' fill="#555555"'))
                continue
            # Coloured by the printed weight, so that the last bits of the
            # float cannot change the colour.
            rgba = cmap(float(weights[r][c]))
            dark = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] < 0.5
            rects.append(rect + f' fill="{_hex(rgba)}"/>')
            labels.append(_svg_text(mid_x, mid_y, weights[r][c], 13,
                                    extra=' fill="#ffffff"' if dark else ""))
    for c, token in enumerate(tokens):
        labels.append(_svg_text(x0 + c * side + side / 2, y0 + n * side + 17,
                                escape(token), 14))
    for r, token in enumerate(tokens[m - n:]):
        labels.append(_svg_text(x0 - 6, y0 + r * side + side / 2 + 5,
                                escape(token), 14, anchor="end"))
    mid_x, mid_y = x0 + m * side / 2, y0 + n * side / 2
    labels.append(
        _svg_text(mid_x, y0 + n * side + 37, "key (the token attended to)",
                  13)
        + _svg_text(14, mid_y, "query", 13,
                    extra=f' transform="rotate(-90 14 {mid_y:g})"')
        + _svg_text(mid_x, 19, escape(title), 15))
    label = escape(f"{title}: attention weights of {n} queries over {m} "
                   "keys")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{label}"><rect width="{width}" height="{height}" '
            'fill="#ffffff"/><g stroke="#ffffff">' + "".join(rects)
            + '</g><g pointer-events="none" fill="#000000">'
            + "".join(labels) + "</g></svg>")


def interactive_heatmaps(S, tokens=None, titles=None, figure=None,
                         causal: bool = True,
                         decimals: int = 3) -> InteractiveHeatmaps:
    """Attention weights a reader can hover, one head at a time.

    Book: the first look, chapters 3 and 4. S is (h, n, m), or one head's
    (n, m): S[i - 1] holds head i's weights, rows the queries (the last n
    of the m tokens) and columns the keys. In the HTML book each weight is
    one SVG <rect> carrying its query, key and weight (``decimals`` places,
    the digits the reader sees); hovering, focusing or tapping it shows
    them, and buttons switch between heads. Everything is inline: a few
    lines of CSS and JavaScript, nothing fetched from the network. With
    ``causal``, entries above the diagonal are drawn hatched as "masked"
    and must be 0. A PDF or a static viewer gets the PNG of ``figure``
    (a Figure; it is closed once drawn), by default ``head_heatmaps`` of S
    (``attention_heatmap`` panels for one head or for n < m).
    """
    S = np.asarray(S, dtype=float)
    given = S.shape  # error messages name the shape the caller passed
    if S.ndim == 2:
        S = S[None]
    if S.ndim != 3 or 0 in S.shape:
        raise ValueError("interactive_heatmaps needs S of shape (heads, n, m) "
                         f"or (n, m), none of them 0; got shape {given}")
    h, n, m = S.shape
    if n > m:
        raise ValueError(f"S of shape {given} has {n} queries but only "
                         f"{m} keys; every query is also a key")
    if not np.all(np.isfinite(S)) or S.min() < -1e-9 or S.max() > 1 + 1e-9:
        raise ValueError(f"S of shape {given} must hold weights in [0, 1]")
    masked = (~causal_mask_of(n, m) if causal
              else np.zeros((n, m), bool))  # (n, m)
    if np.any(S[:, masked] != 0):
        raise ValueError(f"S of shape {given} has non-zero weight above the "
                         "diagonal, where the causal mask allows none")
    tokens = ([f"token {k + 1}" for k in range(m)] if tokens is None
              else [str(t) for t in tokens])
    if len(tokens) != m:
        raise ValueError(f"S of shape {given} has {m} keys but "
                         f"{len(tokens)} token labels were given")
    if titles is not None and len(titles) != h:
        raise ValueError(f"{len(titles)} titles for {h} heads "
                         f"(S of shape {given})")
    shown = ([f"head {i}: S{str(i).translate(_SUBSCRIPT)}"
              for i in range(1, h + 1)] if titles is None else list(titles))
    weights = [[[format(v, f".{decimals}f") for v in row]
                for row in np.clip(S[i], 0.0, 1.0)] for i in range(h)]
    if figure is None and h > 1 and n == m and causal:
        figure = head_heatmaps(S, tokens=tokens, titles=titles)
    elif figure is None:  # one head, or n < m: the panels of head_heatmaps
        figure, axes = plt.subplots(1, h, squeeze=False,
                                    figsize=(1.0 * m * h + 1.8, 0.9 * n + 1.5))
        for i, ax in enumerate(axes[0]):
            attention_heatmap(S[i], ax=ax, tokens=tokens, causal=causal,
                              title=None if titles is None else titles[i])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=figure.dpi, bbox_inches="tight")
    plt.close(figure)
    buttons = ""
    if h > 1:
        buttons = ('<div class="mha-attn-heads" role="group" '
                   'aria-label="attention head">' + "".join(
                       f'<button type="button" data-head="{i}" '
                       f'aria-pressed="{str(i == 0).lower()}">'
                       f'{escape(shown[i])}</button>' for i in range(h))
                   + "</div>")
    panels = "".join(
        f'<div class="mha-attn-panel" data-head="{i}"'
        + ("" if i == 0 else " hidden") + ">"
        + _panel_svg(weights[i], masked, tokens, shown[i]) + "</div>"
        for i in range(h))
    html = (f'<div class="mha-attn" data-heads="{h}">'
            f"<style>\n{_page_file('interactive.css')}</style>"
            f"{buttons}{panels}"
            '<div class="mha-attn-tip" role="status" hidden></div>'
            f"<script>\n{_page_file('interactive.js')}</script></div>")
    return InteractiveHeatmaps(html, buffer.getvalue(), weights, (h, n, m))
