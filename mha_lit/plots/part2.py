"""Figures of Part II (chapters 9-13).

Part II is "Matrix multiplications in a transformer". Each function's
docstring names the chapter that draws it. Every function returns its
matplotlib Figure and does not show it. Nothing here computes attention:
``causal_block_grid`` draws the block kinds that ``fast.causal_block_kinds``
computes.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..fast import COMPUTED, MASKED, SKIPPED, causal_block_kinds
from ._style import HIGHLIGHT

# --- Part II, chapters 9-12: counting matrix multiplications --------------


def one_hot_product(O, E, X) -> plt.Figure:
    """The embedding as a product: one-hot O (n, V) times E (V, d_model).

    Book: chapter 9, "The embedding as a product". The product is
    X (n, d_model). The three matrices are drawn side by side as heatmaps,
    each titled with its shape.
    """
    O, E, X = (np.asarray(a, dtype=float) for a in (O, E, X))
    if O.ndim != 2 or E.ndim != 2 or X.ndim != 2:
        raise ValueError("O, E, X must be matrices, got shapes "
                         f"{O.shape}, {E.shape}, {X.shape}")
    if O.shape[1] != E.shape[0] or X.shape != (O.shape[0], E.shape[1]):
        raise ValueError(
            f"O {O.shape} times E {E.shape} cannot give X {X.shape}")
    fig, axes = plt.subplots(1, 3, figsize=(6.4, 3.2),
                             width_ratios=[O.shape[1], E.shape[1] + 2,
                                           X.shape[1] + 2])
    names = [("one-hot $O$", O, "Greys"), ("embedding $E$", E, "RdBu_r"),
             ("$X_\\text{tok} = O E$", X, "RdBu_r")]
    lim = float(np.abs(E).max()) or 1.0
    for ax, (name, M, cmap) in zip(axes, names, strict=False):
        vmin, vmax = (0, 1) if cmap == "Greys" else (-lim, lim)
        ax.imshow(M, cmap=cmap, vmin=vmin, vmax=vmax)
        ax.set_title(f"{name}\n{M.shape[0]} × {M.shape[1]}")
        # rows and columns counted from 1, as in the text
        ax.set_xticks(range(M.shape[1]), range(1, M.shape[1] + 1))
        ax.set_yticks(range(M.shape[0]), range(1, M.shape[0] + 1))
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def matmul_count_bars(separate, fused, multiply_adds=None,
                      title=None) -> plt.Figure:
    """Matrix products per component, head by head and fused, log scale.

    Book: chapter 10. ``separate`` and ``fused`` map the same component
    names to counts of products; the optional ``multiply_adds`` (same
    names) adds a second panel with the arithmetic, which fusing does not
    change.
    """
    names = list(separate)
    if list(fused) != names or (multiply_adds is not None
                                and list(multiply_adds) != names):
        raise ValueError("all mappings need the same components in the same "
                         f"order, got {names}, {list(fused)}")
    panels = 1 if multiply_adds is None else 2
    fig, axes = plt.subplots(panels, 1,
                             figsize=(7.5, 0.55 * len(names) * panels + 1.6),
                             squeeze=False)
    y = np.arange(len(names))  # one row of bars per component
    ax = axes[0, 0]
    for offset, data, label, color in (
            (-0.2, separate, "one product per head", HIGHLIGHT),
            (0.2, fused, "heads fused / batched", "#1b9e77")):
        vals = [data[k] for k in names]
        bars = ax.barh(y + offset, vals, height=0.4, label=label, color=color)
        ax.bar_label(bars, labels=[f"{v:,}" for v in vals], fontsize=8,
                     padding=2)
    ax.set_xscale("log")
    # a bar of 1 product stays visible on the log axis
    ax.set_xlim(left=0.5)
    ax.set_xlabel("matrix products (log scale)")
    ax.legend(loc="lower right", fontsize=8)
    if multiply_adds is not None:
        ax2 = axes[1, 0]
        vals = [multiply_adds[k] for k in names]
        bars = ax2.barh(y, vals, height=0.5, color="#7570b3")
        ax2.bar_label(bars, labels=[f"{v:.2g}" for v in vals], fontsize=8,
                      padding=2)
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


def flops_vs_length(seq_lens, models, crossovers, contexts=None,
                    crossovers_ffn=None) -> plt.Figure:
    """FLOPs of one forward pass against sequence length, log-log.

    Book: chapter 11. One panel per model, stacked. ``models`` maps a model
    name to curves (name -> FLOPs at each of ``seq_lens``); ``crossovers``
    maps it to the length where the n^2 curve meets the projections
    (dashed line); ``contexts`` to the model's context length (dotted
    line); ``crossovers_ffn`` to the length where n^2 meets projections
    plus feed-forward network (dash-dot line).
    """
    n = np.asarray(seq_lens, dtype=float)
    if n.ndim != 1 or n.size < 2 or np.any(n <= 0):
        raise ValueError("seq_lens must be at least two positive lengths, "
                         f"got {seq_lens!r}")
    fig, axes = plt.subplots(len(models), 1,
                             figsize=(6.5, 4.2 * len(models)), squeeze=False)
    for ax, (name, curves) in zip(axes[:, 0], models.items(), strict=False):
        for label, values in curves.items():
            values = np.asarray(values, dtype=float)
            if values.shape != n.shape:
                raise ValueError(f"curve {label!r} of {name} has "
                                 f"{values.size} values for {n.size} lengths")
            ax.loglog(n, values, label=label, lw=2)
        ax.axvline(crossovers[name], ls="--", color="k", lw=1,
                   label=f"$n^2$ = projections at n = "
                         f"{crossovers[name]:,.0f}")
        if crossovers_ffn is not None:
            ax.axvline(crossovers_ffn[name], ls="-.", color="k", lw=1,
                       label="$n^2$ = projections + feed-forward at n = "
                             f"{crossovers_ffn[name]:,.0f}")
        if contexts is not None:
            ax.axvline(contexts[name], ls=":", color="grey", lw=1.5,
                       label=f"context length {contexts[name]:,}")
        ax.set_title(name)
        ax.set_xlabel("sequence length n (tokens)")
        ax.set_ylabel("FLOPs per forward pass")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def causal_block_grid(n: int, block: int | None = None) -> plt.Figure:
    """The score blocks of a causal pass: computed, masked or skipped.

    Book: chapter 12, "Skipping the masked blocks". Draws
    ``fast.causal_block_kinds(n, block)`` at the true sizes of the blocks; the
    title gives the share of the n^2 score entries that is skipped.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Polygon

    from ..fast import BLOCK_ROWS
    block = BLOCK_ROWS if block is None else block
    kinds = causal_block_kinds(n, block)  # (k, k), fast.py's block rule
    edges = np.minimum(np.arange(0, n + block, block), n)  # (k + 1,)
    sizes = np.diff(edges)  # (k,) rows of each block
    skipped = (np.outer(sizes, sizes) * (kinds == SKIPPED)).sum() / n**2
    colors = {SKIPPED: "#f2f2f2", MASKED: HIGHLIGHT, COMPUTED: "#1b9e77"}
    cmap = ListedColormap([colors[k] for k in (SKIPPED, MASKED, COMPUTED)])
    fig, ax = plt.subplots(figsize=(5.6, 6.2))
    ax.pcolormesh(edges, edges, kinds, cmap=cmap, vmin=-0.5, vmax=2.5,
                  edgecolors="white", linewidth=1.5)
    ax.plot([0, n], [0, n], color="k", lw=1)  # key index = query index
    for i in np.flatnonzero(np.diag(kinds) == MASKED):
        r0, r1 = edges[i], edges[i + 1]  # the masked part: keys after query
        ax.add_patch(Polygon([(r0, r0), (r1, r0), (r1, r1)], fill=False,
                             hatch="///", edgecolor="white", lw=0))
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    firsts = [str(e + 1) for e in edges[:-1]]  # counted from 1, as in the text
    ax.set_xticks(edges[:-1], firsts)
    ax.set_yticks(edges[:-1], firsts)
    ax.tick_params(labelsize=7)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("first key of the block (columns of S)")
    ax.set_ylabel("first query of the block (rows of S)")
    names = {COMPUTED: "computed in full", MASKED: "computed, then the "
             "hatched half masked", SKIPPED: "skipped, never computed"}
    ax.legend(handles=[Patch(color=colors[k], label=f"{names[k]} "
                             f"({(kinds == k).sum()})")
                       for k in (COMPUTED, MASKED, SKIPPED)],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=8)
    ax.set_title(f"n = {n}, blocks of {block}: {skipped:.0%} of the "
                 "score entries skipped", fontsize=10, pad=8)
    fig.tight_layout()
    return fig

