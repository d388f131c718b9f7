"""Figures of the book. Every function draws with matplotlib and returns a Figure.

Book: each function's docstring names the chapter that shows it. Nothing here computes
attention itself; the figures draw what the other modules compute.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

# --- Part I, chapters 1-3: matrix products, attention weights ----------------------------

HIGHLIGHT = "#d95f02"  # the shared axis of a product, the entry being computed
_CELL = "#e8eef7"  # an ordinary cell of a shape diagram


def _block(ax, x0, rows, cols, name, shade):
    """Draw a rows x cols grid of unit cells with its left edge at x0; shade(i, j) -> bool."""
    for i in range(rows):
        for j in range(cols):
            hot = shade(i, j)
            ax.add_patch(plt.Rectangle((x0 + j, -i - 1), 1, 1, facecolor=HIGHLIGHT if hot
                                       else _CELL, edgecolor="white", lw=1.5,
                                       gid="highlight" if hot else "cell"))
    ax.text(x0 + cols / 2, 0.9, f"{name}\n{rows} × {cols}", ha="center", va="bottom", fontsize=11)


def product_shapes(a: int, b: int, c: int, entry=(1, 1), names=("A", "B", "R"), ax=None):
    """Shape diagram of an (a x b) times (b x c) product, one cell per entry. Book: chapter 1.

    Row x of A and column y of B (``entry = (x, y)``, counted from 1) are highlighted, with
    the entry R_xy they produce; the shared size b is written in the highlight colour on
    both factors. Returns the Figure.
    """
    if min(a, b, c) < 1:
        raise ValueError(f"product_shapes needs positive sizes, got {a} x {b} times {b} x {c}")
    x, y = entry
    if not (1 <= x <= a and 1 <= y <= c):
        raise ValueError(f"entry {entry} is outside the {a} x {c} result")
    gap = 2.0
    xa, xb = 0.0, b + gap
    xr = xb + c + gap
    size = (0.42 * (xr + c) + 0.6, 0.42 * max(a, b) + 1.4)  # inches, 0.42 per cell
    fig = ax.figure if ax is not None else plt.figure(figsize=size)
    ax = ax if ax is not None else fig.add_subplot()
    _block(ax, xa, a, b, names[0], lambda i, j: i == x - 1)
    _block(ax, xb, b, c, names[1], lambda i, j: j == y - 1)
    _block(ax, xr, a, c, names[2], lambda i, j: (i, j) == (x - 1, y - 1))
    mid = -min(a, b) / 2
    ax.text(xb - gap / 2, mid, "·", ha="center", va="center", fontsize=22)
    ax.text(xr - gap / 2, mid, "=", ha="center", va="center", fontsize=18)
    ax.text(xa + b / 2, -a - 0.2, f"{b} columns", ha="center", va="top", color=HIGHLIGHT,
            fontsize=10)
    ax.text(xb - 0.25, -b / 2, f"{b} rows", ha="right", va="center", rotation=90,
            color=HIGHLIGHT, fontsize=10)
    ax.set_xlim(-0.3, xr + c + 0.3)
    ax.set_ylim(-max(a, b) - 1.1, 2.2)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


def _annotate(ax, M, fmt, skip=lambda i, j: False):
    """Write each entry of M in its cell, dark text on light cells and white on dark ones."""
    image = ax.images[0]
    for (i, j), v in np.ndenumerate(M):
        if not skip(i, j):
            r, g, b, _ = image.cmap(image.norm(v))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # luminance of the cell colour
            ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=9,
                    color="white" if dark else "black")


def matrix_panels(matrices, names, ops=(), row_labels=None, fmt=".2f", ax_width=0.6):
    """Annotated heatmaps side by side, e.g. E + P = X. Book: chapter 2, "The input X".

    ``ops`` are the symbols written between consecutive panels ("+", "="), ``row_labels``
    (one per row) name the rows of every panel; one colour scale, centred on 0, is shared
    by all panels. Returns the Figure.
    """
    matrices = [np.asarray(M, dtype=float) for M in matrices]
    if len(names) != len(matrices) or len(ops) not in (0, len(matrices) - 1):
        raise ValueError(f"{len(matrices)} matrices need as many names and "
                         f"{len(matrices) - 1} operators, got {len(names)} and {len(ops)}")
    if any(M.ndim != 2 for M in matrices):
        raise ValueError(f"matrix_panels draws 2-D matrices, got shapes "
                         f"{[M.shape for M in matrices]}")
    vmax = max(float(np.abs(M).max()) for M in matrices) or 1.0
    widths = [M.shape[1] for M in matrices]
    rows = max(M.shape[0] for M in matrices)
    size = (ax_width * sum(widths) + 1.2 * len(matrices), ax_width * rows + 1.0)  # inches
    fig, axes = plt.subplots(1, len(matrices), figsize=size, gridspec_kw={"width_ratios": widths})
    axes = np.atleast_1d(axes)
    for k, (ax, M, name) in enumerate(zip(axes, matrices, names)):
        ax.imshow(M, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        _annotate(ax, M, fmt)
        ax.set_title(f"{name}  ({M.shape[0]} × {M.shape[1]})", fontsize=11)
        ax.set_xticks(range(M.shape[1]), [str(j + 1) for j in range(M.shape[1])])
        labels = range(1, M.shape[0] + 1) if row_labels is None else row_labels
        ax.set_yticks(range(M.shape[0]), [str(t) for t in labels])
        ax.tick_params(length=0, labelsize=9)
        if k < len(ops):
            ax.annotate(ops[k], xy=(1.0, 0.5), xycoords="axes fraction", xytext=(8, 0),
                        textcoords="offset points", ha="left", va="center", fontsize=18)
    fig.tight_layout(w_pad=2.5)
    return fig


def attention_heatmap(S, ax=None, title=None, tokens=None, causal: bool = True, fmt=".3f"):
    """Heatmap of attention weights S (n x m), numbers in the cells. Book: chapter 3, "H = S V".

    With ``causal`` the strictly upper triangle (a query looking at a later key) is drawn
    hatched grey and labelled "masked"; S must be 0 there. Returns the Figure.
    """
    S = np.asarray(S, dtype=float)
    if S.ndim != 2:
        raise ValueError(f"attention_heatmap needs a 2-D S, got shape {S.shape}")
    n, m = S.shape
    masked = np.triu(np.ones((n, m), dtype=bool), k=1 + m - n) if causal else np.zeros((n, m), bool)
    if np.any(S[masked] != 0):
        raise ValueError(f"S ({n} x {m}) has non-zero weight above the diagonal, where the "
                         "causal mask allows none")
    tokens = [f"token {k + 1}" for k in range(m)] if tokens is None else list(tokens)
    if len(tokens) != m:
        raise ValueError(f"S has {m} columns but {len(tokens)} token labels were given")
    fig = ax.figure if ax is not None else plt.figure(figsize=(1.0 * m + 1.8, 0.9 * n + 1.2))
    ax = ax if ax is not None else fig.add_subplot()
    ax.imshow(np.where(masked, np.nan, S), cmap="Blues", vmin=0, vmax=1)
    _annotate(ax, S, fmt, skip=lambda i, j: masked[i, j])
    for i, j in zip(*np.nonzero(masked)):
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#dddddd", hatch="//",
                                   edgecolor="#999999", lw=0, gid="masked"))
        ax.text(j, i, "masked", ha="center", va="center", fontsize=8, color="#555555")
    ax.set_xticks(range(m), tokens)
    ax.set_yticks(range(n), tokens[m - n:])
    ax.set_xlabel("key (the token attended to)")
    ax.set_ylabel("query")
    ax.tick_params(length=0)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig

# --- end of Part I, chapters 1-3 ------------------------------------------------------------

# --- Part I, chapters 4-7: heads, output, dependence, KV cache --------------------------------

# --- end of Part I, chapters 4-7 --------------------------------------------------------------

# --- Part I, chapter 8: the GPT block ----------------------------------------------------

# --- end of Part I, chapter 8 ------------------------------------------------------------------

# --- Part II: counting matrix multiplications ------------------------------------------


def one_hot_product(O, E, X) -> plt.Figure:
    """The embedding as a product: one-hot O (n, V) times E (V, d_model) gives X (n, d_model).

    Book: Part II, chapter 1, "The embedding as a product". The three matrices are drawn side
    by side as heatmaps, each titled with its shape.
    """
    O, E, X = (np.asarray(a, dtype=float) for a in (O, E, X))
    if O.ndim != 2 or E.ndim != 2 or X.ndim != 2:
        raise ValueError(f"O, E, X must be matrices, got shapes {O.shape}, {E.shape}, {X.shape}")
    if O.shape[1] != E.shape[0] or X.shape != (O.shape[0], E.shape[1]):
        raise ValueError(f"O {O.shape} times E {E.shape} cannot give X {X.shape}")
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.6), width_ratios=[O.shape[1], E.shape[1] + 2,
                                                                    X.shape[1] + 2])
    names = [("one-hot $O$", O, "Greys"), ("embedding $E$", E, "RdBu_r"), ("$X = O E$", X, "RdBu_r")]
    lim = float(np.abs(E).max()) or 1.0
    for ax, (name, M, cmap) in zip(axes, names):
        vmin, vmax = (0, 1) if cmap == "Greys" else (-lim, lim)
        ax.imshow(M, cmap=cmap, vmin=vmin, vmax=vmax)
        ax.set_title(f"{name}\n{M.shape[0]} × {M.shape[1]}")
        ax.set_xticks(range(M.shape[1]))
        ax.set_yticks(range(M.shape[0]))
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def matmul_count_bars(separate, fused, multiply_adds=None, title=None) -> plt.Figure:
    """Matrix products per component, head by head and fused, on a log scale. Book: Part II, ch. 2.

    ``separate`` and ``fused`` map the same component names to counts of products; the
    optional ``multiply_adds`` (same names) adds a second panel with the arithmetic, which
    fusing does not change.
    """
    names = list(separate)
    if list(fused) != names or (multiply_adds is not None and list(multiply_adds) != names):
        raise ValueError(f"all mappings need the same components in the same order, got "
                         f"{names}, {list(fused)}")
    panels = 1 if multiply_adds is None else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7.5, 0.55 * len(names) * panels + 1.6),
                             squeeze=False)
    y = np.arange(len(names))  # one row of bars per component
    ax = axes[0, 0]
    for offset, data, label, color in ((-0.2, separate, "one product per head", HIGHLIGHT),
                                       (0.2, fused, "heads fused / batched", "#1b9e77")):
        vals = [data[k] for k in names]
        bars = ax.barh(y + offset, vals, height=0.4, label=label, color=color)
        ax.bar_label(bars, labels=[f"{v:,}" for v in vals], fontsize=8, padding=2)
    ax.set_xscale("log")
    ax.set_xlabel("matrix products (log scale)")
    ax.legend(loc="lower right", fontsize=8)
    if multiply_adds is not None:
        ax2 = axes[1, 0]
        vals = [multiply_adds[k] for k in names]
        bars = ax2.barh(y, vals, height=0.5, color="#7570b3")
        ax2.bar_label(bars, labels=[f"{v:.2g}" for v in vals], fontsize=8, padding=2)
        ax2.set_xscale("log")
        ax2.set_xlabel("multiply-adds (log scale), the same either way")
    for a in axes[:, 0]:
        a.set_yticks(y, names)
        a.invert_yaxis()
        a.margins(x=0.25)
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    return fig


def flops_vs_length(seq_lens, models, crossovers, contexts=None) -> plt.Figure:
    """FLOPs of one forward pass against sequence length, log-log, one panel per model.

    Book: Part II, chapter 3. ``models`` maps a model name to curves (name -> FLOPs at each
    of ``seq_lens``); ``crossovers`` maps it to the length where the n^2 curve meets the
    projections (dashed line); ``contexts`` to the model's context length (dotted line).
    """
    n = np.asarray(seq_lens, dtype=float)
    if n.ndim != 1 or n.size < 2 or np.any(n <= 0):
        raise ValueError(f"seq_lens must be at least two positive lengths, got {seq_lens!r}")
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.2), squeeze=False)
    for ax, (name, curves) in zip(axes[0], models.items()):
        for label, values in curves.items():
            values = np.asarray(values, dtype=float)
            if values.shape != n.shape:
                raise ValueError(f"curve {label!r} of {name} has {values.size} values for "
                                 f"{n.size} lengths")
            ax.loglog(n, values, label=label, lw=2)
        ax.axvline(crossovers[name], ls="--", color="k", lw=1,
                   label=f"$n^2$ = projections at n = {crossovers[name]:,.0f}")
        if contexts is not None:
            ax.axvline(contexts[name], ls=":", color="grey", lw=1.5,
                       label=f"context length {contexts[name]:,}")
        ax.set_title(name)
        ax.set_xlabel("sequence length n (tokens)")
        ax.set_ylabel("FLOPs per forward pass")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig

# --- end of Part II --------------------------------------------------------------------------
