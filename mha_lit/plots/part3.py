"""Figures of Part III, "Attention in today's models" (chapters 14-18).

Each function's docstring names the chapter that draws it. Every
function returns its matplotlib Figure and does not show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401
import numpy as np  # noqa: F401

from ..checks import groups, positive_int
from ..masks import window_reach

# --- chapter 14: grouped-query and multi-query attention ---


def head_groups(heads: int, kv_heads) -> plt.Figure:
    """Which key/value head each query head uses, one panel per h_kv.

    Book: Part III, chapter 14 "Grouped-query and multi-query attention".
    ``kv_heads`` is one number h_kv or a list of them, each dividing
    ``heads``. In each panel the h query heads Q_1 .. Q_h form the top row
    and the h_kv key/value heads the bottom one; a line joins query head i
    to key/value head ceil(i / g), g = heads / h_kv (``i // g`` counted
    from 0), and each group has its own colour. Artists carry gids
    ``query:i``, ``kv:j`` and ``uses:i->j`` (counted from 1). Returns the
    Figure.
    """
    h = positive_int(heads, "heads")
    counts = [kv_heads] if np.ndim(kv_heads) == 0 else list(kv_heads)
    if not counts:
        raise ValueError("head_groups needs at least one value of kv_heads")
    for k in counts:
        groups(h, positive_int(k, "kv_heads"))
    fig, axes = plt.subplots(len(counts), 1, squeeze=False,
                             figsize=(max(4.0, 0.95 * h + 1.6),
                                      1.9 * len(counts)))
    colours = plt.get_cmap("tab10").colors
    for ax, h_kv in zip(axes[:, 0], counts, strict=True):
        _draw_groups(ax, h, int(h_kv), colours)
    fig.tight_layout()
    return fig


def _draw_groups(ax, h: int, h_kv: int, colours) -> None:
    """One panel of ``head_groups``: h query heads above h_kv K/V heads."""
    g = h // h_kv
    kind = ("multi-head" if h_kv == h else "multi-query" if h_kv == 1
            else "grouped-query")
    ax.set_title(f"{kind}: $h$ = {h} query heads, "
                 f"$h_\\mathrm{{kv}}$ = {h_kv}, $g$ = {g}", fontsize=11)
    for i in range(1, h + 1):  # query head i, in group ceil(i / g)
        j = (i - 1) // g + 1
        colour = colours[(j - 1) % len(colours)]
        x_q, x_kv = i - 1, (j - 1) * g + (g - 1) / 2
        ax.plot([x_q, x_kv], [1.45, 0.75], color=colour, lw=1.6,
                gid=f"uses:{i}->{j}")
        ax.add_patch(plt.Rectangle((x_q - 0.35, 1.45), 0.7, 0.5,
                                   facecolor=colour, alpha=0.35,
                                   edgecolor=colour, gid=f"query:{i}"))
        ax.text(x_q, 1.7, f"$Q_{{{i}}}$", ha="center", va="center",
                fontsize=11)
    for j in range(1, h_kv + 1):
        colour = colours[(j - 1) % len(colours)]
        x_kv = (j - 1) * g + (g - 1) / 2
        ax.add_patch(plt.Rectangle((x_kv - 0.42, 0.0), 0.84, 0.75,
                                   facecolor=colour, alpha=0.75,
                                   edgecolor=colour, gid=f"kv:{j}"))
        ax.text(x_kv, 0.375, f"$K_{{{j}}}$\n$V_{{{j}}}$", ha="center",
                va="center", fontsize=10)
    ax.set_xlim(-0.6, h - 0.4)
    ax.set_ylim(-0.1, 2.05)
    ax.set_xticks([])
    ax.set_yticks([0.375, 1.7], ["key/value\nheads", "query\nheads"])
    ax.tick_params(axis="y", length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)


# --- chapter 15: rotary positions ---


def rope_planes(d: int = 14, positions=range(11), base: float = 10000.0,
                cols: int = 4):
    """Where RoPE turns the point (1, 0) of each plane, position by position.

    Book: chapter 15, "The frequencies". One panel per plane j = 1 .. d/2:
    the unit circle and the points that ``rope.rotate`` makes of a row
    holding (1, 0) in every plane, at each of ``positions`` (coloured by
    position). A panel's title gives the plane's angle per position
    omega_j (radians) and its wavelength 2 pi / omega_j (positions per
    full turn). ``cols`` panels a row keep the figure narrow.
    Returns the Figure.
    """
    from ..rope import frequencies, rotate  # refuses an odd or small d

    omega = frequencies(d, base)  # (P,)
    P = len(omega)
    pos = np.asarray(positions)
    if pos.ndim != 1 or pos.size == 0:
        raise ValueError(f"rope_planes needs a non-empty 1-D sequence of "
                         f"positions, got shape {pos.shape}")
    cols = positive_int(cols, "cols")
    # the row with (1, 0) in every plane, half split: P ones, then P zeros
    unit = np.concatenate([np.ones(P), np.zeros(P)])  # (d,)
    turned = rotate(np.tile(unit, (len(pos), 1)), pos, base)  # (n, d)
    cols = min(cols, P)
    rows = -(-P // cols)  # ceiling
    fig, axes = plt.subplots(rows, cols, figsize=(1.7 * cols + 1.0,
                                                  2.2 * rows),
                             squeeze=False, layout="constrained")
    circle = np.linspace(0, 2 * np.pi, 181)  # (181,)
    for j, ax in enumerate(axes.flat):
        if j >= P:
            ax.set_visible(False)
            continue
        ax.plot(np.cos(circle), np.sin(circle), color="0.75", lw=1,
                gid="circle")
        ax.axhline(0, color="0.9", lw=0.8, zorder=0)
        ax.axvline(0, color="0.9", lw=0.8, zorder=0)
        px, py = turned[:, j], turned[:, P + j]  # (n,) each: plane j's points
        dots = ax.scatter(px, py, c=pos, cmap="viridis", vmin=pos.min(),
                          vmax=max(pos.max(), pos.min() + 1), s=22,
                          zorder=3, gid="positions")
        turn = 2 * np.pi / omega[j]  # wavelength, in positions
        ax.set_title(f"plane {j + 1}\nω = {omega[j]:.3g}\n"
                     f"2π/ω = {turn:,.{1 if turn < 100 else 0}f}",
                     fontsize=9)
        ax.set_xlim(-1.25, 1.25)
        ax.set_ylim(-1.25, 1.25)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
    bar = fig.colorbar(dots, ax=axes.ravel().tolist(), shrink=0.8)
    bar.set_label("position p")
    return fig


# --- chapter 16: sliding-window attention ---

_UNREACHED, _REACHED, _QUERY_ROW = 0, 1, 2  # cell kinds of the reach figure


def sliding_window_reach(n: int, w: int, layers=(1, 2, 3),
                         query: int | None = None) -> plt.Figure:
    """The sliding-window mask and what stacked layers reach, side by side.

    Book: chapter 16. One panel per entry L of ``layers``: the n x n
    pattern ``masks.window_reach(n, w, L)``, output rows t down the side, input
    rows u along the top, both counted from 1. For L = 1 it is the mask
    itself (the keys query t sees). Row ``query`` (counted from 1, default
    n) is drawn in the highlight colour, and each panel's title says how
    many inputs it reaches. Returns the Figure.
    """
    from matplotlib.colors import ListedColormap

    from ._style import HIGHLIGHT

    layers = [layers] if isinstance(layers, int) else list(layers)
    if not layers:
        raise ValueError("layers must name at least one depth, got none")
    patterns = [window_reach(n, w, L) for L in layers]  # checks n, w, L
    query = n if query is None else query
    if (isinstance(query, bool) or not isinstance(query, int)
            or not 1 <= query <= n):
        raise ValueError(f"query must be a position 1 .. {n}, got {query!r}")
    cmap = ListedColormap(["#f2f2f2", "#7fa7d6", HIGHLIGHT])
    fig, axes = plt.subplots(1, len(layers), squeeze=False,
                             figsize=(0.24 * n * len(layers) + 1.2,
                                      0.24 * n + 1.6))
    for ax, L, R in zip(axes[0], layers, patterns, strict=True):
        kinds = np.where(R, _REACHED, _UNREACHED)  # (n, n)
        kinds[query - 1][R[query - 1]] = _QUERY_ROW  # (n,): the query's row
        ax.pcolormesh(np.arange(n + 1), np.arange(n + 1), kinds, cmap=cmap,
                      vmin=-0.5, vmax=2.5, edgecolors="white", linewidth=1)
        ax.set_xlim(0, n)
        ax.set_ylim(n, 0)
        ax.set_aspect("equal")
        step = 1 if n <= 20 else int(np.ceil(n / 10))
        ticks = np.arange(0, n, step)  # 0-based cells, labelled from 1
        ax.set_xticks(ticks + 0.5, [str(t + 1) for t in ticks], fontsize=7)
        ax.set_yticks(ticks + 0.5, [str(t + 1) for t in ticks], fontsize=7)
        ax.xaxis.tick_top()
        ax.xaxis.set_label_position("top")
        ax.set_xlabel("input row u" if L > 1 else "key u", fontsize=9)
        ax.set_ylabel("output row t" if L > 1 else "query t", fontsize=9)
        count = int(R[query - 1].sum())
        ax.set_title(f"the mask, w = {w}\nquery {query} sees {count} keys"
                     if L == 1 else f"{L} layers of window {w}\noutput "
                     f"{query} reaches {count} inputs", fontsize=9)
    fig.tight_layout()
    return fig


# --- chapter 17: latent KV ---

_LATENT_COLOURS = {"key": "#9ecae1", "value": "#fdae6b", "latent": "#a1d99b",
                   "rotary": "#d95f02"}  # rotary: the shared HIGHLIGHT colour


def latent_cache_cells(heads: int = 2, d_k: int = 7, d_v: int = 11,
                       d_c: int = 13, d_r: int = 8) -> plt.Figure:
    """One token's cached numbers, one cell each: MHA's row and MLA's.

    Book: chapter 17, "One row per token". The top row is what multi-head
    attention keeps per token and layer: h keys of d_k cells, then h
    values of d_v cells; the bottom row what latent attention keeps: the
    latent c (d_c cells) and the rotary key k_R (d_r cells). Every cell is
    a Rectangle with gid "key", "value", "latent" or "rotary"; each row
    ends with its count of numbers. At most 120 cells a row.
    Returns the Figure.
    """
    sizes = {"heads": heads, "d_k": d_k, "d_v": d_v, "d_c": d_c, "d_r": d_r}
    for name, value in sizes.items():
        positive_int(value, name)
    mha, mla = heads * (d_k + d_v), d_c + d_r
    if max(mha, mla) > 120:
        raise ValueError(f"latent_cache_cells draws one cell per number; "
                         f"rows of {mha} and {mla} cells are too long "
                         "(at most 120)")
    gap = 0.6
    mha_blocks = ([("key", f"$k_{{{i}}}$", d_k) for i in range(1, heads + 1)]
                  + [("value", f"$v_{{{i}}}$", d_v)
                     for i in range(1, heads + 1)])
    mla_blocks = [("latent", "$c$", d_c), ("rotary", "$k_R$", d_r)]
    width = max(mha + gap * (2 * heads - 1), mla + gap)
    left, right = 10.5, 6.0  # room for the row names and the counts
    bottom, top = -0.3, 4.6
    fig, ax = plt.subplots(figsize=(0.2 * (width + left + right),
                                    0.2 * (top - bottom)))  # 0.2 in a cell
    fig.subplots_adjust(left=0, right=1, bottom=0, top=1)
    for y, blocks, total, name in (
            (2.5, mha_blocks, mha, "multi-head attention"),
            (0.0, mla_blocks, mla, "latent attention")):
        x = 0.0
        for kind, label, cells in blocks:
            for j in range(cells):
                ax.add_patch(plt.Rectangle(
                    (x + j, y), 1, 1, facecolor=_LATENT_COLOURS[kind],
                    edgecolor="white", lw=1, gid=kind))
            ax.text(x + cells / 2, y + 1.1, f"{label} ({cells})",
                    ha="center", va="bottom", fontsize=10)
            x += cells + gap
        ax.text(x + 0.3, y + 0.5, f"{total} numbers", ha="left",
                va="center", fontsize=11)
        ax.text(-0.6, y + 0.5, name, ha="right", va="center", fontsize=11)
    ax.set_xlim(-left, width + right)
    ax.set_ylim(bottom, top)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


# --- chapter 18: what the cache costs, model by model ---

_GIB = 2**30  # bytes in a GiB, the unit of kv_cache_growth's axis


def kv_cache_growth(curves, weights=None, capacity=None) -> plt.Figure:
    """One sequence's KV cache against its length, one line per model.

    Book: chapter 18, "The cache against the weights". ``curves`` maps a
    model's label to (tokens, bytes): its cache at each of those sequence
    lengths, drawn in GiB (2**30 bytes) on log-log axes and ending in a dot
    (the context length, when the curve runs that far). ``weights`` maps
    some of the labels to the size of the model's weights in bytes, a
    dashed line in the model's colour; ``capacity`` = (label, bytes) is one
    device's memory, a dotted black line. Artists carry gids "cache:<label>",
    "weights:<label>" and "capacity". Returns the Figure.
    """
    weights = dict(weights or {})
    if not curves:
        raise ValueError("curves must name at least one model")
    data = {}
    for label, (tokens, nbytes) in curves.items():
        n = np.asarray(tokens, dtype=float)  # (points,)
        b = np.asarray(nbytes, dtype=float)  # (points,)
        if n.ndim != 1 or n.shape != b.shape or n.size < 2:
            raise ValueError(
                f"curve {label!r} needs as many byte counts as lengths, at "
                f"least two, got shapes {n.shape} and {b.shape}")
        if np.any(n <= 0) or np.any(b <= 0):
            raise ValueError(f"curve {label!r} has a length or a size <= 0; "
                             "log axes need positive values")
        data[label] = (n, b)
    for label, size in weights.items():
        if label not in data:
            raise ValueError(f"weights name {label!r}, which has no curve; "
                             f"curves are {sorted(data)}")
        if not size > 0:
            raise ValueError(f"weights of {label!r} must be positive, "
                             f"got {size!r}")
    if capacity is not None and not capacity[1] > 0:
        raise ValueError(f"capacity must be positive, got {capacity[1]!r}")
    fig, ax = plt.subplots(figsize=(9.4, 5.2))
    colours = plt.get_cmap("tab10").colors
    for k, (label, (n, b)) in enumerate(data.items()):
        colour = colours[k % len(colours)]
        ax.loglog(n, b / _GIB, color=colour, lw=2.2, label=f"{label}: cache",
                  gid=f"cache:{label}")
        ax.plot(n[-1:], b[-1:] / _GIB, "o", color=colour, ms=6)
        if label in weights:
            ax.axhline(weights[label] / _GIB, color=colour, ls="--", lw=1.3,
                       label=f"{label}: weights", gid=f"weights:{label}")
    if capacity is not None:
        ax.axhline(capacity[1] / _GIB, color="black", ls=":", lw=1.8,
                   label=capacity[0], gid="capacity")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(plt.FuncFormatter(
        lambda t, _: f"{t / 1024:g}K" if t >= 1024 else f"{t:g}"))
    ax.set_xlabel("tokens in the sequence (K = 1,024)")
    ax.set_ylabel("GiB (2^30 bytes)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


# every public figure function defined above, for ``from .part3 import *``
__all__ = sorted(name for name, obj in list(globals().items())
                 if callable(obj) and not name.startswith("_")
                 and getattr(obj, "__module__", None) == __name__)
