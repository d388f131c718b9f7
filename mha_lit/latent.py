"""Multi-head latent attention (MLA): a cache of one short row per token.

Book: Part III, chapter 17 "Latent KV".

DeepSeek-V2 and DeepSeek-V3 (DeepSeek-AI 2024) keep, per token and layer,
one latent row c = x W_DKV (d_c wide; the papers' c^KV) and one rotary key
k_R = RoPE(x W_KR) (d_r wide, the papers' d_h^R, shared by every head)
instead of h keys and h values. Head i rebuilds its key and value from
them:

    key of head i    [c W_UKi | k_R]                 (d_k + d_r)
    value of head i  c W_UVi                         (d_v)
    query of head i  [x W_Qi | RoPE(x W_QRi)]        (d_k + d_r)

and the scores are scaled by 1/sqrt(d_k + d_r), as DeepSeek scales them by
1/sqrt(d_h + d_h^R). The first d_k columns carry no position ("nope"), the
last d_r are rotated (chapter 15). The latents of n tokens are the rows of
C_KV (the book's C^KV), n x d_c.

Left out, as neither changes the size of the cache or how absorption works:
DeepSeek-V2 and V3 project the queries through a latent of their own
(c_Q = x W_DQ, d_c' = 1536 wide, then W_UQ and W_QR act on c_Q), which
saves activation memory in training, and they normalise both latents
(RMSNorm). Here the queries are projected from x directly.

Two computations give the same Y (``latent_attend``):

* un-absorbed: the unrotated keys K_i^C = C_KV W_UKi and the values
  V_i = C_KV W_UVi are rebuilt from the cached rows, then chapter 3's
  attention runs on them;
* absorbed: q_i (C_KV W_UKi)^T = (q_i W_UKi^T) C_KV^T moves W_UKi to the
  query side and S_i (C_KV W_UVi) = (S_i C_KV) W_UVi to the output side,
  so no key or value of any head is ever formed.

Letters in shape comments: n positions (rows of the cache), n_new new
query rows (n_new <= n: the last n_new positions), d_model, d_k (the
unrotated part of a query and key), d_r (the rotated part), d_v, d_c (the
latent), h heads, B sequences in a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import checks, masks
from .attention import attention
from .models import MODELS, DecoderConfig
from .rope import check_base, rotate
from .shapes import read_only_copy

__all__ = ["LatentDims", "LatentWeights", "init_latent_weights",
           "PUBLISHED", "latent_rows", "latent_attend", "latent_attention",
           "LatentKVCache", "latent_cache_bytes", "mha_cache_bytes",
           "latent_multiply_adds"]


@dataclass(frozen=True)
class LatentDims:
    """The sizes of one latent-attention layer, and the number of layers.

    Book: chapter 17. The defaults are the book's: d_model 5, 2 heads,
    d_k 7, d_v 11 as in Part I, a latent of d_c = 23 and a rotary part of
    d_r = 8 (even: RoPE turns pairs). A token's cached row is d_c + d_r = 31
    numbers per layer, where multi-head attention keeps h (d_k + d_v) = 36.
    """

    d_model: int = 5
    heads: int = 2
    d_k: int = 7
    d_v: int = 11
    d_c: int = 23
    d_r: int = 8
    layers: int = 1

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "d_k", "d_v", "d_c", "d_r",
                     "layers"):
            object.__setattr__(self, name, checks.positive_int(
                getattr(self, name), f"LatentDims.{name}"))
        if self.d_r % 2:
            raise ValueError(f"d_r = {self.d_r} is odd, but RoPE rotates "
                             "pairs of columns: d_r must be even")

    @classmethod
    def of(cls, cfg: DecoderConfig) -> LatentDims:
        """The sizes of a published MLA model (``models.DecoderConfig``).

        Book: chapters 17 and 18. Its keys and values are d_k wide (d_v =
        d_k); the query latent ``cfg.latent.d_cq`` is not modelled here.
        """
        if not isinstance(cfg, DecoderConfig) or cfg.latent is None:
            got = getattr(cfg, "attention_kind", type(cfg).__name__)
            raise TypeError("LatentDims.of needs the DecoderConfig of an MLA "
                            f"model, got {got}")
        return cls(d_model=cfg.d_model, heads=cfg.heads, d_k=cfg.d_k,
                   d_v=cfg.d_k, d_c=cfg.latent.d_c, d_r=cfg.latent.d_r,
                   layers=cfg.layers)

    @property
    def latent_row(self) -> int:
        """Numbers cached per token and layer: d_c + d_r."""
        return self.d_c + self.d_r

    @property
    def mha_row(self) -> int:
        """Numbers multi-head attention caches per token and layer:
        h (d_k + d_v)."""
        return self.heads * (self.d_k + self.d_v)


# Published sizes (data): DeepSeek-V2, section 3.1.2 "Model
# Hyper-Parameters" (DeepSeek-AI 2024): 60 layers, d_model 5120, n_h = 128
# heads of d_h = 128 for keys and values, d_c = 512 and a decoupled rotary
# part d_h^R = 64; its query latent d_c' = 1536 is not modelled (module
# docstring). DeepSeek-V3's (section 4.2) are read from models.MODELS, the
# one copy, which chapter 18 uses too.
PUBLISHED: dict[str, LatentDims] = {
    "deepseek-v2": LatentDims(d_model=5120, heads=128, d_k=128, d_v=128,
                              d_c=512, d_r=64, layers=60),
    "deepseek-v3": LatentDims.of(MODELS["deepseek-v3"].config),
}

_SHAPES = {  # every matrix's shape, in the letters of the module docstring
    "W_DKV": "(d_model, d_c)", "W_UK": "(h, d_c, d_k)",
    "W_UV": "(h, d_c, d_v)", "W_Q": "(h, d_model, d_k)",
    "W_QR": "(h, d_model, d_r)", "W_KR": "(d_model, d_r)",
    "W_O": "(h*d_v, d_model)",
}


@dataclass(frozen=True, eq=False)
class LatentWeights:
    """All matrices of one latent-attention layer. Book: chapter 17.

    Per-head matrices are stacked on a leading head axis (W_UK[0] is the
    book's W_UK1). In the book's sizes:

        W_DKV (d_model, d_c)     (5, 23)     x -> latent c
        W_UK  (h, d_c, d_k)      (2, 23, 7)  c -> head i's unrotated key
        W_UV  (h, d_c, d_v)      (2, 23, 11) c -> head i's value
        W_Q   (h, d_model, d_k)  (2, 5, 7)   x -> head i's unrotated query
        W_QR  (h, d_model, d_r)  (2, 5, 8)   x -> head i's rotary query
        W_KR  (d_model, d_r)     (5, 8)      x -> the rotary key, one for all
        W_O   (h*d_v, d_model)   (22, 5)     Concat -> output

    Shapes are checked on construction, with errors that name them; the
    arrays become private read-only copies in one floating dtype.
    """

    W_DKV: np.ndarray
    W_UK: np.ndarray
    W_UV: np.ndarray
    W_Q: np.ndarray
    W_QR: np.ndarray
    W_KR: np.ndarray
    W_O: np.ndarray

    def __post_init__(self) -> None:
        arrs = {name: checks.float_array(getattr(self, name), name,
                                     ndim=_SHAPES[name].count(",") + 1)
                for name in _SHAPES}
        d_model, d_c = arrs["W_DKV"].shape
        h, _, d_k = arrs["W_UK"].shape
        d_v, d_r = arrs["W_UV"].shape[2], arrs["W_KR"].shape[1]
        want = {"W_DKV": (d_model, d_c), "W_UK": (h, d_c, d_k),
                "W_UV": (h, d_c, d_v), "W_Q": (h, d_model, d_k),
                "W_QR": (h, d_model, d_r), "W_KR": (d_model, d_r),
                "W_O": (h * d_v, d_model)}
        for name, shape in want.items():
            if arrs[name].shape != shape:
                raise ValueError(
                    f"{name} has shape {arrs[name].shape} but must be "
                    f"{_SHAPES[name]} = {shape}, from W_DKV "
                    f"{arrs['W_DKV'].shape}, W_UK {arrs['W_UK'].shape}, "
                    f"W_UV {arrs['W_UV'].shape} and W_KR "
                    f"{arrs['W_KR'].shape}")
        if min(d_model, h, d_k, d_v, d_c, d_r) == 0 or d_r % 2:
            raise ValueError(
                f"LatentWeights need positive sizes and an even d_r (RoPE "
                f"turns pairs of columns), got W_DKV {arrs['W_DKV'].shape}, "
                f"W_UK {arrs['W_UK'].shape}, W_UV {arrs['W_UV'].shape}, "
                f"W_KR {arrs['W_KR'].shape}")
        dtype = np.result_type(*arrs.values())
        for name, arr in arrs.items():
            object.__setattr__(self, name, read_only_copy(arr, dtype))

    @property
    def dims(self) -> LatentDims:
        """The sizes these weights have (one layer)."""
        (d_model, d_c), (h, _, d_k) = self.W_DKV.shape, self.W_UK.shape
        return LatentDims(d_model, h, d_k, self.W_UV.shape[2], d_c,
                          self.W_KR.shape[1])

    @property
    def dtype(self) -> np.dtype:
        """The floating dtype all matrices share."""
        return self.W_DKV.dtype

    def arrays(self) -> dict[str, np.ndarray]:
        """Every matrix by name, in the order of the class docstring."""
        return {name: getattr(self, name) for name in _SHAPES}

    def __repr__(self) -> str:
        s = self.dims
        return (f"LatentWeights(d_model={s.d_model}, heads={s.heads}, "
                f"d_k={s.d_k}, d_v={s.d_v}, d_c={s.d_c}, d_r={s.d_r}, "
                f"dtype={self.dtype})")


def init_latent_weights(dims: LatentDims | None = None, seed: int = 0,
                        dtype=np.float64) -> LatentWeights:
    """Random weights for ``dims``, each entry N(0, 1/fan_in).

    Book: chapter 17. fan_in is the number of rows a matrix multiplies:
    d_model for W_DKV, W_Q, W_QR, W_KR; d_c for W_UK, W_UV; h*d_v for W_O.
    The same seed always gives the same weights.
    """
    s = LatentDims() if dims is None else dims
    if not isinstance(s, LatentDims):
        raise TypeError(f"dims must be LatentDims, got {type(s).__name__}")
    rng = np.random.default_rng(seed)
    shapes = {"W_DKV": (s.d_model, s.d_c), "W_UK": (s.heads, s.d_c, s.d_k),
              "W_UV": (s.heads, s.d_c, s.d_v),
              "W_Q": (s.heads, s.d_model, s.d_k),
              "W_QR": (s.heads, s.d_model, s.d_r),
              "W_KR": (s.d_model, s.d_r),
              "W_O": (s.heads * s.d_v, s.d_model)}
    return LatentWeights(**{
        name: (rng.standard_normal(shape)
               / math.sqrt(shape[-2])).astype(dtype)  # fan_in = rows
        for name, shape in shapes.items()})


# --- the computation ---------------------------------------------------------


def _check_weights(W) -> None:
    if not isinstance(W, LatentWeights):
        raise TypeError(f"W must be mha_lit.latent.LatentWeights, got "
                        f"{type(W).__name__}")


def _check_rows(X, W: LatentWeights, name: str = "X") -> np.ndarray:
    """X (n_new, d_model) as a float array, or an error naming the shapes."""
    _check_weights(W)
    X = checks.float_array(X, name)
    d_model = W.W_DKV.shape[0]
    if X.ndim != 2 or X.shape[1] != d_model or X.shape[0] == 0:
        raise ValueError(f"{name} must be (rows >= 1, d_model = {d_model}) "
                         f"to meet W_DKV {W.W_DKV.shape}, got shape "
                         f"{X.shape}")
    return X


def latent_rows(X, W: LatentWeights, positions,
                rope_base: float = 10000.0) -> np.ndarray:
    """The rows a latent cache keeps: [c | k_R] = [x W_DKV | RoPE(x W_KR)].

    Book: chapter 17, "One row per token". X is (n, d_model), positions
    (n,) the positions of its rows (counted from 0); the result is
    (n, d_c + d_r): the latent c, then the rotary key turned to its
    token's position (half-split convention of chapter 15).
    """
    X = _check_rows(X, W)
    C_KV = X @ W.W_DKV  # (n, d_model) @ (d_model, d_c) -> (n, d_c)
    K_R = rotate(X @ W.W_KR, positions, check_base(rope_base))  # (n, d_r)
    return np.concatenate([C_KV, K_R], axis=1)  # (n, d_c + d_r)


def latent_attend(X, rows, W: LatentWeights, causal: bool = True, *,
                  absorbed: bool = True,
                  rope_base: float = 10000.0) -> np.ndarray:
    """Output rows of the queries X against cached rows. Book: chapter 17.

    X (n_new, d_model) holds the input rows of the last n_new of the n
    positions whose ``rows`` [C_KV | K_R] (n, d_c + d_r) come from
    ``latent_rows``; returns Y (n_new, d_model). With ``causal`` the query
    at position t sees keys 0 .. t. ``absorbed=False`` rebuilds every
    head's keys and values from the rows and runs chapter 3's attention;
    ``absorbed=True`` never forms them (module docstring). Both give the
    same Y, to rounding.
    """
    X = _check_rows(X, W)
    rows = checks.float_array(rows, "rows")
    s = W.dims
    n_new = len(X)
    if rows.ndim != 2 or rows.shape[1] != s.latent_row or n_new > len(rows):
        raise ValueError(
            f"rows must be (n >= {n_new}, d_c + d_r = {s.latent_row}) for X "
            f"{X.shape}: one cached row per position, the n_new queries last; "
            f"got rows of shape {rows.shape}")
    n = len(rows)
    positions = np.arange(n - n_new, n)  # (n_new,): where the queries stand
    # (n_new, d_model) @ (h, d_model, d_r) -> (h, n_new, d_r), turned
    Q_R = rotate(X @ W.W_QR, positions, check_base(rope_base))
    mask = masks.causal(n_new, n) if causal else None  # (n_new, n)
    heads = _absorbed_heads if absorbed else _rebuilt_heads
    H = heads(X, Q_R, rows, W, mask)  # h blocks (n_new, d_v)
    concat = np.concatenate(H, axis=1)  # (n_new, h*d_v)
    return concat @ W.W_O  # (n_new, h*d_v) @ (h*d_v, d_model)


def _rebuilt_heads(X, Q_R, rows, W: LatentWeights, mask) -> list:
    """Every head's output with K_i and V_i rebuilt from the latent rows.

    Book: chapter 17, "Rebuilding the keys". Head i's query and key are
    the unrotated part and the rotary part side by side, so chapter 3's
    ``attention`` scales their scores by 1/sqrt(d_k + d_r) by itself.
    """
    d_c = W.dims.d_c
    C_KV, K_R = rows[:, :d_c], rows[:, d_c:]  # (n, d_c), (n, d_r)
    H = []
    for i in range(W.dims.heads):
        # (n_new, d_k + d_r)
        Q = np.concatenate([X @ W.W_Q[i], Q_R[i]], axis=1)
        K = np.concatenate([C_KV @ W.W_UK[i], K_R], axis=1)  # (n, d_k + d_r)
        V = C_KV @ W.W_UV[i]  # (n, d_c) @ (d_c, d_v) -> (n, d_v)
        H.append(attention(Q, K, V, mask))  # (n_new, d_v)
    return H


def _absorbed_heads(X, Q_R, rows, W: LatentWeights, mask) -> list:
    """Every head's output from the latent rows alone, K_i and V_i unformed.

    Book: chapter 17, "Absorbing W_UK and W_UV". Head i's query becomes
    [q W_UKi^T | q_R] (d_c + d_r), scored against the cached rows
    [C_KV | K_R] themselves by chapter 3's ``attention``, with the scale
    of the rebuilt heads, 1/sqrt(d_k + d_r); the weights then average the
    latents, S_i C_KV, and W_UVi maps the average to d_v.
    """
    s = W.dims
    C_KV = rows[:, :s.d_c]  # (n, d_c)
    scale = 1 / math.sqrt(s.d_k + s.d_r)  # not 1/sqrt(d_c + d_r)
    H = []
    for i in range(s.heads):
        q_lat = (X @ W.W_Q[i]) @ W.W_UK[i].T  # (n_new, d_k) @ (d_k, d_c)
        Q = np.concatenate([q_lat, Q_R[i]], axis=1)  # (n_new, d_c + d_r)
        # (n_new, d_c): each query's average of the latents
        latent = attention(Q, rows, C_KV, mask, scale=scale)
        H.append(latent @ W.W_UV[i])  # (n_new, d_c) @ (d_c, d_v)
    return H


def latent_attention(X, W: LatentWeights, causal: bool = True, *,
                     absorbed: bool = True,
                     rope_base: float = 10000.0) -> np.ndarray:
    """Multi-head latent attention: X (n, d_model) -> Y (n, d_model).

    Book: chapter 17. The rows of X stand at positions 0 .. n-1; their
    latent rows (``latent_rows``) serve as keys and values of every head
    (``latent_attend``). X may be a batch (B, n, d_model): one sequence at
    a time, each from position 0. The output has X's floating dtype.
    """
    _check_weights(W)
    arr = checks.float_array(X, "X")
    if arr.ndim == 3:  # (B, n, d_model): one sequence at a time
        if arr.shape[2] != W.W_DKV.shape[0] or 0 in arr.shape[:2]:
            raise ValueError(f"X must be (B, n >= 1, d_model = "
                             f"{W.W_DKV.shape[0]}) to meet W_DKV "
                             f"{W.W_DKV.shape}, got shape {arr.shape}")
        return np.stack([latent_attention(x, W, causal, absorbed=absorbed,
                                          rope_base=rope_base)
                         for x in arr])  # (B, n, d_model)
    if arr.ndim != 2:
        raise ValueError(f"X must be (n, d_model) or (B, n, d_model), got "
                         f"shape {arr.shape}")
    _check_rows(arr, W)
    Xc = arr.astype(np.result_type(arr, W.dtype), copy=False)  # (n, d_model)
    rows = latent_rows(Xc, W, np.arange(len(Xc)),
                       rope_base)  # (n, d_c + d_r)
    Y = latent_attend(Xc, rows, W, causal, absorbed=absorbed,
                      rope_base=rope_base)  # (n, d_model)
    return Y.astype(arr.dtype, copy=False)


# --- generating one token at a time ------------------------------------------


class LatentKVCache:
    """Causal latent attention computed as tokens arrive. Book: chapter 17.

    Keeps one row [c | k_R] (d_c + d_r numbers) per token and nothing
    else: no key or value of any head. ``step(x)`` takes one input row
    (d_model,) and returns its output row, ``extend(X)`` a block
    (n_new, d_model) and its n_new output rows; both equal the last rows of
    ``latent_attention`` on every row seen, to rounding. ``absorbed``
    chooses the computation of ``latent_attend`` (the cache is the same).
    Rows live in a buffer that doubles when full; a refused input leaves
    the cache as it was.
    """

    def __init__(self, W: LatentWeights, capacity: int = 16, *,
                 absorbed: bool = True, rope_base: float = 10000.0):
        if not isinstance(W, LatentWeights):
            raise TypeError(f"LatentKVCache needs LatentWeights, got "
                            f"{type(W).__name__}")
        capacity = checks.positive_int(capacity, "capacity")
        self.W, self.absorbed = W, bool(absorbed)
        self.rope_base = check_base(rope_base)
        self._n = 0
        self._buf = np.zeros((int(capacity), W.dims.latent_row),
                           W.dtype)  # (cap, d_c + d_r)

    def __len__(self) -> int:
        """Positions seen (rows cached)."""
        return self._n

    @property
    def rows(self) -> np.ndarray:
        """The cached rows [c | k_R], read-only: (n, d_c + d_r)."""
        view = self._buf[: self._n].view()
        view.flags.writeable = False
        return view

    def bytes_per_token(self) -> int:
        """Bytes the cache keeps per token: (d_c + d_r) numbers."""
        return self.W.dims.latent_row * self._buf.itemsize

    def step(self, x) -> np.ndarray:
        """Append one row x (d_model,); return its output row (d_model,)."""
        x = checks.float_array(x, "x")
        if x.shape != (self.W.dims.d_model,):
            raise ValueError(f"step takes one row x (d_model,) with "
                             f"d_model = {self.W.dims.d_model}, got shape "
                             f"{x.shape}")
        return self.extend(x[None, :])[0]  # (d_model,)

    def extend(self, X) -> np.ndarray:
        """Append a block X (n_new, d_model); return its outputs, the same
        shape."""
        X = _check_rows(X, self.W)
        dtype = np.result_type(X, self.W.dtype)
        p, n = self._n, self._n + len(X)
        new = latent_rows(X.astype(dtype, copy=False), self.W,
                          np.arange(p, n),
                          self.rope_base)  # (n_new, d_c + d_r)
        buf = self._buf
        if n > len(buf) or np.result_type(buf, dtype) != buf.dtype:
            cap = len(buf)
            while cap < n:
                cap *= 2
            buf = np.zeros((cap, buf.shape[1]), np.result_type(buf, dtype))
            buf[:p] = self._buf[:p]  # (cap, d_c + d_r), the rows kept
        buf[p:n] = new
        Y = latent_attend(X.astype(dtype, copy=False), buf[:n], self.W,
                          absorbed=self.absorbed,
                          rope_base=self.rope_base)  # (n_new, d_model)
        self._buf, self._n = buf, n  # commit only once everything succeeded
        return Y.astype(X.dtype, copy=False)

    def __repr__(self) -> str:
        s = self.W.dims
        return (f"LatentKVCache(rows={self._n}, d_c={s.d_c}, d_r={s.d_r}, "
                f"absorbed={self.absorbed})")


# --- what it costs -----------------------------------------------------------


def latent_cache_bytes(dims: LatentDims, tokens: int = 1,
                       bytes_per_value: int = 2) -> int:
    """Bytes of one sequence's latent cache: L (d_c + d_r) per token.

    Book: chapter 17, "Bytes per token". Every layer keeps one row of
    d_c + d_r numbers per token; 2 bytes per number is fp16/bf16.
    """
    tokens = checks.positive_int(tokens, "tokens")
    bytes_per_value = checks.positive_int(bytes_per_value, "bytes_per_value")
    return dims.layers * dims.latent_row * tokens * bytes_per_value


def mha_cache_bytes(dims: LatentDims, tokens: int = 1,
                    bytes_per_value: int = 2) -> int:
    """Bytes the same sizes cost with multi-head attention's KV cache.

    Book: chapter 17. Every layer keeps h keys of d_k and h values of d_v
    per token: L h (d_k + d_v), chapter 7's count, 2 L h d_k when d_k = d_v
    (chapter 12).
    """
    tokens = checks.positive_int(tokens, "tokens")
    bytes_per_value = checks.positive_int(bytes_per_value, "bytes_per_value")
    return dims.layers * dims.mha_row * tokens * bytes_per_value


def latent_multiply_adds(n_new: int, n: int, dims: LatentDims,
                         absorbed: bool = True) -> int:
    """Multiply-adds of n_new new rows among n positions: their cached rows
    (``latent_rows``) and their outputs (``latent_attend``).

    Book: chapter 17, "What a step costs". One layer. A decoding step is
    n_new = 1 (its row and the n - 1 before it cached); a dense prefill is
    n_new = n (every score computed, the masked ones too). Both ways
    compute the new rows' cached rows n_new d_model (d_c + d_r)
    (``latent_rows``), every head's query parts n_new d_model (d_k + d_r),
    and Concat W_O n_new h d_v d_model; per head, rebuilt: K_i^C, V_i for
    all n rows, n d_c (d_k + d_v), scores n_new n (d_k + d_r), S V
    n_new n d_v; absorbed: q W_UK^T n_new d_k d_c, scores
    n_new n (d_c + d_r), S C_KV n_new n d_c, then W_UV n_new d_c d_v. The
    queries are projected from x (module docstring): DeepSeek's query
    latent would change the query term, none of the terms in n.
    """
    n_new = checks.positive_int(n_new, "n_new")
    n = checks.positive_int(n, "n")
    if n_new > n:
        raise ValueError(f"n_new = {n_new} query rows need at least as "
                         f"many positions, got n = {n}")
    s = dims
    shared = (n_new * s.d_model * (s.d_c + s.d_r)  # latent_rows
              + n_new * s.heads * s.d_v * s.d_model)  # Concat W_O
    queries = n_new * s.d_model * (s.d_k + s.d_r)
    if absorbed:
        per_head = (n_new * s.d_k * s.d_c + n_new * n * (s.d_c + s.d_r)
                    + n_new * n * s.d_c + n_new * s.d_c * s.d_v)
    else:
        per_head = (n * s.d_c * (s.d_k + s.d_v)
                    + n_new * n * (s.d_k + s.d_r) + n_new * n * s.d_v)
    return shared + s.heads * (queries + per_head)
