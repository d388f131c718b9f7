"""Figures of Part III, "Attention in today's models" (chapters 14-18).

Each function's docstring names the chapter that draws it. Every
function returns its matplotlib Figure and does not show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401
import numpy as np  # noqa: F401

from ..checks import groups, positive_int
from ..masks import band, sink_band, window_reach

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


# --- chapter 15 (scaling): beyond the trained length ---


def rope_wavelengths(d: int, base: float, trained_length: int,
                     longer: int | None = None) -> plt.Figure:
    """The wavelength of every plane, with the trained length marked.

    Book: Part III, chapter 15, "Beyond the trained length". The
    wavelength 2 pi / omega_j of each plane j = 1 .. d/2 (log scale); the
    planes whose largest trained angle (trained_length - 1) omega_j stays
    below 2 pi, which never made a full turn in training, are drawn in the
    highlight colour (gid "never turned", the others gid "turned"). Dashed
    line (gid "trained"): trained_length; dotted (gid "longer"): a longer
    context, if given. Returns the Figure.
    """
    from ..rope import frequencies
    from ._style import HIGHLIGHT

    omega = frequencies(d, base)  # (P,); refuses an odd d or base <= 1
    L0 = positive_int(trained_length, "trained_length")
    wavelength = 2 * np.pi / omega  # (P,)
    j = np.arange(1, len(omega) + 1)  # (P,): planes counted from 1
    never = wavelength > L0 - 1  # (P,): largest angle below 2 pi
    fig, ax = plt.subplots(figsize=(7.0, 3.6), layout="constrained")
    ax.scatter(j[~never], wavelength[~never], s=16, color="0.45",
               gid="turned", label="a full turn or more in training")
    ax.scatter(j[never], wavelength[never], s=16, color=HIGHLIGHT,
               gid="never turned",
               label=f"less than one turn in training ({never.sum()} planes)")
    ax.axhline(L0, color="black", ls="--", lw=1, gid="trained",
               label=f"trained length {L0:,}")
    if longer is not None:
        longer = positive_int(longer, "longer")
        ax.axhline(longer, color="black", ls=":", lw=1, gid="longer",
                   label=f"a longer context, {longer:,}")
    ax.set_yscale("log")
    ax.set_xlabel("plane j", fontsize=9)
    ax.set_ylabel(r"wavelength $2\pi/\omega_j$ (positions)", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def rope_scaling_frequencies(d: int, base: float, rules: dict, *,
                             length: int | None = None,
                             trained_length: int | None = None,
                             cols: int = 2) -> plt.Figure:
    """The frequencies of a head before and after each rope_scaling rule.

    Book: Part III, chapter 15, "Beyond the trained length". ``rules``
    maps a panel title to a rope_scaling dictionary; each panel draws
    omega_j by plane j (log scale): the trained frequencies in grey (gid
    "trained") and ``rope.frequencies(d, base, rule, length=length)`` in
    colour (gid "scaled"). With ``trained_length`` L_0, a dashed line (gid
    "one turn") at 2 pi / L_0: planes below it turn less than once in L_0
    positions. Panels share their axes. Returns the Figure.
    """
    from ..rope import frequencies
    from ._style import HIGHLIGHT

    if not isinstance(rules, dict) or not rules:
        raise ValueError("rules must map at least one panel title to a "
                         "rope_scaling dictionary")
    omega = frequencies(d, base)  # (P,); refuses an odd d or base <= 1
    scaled = {title: frequencies(d, base, rule, length=length)
              for title, rule in rules.items()}  # each (P,); checks rule
    cols = min(positive_int(cols, "cols"), len(rules))
    L0 = (None if trained_length is None
          else positive_int(trained_length, "trained_length"))
    rows = -(-len(rules) // cols)  # ceiling
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows),
                             squeeze=False, sharex=True, sharey=True,
                             layout="constrained")
    j = np.arange(1, len(omega) + 1)  # (P,): planes counted from 1
    for ax, (title, w) in zip(axes.flat[:len(scaled)], scaled.items(),
                              strict=True):
        ax.plot(j, omega, color="0.6", lw=2, gid="trained",
                label="trained")
        ax.plot(j, w, color=HIGHLIGHT, lw=1.2, marker="o", ms=2.5,
                gid="scaled", label="with the rule")
        if L0 is not None:
            ax.axhline(2 * np.pi / L0, color="black", ls="--", lw=0.8,
                       gid="one turn", label=f"one turn in {L0:,}")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(rules):]:
        ax.set_visible(False)
    # the lowest panel of each column carries its plane labels (one above
    # an empty slot of the last row too)
    for c in range(cols):
        r = max(r for r in range(rows) if r * cols + c < len(rules))
        axes[r, c].set_xlabel("plane j", fontsize=9)
        axes[r, c].tick_params(labelbottom=True)
    for ax in axes[:, 0]:
        ax.set_ylabel(r"$\omega_j$ (radians per position)", fontsize=9)
    axes.flat[0].legend(fontsize=8, loc="lower left")
    return fig


# --- chapter 16: sliding-window attention ---

_UNREACHED, _REACHED, _QUERY_ROW = 0, 1, 2  # cell kinds of the reach figure


def _square_grid(ax, n: int) -> None:
    """An n x n grid of cells, row 1 at the top, labelled from 1 on both
    axes (every cell up to 20, else about ten labels), keys along the top.

    Book: Part III, chapter 16 (its figures of masks and reach).
    """
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    step = 1 if n <= 20 else int(np.ceil(n / 10))
    ticks = np.arange(0, n, step)  # 0-based cells, labelled from 1
    ax.set_xticks(ticks + 0.5, [str(t + 1) for t in ticks], fontsize=7)
    ax.set_yticks(ticks + 0.5, [str(t + 1) for t in ticks], fontsize=7)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")


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
        _square_grid(ax, n)
        ax.set_xlabel("input row u" if L > 1 else "key u", fontsize=9)
        ax.set_ylabel("output row t" if L > 1 else "query t", fontsize=9)
        count = int(R[query - 1].sum())
        ax.set_title(f"the mask, w = {w}\nquery {query} sees {count} keys"
                     if L == 1 else f"{L} layers of window {w}\noutput "
                     f"{query} reaches {count} inputs", fontsize=9)
    fig.tight_layout()
    return fig


# --- chapter 16 (sinks, local/global) ---

_HIDDEN, _WINDOW, _SINK = 0, 1, 2  # cell kinds of the sink-band figure
_SINK_COLOURS = ["#f2f2f2", "#7fa7d6", "#1b9e77"]
_GIB_16 = 2**30  # bytes in a GiB, the unit of local_global_cache's axis


def sink_band_mask(n: int, w: int, sinks: int,
                   query: int | None = None) -> plt.Figure:
    """The sliding-window mask beside the same window with attention sinks.

    Book: Part III, chapter 16, "Attention sinks". Left: ``band(n, w)``;
    right: ``sink_band(n, w, sinks)``, where the keys that only the sinks
    keep (among the first ``sinks``, outside the window) have a colour of
    their own. Queries t down the side, keys u along the top, both from
    1. Row ``query`` (default n) is outlined (gid "query") and each
    panel's title counts the keys it sees. Returns the Figure.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle

    from ._style import HIGHLIGHT

    window = band(n, w)  # (n, n), checks n and w
    kept = sink_band(n, w, sinks)  # (n, n), checks sinks
    query = n if query is None else query
    if (isinstance(query, bool) or not isinstance(query, int)
            or not 1 <= query <= n):
        raise ValueError(f"query must be a position 1 .. {n}, got {query!r}")
    panels = [(np.where(window, _WINDOW, _HIDDEN),
               f"window w = {w}\nquery {query} sees "
               f"{int(window[query - 1].sum())} keys"),
              (np.where(window, _WINDOW, np.where(kept, _SINK, _HIDDEN)),
               f"{sinks} sinks and window w = {w}\nquery {query} sees "
               f"{int(kept[query - 1].sum())} keys")]
    cmap = ListedColormap(_SINK_COLOURS)
    fig, axes = plt.subplots(1, 2, figsize=(0.48 * n + 1.4, 0.24 * n + 1.5))
    for ax, (kinds, title) in zip(axes, panels, strict=True):
        ax.pcolormesh(np.arange(n + 1), np.arange(n + 1), kinds, cmap=cmap,
                      vmin=-0.5, vmax=2.5, edgecolors="white", linewidth=1)
        ax.add_patch(Rectangle((0, query - 1), n, 1, fill=False, lw=2,
                               edgecolor=HIGHLIGHT, gid="query"))
        _square_grid(ax, n)
        ax.set_xlabel("key u", fontsize=9)
        ax.set_ylabel("query t", fontsize=9)
        ax.set_title(title, fontsize=9)
    handles = [Patch(color=_SINK_COLOURS[_WINDOW], label="in the window"),
               Patch(color=_SINK_COLOURS[_SINK], label="kept as a sink"),
               Patch(facecolor="none", edgecolor=HIGHLIGHT, lw=2,
                     label=f"query {query}")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def local_global_cache(curves, window: int, context: int) -> plt.Figure:
    """One sequence's KV cache against its length, as released and all global.

    Book: Part III, chapter 16, "Local and global layers". ``curves`` maps a
    model's label to (tokens, bytes, all_global_bytes): its cache with its
    local and global layers (a solid line, gid "stack:<label>") and with
    every layer global (dashed, in the same colour, gid "global:<label>"),
    in GiB (2**30 bytes) on linear axes. Dotted vertical lines mark the
    window w (gid "window") and the context length (gid "context").
    Returns the Figure.
    """
    window = positive_int(window, "window")
    context = positive_int(context, "context")
    if not curves:
        raise ValueError("curves must name at least one model")
    data = {}
    for label, (tokens, stack, full) in curves.items():
        n = np.asarray(tokens, dtype=float)  # (points,)
        a = np.asarray(stack, dtype=float)  # (points,)
        b = np.asarray(full, dtype=float)  # (points,)
        if n.ndim != 1 or n.size < 2 or not a.shape == b.shape == n.shape:
            raise ValueError(
                f"curve {label!r} needs two byte counts per length, at "
                f"least two lengths, got shapes {n.shape}, {a.shape} and "
                f"{b.shape}")
        if np.any(a > b):
            raise ValueError(f"curve {label!r} holds more with its local "
                             "layers than with every layer global")
        data[label] = (n, a, b)
    fig, ax = plt.subplots(figsize=(9.4, 5.0))
    colours = plt.get_cmap("tab10").colors
    for k, (label, (n, a, b)) in enumerate(data.items()):
        colour = colours[k % len(colours)]
        ax.plot(n, a / _GIB_16, color=colour, lw=2.2, gid=f"stack:{label}",
                label=f"{label}: local and global, as released")
        ax.plot(n, b / _GIB_16, color=colour, lw=1.4, ls="--",
                gid=f"global:{label}", label=f"{label}: every layer global")
    ax.axvline(window, color="black", ls=":", lw=1.2, gid="window",
               label=f"window w = {window:,}")
    ax.axvline(context, color="grey", ls=":", lw=1.2, gid="context",
               label=f"context length {context:,}")
    ax.xaxis.set_major_locator(plt.MultipleLocator(window))
    ax.xaxis.set_major_formatter(plt.FuncFormatter(
        lambda t, _: f"{t / 1024:g}K" if t >= 1024 else f"{t:g}"))
    ax.set_xlim(0, None)
    ax.set_ylim(0, None)
    ax.set_xlabel("tokens in the sequence (K = 1,024)")
    ax.set_ylabel("KV cache of one sequence, GiB (2^30 bytes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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


# --- chapter 18 (a paged cache): block tables and the pool of blocks ---

_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "pad": 1.0}


def paged_blocks(tables, lengths, block_size: int,
                 num_blocks: int) -> plt.Figure:
    """Each sequence's block table above the pool of blocks they point to.

    Book: Part III, chapter 18, "A paged cache". ``tables`` maps a
    sequence's label to its block ids in position order (what
    ``PagedKVCache.block_table`` returns), ``lengths`` the label to its
    rows. Top: one row per sequence, logical block j (from 0, the index
    of the block table) a box naming its block of the pool, the rows it
    holds shaded in the sequence's colour. Bottom: the ``num_blocks``
    blocks of the pool, in the colour of the one sequence that holds
    them, hatched grey with the number of sequences when shared, white
    when free. Artists carry gids "table:<label>:<j>" and
    "block:<id>:<free|own|shared>". Returns the Figure.
    """
    from matplotlib.patches import Rectangle

    b = positive_int(block_size, "block_size")
    N = positive_int(num_blocks, "num_blocks")
    refs = _check_tables(tables, lengths, b, N)  # (N,) sequences per block
    longest = max([len(t) for t in tables.values()] + [1])
    width = max(N, longest + 2)
    fig, (top, pool) = plt.subplots(
        2, 1, figsize=(0.62 * width + 1.4, 0.55 * len(tables) + 2.4),
        gridspec_kw={"height_ratios": [max(len(tables), 1), 1.3]})
    colours = plt.get_cmap("tab10").colors
    owner = {}
    for r, (label, table) in enumerate(tables.items()):
        colour, n = colours[r % len(colours)], lengths[label]
        top.text(-0.2, -r, f"{label} ({n} rows)", ha="right",
                 va="center", fontsize=9)
        for j, block in enumerate(table):
            held = min(b, n - j * b) / b  # share of the block's rows
            top.add_patch(Rectangle((j + 0.05, -r - 0.4), 0.9 * held, 0.8,
                                    facecolor=colour, alpha=0.45, lw=0))
            top.add_patch(Rectangle(
                (j + 0.05, -r - 0.4), 0.9, 0.8, fill=False, lw=1.2,
                edgecolor="0.2", hatch="//" if refs[block] > 1 else None,
                gid=f"table:{label}:{j}"))
            top.text(j + 0.5, -r, str(block), ha="center", va="center",
                     fontsize=9, bbox=_LABEL_BOX)
            owner.setdefault(block, colour)
    for j in range(longest):  # the logical blocks, from 0
        top.text(j + 0.5, 0.55, str(j), ha="center", va="bottom",
                 fontsize=8)
    top.text(-0.2, 0.55, "logical block", ha="right", va="bottom",
             fontsize=8)
    top.set_xlim(-3.2, width)
    top.set_ylim(-len(tables) + 0.4, 0.95)
    top.set_title(f"block tables (logical blocks of {b} rows; the number "
                  "is the block of the pool)", fontsize=9)
    for k in range(N):
        kind = ("free" if refs[k] == 0 else "own" if refs[k] == 1
                else "shared")
        face = {"free": "white", "own": owner.get(k, "white"),
                "shared": "0.75"}[kind]
        pool.add_patch(Rectangle((k + 0.05, -0.4), 0.9, 0.8, facecolor=face,
                                 alpha=0.45 if kind == "own" else 1.0,
                                 edgecolor="0.2", lw=1.2,
                                 hatch="//" if kind == "shared" else None,
                                 gid=f"block:{k}:{kind}"))
        pool.text(k + 0.5, 0.0, str(k), ha="center", va="center",
                  fontsize=9, bbox=_LABEL_BOX)
        note = {"free": "free", "own": "", "shared": f"×{refs[k]}"}[kind]
        pool.text(k + 0.5, -0.48, note, ha="center", va="top", fontsize=8)
    pool.text(-0.2, 0.0, "block id", ha="right", va="center", fontsize=8)
    pool.set_xlim(-3.2, width)
    pool.set_ylim(-0.85, 0.5)
    pool.set_title(f"the pool: {N} blocks, {int((refs > 0).sum())} in use",
                   fontsize=9)
    for ax in (top, pool):
        ax.axis("off")
    fig.tight_layout()
    return fig


def _check_tables(tables, lengths, b: int, N: int) -> np.ndarray:
    """Reference counts (N,) of the blocks in ``tables``, checked."""
    if set(tables) != set(lengths):
        raise ValueError(f"tables name {sorted(map(str, tables))} but "
                         f"lengths name {sorted(map(str, lengths))}")
    refs = np.zeros(N, dtype=int)  # (N,)
    for label, table in tables.items():
        n = lengths[label]
        if len(table) != -(-n // b):
            raise ValueError(f"{label!r} has {n} rows, which take "
                             f"{-(-n // b)} blocks of {b}, but its table "
                             f"lists {len(table)}")
        for block in table:
            if not 0 <= block < N:
                raise ValueError(f"{label!r} names block {block}, outside "
                                 f"the pool's 0 .. {N - 1}")
            refs[block] += 1
    return refs


# every public figure function defined above, for ``from .part3 import *``
__all__ = sorted(name for name, obj in list(globals().items())
                 if callable(obj) and not name.startswith("_")
                 and getattr(obj, "__module__", None) == __name__)
