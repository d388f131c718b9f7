"""Figures of Part V, "Attention on many devices" (chapters 22-24).

Each function's docstring names the chapter that draws it. Every
function returns its matplotlib Figure and does not show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401
import numpy as np  # noqa: F401
from matplotlib.patches import FancyBboxPatch

from ._style import CELL, HIGHLIGHT, annotate  # noqa: F401

__all__: list[str] = []

# --- chapter 22: splitting the heads ---

_RANK_COLOURS = ("#fdd0a2", "#c7e9c0", "#dadaeb", "#fcbba1", "#c6dbef",
                 "#d9d9d9")  # one tint per rank, cycled
_SHARED = "#525252"  # the all-reduce: every rank's, so no rank's tint


def _shape(shape, what: str) -> tuple[int, int]:
    """(rows, cols) of a drawn array, or a refusal naming it."""
    try:
        rows, cols = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: a shape is (rows, cols), got "
                         f"{shape!r}") from None
    if not (0 < rows <= 40 and 0 < cols <= 40):
        raise ValueError(f"{what}: {rows} x {cols} cannot be drawn one "
                         "cell per entry (1 to 40 rows and columns)")
    return rows, cols


def _array_cells(ax, x0: float, top: float, rows: int, cols: int,
                 colour: str, gid: str) -> None:
    """A rows x cols grid of unit cells whose top left corner is (x0, top)."""
    for i in range(rows):
        for j in range(cols):
            ax.add_patch(plt.Rectangle((x0 + j, top - i - 1), 1, 1,
                                       facecolor=colour, edgecolor="white",
                                       lw=0.6, gid=gid))


def head_split_ranks(held, total, *, lanes=None,
                     after: str = "") -> plt.Figure:
    """What each rank holds at each step of tensor-parallel attention.

    Book: Part V, chapter 22 "Splitting the heads", "What each rank holds,
    step by step". ``held`` lists the steps in order; each step is
    (op, arrays): ``op`` is written before it in every lane ("" for
    none, or an operator such as "→" or "×"), and ``arrays`` has one
    (label, (rows, cols)) per rank, ranks counted from 0. An array whose
    label is the same on every rank is whole on every rank (drawn in the
    book's cell colour, gid "whole"); otherwise it is that rank's share
    (drawn in the rank's tint, gid "share"). Then one box spanning the
    lanes stands for the all-reduce that sums the last step's arrays
    (gid "allreduce"; it and its arrows in grey, as every rank's, in no
    rank's tint), and ``total`` = (label, (rows, cols)) is drawn in
    every lane, whole (gid "total"), with ``after`` (e.g. "+ $b_O$")
    written on the arrow into it. ``lanes`` names the lanes (default
    "rank r"). One cell per entry, so every shape can be counted.
    Returns the Figure.
    """
    steps = [(str(op), list(arrays)) for op, arrays in held]
    if not steps:
        raise ValueError("head_split_ranks needs at least one step")
    counts = {len(arrays) for _, arrays in steps}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"every step needs one array per rank; the steps "
                         f"have {[len(a) for _, a in steps]}")
    p = counts.pop()
    lanes = [f"rank {r}" for r in range(p)] if lanes is None else list(lanes)
    if len(lanes) != p:
        raise ValueError(f"{len(lanes)} lane names for {p} ranks")
    shapes = [[_shape(s, f"step {k}, rank {r}")
               for r, (_, s) in enumerate(arrays)]
              for k, (_, arrays) in enumerate(steps)]
    total_label, total_shape = total
    t_rows, t_cols = _shape(total_shape, "total")
    gap, box = 3.2, 6.0
    widths = [max(c for _, c in step) for step in shapes]
    tall = max([r for step in shapes for r, _ in step] + [t_rows])
    lane = tall + 5.0  # labels above, shapes below
    x_box = sum(widths) + gap * len(widths)
    x_total = x_box + box + gap
    right = x_total + t_cols + 0.5
    left = 8.0
    fig, ax = plt.subplots(figsize=(0.105 * (right + left),
                                    0.105 * (p * lane + 1.0)))
    fig.subplots_adjust(left=0, right=1, bottom=0, top=1)
    ends = []  # where each lane's last array ends (x, y of its middle)
    for r in range(p):
        top = -r * lane - 2.4
        ax.text(-left + 0.3, top - tall / 2, lanes[r], ha="left",
                va="center", fontsize=10)
        x = 0.0
        for k, (op, arrays) in enumerate(steps):
            label = arrays[r][0]
            rows, cols = shapes[k][r]
            whole = all(a[0] == label for a in arrays)
            colour = CELL if whole else _RANK_COLOURS[r % 6]
            if op and k:
                ax.text(x - gap / 2, top - min(rows, 3) / 2, op,
                        ha="center", va="center", fontsize=12)
            _array_cells(ax, x, top, rows, cols, colour,
                         "whole" if whole else "share")
            ax.text(x + cols / 2, top + 0.4, label, ha="center",
                    va="bottom", fontsize=10)
            ax.text(x + cols / 2, top - rows - 0.3, f"{rows} × {cols}",
                    ha="center", va="top", fontsize=9)
            x += widths[k] + gap
        ends.append((x - gap + 0.2, top - shapes[-1][r][0] / 2))
        _array_cells(ax, x_total, top, t_rows, t_cols, CELL, "total")
        ax.text(x_total + t_cols / 2, top + 0.4, total_label, ha="center",
                va="bottom", fontsize=10)
        ax.text(x_total + t_cols / 2, top - t_rows - 0.3,
                f"{t_rows} × {t_cols}", ha="center", va="top", fontsize=9)
    y_top, y_bottom = 0.2, -(p - 1) * lane - 2.4 - tall - 1.2
    ax.add_patch(FancyBboxPatch((x_box, y_bottom), box, y_top - y_bottom,
                                boxstyle="round,pad=0.2", facecolor="white",
                                edgecolor=_SHARED, lw=1.5,
                                gid="allreduce"))
    ax.text(x_box + box / 2, (y_top + y_bottom) / 2, "all-reduce\n(sum)",
            ha="center", va="center", fontsize=10, rotation=90,
            color=_SHARED)
    style = dict(arrowstyle="-|>", color=_SHARED, lw=1.2,
                 mutation_scale=10)
    for r, (x_end, y_mid) in enumerate(ends):
        ax.annotate("", xy=(x_box - 0.2, y_mid), xytext=(x_end, y_mid),
                    arrowprops=style, gid="send")
        y = -r * lane - 2.4 - t_rows / 2
        ax.annotate("", xy=(x_total - 0.2, y), xytext=(x_box + box + 0.2, y),
                    arrowprops=style, gid="receive")
        if after:
            ax.text(x_box + box + gap / 2, y + 0.9, after, ha="center",
                    va="bottom", fontsize=9)
    ax.set_xlim(-left, right)
    ax.set_ylim(y_bottom - 0.6, 0.6 + 0.4)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


__all__ += ["head_split_ranks"]


# --- chapter 23: splitting the sequence ---


def ring_work_grid(works) -> plt.Figure:
    """Scores each rank computes at each ring step, one panel per layout.

    Book: Part V, chapter 23 "Splitting the sequence", "Work per rank".
    ``works`` maps a layout's name to its (p, p) counts, rank r (row) at
    ring step j (column), as ``parallel.ring_work`` returns them. Below
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
        ax.set_xticks(range(p), [f"step {j}" for j in range(p)])
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
    from 0). Cell (r, j) is rank r at step j: it holds the keys and values
    of rank r' = (r - j) mod p, coloured by that rank, with their
    positions. A cell whose keys all come after all of rank r's queries
    has nothing to compute under the causal mask: it is hatched (gid
    "skipped").
    Arrows (gid "send") show each block passed from rank r at step j to
    rank r + 1 at step j + 1, for j < p - 1 (nothing moves after the last
    step); from the last rank it goes to rank 0 (marked by a half arrow
    out of the last row and one into the first).
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
        for j in range(p):
            src = (r - j) % p  # r': whose keys and values rank r holds
            skipped = blocks[src].min() > blocks[r].max()
            ax.add_patch(plt.Rectangle(
                (j - 0.45, r - 0.4), 0.9, 0.8, facecolor=colours[src % 9],
                edgecolor="#aaaaaa", lw=0.8, hatch="//" if skipped else None,
                gid="skipped" if skipped else "held"))
            text = f"K, V of rank {src}\n{_position_runs(blocks[src])}"
            ax.text(j, r, text + ("\n(nothing to compute)" if skipped
                                  else ""), ha="center", va="center",
                    fontsize=8, bbox=dict(facecolor="white", alpha=0.8,
                                          lw=0) if skipped else None)
    style = dict(arrowstyle="-|>", color=HIGHLIGHT, lw=1.5,
                 mutation_scale=12)
    for j in range(p - 1):  # no transfer after the last step
        for r in range(p - 1):
            ax.annotate("", xy=(j + 0.7, r + 0.63),
                        xytext=(j + 0.3, r + 0.37), arrowprops=style,
                        gid="send")
        # the last rank's block goes round to rank 0
        ax.annotate("", xy=(j + 0.5, p - 0.47), xytext=(j + 0.3, p - 0.63),
                    arrowprops=style, gid="send")
        ax.annotate("", xy=(j + 0.7, -0.37), xytext=(j + 0.5, -0.53),
                    arrowprops=style, gid="send-arrives")
    ax.set_xlim(-0.55, p - 0.45)
    ax.set_ylim(p - 0.45, -0.55)
    ax.set_xticks(range(p), [f"step {j}" for j in range(p)])
    ax.set_yticks(range(p), [f"rank {r}\nqueries {_position_runs(b)}"
                             for r, b in enumerate(blocks)])
    ax.tick_params(length=0, labelsize=8)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"{name}: rank r sends to rank r + 1 "
                 f"(the last to rank 0)", fontsize=10)


__all__ += ["ring_steps"]


# --- chapter 24: the cost of talking ---


def _log_curve(x, y, what: str) -> tuple[np.ndarray, np.ndarray]:
    """x and y as float arrays of one length (at least two), all > 0."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.ndim != 1 or x.shape != y.shape or x.size < 2:
        raise ValueError(f"{what}: needs as many values as x positions, at "
                         f"least two, got shapes {x.shape} and {y.shape}")
    if not (np.all(x > 0) and np.all(y > 0)):
        raise ValueError(f"{what} has a value <= 0; log axes need positive "
                         "values")
    return x, y


def comm_compute_ratio(panels) -> plt.Figure:
    """Communication time over compute time, on log-log axes, per panel.

    Book: Part V, chapter 24 "The cost of talking", "When talking hides
    behind computing". ``panels`` is a list of (title, x label, curves),
    curves being {label: (x, ratio)} with labels "<model>, <link>": a
    model has one colour in every panel, a link one line style (solid,
    dashed, dotted, in the order the links first appear), and one legend
    below the panels names each label once. A dotted grey
    line marks the ratio 1 (gid "break-even"), below which the transfer
    takes less time than the work beside it. Lines carry gids
    "<title>:<label>". Returns the Figure.
    """
    panels = list(panels)
    if not panels:
        raise ValueError("panels must hold at least one (title, x label, "
                         "curves)")
    models, links = [], []
    for title, _, curves in panels:
        if not curves:
            raise ValueError(f"panel {title!r} has no curves")
        for label, (x, y) in curves.items():
            _log_curve(x, y, f"{title!r}, curve {label!r}")
            model, sep, link = label.rpartition(", ")
            if not sep:
                raise ValueError(f"curve {label!r} of panel {title!r} must "
                                 "be labelled '<model>, <link>'")
            models += [model] if model not in models else []
            links += [link] if link not in links else []
    colours = dict(zip(models, plt.get_cmap("tab10").colors, strict=False))
    styles = dict(zip(links, ("-", "--", ":", "-."), strict=False))
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             figsize=(5.0 * len(panels) + 0.6, 4.4))
    for ax, (title, xlabel, curves) in zip(axes[0], panels, strict=True):
        for label, (x, y) in curves.items():
            model, _, link = label.rpartition(", ")
            ax.loglog(x, y, lw=2, color=colours[model],
                      ls=styles.get(link, "-"), label=label,
                      gid=f"{title}:{label}")
        ax.axhline(1, color="0.4", lw=1, ls=":", gid="break-even")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plt.FuncFormatter(
            lambda t, _: f"{t / 1024:g}K" if t >= 1024 else f"{t:g}"))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].set_ylabel("communication time / compute time", fontsize=9)
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    columns = -(-len(handles) // len(links))  # a model's links, one column
    fig.legend(handles.values(), handles.keys(), fontsize=8, ncol=columns,
               loc="lower center", bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.045 * len(links) + 0.01, 1, 1))
    return fig


def alpha_beta_fit(measured, predicted) -> plt.Figure:
    """Measured times as points, the alpha-beta model's as lines, log-log.

    Book: Part V, chapter 24 "The cost of talking", "This machine's
    links". ``measured`` and ``predicted`` map a label to (bytes,
    seconds); a label found in both is drawn in one colour, its
    measurements as dots (gid "measured:<label>") and its prediction as a
    line (gid "predicted:<label>"). Returns the Figure.
    """
    if not measured:
        raise ValueError("measured must name at least one series")
    labels = list(measured) + [k for k in predicted if k not in measured]
    colours = dict(zip(labels, plt.get_cmap("tab10").colors, strict=False))
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for label, (x, t) in predicted.items():
        x, t = _log_curve(x, t, f"prediction {label!r}")
        ax.loglog(x, t, lw=1.6, color=colours[label],
                  label=f"{label}, model", gid=f"predicted:{label}")
    for label, (x, t) in measured.items():
        x, t = _log_curve(x, t, f"measurement {label!r}")
        ax.loglog(x, t, "o", ms=5, color=colours[label],
                  label=f"{label}, measured", gid=f"measured:{label}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(plt.FuncFormatter(_bytes_label))
    ax.set_xlabel("message or array (bytes)", fontsize=9)
    ax.set_ylabel("seconds", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    return fig


def _bytes_label(x, _) -> str:
    """4 -> "4 B", 4096 -> "4 KiB", 2**20 -> "1 MiB"."""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:g} {unit}"
    return f"{x:g} B"


__all__ += ["comm_compute_ratio", "alpha_beta_fit"]