# --- end of Part II, chapters 9-12 -----------------------------------------


# --- Part II, chapter 13: the roofline ---------------------------------------

_ROOF_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e")
_POINT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def roofline(ceilings, points=None, title=None) -> plt.Figure:
    """Roofline of one or more machines, with products placed on it.

    Book: chapter 13. ``ceilings`` maps a machine's label to (peak FLOP/s,
    bandwidth in bytes/s); its roof min(peak, intensity * bandwidth) is
    drawn log-log with its ridge point marked. ``points`` maps a product's
    label to (intensity in FLOPs/byte, machine label): the product is
    drawn on that machine's roof, at the rate the roofline allows it.
    Roof lines carry gid "roof:<label>", points "point:<label>".
    """
    if not ceilings:
        raise ValueError("ceilings must name at least one machine")
    points = dict(points or {})
    for label, (peak, bw) in ceilings.items():
        if not (peak > 0 and bw > 0):
            raise ValueError(f"machine {label!r} needs a positive peak and "
                             f"bandwidth, got {peak!r} and {bw!r}")
    for label, (intensity, machine) in points.items():
        if machine not in ceilings:
            raise ValueError(f"point {label!r} names machine {machine!r}, "
                             f"not one of {sorted(ceilings)}")
        if not intensity > 0:
            raise ValueError(f"point {label!r} needs a positive intensity, "
                             f"got {intensity!r}")
    ridges = [peak / bw for peak, bw in ceilings.values()]
    xs = [i for i, _ in points.values()] + ridges
    x = np.logspace(np.floor(np.log10(min(xs) / 2)),
                    np.ceil(np.log10(max(xs) * 4)), 200)
    fig, ax = plt.subplots(figsize=(7.2, 5.0))
    colors = dict(zip(ceilings, _ROOF_COLORS * len(ceilings), strict=False))
    for label, (peak, bw) in ceilings.items():
        ax.loglog(x, np.minimum(peak, x * bw), color=colors[label], lw=2.2,
                  label=f"{label}: ridge at {peak / bw:,.1f} FLOPs/byte",
                  gid=f"roof:{label}")
        ax.plot([peak / bw], [peak], marker="|", ms=14, mew=2,
                color=colors[label])
    for j, (label, (intensity, machine)) in enumerate(points.items()):
        peak, bw = ceilings[machine]
        ax.plot([intensity], [min(peak, intensity * bw)],
                marker=_POINT_MARKERS[j % len(_POINT_MARKERS)], ms=8,
                ls="none", color=colors[machine], mec="black",
                label=f"{label} ({intensity:,.1f})", gid=f"point:{label}")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("attainable rate (FLOP/s)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5, loc="lower right")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
