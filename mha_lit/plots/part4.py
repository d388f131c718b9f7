"""Figures of Part IV, "Attention, learned" (chapters 19-21).

Each function's docstring names the chapter that draws it. Every
function returns its matplotlib Figure and does not show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt  # noqa: F401
import numpy as np  # noqa: F401

from ._style import HIGHLIGHT, annotate

# --- chapter 19: the backward pass of attention ---


def softmax_backward_panels(dS, S, dZ, tokens=None) -> plt.Figure:
    """dS, S and dZ of one causal head side by side: the softmax's backward.

    Book: Part IV, chapter 19 "The backward pass of attention", "What the
    causal mask does to the gradient". dS, S and dZ are (n, n): the
    gradient of the weights, the weights, and the gradient of the scores,
    dZ = S * (dS - rowsum(dS * S)). dS is drawn in full; in S and dZ the
    entries above the diagonal must be exactly 0 and are hatched and
    labelled "0" (gid "zero"). dS and dZ each have their own colour scale
    centred on 0, S one from 0 to 1; an entry that is exactly 0 elsewhere
    is written "0". Returns the Figure.
    """
    dS, S, dZ = (np.asarray(M, dtype=float) for M in (dS, S, dZ))
    if dS.ndim != 2 or dS.shape[0] != dS.shape[1] or not (
            dS.shape == S.shape == dZ.shape):
        raise ValueError("dS, S and dZ must be square matrices of one "
                         f"shape, got {dS.shape}, {S.shape} and {dZ.shape}")
    n = len(S)
    above = np.triu(np.ones((n, n), dtype=bool), k=1)  # u > t
    for name, M in (("S", S), ("dZ", dZ)):
        if np.any(M[above] != 0):
            raise ValueError(f"{name} ({n} x {n}) has a non-zero entry "
                             "above the diagonal, where the causal mask "
                             "leaves exactly 0")
    tokens = ([f"token {k + 1}" for k in range(n)] if tokens is None
              else list(tokens))
    if len(tokens) != n:
        raise ValueError(f"{n} x {n} matrices need {n} token labels, got "
                         f"{len(tokens)}")
    g_S, g_Z = (float(np.abs(M).max()) or 1.0 for M in (dS, dZ))
    fig, axes = plt.subplots(1, 3, figsize=(3 * (0.95 * n + 0.9),
                                            0.9 * n + 1.6))
    panels = ((axes[0], dS, r"$\mathrm{d}S$: every entry", "RdBu_r",
               -g_S, g_S, False),
              (axes[1], S, "$S$: 0 above the diagonal", "Blues", 0, 1, True),
              (axes[2], dZ, r"$\mathrm{d}Z$: 0 where $S$ is 0", "RdBu_r",
               -g_Z, g_Z, True))
    for ax, M, title, cmap, lo, hi, zeros in panels:
        _panel(ax, M, above if zeros else np.zeros_like(above), cmap, lo, hi)
        ax.set_title(title, fontsize=11)
        ax.set_xticks(range(n), tokens)
        ax.set_yticks(range(n), tokens)
        ax.set_xlabel("key $u$", fontsize=10)
        ax.tick_params(length=0, labelsize=9)
    axes[0].set_ylabel("query $t$", fontsize=10)
    fig.tight_layout(w_pad=1.5)
    return fig


def _panel(ax, M, zero, cmap, lo, hi) -> None:
    """One heatmap of ``softmax_backward_panels``; ``zero`` cells hatched."""
    ax.imshow(np.where(zero, np.nan, M), cmap=cmap, vmin=lo, vmax=hi)
    # an exact 0 is written "0", as no rounded number could show it
    annotate(ax, M, ".2f", skip=lambda r, c: zero[r, c] or M[r, c] == 0)
    for r, c in zip(*np.nonzero((M == 0) & ~zero), strict=True):
        ax.text(c, r, "0", ha="center", va="center", fontsize=10)
    for r, c in zip(*np.nonzero(zero), strict=True):
        ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1,
                                   facecolor="white", hatch="//",
                                   edgecolor="#bbbbbb", lw=0, gid="zero"))
        ax.text(c, r, "0", ha="center", va="center", fontsize=10,
                color="#555555")


# --- chapter 20: what the backward pass costs ---

_GB = 1e9  # decimal gigabytes, as GPU datasheets print their memory


def training_memory_bars(budgets, capacity=None) -> plt.Figure:
    """What one training step holds in memory, one panel per model.

    Book: Part IV, chapter 20, "The memory budget of training".
    ``budgets`` maps a model's label to its bars, {bar label: {part:
    bytes}}; each bar stacks its parts from the left, in GB (10^9 bytes),
    and a part has the same colour in every bar and panel (the legend).
    ``capacity`` = (label, bytes), one device's memory, is a dotted line in
    every panel. Rectangles carry gids "<model>:<bar>:<part>". Returns the
    Figure.
    """
    if not budgets:
        raise ValueError("budgets must name at least one model")
    parts = []
    for model, bars in budgets.items():
        if not bars:
            raise ValueError(f"model {model!r} has no bar")
        for bar, stack in bars.items():
            for part, size in stack.items():
                if not size >= 0:
                    raise ValueError(f"{model!r}, bar {bar!r}: part {part!r} "
                                     f"has {size!r} bytes; sizes must be >= 0")
                if part not in parts:
                    parts.append(part)
    if capacity is not None and not capacity[1] > 0:
        raise ValueError(f"capacity must be positive, got {capacity[1]!r}")
    colours = dict(zip(parts, plt.get_cmap("tab10").colors, strict=False))
    rows = max(len(bars) for bars in budgets.values())
    fig, axes = plt.subplots(len(budgets), 1, squeeze=False,
                             figsize=(9.4, 1.0 + 0.62 * rows * len(budgets)))
    for ax, (model, bars) in zip(axes[:, 0], budgets.items(), strict=True):
        labels, named = list(bars), set()
        for y, bar in enumerate(labels):
            left = 0.0
            for part, size in bars[bar].items():
                ax.barh(y, size / _GB, left=left, height=0.62,
                        color=colours[part], gid=f"{model}:{bar}:{part}",
                        label=None if part in named else part)
                named.add(part)
                left += size / _GB
            total = f"{left:,.0f}" if left >= 100 else f"{left:.3g}"
            ax.text(left, y, f"  {total} GB", va="center", fontsize=9)
        if capacity is not None:
            ax.axvline(capacity[1] / _GB, color="black", ls=":", lw=1.6,
                       label=capacity[0], gid="capacity")
        ax.set_yticks(range(len(labels)), labels, fontsize=9)
        ax.invert_yaxis()  # the first bar on top
        ax.set_title(model, fontsize=10, loc="left")
        ax.set_xlabel("GB (10^9 bytes)")
        ax.margins(x=0.18)
        ax.grid(alpha=0.3, axis="x")
    handles = {}
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    if capacity is not None:  # the parts first, the line last
        handles[capacity[0]] = handles.pop(capacity[0])
    fig.legend(handles.values(), handles.keys(), fontsize=8, ncol=3,
               loc="lower center", bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.06 + 0.02 * len(handles) / 3, 1, 1))
    return fig


def traffic_curves(panels) -> plt.Figure:
    """Numbers one head's attention moves to and from HBM, against n.

    Book: Part IV, chapter 20, "The traffic of the backward pass". ``panels``
    maps a panel's title to its curves, {label: (lengths, numbers)}, drawn
    on log-log axes; a label has one colour in every panel, and a label
    that starts with "forward" is dashed. Lines carry gids
    "<panel>:<label>". Returns the Figure.
    """
    if not panels:
        raise ValueError("panels must name at least one panel")
    labels = []
    for title, curves in panels.items():
        for label, (n, moved) in curves.items():
            n, moved = np.asarray(n, float), np.asarray(moved, float)
            if n.ndim != 1 or n.shape != moved.shape or n.size < 2:
                raise ValueError(
                    f"{title!r}, curve {label!r}: needs as many counts as "
                    f"lengths, at least two, got shapes {n.shape} and "
                    f"{moved.shape}")
            if np.any(n <= 0) or np.any(moved <= 0):
                raise ValueError(f"{title!r}, curve {label!r} has a value "
                                 "<= 0; log axes need positive values")
            if label not in labels:
                labels.append(label)
    colours = dict(zip(labels, plt.get_cmap("tab10").colors, strict=False))
    fig, axes = plt.subplots(1, len(panels), squeeze=False, sharey=True,
                             figsize=(4.9 * len(panels) + 0.6, 4.4))
    for ax, (title, curves) in zip(axes[0], panels.items(), strict=True):
        for label, (n, moved) in curves.items():
            ax.loglog(n, np.asarray(moved, float), lw=2,
                      ls="--" if label.startswith("forward") else "-",
                      color=colours[label], label=label,
                      gid=f"{title}:{label}")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plt.FuncFormatter(
            lambda t, _: f"{t / 1024:g}K" if t >= 1024 else f"{t:g}"))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("tokens n (K = 1,024)")
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].set_ylabel("numbers moved (one head)")
    axes[0, -1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig

# --- chapter 21: a model that learns ---


def training_loss(losses, vocab_size: int, window: int = 50) -> plt.Figure:
    """The loss of each training step, and its running mean.

    Book: Part IV, chapter 21 "A model that learns", "Training with Adam".
    ``losses`` holds one loss per step (at least ``window``); the thin
    grey line (gid "step") is each step's, the dark one (gid "mean") the
    mean of the last ``window`` steps, and the dashed line (gid "guess")
    ln(vocab_size), the loss of a uniform guess over the vocabulary.
    Log scale; returns the Figure.
    """
    losses = np.asarray(losses, dtype=float)
    if losses.ndim != 1 or len(losses) < window or window < 1:
        raise ValueError(f"losses must be one loss per step, at least "
                         f"window = {window} of them; got shape "
                         f"{losses.shape}")
    if not (np.isfinite(losses).all() and (losses > 0).all()):
        raise ValueError("every loss must be finite and positive (the "
                         "axis is logarithmic)")
    steps = np.arange(1, len(losses) + 1)
    mean = np.convolve(losses, np.ones(window) / window, mode="valid")
    guess = np.log(vocab_size)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(steps, losses, color="0.75", lw=0.6, gid="step",
            label="one step's batch")
    ax.plot(steps[window - 1:], mean, color="C0", lw=1.8, gid="mean",
            label=f"mean of the last {window} steps")
    ax.axhline(guess, color="0.3", ls="--", lw=1, gid="guess",
               label=f"uniform guess: ln {vocab_size} = {guess:.2f}")
    ax.set_yscale("log")
    ax.set_xlabel("training step", fontsize=10)
    ax.set_ylabel("loss (mean cross-entropy)", fontsize=10)
    ax.tick_params(labelsize=9)
    ax.legend(fontsize=9, frameon=False)
    fig.tight_layout()
    return fig


def learned_attention(maps, tokens, marks, titles) -> plt.Figure:
    """Attention weights of a trained model, one panel per head.

    Book: Part IV, chapter 21 "A model that learns", "The two heads".
    ``maps`` (panels, n, n): each head's weights S on one sequence, rows
    queries, columns keys; ``tokens`` the n token ids, written along both
    axes with their positions; ``marks`` (panels, n, n) booleans, the
    cells a panel outlines in the highlight colour (gid "mark"), such as
    the previous token of every query; ``titles`` one per panel. Cells
    above the diagonal, which the causal mask hides, are grey (gid
    "masked"). Returns the Figure.
    """
    maps, marks = np.asarray(maps, dtype=float), np.asarray(marks)
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2] or (
            marks.shape != maps.shape):
        raise ValueError(f"maps must be (panels, n, n) and marks the same "
                         f"shape; got {maps.shape} and {marks.shape}")
    panels, n, _ = maps.shape
    if len(tokens) != n or len(titles) != panels:
        raise ValueError(f"{panels} panels of {n} x {n} need {n} tokens and "
                         f"{panels} titles, got {len(tokens)} and "
                         f"{len(titles)}")
    labels = [f"{t}: {int(token)}" for t, token in enumerate(tokens)]
    fig, axes = plt.subplots(1, panels, squeeze=False, layout="constrained",
                             figsize=(4.6 * panels + 0.8, 4.9))
    for ax, S, mark, title in zip(axes[0], maps, marks, titles,
                                  strict=True):
        image = ax.imshow(S, cmap="Blues", vmin=0, vmax=1)
        for t, u in zip(*np.nonzero(np.triu(np.ones((n, n)), k=1)),
                        strict=True):
            ax.add_patch(plt.Rectangle((u - 0.5, t - 0.5), 1, 1,
                                       facecolor="0.9", lw=0, gid="masked"))
        for t, u in zip(*np.nonzero(mark), strict=True):
            ax.add_patch(plt.Rectangle((u - 0.5, t - 0.5), 1, 1,
                                       fill=False, edgecolor=HIGHLIGHT,
                                       lw=1.6, gid="mark"))
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(n), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(n), labels, fontsize=7)
        ax.set_xlabel("key (position: token)", fontsize=9)
        ax.set_ylabel("query (position: token)", fontsize=9)
    bar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    bar.ax.tick_params(labelsize=8)
    bar.set_label("weight", fontsize=9)
    return fig


# every public figure function defined above, for ``from .part4 import *``
__all__ = sorted(name for name, obj in list(globals().items())
                 if callable(obj) and not name.startswith("_")
                 and getattr(obj, "__module__", None) == __name__)
