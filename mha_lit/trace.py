"""Watching matrix products happen: a recorder of every ``@``.

Book: chapter 10 "Counting the multiplications" (MatmulLog, record_matmuls,
label_attention_products), where it checks the counts of ``counting``; the
chapters that count products again (4, 7, 11, 12, 14, 16, 17) use it too.

``with record_matmuls() as log: f(log.track(X))`` runs f as usual and
writes down every matrix product its arrays take part in: the shapes of
the two factors and of the result, and the multiply-adds. A product of a
rows x inner and an inner x cols matrix does rows * inner * cols
multiply-adds; a batched product over h heads (a leading axis of h)
counts h products.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod

import numpy as np

from .shapes import Weights

__all__ = ["MatmulRecord", "MatmulLog", "record_matmuls",
           "label_attention_products"]


@dataclass(frozen=True)
class MatmulRecord:
    """One observed matrix product.

    Its shapes, its multiply-adds and where its right operand lives.
    """

    a_shape: tuple
    b_shape: tuple
    out_shape: tuple
    # 2-D products in this call: the batch size of a batched matmul
    products: int
    multiply_adds: int
    b_address: int
    b_transposed: bool


@dataclass
class MatmulLog:
    """Every matrix product computed from a tracked array. Book: chapter 10.

    ``track(X)`` returns X as an array that records each ``@`` /
    ``np.matmul`` it takes part in, and passes the tracking on to every
    array computed from it. The values are computed by NumPy exactly as
    without tracking. Tracking follows values through expressions; a value
    written into an untracked buffer (``buf[...] = tracked``) leaves the
    log's sight, so count code that computes by expressions, as
    ``multi_head_attention_reference`` does.
    """

    records: list = field(default_factory=list)
    active: bool = True

    def track(self, a) -> np.ndarray:
        """``a`` as a tracked array whose products go into this log.

        The tracked array is a view, no copy.
        """
        t = np.asanyarray(a).view(_Tracked)
        t._log = self
        return t

    def __len__(self) -> int:
        return len(self.records)

    @property
    def calls(self) -> int:
        """Number of matmul calls."""
        return len(self.records)

    @property
    def products(self) -> int:
        """Number of 2-D matrix products.

        A batched call over h heads counts h.
        """
        return sum(r.products for r in self.records)

    @property
    def multiply_adds(self) -> int:
        """Total multiply-adds of all recorded products."""
        return sum(r.multiply_adds for r in self.records)

    def _add(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        if not self.active or a.ndim < 2 or b.ndim < 2:
            return  # vector products are not matrix products
        # heads, if batched
        batch = prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        rows, inner, cols = a.shape[-2], a.shape[-1], b.shape[-1]
        transposed = b.strides[-2] < b.strides[-1]  # a K.T-like view
        self.records.append(MatmulRecord(
            a.shape, b.shape, out.shape, batch, batch * rows * inner * cols,
            b.__array_interface__["data"][0], bool(transposed)))


def _plain(x):
    """Strip tracking from an array (or the arrays inside a list/tuple)."""
    if isinstance(x, _Tracked):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


class _Tracked(np.ndarray):
    """An ndarray that reports its matrix products to a MatmulLog.

    See MatmulLog.track.
    """

    _log: MatmulLog | None = None

    def __array_finalize__(self, obj) -> None:
        self._log = getattr(obj, "_log", None)

    def _wrap(self, result):
        if isinstance(result, np.ndarray) and not isinstance(result, _Tracked):
            result = result.view(_Tracked)
            result._log = self._log
        elif isinstance(result, tuple):
            result = tuple(self._wrap(r) for r in result)
        return result

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [_plain(x) for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = _plain(kwargs["out"])
        # the value NumPy computes anyway
        result = getattr(ufunc, method)(*plain, **kwargs)
        if (ufunc is np.matmul and method == "__call__"
                and self._log is not None):
            self._log._add(np.asarray(plain[0]), np.asarray(plain[1]),
                           np.asarray(result))
        return self._wrap(result)

    def __array_function__(self, func, types, args, kwargs):
        if func in _UNWATCHED_PRODUCTS:
            raise TypeError(
                "record_matmuls watches @ and np.matmul only, but "
                f"np.{func.__name__} was called on a tracked array; "
                "its products would go uncounted")
        result = func(*_plain(list(args)),
                      **{k: _plain(v) for k, v in kwargs.items()})
        return self._wrap(result)  # e.g. np.concatenate, np.where


_UNWATCHED_PRODUCTS = (np.dot, np.einsum, np.tensordot, np.inner, np.vdot,
                       np.linalg.multi_dot)


@contextmanager
def record_matmuls():
    """Record the matrix products computed inside a ``with`` block.

    Book: chapter 10. ``with record_matmuls() as log: f(log.track(X), ...)``
    records f's matrix products. Recording stops when the block ends.
    """
    log = MatmulLog()
    try:
        yield log
    finally:
        log.active = False


def label_attention_products(log: MatmulLog,
                             W: Weights) -> list[tuple[int, str]]:
    """(head, name) of every product ``multi_head_attention_reference`` made.

    Book: chapter 10. A projection is recognised by its right operand being
    W_Q[i], W_K[i], W_V[i] (same memory), the output projection by W_O
    (head 0 means "all heads"); Q K^T by a transposed right operand and S V
    otherwise, both in the head of the latest projection.
    """
    weights = {W.W_O.__array_interface__["data"][0]: (0, "Concat W_O")}
    for i in range(W.heads):
        for letter, stack in (("Q", W.W_Q), ("K", W.W_K), ("V", W.W_V)):
            weights[stack[i].__array_interface__["data"][0]] = (
                i + 1, f"X W_{letter}")
    labels, head = [], 0
    for r in log.records:
        if r.b_address in weights:
            head, name = weights[r.b_address]
        else:
            name = "Q K^T" if r.b_transposed else "S V"
        labels.append((head, name))
    return labels
