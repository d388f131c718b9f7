"""Figures of Part V, "Attention on many devices" (chapters 22-24).

Each function's docstring names the chapter that draws it. Every
function returns its matplotlib Figure and does not show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401
import numpy as np  # noqa: F401

from ._style import HIGHLIGHT, annotate  # noqa: F401

__all__: list[str] = []

# --- chapter 22: splitting the heads ---

# --- chapter 23: splitting the sequence ---


def ring_work_grid(works) -> plt.Figure:
    """Scores each rank computes at each ring step, one panel per layout.

    Book: Part V, chapter 23 "Splitting the sequence", "Work per rank".
    ``works`` maps a layout's name to its (p, p) counts, rank r (row) at
    ring step s (column), as ``parallel.ring_work`` returns them. Below
    the ranks a last row, ``busiest``, holds each step's largest count
    (the rank the others wait for); the title gives their sum, the
    critical path. Every cell is labelled with its count. Returns the
    Figure.
    """
    panels = {str(k): np.asarray(v) for k, v in dict(works).items()}
    if not panels:
        raise ValueError("ring_work_grid needs at least one layout")
    shapes = {k: v.shape for k, v in panels.items()}
    p = next(iter(panels.values())).shape[0]
    if any(s != (p, p) for s in shapes.values()):
        raise ValueError(f"each layout needs a (p, p) array of counts, one "
                         f"shape for all; got {shapes}")
    if any(np.any(v < 0) or not np.issubdtype(v.dtype, np.integer)
           for v in panels.values()):
        raise ValueError("the counts must be integers >= 0")
    top = max(int(v.max()) for v in panels.values()) or 1
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             figsize=(len(panels) * (0.95 * p + 1.7),
                                      0.7 * p + 2.1))
    for ax, (name, work) in zip(axes[0], panels.items(), strict=True):
        busiest = work.max(axis=0)  # (p,): each step's slowest rank
        shown = np.vstack([work, busiest])  # (p + 1, p)
        ax.imshow(shown, cmap="Blues", vmin=0, vmax=1.35 * top)
        annotate(ax, shown, ",d")
        ax.axhline(p - 0.5, color="white", lw=4)
        ax.set_title(f"{name}: sum of busiest = {int(busiest.sum()):,}",
                     fontsize=10)
        ax.set_xticks(range(p), [f"step {s}" for s in range(p)])
        ax.set_yticks(range(p + 1),
                      [f"rank {r}" for r in range(p)] + ["busiest"])
        ax.tick_params(length=0, labelsize=9)
        ax.get_yticklabels()[-1].set_color(HIGHLIGHT)
    fig.tight_layout(w_pad=2.0)
    return fig


__all__ += ["ring_work_grid"]


def _position_runs(positions) -> str:
    """'6-7' or '0-1, 14-15': the runs of consecutive positions."""
    pos = np.asarray(positions, dtype=int)
    cuts = np.flatnonzero(np.diff(pos) != 1) + 1
    runs = np.split(pos, cuts)
    return ", ".join(f"{a[0]}" if len(a) == 1 else f"{a[0]}\u2013{a[-1]}"
                     for a in runs)


def ring_steps(layouts) -> plt.Figure:
    """What every rank holds at every step of the ring, one panel a layout.

    Book: Part V, chapter 23 "Splitting the sequence", "What each rank
    holds". ``layouts`` maps a layout's name to the positions each rank
    holds (``parallel.sequence_blocks``, a list of p arrays, ranks counted
    from 0). Cell (r, s) is rank r at step s: it holds the keys and values
    of rank (r - s) mod p, coloured by that rank, with their positions.
    A cell whose keys all come after all of rank r's queries has nothing
    to compute under the causal mask: it is hatched (gid "skipped").
    Arrows (gid "send") show each block passed from rank r at step s to
    rank r + 1 at step s + 1; from the last rank it goes to rank 0
    (marked by a half arrow out of the last row and one into the first).
    Returns the Figure.
    """
    panels = {str(k): [np.asarray(b) for b in v]
              for k, v in dict(layouts).items()}
    if not panels:
        raise ValueError("ring_steps needs at least one layout")
    sizes = {k: len(v) for k, v in panels.items()}
    p = next(iter(sizes.values()))
    if len(set(sizes.values())) != 1 or any(
            len(b) == 0 or b.ndim != 1 for v in panels.values() for b in v):
        raise ValueError(f"each layout needs the same number of ranks, each "
                         f"with a 1-D array of positions; got {sizes}")
    colours = plt.get_cmap("Pastel1").colors
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(1.55 * p + 2.2,
                                      len(panels) * (0.95 * p + 1.1)))
    for ax, (name, blocks) in zip(axes[:, 0], panels.items(), strict=True):
        _ring_panel(ax, name, blocks, colours)
    fig.tight_layout(h_pad=1.5)
    return fig


def _ring_panel(ax, name: str, blocks, colours) -> None:
    """One panel of ``ring_steps``: p ranks (rows) by p steps (columns)."""
    p = len(blocks)
    for r in range(p):
        for s in range(p):
            j = (r - s) % p  # whose keys and values rank r holds
            skipped = blocks[j].min() > blocks[r].max()
            ax.add_patch(plt.Rectangle(
                (s - 0.45, r - 0.4), 0.9, 0.8, facecolor=colours[j % 9],
                edgecolor="#999999", lw=0.8, hatch="//" if skipped else None,
                gid="skipped" if skipped else "held"))
            ax.text(s, r, f"K, V of rank {j}\n{_position_runs(blocks[j])}",
                    ha="center", va="center", fontsize=8,
                    color="#555555" if skipped else "black")
    style = dict(arrowstyle="-|>", color=HIGHLIGHT, lw=1.1)
    for s in range(p - 1):
        for r in range(p - 1):
            ax.annotate("", xy=(s + 0.55, r + 0.55), xytext=(s + 0.35, r + 0.4),
                        arrowprops=style, gid="send")
        # the last rank's block goes round to rank 0
        ax.annotate("", xy=(s + 0.5, p - 0.5), xytext=(s + 0.35, p - 0.6),
                    arrowprops=style, gid="send")
        ax.annotate("", xy=(s + 0.65, -0.4), xytext=(s + 0.5, -0.5),
                    arrowprops=style, gid="send-arrives")
    ax.set_xlim(-0.55, p - 0.45)
    ax.set_ylim(p - 0.45, -0.55)
    ax.set_xticks(range(p), [f"step {s}" for s in range(p)])
    ax.set_yticks(range(p), [f"rank {r}\nqueries {_position_runs(b)}"
                             for r, b in enumerate(blocks)])
    ax.tick_params(length=0, labelsize=8)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"{name}: rank r sends to rank r + 1 "
                 f"(the last to rank 0)", fontsize=10)


__all__ += ["ring_steps"]


# --- chapter 24: the cost of talking ---
