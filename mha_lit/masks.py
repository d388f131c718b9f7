"""Which keys each query may look at: the masks of attention, as booleans.

Book: chapter 3 "Q, K, V" (the causal mask), Part III chapter 16
"Sliding-window attention" (the band and its reach through layers, the
band with attention sinks, stacks of local and global layers).

A mask is a boolean matrix (n, m), True where query t may look at key u:
``attention`` gives every False entry the score -inf, so its weight is
exp(-inf) = 0. Every mask in the package is made here, from the
*positions* of the queries and keys, so a block of queries, a cache whose
slots hold keys out of order, and the whole sequence all use one rule.

Letters in shape comments (see ``mha_lit.shapes``): n queries, m keys,
w the window (keys a query sees, itself included), L stacked layers,
n_sink the first positions that every query sees (attention sinks).
"""

from __future__ import annotations

import functools

import numpy as np

from . import checks

__all__ = ["visible", "causal", "band", "rule", "window_reach",
           "sink_band", "LAYER_KINDS", "layer_kinds", "stack_reach"]


def visible(query_positions, key_positions, window=None) -> np.ndarray:
    """(n, m) booleans: may the query at position t see the key at u?

    Book: chapter 3, "The causal mask". Yes when u <= t (no later key)
    and, with a ``window`` w (chapter 16), when t - u < w: the last w
    positions, the query's own included. A key position of -1 marks an
    empty cache slot, which no query sees. Positions count from 0.
    """
    t = np.asarray(query_positions)[..., :, None]  # (.., n, 1)
    u = np.asarray(key_positions)[..., None, :]  # (.., 1, m)
    seen = (u <= t) & (u >= 0)  # (.., n, m): not later, not empty
    if window is not None:
        seen &= t - u < window  # (.., n, m): inside the window
    return seen


def causal(n: int, m: int | None = None) -> np.ndarray:
    """The causal mask (n, m): the n queries are the last n of m positions.

    Book: chapter 3, "The causal mask". Rows, columns and positions
    count from 0 here, as in the code. With m = n (the default) it is
    the lower triangle, diagonal included: row t sees keys 0 .. t. With
    m > n (a KV cache supplies m - n earlier keys) row t stands at
    position m - n + t (the book's query t + 1).
    """
    n, m = checks.mask_sizes(n, m)
    return visible(np.arange(m - n, m), np.arange(m))  # (n, m)


def band(n: int, window: int, m: int | None = None) -> np.ndarray:
    """The sliding-window mask (n, m): causal, and only the last w keys.

    Book: Part III, chapter 16. Query t sees keys t - w + 1 .. t.
    """
    n, m = checks.mask_sizes(n, m)
    window = checks.positive_int(window, "window")
    return visible(np.arange(m - n, m), np.arange(m), window)  # (n, m)


def rule(causal: bool = True, window: int | None = None):
    """The mask as a rule of positions: ``rule(...)(q_pos, k_pos)``.

    Book: chapter 12 (causal) and Part III, chapter 16 (a window). None
    when every query sees every key (``causal=False``).
    """
    if not causal:
        return None
    return visible if window is None else functools.partial(visible,
                                                             window=window)


def window_reach(n: int, window: int, layers: int = 1) -> np.ndarray:
    """Which input rows reach which output rows through L window layers.

    Book: Part III, chapter 16, "Stacked layers: the receptive field". One
    layer's pattern D = ``band(n, w)``; L layers reach along chains
    u -> ... -> t of L steps inside a window: the boolean matrix D^L > 0,
    composed one integer product at a time (every entry of a product is
    at most w, so it is exact). (n, n) booleans.
    """
    layers = checks.positive_int(layers, "layers")
    D = band(n, window).astype(np.int64)  # (n, n), one layer
    R = D
    for _ in range(layers - 1):
        R = (D @ R > 0).astype(np.int64)  # (n, n), one more layer below
    return R.astype(bool)


# --- Part III, chapter 16: attention sinks, local and global layers ---------


def sink_band(n: int, window: int, sinks: int,
              m: int | None = None) -> np.ndarray:
    """The window with attention sinks (n, m): the first keys stay visible.

    Book: Part III, chapter 16, "Attention sinks". Query t sees key u when
    u <= t and (u < n_sink or t - u < w): the first ``sinks`` positions
    and the last ``window`` ones, its own included (positions from 0; the
    n queries are the last n of m positions, as in ``causal``). With
    ``sinks`` = 0 it is ``band``.
    """
    n, m = checks.mask_sizes(n, m)
    window = checks.positive_int(window, "window")
    sinks = checks.whole_number(sinks, "sinks")
    t, u = np.arange(m - n, m), np.arange(m)  # query and key positions
    first = visible(t, u) & (u < sinks)  # (n, m): a sink, not later
    return visible(t, u, window) | first  # (n, m)


LAYER_KINDS = ("local", "global")  # a window of w keys; every earlier key


def layer_kinds(kinds) -> tuple[str, ...]:
    """``kinds`` as a tuple of "local" and "global", or an error naming it.

    Book: Part III, chapter 16, "Local and global layers". One entry per
    layer, the first layer first; at least one layer.
    """
    if isinstance(kinds, str):
        raise TypeError(f"kinds must be a sequence of layer kinds, one "
                        f"per layer, got the string {kinds!r}")
    kinds = tuple(kinds)
    if not kinds:
        raise ValueError("kinds must name at least one layer, got none")
    for i, kind in enumerate(kinds):
        if kind not in LAYER_KINDS:
            raise ValueError(f"kinds[{i}] must be 'local' or 'global', "
                             f"got {kind!r}")
    return kinds


def stack_reach(n: int, kinds, window: int) -> np.ndarray:
    """Which input rows reach which output rows through a stack of layers.

    Book: Part III, chapter 16, "Local and global layers". Layer by layer,
    the first first: a "local" layer's pattern is ``band(n, w)``, a
    "global" layer's ``causal(n)``; L layers reach along chains of L
    steps, composed as in ``window_reach`` (exact integers). (n, n)
    booleans.
    """
    kinds = layer_kinds(kinds)
    window = checks.positive_int(window, "window")
    local = band(n, window).astype(np.int64)  # (n, n), checks n
    full = causal(n).astype(np.int64)  # (n, n)
    R = np.eye(n, dtype=np.int64)  # (n, n): no layer yet
    for kind in kinds:
        D = local if kind == "local" else full  # (n, n), this layer
        R = (D @ R > 0).astype(np.int64)  # (n, n), one more layer on top
    return R.astype(bool)
