"""Figures of the first look and of Part I (chapters 1-8).

Part I is "Computing multi-head attention". Each function's docstring
names the chapter that draws it. Every function returns its matplotlib
Figure and does not show it. The heatmaps a web page lets the reader
hover, ``interactive_heatmaps``, are in ``interactive``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..masks import causal as causal_mask_of
from ._style import CELL, HIGHLIGHT, annotate, cell_text

# --- Part I, chapters 1-3: matrix products, attention weights --------------

def _block(ax, x0, rows, cols, name, shade):
    """Draw a rows x cols grid of unit cells with its left edge at x0.

    shade(i, j) -> bool says which cells are highlighted.
    """
    for i in range(rows):
        for j in range(cols):
            hot = shade(i, j)
            ax.add_patch(plt.Rectangle((x0 + j, -i - 1), 1, 1,
                                       facecolor=HIGHLIGHT if hot
                                       else CELL, edgecolor="white", lw=1.5,
                                       gid="highlight" if hot else "cell"))
    ax.text(x0 + cols / 2, 0.9, f"{name}\n{rows} × {cols}", ha="center",
            va="bottom", fontsize=15)


def product_shapes(a: int, b: int, c: int, entry=(1, 1),
                   names=("A", "C", "R"), ax=None):
    """Shape diagram of an (a x b) times (b x c) product, one cell per entry.

    Book: chapter 1, R = A C. Row x of A and column y of C (``entry = (x, y)``,
    counted from 1) are highlighted, with the entry R_xy they produce; the
    shared size b is written in the highlight colour on both factors.
    Returns the Figure.
    """
    if min(a, b, c) < 1:
        raise ValueError("product_shapes needs positive sizes, "
                         f"got {a} x {b} times {b} x {c}")
    x, y = entry
    if not (1 <= x <= a and 1 <= y <= c):
        raise ValueError(f"entry {entry} is outside the {a} x {c} result")
    gap = 2.0
    xa, xb = 0.0, b + gap
    xr = xb + c + gap
    # inches, 0.32 per cell
    size = (0.32 * (xr + c) + 0.5, 0.32 * max(a, b) + 1.3)
    fig = ax.figure if ax is not None else plt.figure(figsize=size)
    ax = ax if ax is not None else fig.add_subplot()
    _block(ax, xa, a, b, names[0], lambda i, j: i == x - 1)
    _block(ax, xb, b, c, names[1], lambda i, j: j == y - 1)
    _block(ax, xr, a, c, names[2], lambda i, j: (i, j) == (x - 1, y - 1))
    mid = -min(a, b) / 2
    ax.plot([xb - gap + 0.6], [mid], "o", color="black",
            markersize=6)  # the product dot
    ax.text(xr - gap / 2, mid, "=", ha="center", va="center", fontsize=24)
    ax.text(xa + b / 2, -a - 0.2, f"{b} columns", ha="center", va="top",
            color=HIGHLIGHT, fontsize=14)
    ax.text(xb - 0.2, -b / 2, f"{b} rows", ha="right", va="center",
            rotation=90, color=HIGHLIGHT, fontsize=14)
    ax.set_xlim(-0.3, xr + c + 0.3)
    ax.set_ylim(-max(a, b) - 1.4, 2.6)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


def matrix_panels(matrices, names, ops=(), row_labels=None, fmt=".2f",
                  cell=0.62):
    """Annotated heatmaps stacked top to bottom, e.g. E + P = X.

    Book: chapter 2, "The input X". ``ops`` are the symbols written before
    the second, third, ... panel ("+", "="), ``row_labels`` (one per row)
    name the rows of every panel; one colour scale, centred on 0, is shared
    by all panels. Stacking keeps the figure narrow enough for a phone
    screen. Returns the Figure.
    """
    matrices = [np.asarray(M, dtype=float) for M in matrices]
    if len(names) != len(matrices) or len(ops) not in (0, len(matrices) - 1):
        raise ValueError(f"{len(matrices)} matrices need as many names and "
                         f"{len(matrices) - 1} operators, "
                         f"got {len(names)} and {len(ops)}")
    if any(M.ndim != 2 for M in matrices):
        raise ValueError(f"matrix_panels draws 2-D matrices, got shapes "
                         f"{[M.shape for M in matrices]}")
    vmax = max(float(np.abs(M).max()) for M in matrices) or 1.0
    heights = [M.shape[0] for M in matrices]
    cols = max(M.shape[1] for M in matrices)
    size = (cell * cols + 1.6,
            cell * sum(heights) + 0.75 * len(matrices))  # inches
    fig, axes = plt.subplots(len(matrices), 1, figsize=size,
                             gridspec_kw={"height_ratios": heights})
    axes = np.atleast_1d(axes)
    for k, (ax, M, name) in enumerate(zip(axes, matrices, names,
                                          strict=False)):
        ax.imshow(M, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        annotate(ax, M, fmt)
        ax.set_title(f"{name}  ({M.shape[0]} × {M.shape[1]})", fontsize=11)
        if k > 0 and ops:
            ax.text(-0.02, 1.04, ops[k - 1], transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=18, fontweight="bold")
        ax.set_xticks(range(M.shape[1]),
                      [str(j + 1) for j in range(M.shape[1])])
        labels = (range(1, M.shape[0] + 1) if row_labels is None
                  else row_labels)
        ax.set_yticks(range(M.shape[0]), [str(t) for t in labels])
        ax.tick_params(length=0, labelsize=9)
    fig.tight_layout(h_pad=0.6)
    return fig


def attention_heatmap(S, ax=None, title=None, tokens=None,
                      causal: bool = True, fmt=".3f"):
    """Heatmap of attention weights S (n x m), numbers in the cells.

    Book: chapter 3, "The attention weights S". With ``causal`` the
    strictly upper triangle (a query looking at a later key) is drawn
    hatched grey and labelled "masked"; S must be 0 there. Returns the
    Figure.
    """
    S = np.asarray(S, dtype=float)
    if S.ndim != 2:
        raise ValueError(
            f"attention_heatmap needs a 2-D S, got shape {S.shape}")
    n, m = S.shape
    masked = (~causal_mask_of(n, m) if causal
              else np.zeros((n, m), bool))  # (n, m)
    if np.any(S[masked] != 0):
        raise ValueError(f"S ({n} x {m}) has non-zero weight above the "
                         "diagonal, where the causal mask allows none")
    tokens = ([f"token {k + 1}" for k in range(m)] if tokens is None
              else list(tokens))
    if len(tokens) != m:
        raise ValueError(f"S has {m} columns but {len(tokens)} token labels "
                         "were given")
    fig = (ax.figure if ax is not None
           else plt.figure(figsize=(1.0 * m + 1.8, 0.9 * n + 1.2)))
    ax = ax if ax is not None else fig.add_subplot()
    ax.imshow(np.where(masked, np.nan, S), cmap="Blues", vmin=0, vmax=1)
    annotate(ax, S, fmt, skip=lambda i, j: masked[i, j])
    for i, j in zip(*np.nonzero(masked), strict=False):
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1,
                                   facecolor="#dddddd", hatch="//",
                                   edgecolor="#999999", lw=0, gid="masked"))
        ax.text(j, i, "masked", ha="center", va="center", fontsize=8,
                color="#555555")
    ax.set_xticks(range(m), tokens)
    ax.set_yticks(range(n), tokens[m - n:])
    ax.set_xlabel("key (the token attended to)")
    ax.set_ylabel("query")
    ax.tick_params(length=0)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig

# --- end of Part I, chapters 1-3 -------------------------------------------

# --- Part I, chapters 4-7: heads, output, dependence, KV cache -------------


def head_heatmaps(S, tokens=None, titles=None) -> plt.Figure:
    """Attention weights S_1, ..., S_h side by side, masked entries hatched.

    Book: chapter 4. S is (h, n, n): S[i - 1] is head i's matrix of
    attention weights. Each panel is drawn by ``attention_heatmap``
    (chapter 3), so the causal mask shows as hatched "masked" cells.
    ``titles`` (one per panel) defaults to "head i: S_i".
    """
    S = np.asarray(S, dtype=float)
    if S.ndim != 3 or S.shape[1] != S.shape[2]:
        raise ValueError(f"S must be (heads, n, n), got shape {S.shape}")
    h, n, _ = S.shape
    if titles is None:
        titles = [f"head {i}: $S_{i}$" for i in range(1, h + 1)]
    if len(titles) != h:
        raise ValueError(f"{len(titles)} titles for {h} heads")
    fig, axes = plt.subplots(1, h, figsize=(3.6 * h + 0.4, 0.9 * n + 1.5),
                             squeeze=False)
    for i, ax in enumerate(axes[0]):
        attention_heatmap(S[i], ax=ax, title=titles[i], tokens=tokens,
                          fmt=".3f")
    fig.tight_layout(w_pad=2.0)
    return fig


# Outlines of head 1, 2, 3, ...: colour and line style, neither red nor blue.
_HEAD_OUTLINES = [("#1b9e77", "-"), ("black", "--"), ("#e6ab02", ":")]


def concat_output(H, W_O) -> plt.Figure:
    """Concat(H_1, ..., H_h) W_O = Y laid out as a product, blocks outlined.

    Book: chapter 5. H is (h, n, d_v) (H[i - 1] is head i's output), W_O is
    (h*d_v, d_model). Concat sits bottom left, W_O top right, Y where their
    rows and columns meet; block i of Concat's columns and block i of W_O's
    rows share an outline (colour and line style), because they multiply
    each other. The outlines avoid red and blue, which show the values.
    """
    H, W_O = np.asarray(H, dtype=float), np.asarray(W_O, dtype=float)
    if (H.ndim != 3 or W_O.ndim != 2
            or W_O.shape[0] != H.shape[0] * H.shape[2]):
        raise ValueError("H must be (h, n, d_v) and W_O (h*d_v, d_model); "
                         f"got H {H.shape}, W_O {W_O.shape}")
    h, n, d_v = H.shape
    concat = np.concatenate(list(H), axis=1)  # (n, h*d_v)
    Y = concat @ W_O  # (n, d_model)
    fig = plt.figure(figsize=(7, 6.4), constrained_layout=True)
    grid = fig.add_gridspec(2, 2, width_ratios=[h * d_v, W_O.shape[1]],
                            height_ratios=[h * d_v, n])
    heads = ", ".join(f"H_{i + 1}" for i in range(h))
    panels = [(grid[1, 0], concat,
               rf"Concat$({heads})$: {n} × {h * d_v}"),
              (grid[0, 1], W_O, rf"$W_O$: {h * d_v} × {W_O.shape[1]}"),
              (grid[1, 1], Y, rf"$Y$: {n} × {W_O.shape[1]}")]
    for spec, M, title in panels:
        ax = fig.add_subplot(spec)
        lim = float(np.abs(M).max()) or 1.0
        ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(title, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
        for i in range(h if M is not Y else 0):
            color, style = _HEAD_OUTLINES[i % len(_HEAD_OUTLINES)]
            if M is concat:
                ax.add_patch(plt.Rectangle((i * d_v - 0.5, -0.5), d_v, n,
                                           fill=False, edgecolor=color,
                                           ls=style, lw=3))
                ax.text(i * d_v + d_v / 2 - 0.5, n - 0.5 + 0.15 * n,
                        f"$H_{i + 1}$", ha="center", va="top", color=color,
                        fontsize=12)
            else:
                ax.add_patch(plt.Rectangle((-0.5, i * d_v - 0.5), M.shape[1],
                                           d_v, fill=False, edgecolor=color,
                                           ls=style, lw=3))
                ax.text(-0.9, i * d_v + d_v / 2 - 0.5, f"block {i + 1}",
                        rotation=90, ha="right", va="center", color=color,
                        fontsize=11)
    note = fig.add_subplot(grid[0, 0])
    note.axis("off")
    note.text(0.5, 0.5, "$Y = \\sum_i H_i \\, W_{Oi}$\n\n"
              "block $i$ of $W_O$ (its rows)\n"
              "meets $H_i$ (its columns)", ha="center", va="center",
              fontsize=13)
    return fig


def dependency_grid(D, title: str = "") -> plt.Figure:
    """How much output row t moves with input row u: an n x n grid.

    Book: chapter 6. D[t - 1, u - 1] >= 0 is a size of the block
    dY_t / dX_u (for instance its largest entry). Cells exactly 0 are
    hatched and labelled "0".
    """
    D = np.asarray(D, dtype=float)
    if D.ndim != 2 or D.shape[0] != D.shape[1] or (D < 0).any():
        raise ValueError("D must be a square matrix of sizes >= 0, "
                         f"got shape {D.shape}")
    n = D.shape[0]
    fig, ax = plt.subplots(figsize=(1.2 * n + 2.2, 1.1 * n + 1.4),
                           constrained_layout=True)
    im = ax.imshow(np.ma.masked_equal(D, 0.0), cmap="Blues", vmin=0,
                   vmax=float(D.max()) or 1)
    for r, c in np.ndindex(n, n):
        if D[r, c] == 0:
            ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1,
                                       facecolor="white", hatch="//",
                                       edgecolor="#bbbbbb", lw=0, gid="zero"))
        cell_text(ax, r, c, "0" if D[r, c] == 0 else f"{D[r, c]:.2g}",
                   D[r, c] > 0.6 * D.max())
    ax.set_xticks(range(n), [f"$X_{j + 1}$" for j in range(n)])
    ax.set_yticks(range(n), [f"$Y_{j + 1}$" for j in range(n)])
    ax.set_xlabel("input row")
    ax.set_ylabel("output row")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.85)
    return fig


def kv_cost_curves(n, cached, recomputed) -> plt.Figure:
    """Multiply-adds per new token and in total, with and without the cache.

    Book: chapter 7. n is the number of tokens (1-D, increasing); cached[k]
    and recomputed[k] are the multiply-adds that produce output row n[k]
    with the KV cache and by recomputing all rows. Both axes are
    logarithmic, so growth like n shows as slope 1 and like n^2 as slope 2.
    """
    n, cached, recomputed = (np.asarray(a, dtype=float)
                             for a in (n, cached, recomputed))
    if not (n.ndim == 1 and n.shape == cached.shape == recomputed.shape
            and len(n) > 0):
        raise ValueError("n, cached and recomputed must be 1-D of one "
                         "length, got shapes "
                         f"{n.shape}, {cached.shape}, {recomputed.shape}")
    fig, (per, total) = plt.subplots(1, 2, figsize=(9, 3.6),
                                     constrained_layout=True)
    for ax, a, b, what in ((per, cached, recomputed, "for output row $n$"),
                           (total, np.cumsum(cached), np.cumsum(recomputed),
                            "for all of rows $1, \\ldots, n$")):
        ax.plot(n, b, "o-", color="C3", ms=3, label="recompute every row")
        ax.plot(n, a, "s-", color="C0", ms=3, label="with the KV cache")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens $n$ (log scale)")
        ax.set_ylabel("multiply-adds (log scale)")
        ax.set_title(f"multiply-adds {what}", fontsize=10)
        ax.grid(alpha=0.3)
    per.legend()
    return fig

# --- end of Part I, chapters 4-7 -------------------------------------------

# --- Part I, chapter 8: the GPT block --------------------------------------

_GPT_COLORS = {"embed": "#eeeeee", "attn": "#fdd9b5", "norm": "#dbe6f4",
               "ffn": "#d5ecd0", "out": "#eeeeee"}
# box width and height, distance between centres
_GPT_W, _GPT_H, _GPT_STEP = 5.1, 0.72, 1.2
_GPT_INCH = 0.62  # inches per data unit
_GPT_SKIP_X = _GPT_W / 2 + 0.55  # x of the vertical residual lines


def _gpt_nodes(pre_ln: bool, n: int, d_model: int,
               d_ff: int) -> list[tuple[str, str, str]]:
    """(kind, title, subtitle) of each node of the block diagram.

    Top to bottom.
    """
    attn = ("attn", "Masked multi-head attention",
            "chapters 3–7 of this book")
    ffn = ("ffn", "Feed-forward network",
           f"GELU, per row: {d_model} → {d_ff} → {d_model}")
    nodes = [("embed", "Token + position embedding",
              f"X: {n} × {d_model}, one row per token")]
    if pre_ln:
        nodes += [("norm", "Layer norm 1", "per row"), attn, ("add", "+", ""),
                  ("norm", "Layer norm 2", "per row"), ffn, ("add", "+", ""),
                  ("norm", "Final layer norm", "added in GPT-2, per row")]
    else:
        nodes += [attn,
                  ("norm", "Add & layer norm 1", "LN(X + attention), per row"),
                  ffn,
                  ("norm", "Add & layer norm 2", "LN(X′ + FFN), per row")]
    return nodes + [("out", "Linear: output layer",
                     "one score per vocabulary entry"),
                    ("out", "Softmax", "next-token probabilities, per row")]


def _gpt_node(ax, y: float, kind: str, title: str,
              subtitle: str) -> tuple[float, float]:
    """Draw one node centred at (0, y); return its half-width, half-height."""
    from matplotlib.patches import Circle, FancyBboxPatch

    if kind == "add":
        ax.add_patch(Circle((0, y), 0.26, facecolor="white", edgecolor="black",
                            lw=1.2, gid="node:+"))
        ax.text(0, y, "+", ha="center", va="center", fontsize=15)
        return 0.26, 0.26
    ax.add_patch(FancyBboxPatch((-_GPT_W / 2, y - _GPT_H / 2), _GPT_W, _GPT_H,
                                boxstyle="round,pad=0,rounding_size=0.12",
                                lw=1.2, facecolor=_GPT_COLORS[kind],
                                edgecolor="black", gid=f"node:{title}"))
    ax.text(0, y + 0.13, title, ha="center", va="center", fontsize=12)
    ax.text(0, y - 0.18, subtitle, ha="center", va="center", fontsize=10,
            color="#444444")
    return _GPT_W / 2, _GPT_H / 2


def _gpt_arrow(ax, points, gid: str) -> None:
    """An arrow along the polyline ``points`` (data coordinates).

    Its head is at the last point.
    """
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path

    ax.add_patch(FancyArrowPatch(path=Path(points), arrowstyle="-|>",
                                 mutation_scale=14, lw=1.3, color="black",
                                 gid=gid))


def _gpt_repeat_frame(ax, top: float, bottom: float, n_text: str) -> None:
    """The dashed frame around the nodes of one block.

    It is labelled "× L" (L blocks) on its right.
    """
    from matplotlib.patches import FancyBboxPatch

    left, right = -_GPT_W / 2 - 0.25, _GPT_SKIP_X + 0.3
    ax.add_patch(FancyBboxPatch((left, bottom), right - left, top - bottom,
                                fill=False,
                                boxstyle="round,pad=0,rounding_size=0.2",
                                ls="--", lw=1.1, edgecolor="#777777",
                                gid="frame"))
    ax.text(right + 0.1, (top + bottom) / 2, f"× L   ({n_text})",
            rotation=270, ha="left", va="center", fontsize=12)


def gpt_block_diagram(pre_ln: bool = False, n: int = 3, d_model: int = 5,
                      d_ff: int = 17, n_vocab: int = 13):
    """The GPT decoder stack as boxes and arrows, data flowing down.

    Book: chapter 8, "The decoder block at a glance"; figures 8.1 and 8.2.

    ``pre_ln=False`` draws GPT's block (layer norm after each residual
    addition), ``True`` GPT-2's (layer norm before each sub-layer, one more
    after the last block). Arrows carry their shape in the book's sizes;
    the dashed frame is the block, repeated L times; the output layer
    gives n_vocab scores per row. Node patches have gid
    "node:<title>", arrows "arrow" or "residual". Returns the Figure.
    """
    nodes = _gpt_nodes(pre_ln, n, d_model, d_ff)
    # node centres, top to bottom
    ys = [-_GPT_STEP * i for i in range(len(nodes))]
    xlim, ylim = (-_GPT_W / 2 - 0.4, _GPT_SKIP_X + 0.9), (ys[-1] - 0.45, 0.45)
    size = (_GPT_INCH * (xlim[1] - xlim[0]),
            _GPT_INCH * (ylim[1] - ylim[0]) + 0.6)
    fig, ax = plt.subplots(figsize=size, dpi=110, gridspec_kw={
        "left": 0.01, "right": 0.99, "bottom": 0.01,
        "top": 1 - 0.6 / size[1]})
    half_w, half = zip(*(_gpt_node(ax, y, *node)
                         for y, node in zip(ys, nodes, strict=False)),
                       strict=False)
    for i in range(len(nodes) - 1):
        _gpt_arrow(ax, [(0, ys[i] - half[i]), (0, ys[i + 1] + half[i + 1])],
                   "arrow")
        shape = (f"{n} × {n_vocab}" if i == len(nodes) - 2
                 else f"{n} × {d_model}")
        ax.text(-0.14, ys[i + 1] + half[i + 1] + 0.2, shape, ha="right",
                va="center", fontsize=9.5, color="#555555", style="italic")
    adds = [i for i, node in enumerate(nodes)
            if node[0] == "add" or "Add" in node[1]]
    for start, add in zip([0, adds[0]], adds, strict=False):
        # branch off just above the next node
        y0 = ys[start + 1] + half[start + 1] + 0.2
        ax.plot([0], [y0], "o", color="black", ms=4)
        _gpt_arrow(ax, [(0, y0), (_GPT_SKIP_X, y0), (_GPT_SKIP_X, ys[add]),
                        (half_w[add], ys[add])], "residual")
        ax.text((_GPT_W / 2 + _GPT_SKIP_X) / 2, (y0 + ys[add]) / 2,
                "residual", rotation=90, ha="center", va="center",
                fontsize=9.5, color="#555555")
    _gpt_repeat_frame(ax, ys[1] + half[1] + 0.42,
                      ys[adds[1]] - half[adds[1]] - 0.12,
                      "12 to 48 in GPT-2" if pre_ln else "12 in GPT")
    ax.set_title("GPT-2 (pre-LN): layer norm before\neach sub-layer"
                 if pre_ln else
                 "GPT (post-LN): layer norm after\neach residual addition",
                 fontsize=12.5)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig

# --- end of Part I, chapter 8 ----------------------------------------------
