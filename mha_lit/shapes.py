"""The sizes of the running example and the weights of multi-head attention.

Book: Part I, chapter 2 "From input to output" (Dims) and chapter 4
"Multi-head attention" (Weights).

Letters used in shape comments throughout ``mha_lit``:

    n        tokens (rows of X)                       3 in the running example
    d_model  width of a token vector (columns of X)   5
    d_k      width of a query or key                  7
    d_v      width of a value                         11
    h        number of heads                          2
    h_kv     key/value heads (Part III, chapter 14)   h unless grouped
    g        query heads per key/value head, h/h_kv   1 unless grouped
    h*d_v    width of Concat(H_1, ..., H_h)           22
    B        sequences in a batch (chapter 8)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .checks import float_array, groups, positive_int

# Until latent imports checks.float_array and read_only_copy.

__all__ = ["Dims", "Weights", "init_weights"]


@dataclass(frozen=True)
class Dims:
    """The five sizes of multi-head attention.

    Book: chapter 2, "From input to output". The defaults are the book's
    distinct primes, so every shape names its axes: 3 tokens, d_model 5,
    d_k 7, d_v 11, 2 heads (Concat is 3 x 22, W_O is 22 x 5).

    ``kv_heads`` (Part III, chapter 14 "Grouped-query attention"): the
    number of key/value heads h_kv, which must divide ``heads``; each
    group of g = heads / kv_heads query heads shares one. None (the
    default) means kv_heads = heads: the book's multi-head attention.
    """

    tokens: int = 3
    d_model: int = 5
    d_k: int = 7
    d_v: int = 11
    heads: int = 2
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("tokens", "d_model", "d_k", "d_v", "heads", "kv_heads"):
            object.__setattr__(self, name, positive_int(getattr(self, name),
                                                        f"Dims.{name}"))
        groups(self.heads, self.kv_heads)

    def __repr__(self) -> str:
        grouped = ("" if self.kv_heads == self.heads
                   else f", kv_heads={self.kv_heads}")
        return (f"Dims(tokens={self.tokens}, d_model={self.d_model}, "
                f"d_k={self.d_k}, d_v={self.d_v}, heads={self.heads}"
                f"{grouped})")

    @property
    def group(self) -> int:
        """Query heads per key/value head, g = heads / kv_heads.

        Book: Part III, chapter 14.
        """
        return self.heads // self.kv_heads

    @property
    def concat(self) -> int:
        """Width of Concat(H_1, ..., H_h): heads * d_v (22 in the book)."""
        return self.heads * self.d_v


def read_only_copy(a: np.ndarray, dtype) -> np.ndarray:
    """A private copy of ``a`` in ``dtype`` that nobody can change."""
    out = np.array(a, dtype=dtype, copy=True)
    out.flags.writeable = False
    return out



_MATRICES = ("W_Q", "W_K", "W_V", "W_O")
_BIASES = ("b_Q", "b_K", "b_V", "b_O")


@dataclass(frozen=True, eq=False)
class Weights:
    """All trainable arrays of one multi-head attention layer.

    Book: chapter 4, "Multi-head attention". The per-head matrices are
    stacked along a leading head axis, so ``W_Q[0]`` is the book's W_{Q1}:

        W_Q      : (h, d_model, d_k)       (2, 5, 7) in the book
        W_K      : (h_kv, d_model, d_k)    (2, 5, 7)
        W_V      : (h_kv, d_model, d_v)    (2, 5, 11)
        W_O      : (h*d_v, d_model)        (22, 5)

    In multi-head attention h_kv = h. Grouped-query attention (Part III,
    chapter 14) has fewer key/value heads: h_kv divides h, and query head
    i uses K/V head i // g, g = h / h_kv.

    Optional biases, as GPT-2 has them (Book: chapter 8, "GPT-2's block,
    exactly"); ``None``, the default, means zero:

        b_Q      : (h, d_k)    Q_i = X W_Qi + b_Qi, every row
        b_K      : (h_kv, d_k)
        b_V      : (h_kv, d_v)
        b_O      : (d_model,)  Y = Concat(H_1, ..., H_h) W_O + b_O

    Every shape is checked on construction; the arrays are private
    read-only copies in one floating dtype (the widest of the inputs).
    """

    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray
    b_Q: np.ndarray | None = None
    b_K: np.ndarray | None = None
    b_V: np.ndarray | None = None
    b_O: np.ndarray | None = None

    def __post_init__(self) -> None:
        arrs = _checked_matrices(self)
        h, d_model, d_k = arrs["W_Q"].shape
        h_kv, d_v = arrs["W_K"].shape[0], arrs["W_V"].shape[2]
        arrs |= _checked_biases(self, h, d_model, d_k, d_v, h_kv)
        dtype = np.result_type(*arrs.values())
        for name, arr in arrs.items():
            object.__setattr__(self, name, read_only_copy(arr, dtype))

    @property
    def heads(self) -> int:
        """Number of heads h."""
        return self.W_Q.shape[0]

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads h_kv (h unless grouped; chapter 14)."""
        return self.W_K.shape[0]

    @property
    def group(self) -> int:
        """Query heads per key/value head, g = h / h_kv (chapter 14)."""
        return self.heads // self.kv_heads

    @property
    def d_model(self) -> int:
        """Width of a token vector."""
        return self.W_Q.shape[1]

    @property
    def d_k(self) -> int:
        """Width of a query or key."""
        return self.W_Q.shape[2]

    @property
    def d_v(self) -> int:
        """Width of a value."""
        return self.W_V.shape[2]

    @property
    def dtype(self) -> np.dtype:
        """The floating dtype all arrays share."""
        return self.W_Q.dtype

    @property
    def has_biases(self) -> bool:
        """True if any of b_Q, b_K, b_V, b_O was given.

        Book: chapter 8, "GPT-2's block, exactly".
        """
        return any(getattr(self, n) is not None for n in _BIASES)

    def bias(self, name: str) -> np.ndarray:
        """Bias ``name`` ("b_Q", "b_K", "b_V" or "b_O"), zeros if None.

        Book: chapter 8, "GPT-2's block, exactly". Shapes: b_Q (h, d_k),
        b_K (h_kv, d_k), b_V (h_kv, d_v), b_O (d_model,); the result is
        read-only.
        """
        if name not in _BIASES:
            raise ValueError(f"no bias named {name!r}; Weights has {_BIASES}")
        b = getattr(self, name)
        if b is None:
            b = read_only_copy(np.zeros(_bias_shapes(self.heads, self.d_model,
                                              self.d_k, self.d_v,
                                              self.kv_heads)[name]),
                        self.dtype)  # (h, d_k), (h_kv, d_v) or (d_model,)
        return b

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by name: W_Q, W_K, W_V, W_O, then the biases given.

        Book: chapter 8, "The weights of a block": their sizes are the
        layer's parameters (a bias that is None is no parameter).
        """
        return {n: getattr(self, n) for n in _MATRICES + _BIASES
                if getattr(self, n) is not None}

    def dims(self, tokens: int = 3) -> Dims:
        """The Dims these weights fit, with ``tokens`` rows of input."""
        return Dims(tokens, self.d_model, self.d_k, self.d_v, self.heads,
                    self.kv_heads)

    def astype(self, dtype) -> Weights:
        """The same weights (biases included) in another floating dtype."""
        return Weights(**{n: a.astype(dtype)
                          for n, a in self.arrays().items()})

    def __repr__(self) -> str:
        biases = ", biases=True" if self.has_biases else ""
        grouped = ("" if self.kv_heads == self.heads
                   else f", kv_heads={self.kv_heads}")
        return (f"Weights(heads={self.heads}{grouped}, "
                f"d_model={self.d_model}, "
                f"d_k={self.d_k}, d_v={self.d_v}, dtype={self.dtype}"
                f"{biases})")


def _bias_shapes(h: int, d_model: int, d_k: int, d_v: int,
                 h_kv: int | None = None) -> dict[str, tuple[int, ...]]:
    """The shape each bias must have, by name (h_kv defaults to h)."""
    h_kv = h if h_kv is None else h_kv
    return {"b_Q": (h, d_k), "b_K": (h_kv, d_k), "b_V": (h_kv, d_v),
            "b_O": (d_model,)}


def _checked_matrices(W: Weights) -> dict[str, np.ndarray]:
    """W_Q, W_K, W_V, W_O as float arrays whose shapes fit together.

    Book: chapter 4, "Multi-head attention". Errors name the shape found
    and the shape the other matrices imply.
    """
    W_Q, W_K, W_V = (float_array(getattr(W, n), n, ndim=3)
                     for n in ("W_Q", "W_K", "W_V"))
    W_O = float_array(W.W_O, "W_O", ndim=2)
    h, d_model, d_k = W_Q.shape
    h_kv, d_v = W_K.shape[0], W_V.shape[2]
    if min(h, h_kv, d_model, d_k, d_v) == 0:
        raise ValueError(f"Weights need positive sizes, got heads={h}, "
                         f"kv_heads={h_kv}, d_model={d_model}, "
                         f"d_k={d_k}, d_v={d_v}")
    if W_K.shape[1:] != (d_model, d_k):
        raise ValueError(f"W_K has shape {W_K.shape} but W_Q has shape "
                         f"{W_Q.shape}; W_K must be (kv_heads, d_model = "
                         f"{d_model}, d_k = {d_k})")
    groups(h, h_kv, of=f"W_K has shape {W_K.shape} but W_Q has shape "
                       f"{W_Q.shape}")
    if W_V.shape[:2] != (h_kv, d_model):
        raise ValueError(f"W_V has shape {W_V.shape} but W_K has shape "
                         f"{W_K.shape}; W_V must be (kv_heads = {h_kv}, "
                         f"d_model = {d_model}, d_v)")
    if W_O.shape != (h * d_v, d_model):
        raise ValueError(f"W_O has shape {W_O.shape} but must be (heads * "
                         f"d_v, d_model) = ({h} * {d_v}, {d_model}) = "
                         f"{(h * d_v, d_model)}")
    return {"W_Q": W_Q, "W_K": W_K, "W_V": W_V, "W_O": W_O}


def _checked_biases(W: Weights, h: int, d_model: int, d_k: int,
                    d_v: int, h_kv: int) -> dict[str, np.ndarray]:
    """The biases W was given, as float arrays of the right shapes.

    Book: chapter 8, "GPT-2's block, exactly". Errors name the shape
    found and the shape the matching matrix implies.
    """
    shapes = _bias_shapes(h, d_model, d_k, d_v, h_kv)
    implied = {"b_Q": "W_Q expects (h, d_k)",
               "b_K": "W_K expects (h_kv, d_k)",
               "b_V": "W_V expects (h_kv, d_v)",
               "b_O": "W_O expects (d_model,)"}
    found = {}
    for name in _BIASES:
        if getattr(W, name) is None:
            continue
        b = float_array(getattr(W, name), name)  # (h, d) or (d_model,)
        if b.shape != shapes[name]:
            raise ValueError(f"{name} has shape {b.shape} but "
                             f"{implied[name]} = {shapes[name]}")
        found[name] = b
    return found


def init_weights(dims: Dims | None = None, seed: int = 0,
                 dtype=np.float64, *, biases: bool = False) -> Weights:
    """Random weights for ``dims``, each entry N(0, 1/fan_in).

    Book: chapter 4, "Multi-head attention". With ``dims.kv_heads`` < heads
    W_K and W_V have h_kv heads (Part III, chapter 14). The same seed always
    gives the same weights; ``dtype`` may be float64 (default) or float32. With
    ``biases=True`` b_Q, b_K, b_V, b_O are added, each entry N(0, 0.1^2)
    from a stream of their own, so the matrices stay those of
    ``biases=False`` (Book: chapter 8, "GPT-2's block, exactly").
    """
    dims = Dims() if dims is None else dims
    if not isinstance(dims, Dims):
        raise TypeError(
            f"init_weights expects a Dims, got {type(dims).__name__}")
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.floating):
        raise TypeError(f"init_weights needs a floating dtype, got {dtype}")
    rng = np.random.default_rng(seed)
    h, d, dk, dv = dims.heads, dims.d_model, dims.d_k, dims.d_v
    h_kv = dims.kv_heads  # h unless grouped (chapter 14)
    W_Q = rng.standard_normal((h, d, dk)) / np.sqrt(d)  # (h, d_model, d_k)
    W_K = rng.standard_normal((h_kv, d, dk)) / np.sqrt(d)  # (h_kv, d, d_k)
    W_V = rng.standard_normal((h_kv, d, dv)) / np.sqrt(d)  # (h_kv, d, d_v)
    W_O = (rng.standard_normal((h * dv, d))
           / np.sqrt(h * dv))  # (h*d_v, d_model)
    # b_Q, b_K, b_V, b_O: chapter 8
    b = _random_biases(dims, seed) if biases else ()
    return Weights(*(w.astype(dtype) for w in (W_Q, W_K, W_V, W_O) + b))


def _random_biases(dims: Dims, seed: int) -> tuple[np.ndarray, ...]:
    """b_Q, b_K, b_V, b_O with entries N(0, 0.1^2), from their own stream.

    Book: chapter 8, "GPT-2's block, exactly".
    """
    rng = np.random.default_rng([seed, 4])  # independent of the matrices
    shapes = _bias_shapes(dims.heads, dims.d_model, dims.d_k, dims.d_v,
                          dims.kv_heads)
    # (h, d_k), (h_kv, d_k), (h_kv, d_v), (d_model,)
    return tuple(0.1 * rng.standard_normal(shape)
                 for shape in shapes.values())
