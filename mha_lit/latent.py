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

DeepSeek's released layers (Book: chapter 17, "DeepSeek-V3's attention,
exactly as released") add four things, all carried by ``LatentWeights``
so that no printed function needs another keyword: an RMSNorm with
learned scales on the latent (``gamma_KV``: the cache keeps
RMSNorm(x W_DKV)); a query latent c_Q = x W_DQ (``W_DQ``, d_cq = 1536 in
DeepSeek-V3, DeepSeek's d_c') with an RMSNorm of its own (``gamma_Q``),
from which W_Q and W_QR compute the queries (``query_rows``); RoPE on
adjacent pairs of columns (``interleaved``, as the checkpoints store
W_QR and W_KR); and a ``rope_scaling`` rule (YaRN for DeepSeek-V3: its
frequencies, chapter 15, and the score scale 1/sqrt(d_k + d_r) times
yarn_mscale(factor, mscale_all_dim)^2, ``LatentWeights.score_scale``).
``from_checkpoint`` maps one released layer's tensors onto them.
Without them (the defaults) the queries come from x directly and
nothing is normalised.

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
latent), d_cq (the query latent), d_q (the rows the queries are computed
from: d_model, or d_cq with a query latent), h heads, B sequences in a
batch.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from . import checks, masks
from .attention import attention
from .models import MODELS, DecoderConfig
from .rope import check_base, rotate_scaled, scaling_config, yarn_mscale
from .shapes import read_only_copy

__all__ = ["LatentDims", "LatentWeights", "init_latent_weights",
           "PUBLISHED", "rms_norm", "query_rows", "latent_rows",
           "latent_attend", "latent_attention", "LatentKVCache",
           "latent_cache_bytes", "mha_cache_bytes", "latent_multiply_adds",
           "CHECKPOINT_NAMES", "checkpoint_shapes", "from_checkpoint"]


@dataclass(frozen=True)
class LatentDims:
    """The sizes of one latent-attention layer, and the number of layers.

    Book: chapter 17. The defaults are the book's: d_model 5, 2 heads,
    d_k 7, d_v 11 as in Part I, a latent of d_c = 23 and a rotary part of
    d_r = 8 (even: RoPE turns pairs). A token's cached row is d_c + d_r = 31
    numbers per layer, where multi-head attention keeps h (d_k + d_v) = 36.
    ``d_cq`` is the width of a query latent (DeepSeek's d_c'), None for
    queries projected from x directly; it changes what a step costs, not
    the cache.
    """

    d_model: int = 5
    heads: int = 2
    d_k: int = 7
    d_v: int = 11
    d_c: int = 23
    d_r: int = 8
    layers: int = 1
    d_cq: int | None = None

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "d_k", "d_v", "d_c", "d_r",
                     "layers"):
            object.__setattr__(self, name, checks.positive_int(
                getattr(self, name), f"LatentDims.{name}"))
        if self.d_cq is not None:
            object.__setattr__(self, "d_cq", checks.positive_int(
                self.d_cq, "LatentDims.d_cq"))
        if self.d_r % 2:
            raise ValueError(f"d_r = {self.d_r} is odd, but RoPE rotates "
                             "pairs of columns: d_r must be even")

    def __repr__(self) -> str:
        names = ["d_model", "heads", "d_k", "d_v", "d_c", "d_r", "layers"]
        names += [] if self.d_cq is None else ["d_cq"]
        return ("LatentDims(" + ", ".join(f"{k}={getattr(self, k)}"
                                          for k in names) + ")")

    @classmethod
    def of(cls, cfg: DecoderConfig) -> LatentDims:
        """The sizes of a published MLA model (``models.DecoderConfig``).

        Book: chapters 17 and 18. Its keys and values are d_k wide (d_v =
        d_k). The query latent ``cfg.latent.d_cq`` is left out (d_cq =
        None), so that chapter 17's counts are those of queries projected
        from x; ``dataclasses.replace(dims, d_cq=...)`` counts it.
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
# part d_h^R = 64; its query latent d_c' = 1536 is left out here (d_cq =
# None: chapter 17 counts queries projected from x). DeepSeek-V3's
# (section 4.2) are read from models.MODELS, the one copy, which chapter
# 18 uses too.
PUBLISHED: dict[str, LatentDims] = {
    "deepseek-v2": LatentDims(d_model=5120, heads=128, d_k=128, d_v=128,
                              d_c=512, d_r=64, layers=60),
    "deepseek-v3": LatentDims.of(MODELS["deepseek-v3"].config),
}

_SHAPES = {  # every array's shape, in the letters of the module docstring
    "W_DKV": "(d_model, d_c)", "W_UK": "(h, d_c, d_k)",
    "W_UV": "(h, d_c, d_v)", "W_Q": "(h, d_q, d_k)",
    "W_QR": "(h, d_q, d_r)", "W_KR": "(d_model, d_r)",
    "W_O": "(h*d_v, d_model)", "W_DQ": "(d_model, d_cq)",
    "gamma_Q": "(d_cq,)", "gamma_KV": "(d_c,)",
}
_OPTIONAL = ("W_DQ", "gamma_Q", "gamma_KV")  # None: not in the layer


@dataclass(frozen=True, eq=False)
class LatentWeights:
    """All matrices of one latent-attention layer. Book: chapter 17.

    Per-head matrices are stacked on a leading head axis (W_UK[0] is the
    book's W_UK1). In the book's sizes:

        W_DKV (d_model, d_c)     (5, 23)     x -> latent c
        W_UK  (h, d_c, d_k)      (2, 23, 7)  c -> head i's unrotated key
        W_UV  (h, d_c, d_v)      (2, 23, 11) c -> head i's value
        W_Q   (h, d_q, d_k)      (2, 5, 7)   x -> head i's unrotated query
        W_QR  (h, d_q, d_r)      (2, 5, 8)   x -> head i's rotary query
        W_KR  (d_model, d_r)     (5, 8)      x -> the rotary key, one for all
        W_O   (h*d_v, d_model)   (22, 5)     Concat -> output

    DeepSeek's released layers (chapter 17, "DeepSeek-V3's attention,
    exactly as released") have more, each optional:

        W_DQ     (d_model, d_cq)  x -> the query latent c_Q; W_Q and W_QR
                                  then act on it (d_q = d_cq, not d_model)
        gamma_Q  (d_cq,)          RMSNorm scales of c_Q (needs W_DQ)
        gamma_KV (d_c,)           RMSNorm scales of c, before it is cached
        eps                       the RMSNorms' epsilon (1e-6, as released)
        interleaved               RoPE on adjacent column pairs (True) or
                                  the half split (False, chapter 15)
        rope_scaling              a config.json rule ("yarn", "linear",
                                  "llama3"; None: plain RoPE)

    Shapes are checked on construction, with errors that name them; the
    arrays become private read-only copies in one floating dtype.
    ``dataclasses.replace(W, ...)`` changes some and keeps the rest.
    """

    W_DKV: np.ndarray
    W_UK: np.ndarray
    W_UV: np.ndarray
    W_Q: np.ndarray
    W_QR: np.ndarray
    W_KR: np.ndarray
    W_O: np.ndarray
    W_DQ: np.ndarray | None = None
    gamma_Q: np.ndarray | None = None
    gamma_KV: np.ndarray | None = None
    eps: float = 1e-6
    interleaved: bool = False
    rope_scaling: dict | None = None

    def __post_init__(self) -> None:
        arrs = {name: checks.float_array(getattr(self, name), name,
                                     ndim=_SHAPES[name].count(",") + 1
                                     if name.startswith("W") else 1)
                for name in _SHAPES if getattr(self, name) is not None}
        want, label = self._shapes(arrs)
        for name, arr in arrs.items():
            if arr.shape != want[name]:
                raise ValueError(
                    f"{name} has shape {arr.shape} but must be "
                    f"{label[name]} = {want[name]}, from W_DKV "
                    f"{arrs['W_DKV'].shape}, W_UK {arrs['W_UK'].shape}, "
                    f"W_UV {arrs['W_UV'].shape} and W_KR "
                    f"{arrs['W_KR'].shape}"
                    + (f" and W_DQ {arrs['W_DQ'].shape}" if "W_DQ" in arrs
                       else ""))
        if any(0 in a.shape for a in arrs.values()) or want["W_KR"][1] % 2:
            raise ValueError(
                f"LatentWeights need positive sizes and an even d_r (RoPE "
                f"turns pairs of columns), got W_DKV {arrs['W_DKV'].shape}, "
                f"W_UK {arrs['W_UK'].shape}, W_UV {arrs['W_UV'].shape}, "
                f"W_KR {arrs['W_KR'].shape}")
        if "gamma_Q" in arrs and "W_DQ" not in arrs:
            raise ValueError("gamma_Q scales the query latent x W_DQ, but "
                             "W_DQ is None")
        dtype = np.result_type(*arrs.values())
        for name, arr in arrs.items():
            object.__setattr__(self, name, read_only_copy(arr, dtype))
        self._check_settings()

    @staticmethod
    def _shapes(arrs: dict) -> tuple[dict, dict]:
        """The shape each array must have, and its label in letters."""
        d_model, d_c = arrs["W_DKV"].shape
        h, _, d_k = arrs["W_UK"].shape
        d_v, d_r = arrs["W_UV"].shape[2], arrs["W_KR"].shape[1]
        d_q = arrs["W_DQ"].shape[1] if "W_DQ" in arrs else d_model
        want = {"W_DKV": (d_model, d_c), "W_UK": (h, d_c, d_k),
                "W_UV": (h, d_c, d_v), "W_Q": (h, d_q, d_k),
                "W_QR": (h, d_q, d_r), "W_KR": (d_model, d_r),
                "W_O": (h * d_v, d_model), "W_DQ": (d_model, d_q),
                "gamma_Q": (d_q,), "gamma_KV": (d_c,)}
        q_in = "d_cq" if "W_DQ" in arrs else "d_model"
        label = {name: text.replace("d_q", q_in)
                 for name, text in _SHAPES.items()}
        return want, label

    def _check_settings(self) -> None:
        eps = self.eps
        if (isinstance(eps, bool) or not isinstance(eps, numbers.Real)
                or not math.isfinite(eps) or eps <= 0):
            raise ValueError(f"eps, the RMSNorms' epsilon, must be a "
                             f"positive number, got {eps!r}")
        object.__setattr__(self, "eps", float(eps))
        if not isinstance(self.interleaved, (bool, np.bool_)):
            raise TypeError(f"interleaved must be True or False, got "
                            f"{self.interleaved!r}")
        object.__setattr__(self, "interleaved", bool(self.interleaved))
        rs = self.rope_scaling
        if rs is None:
            return
        rs = dict(rs) if isinstance(rs, MappingProxyType) else rs
        if scaling_config(rs)["rope_type"] == "dynamic":
            raise ValueError(
                "rope_scaling of type 'dynamic' changes the frequencies with "
                "the sequence's length, so rotary keys cached at one length "
                "would be wrong at the next: a latent cache cannot use it")
        object.__setattr__(self, "rope_scaling", MappingProxyType(dict(rs)))

    @property
    def dims(self) -> LatentDims:
        """The sizes these weights have (one layer)."""
        (d_model, d_c), (h, _, d_k) = self.W_DKV.shape, self.W_UK.shape
        d_cq = None if self.W_DQ is None else self.W_DQ.shape[1]
        return LatentDims(d_model, h, d_k, self.W_UV.shape[2], d_c,
                          self.W_KR.shape[1], d_cq=d_cq)

    @property
    def dtype(self) -> np.dtype:
        """The floating dtype all matrices share."""
        return self.W_DKV.dtype

    @property
    def score_scale(self) -> float:
        """What the scores are multiplied by: 1/sqrt(d_k + d_r), or more.

        Book: chapter 17, "DeepSeek-V3's attention, exactly as released".
        A ``rope_scaling`` with "mscale_all_dim" multiplies it by
        ``rope.yarn_mscale(factor, mscale_all_dim)`` squared, as Hugging
        Face's DeepSeek-V3 attention does (1.8739 for DeepSeek-V3).
        """
        s = self.dims
        scale = 1 / math.sqrt(s.d_k + s.d_r)
        rs = self.rope_scaling
        if rs is not None and rs.get("mscale_all_dim"):
            scale *= yarn_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
        return scale

    def rope(self, x, positions, rope_base: float = 10000.0) -> np.ndarray:
        """RoPE as these weights want it: their layout and rope_scaling.

        Book: chapters 15 and 17. ``rope.rotate_scaled`` of x (..., n, d_r)
        at ``positions``, adjacent pairs if ``interleaved``; plain
        ``rope.rotate`` when ``rope_scaling`` is None.
        """
        rs = None if self.rope_scaling is None else dict(self.rope_scaling)
        return rotate_scaled(x, positions, check_base(rope_base), rs,
                             interleaved=self.interleaved)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by name, in the order of the class docstring (the
        optional ones only if present; eps, interleaved and rope_scaling
        are settings, not arrays)."""
        return {name: getattr(self, name) for name in _SHAPES
                if getattr(self, name) is not None}

    def __repr__(self) -> str:
        s = self.dims
        more = "" if s.d_cq is None else f", d_cq={s.d_cq}"
        more += "".join(f", {name}" for name in ("gamma_Q", "gamma_KV")
                        if getattr(self, name) is not None)
        more += ", interleaved" if self.interleaved else ""
        if self.rope_scaling is not None:
            kind = scaling_config(dict(self.rope_scaling))["rope_type"]
            more += f", rope_scaling={kind!r}"
        return (f"LatentWeights(d_model={s.d_model}, heads={s.heads}, "
                f"d_k={s.d_k}, d_v={s.d_v}, d_c={s.d_c}, d_r={s.d_r}"
                f"{more}, dtype={self.dtype})")


def init_latent_weights(dims: LatentDims | None = None, seed: int = 0,
                        dtype=np.float64) -> LatentWeights:
    """Random weights for ``dims``, each entry N(0, 1/fan_in).

    Book: chapter 17. fan_in is the number of rows a matrix multiplies:
    d_model for W_DKV, W_KR (and W_DQ), d_q for W_Q and W_QR (d_model, or
    d_cq with a query latent), d_c for W_UK, W_UV; h*d_v for W_O. With
    ``dims.d_cq`` the layer gets a query latent W_DQ; the norms and the
    rotary settings are left at their defaults. The same seed always
    gives the same weights.
    """
    s = LatentDims() if dims is None else dims
    if not isinstance(s, LatentDims):
        raise TypeError(f"dims must be LatentDims, got {type(s).__name__}")
    rng = np.random.default_rng(seed)
    d_q = s.d_model if s.d_cq is None else s.d_cq
    shapes = {"W_DKV": (s.d_model, s.d_c), "W_UK": (s.heads, s.d_c, s.d_k),
              "W_UV": (s.heads, s.d_c, s.d_v),
              "W_Q": (s.heads, d_q, s.d_k),
              "W_QR": (s.heads, d_q, s.d_r),
              "W_KR": (s.d_model, s.d_r),
              "W_O": (s.heads * s.d_v, s.d_model)}
    if s.d_cq is not None:
        shapes["W_DQ"] = (s.d_model, s.d_cq)
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


def rms_norm(z, gamma, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm: each row z divided by its root mean square, times gamma.

    Book: chapter 17, "One row per token", equation (eq-rmsnorm):
    gamma * z / sqrt(mean(z^2) + eps) over the last axis of z (..., d),
    gamma (d,), as Hugging Face's DeepseekV3RMSNorm and DeepSeek's RMSNorm
    compute it (Hugging Face's normalises in float32 and multiplies by
    gamma in the input's dtype; DeepSeek's calls F.rms_norm on the input's
    dtype; this computes all of it in the arrays' dtype).
    """
    z = checks.float_array(z, "z")
    gamma = checks.float_array(gamma, "gamma", ndim=1)
    if z.ndim == 0 or z.shape[-1] != len(gamma):
        raise ValueError(f"RMSNorm scales each column of z by gamma: z "
                         f"{z.shape} needs as many columns as gamma "
                         f"{gamma.shape} has entries")
    if (isinstance(eps, bool) or not isinstance(eps, numbers.Real)
            or not math.isfinite(eps) or eps <= 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    mean_square = np.mean(z * z, axis=-1, keepdims=True)  # (..., 1)
    return gamma * (z / np.sqrt(mean_square + eps))  # (..., d)


def query_rows(X, W: LatentWeights) -> np.ndarray:
    """The rows the queries are computed from: X, or RMSNorm(X W_DQ).

    Book: chapter 17, "DeepSeek-V3's attention, exactly as released".
    Without a query latent (``W.W_DQ`` None) X itself, (n, d_model); with
    one, the query latents c_Q = X W_DQ (n, d_cq), normalised when
    ``W.gamma_Q`` is given. W_Q and W_QR multiply these rows.
    """
    X = _check_rows(X, W)
    if W.W_DQ is None:
        return X
    C_Q = X @ W.W_DQ  # (n, d_model) @ (d_model, d_cq) -> (n, d_cq)
    if W.gamma_Q is not None:
        C_Q = rms_norm(C_Q, W.gamma_Q, W.eps)  # (n, d_cq)
    return C_Q


def latent_rows(X, W: LatentWeights, positions,
                rope_base: float = 10000.0) -> np.ndarray:
    """The rows a latent cache keeps: [c | k_R] = [x W_DKV | RoPE(x W_KR)].

    Book: chapter 17, "One row per token". X is (n, d_model), positions
    (n,) the positions of its rows (counted from 0); the result is
    (n, d_c + d_r): the latent c, then the rotary key turned to its
    token's position (``W.rope``: chapter 15's half split unless W says
    otherwise). With ``W.gamma_KV`` the latent is cached normalised,
    RMSNorm(x W_DKV), as in DeepSeek's released layers.
    """
    X = _check_rows(X, W)
    C_KV = X @ W.W_DKV  # (n, d_model) @ (d_model, d_c) -> (n, d_c)
    if W.gamma_KV is not None:  # the released layers normalise c
        C_KV = rms_norm(C_KV, W.gamma_KV, W.eps)  # (n, d_c)
    K_R = W.rope(X @ W.W_KR, positions, rope_base)  # (n, d_r), turned
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
    same Y, to rounding. The queries are computed from ``query_rows``.
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
    X_Q = query_rows(X, W)  # (n_new, d_q): X, or the query latents
    # (n_new, d_q) @ (h, d_q, d_r) -> (h, n_new, d_r), turned
    Q_R = W.rope(X_Q @ W.W_QR, positions, rope_base)
    mask = masks.causal(n_new, n) if causal else None  # (n_new, n)
    heads = _absorbed_heads if absorbed else _rebuilt_heads
    H = heads(X_Q, Q_R, rows, W, mask)  # h blocks (n_new, d_v)
    concat = np.concatenate(H, axis=1)  # (n_new, h*d_v)
    return concat @ W.W_O  # (n_new, h*d_v) @ (h*d_v, d_model)


def _rebuilt_heads(X_Q, Q_R, rows, W: LatentWeights, mask) -> list:
    """Every head's output with K_i and V_i rebuilt from the latent rows.

    Book: chapter 17, "Rebuilding the keys". X_Q holds the rows the
    queries are computed from (``query_rows``: X itself unless the layer
    has a query latent). Head i's query and key are the unrotated part
    and the rotary part side by side; chapter 3's ``attention`` multiplies
    their scores by ``W.score_scale``, 1/sqrt(d_k + d_r) unless a
    rope_scaling changes it.
    """
    d_c = W.dims.d_c
    C_KV, K_R = rows[:, :d_c], rows[:, d_c:]  # (n, d_c), (n, d_r)
    H = []
    for i in range(W.dims.heads):
        # (n_new, d_k + d_r)
        Q = np.concatenate([X_Q @ W.W_Q[i], Q_R[i]], axis=1)
        K = np.concatenate([C_KV @ W.W_UK[i], K_R], axis=1)  # (n, d_k + d_r)
        V = C_KV @ W.W_UV[i]  # (n, d_c) @ (d_c, d_v) -> (n, d_v)
        H.append(attention(Q, K, V, mask,
                           scale=W.score_scale))  # (n_new, d_v)
    return H


def _absorbed_heads(X_Q, Q_R, rows, W: LatentWeights, mask) -> list:
    """Every head's output from the latent rows alone, K_i and V_i unformed.

    Book: chapter 17, "Absorbing W_UK and W_UV". Head i's query becomes
    [q W_UKi^T | q_R] (d_c + d_r), scored against the cached rows
    [C_KV | K_R] themselves by chapter 3's ``attention``, with the scale
    of the rebuilt heads, ``W.score_scale``; the weights then average the
    latents, S_i C_KV, and W_UVi maps the average to d_v.
    """
    s = W.dims
    C_KV = rows[:, :s.d_c]  # (n, d_c)
    scale = W.score_scale  # 1/sqrt(d_k + d_r), not 1/sqrt(d_c + d_r)
    H = []
    for i in range(s.heads):
        q_lat = (X_Q @ W.W_Q[i]) @ W.W_UK[i].T  # (n_new, d_k) @ (d_k, d_c)
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
    the cache as it was. Weights with ``gamma_KV`` keep the latent
    normalised (``latent_rows``).
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
    (``latent_rows``), every head's query parts n_new d_model (d_k + d_r)
    (with a query latent d_cq instead: n_new d_cq (d_model + h (d_k +
    d_r)) for all heads), and Concat W_O n_new h d_v d_model; per head,
    rebuilt: K_i^C, V_i for all n rows, n d_c (d_k + d_v), scores
    n_new n (d_k + d_r), S V n_new n d_v; absorbed: q W_UK^T
    n_new d_k d_c, scores n_new n (d_c + d_r), S C_KV n_new n d_c, then
    W_UV n_new d_c d_v. The norms multiply no matrices.
    """
    n_new = checks.positive_int(n_new, "n_new")
    n = checks.positive_int(n, "n")
    if n_new > n:
        raise ValueError(f"n_new = {n_new} query rows need at least as "
                         f"many positions, got n = {n}")
    s = dims
    shared = (n_new * s.d_model * (s.d_c + s.d_r)  # latent_rows
              + n_new * s.heads * s.d_v * s.d_model)  # Concat W_O
    if s.d_cq is None:  # every head's query parts from x
        queries = n_new * s.heads * s.d_model * (s.d_k + s.d_r)
    else:  # x W_DQ once, then every head's parts from the query latent
        queries = n_new * s.d_cq * (s.d_model + s.heads * (s.d_k + s.d_r))
    if absorbed:
        per_head = (n_new * s.d_k * s.d_c + n_new * n * (s.d_c + s.d_r)
                    + n_new * n * s.d_c + n_new * s.d_c * s.d_v)
    else:
        per_head = (n * s.d_c * (s.d_k + s.d_v)
                    + n_new * n * (s.d_k + s.d_r) + n_new * n * s.d_v)
    return shared + queries + s.heads * per_head


# --- a released layer ------------------------------------------------------

# The tensors of one attention layer in DeepSeek-V3's safetensors files
# (after "model.layers.<N>.self_attn."), PyTorch's (out, in) layout, as
# Hugging Face's DeepseekV3Attention names them; q_proj.weight stands for
# q_a_proj, q_a_layernorm and q_b_proj in models without a query latent
# (q_lora_rank null).
CHECKPOINT_NAMES = ("q_a_proj.weight", "q_a_layernorm.weight",
                    "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
                    "kv_a_layernorm.weight", "kv_b_proj.weight",
                    "o_proj.weight")

_CONFIG_KEYS = ("hidden_size", "num_attention_heads", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _config_sizes(config) -> dict:
    """The sizes a config.json gives, checked, in the book's letters."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be the dict of a config.json, got "
                        f"{type(config).__name__}")
    needed = _CONFIG_KEYS + ("q_lora_rank",)
    for key in needed:
        if key not in config:
            raise ValueError(f"config has no {key!r}: from_checkpoint "
                             f"needs {sorted(needed)}")
    d = {letter: checks.positive_int(config[key], f"config[{key!r}]")
         for letter, key in zip(("d_model", "h", "d_c", "d_k", "d_r", "d_v"),
                                _CONFIG_KEYS, strict=True)}
    q = config["q_lora_rank"]
    d["d_cq"] = None if q is None else checks.positive_int(
        q, "config['q_lora_rank']")
    return d


def checkpoint_shapes(config) -> dict[str, tuple[int, int] | tuple[int]]:
    """The shape of every attention tensor of one layer, from config.json.

    Book: chapter 17, "DeepSeek-V3's attention, exactly as released".
    PyTorch's (out, in) layout: q_a_proj (d_cq, d_model), q_a_layernorm
    (d_cq,), q_b_proj (h (d_k + d_r), d_cq), kv_a_proj_with_mqa
    (d_c + d_r, d_model), kv_a_layernorm (d_c,), kv_b_proj
    (h (d_k + d_v), d_c), o_proj (d_model, h d_v); with q_lora_rank null,
    q_proj (h (d_k + d_r), d_model) in place of the first three.
    """
    s = _config_sizes(config)
    h, d_model = s["h"], s["d_model"]
    if s["d_cq"] is None:
        query = {"q_proj.weight": (h * (s["d_k"] + s["d_r"]), d_model)}
    else:
        query = {"q_a_proj.weight": (s["d_cq"], d_model),
                 "q_a_layernorm.weight": (s["d_cq"],),
                 "q_b_proj.weight": (h * (s["d_k"] + s["d_r"]), s["d_cq"])}
    return query | {
        "kv_a_proj_with_mqa.weight": (s["d_c"] + s["d_r"], d_model),
        "kv_a_layernorm.weight": (s["d_c"],),
        "kv_b_proj.weight": (h * (s["d_k"] + s["d_v"]), s["d_c"]),
        "o_proj.weight": (d_model, h * s["d_v"])}


def _dequantized(tensors, name: str, block) -> np.ndarray:
    """A weight, times its 128 x 128 block scales if the file has them."""
    w = checks.float_array(tensors[name], name)
    scale_name = name.replace(".weight", ".weight_scale_inv")
    if scale_name not in tensors:
        return w
    s = checks.float_array(tensors[scale_name], scale_name, ndim=2)
    b0, b1 = block
    if w.ndim != 2 or s.shape != (-(-w.shape[0] // b0), -(-w.shape[1] // b1)):
        raise ValueError(f"{scale_name} has shape {s.shape}, but {name} "
                         f"{w.shape} in blocks of {b0} x {b1} needs one "
                         f"scale per block")
    full = np.repeat(np.repeat(s, b0, axis=0), b1, axis=1)  # blocks -> rows
    return w * full[:w.shape[0], :w.shape[1]]


def from_checkpoint(tensors, config) -> LatentWeights:
    """One released DeepSeek-V2/V3 attention layer as ``LatentWeights``.

    Book: chapter 17, "DeepSeek-V3's attention, exactly as released".
    ``tensors`` maps the names of ``CHECKPOINT_NAMES`` (one layer, the
    prefix "model.layers.<N>.self_attn." removed) to arrays in PyTorch's
    (out, in) layout; ``config`` is the model's config.json as a dict. FP8
    files' "<name>_scale_inv" block scales are applied
    (``quantization_config.weight_block_size``, 128 x 128). Every matrix
    is transposed to the book's (in, out) layout and split per head:
    q_b_proj into W_Q and W_QR, kv_a_proj_with_mqa into W_DKV and W_KR,
    kv_b_proj into W_UK and W_UV. The RMSNorms get eps 1e-6, as both
    released implementations build them (not config's rms_norm_eps, which
    is the block's); ``interleaved`` is config's "rope_interleave" (true
    if absent, as in Hugging Face's DeepseekV3Config) and
    ``rope_scaling`` config's (refused if its factor is not
    max_position_embeddings / original_max_position_embeddings, which some
    versions of Hugging Face's rope utilities read in its place; its
    attention reads "factor", and DeepSeek's code uses its own
    ``rope_factor``, 40). Run the result with
    ``rope_base=config["rope_theta"]``.
    """
    shapes = checkpoint_shapes(config)
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> array, got "
                        f"{type(tensors).__name__}")
    scales = {name.replace(".weight", ".weight_scale_inv") for name in shapes
              if name.endswith("proj.weight")}
    unknown = sorted(set(tensors) - set(shapes) - scales)
    missing = sorted(set(shapes) - set(tensors))
    if unknown or missing:
        raise ValueError(
            f"tensors must be one layer's {sorted(shapes)} (the prefix "
            f"'model.layers.<N>.self_attn.' removed); missing {missing}, "
            f"unknown {unknown}")
    if config.get("attention_bias"):
        raise ValueError("config's 'attention_bias' is true, but "
                         "LatentWeights hold no biases")
    _check_yarn_factor(config)
    quant = config.get("quantization_config") or {}
    block = tuple(quant.get("weight_block_size", (128, 128)))
    T = {name: _dequantized(tensors, name, block) for name in shapes}
    for name, shape in shapes.items():
        if T[name].shape != shape:
            raise ValueError(f"{name} has shape {T[name].shape}, but the "
                             f"config's sizes make it {shape}")
    return _from_released(T, _config_sizes(config), config)


def _check_yarn_factor(config: dict) -> None:
    """Refuse a config whose two readings of YaRN's factor differ.

    Some versions of Hugging Face's rope utilities take
    max_position_embeddings divided by original_max_position_embeddings
    for the factor of the frequencies; its DeepseekV3Attention takes
    rope_scaling's "factor" for the score scale, and DeepSeek's code reads
    neither, using its own ModelArgs.rope_factor, 40 (163840 / 4096 = 40 =
    factor in DeepSeek-V3); ``rope.frequencies`` reads "factor".
    """
    rs = config.get("rope_scaling") or {}
    longest = config.get("max_position_embeddings")
    trained = rs.get("original_max_position_embeddings")
    kind = rs.get("rope_type", rs.get("type"))
    if kind != "yarn" or None in (longest, trained, rs.get("factor")):
        return
    if not math.isclose(longest / trained, rs["factor"], rel_tol=1e-12):
        raise ValueError(
            f"config's max_position_embeddings / rope_scaling's "
            f"original_max_position_embeddings = {longest} / {trained} is "
            f"not rope_scaling's factor {rs['factor']!r}: Hugging Face's "
            f"code reads YaRN's factor from one or the other")


def _from_released(T: dict, s: dict, config: dict) -> LatentWeights:
    """Transpose and split the checked tensors T into the book's arrays."""
    h, d_k, d_r, d_v, d_c = s["h"], s["d_k"], s["d_r"], s["d_v"], s["d_c"]
    query = "q_proj.weight" if s["d_cq"] is None else "q_b_proj.weight"
    W_q = T[query].T.reshape(-1, h, d_k + d_r)  # (d_q, h, d_k + d_r)
    W_kv = T["kv_b_proj.weight"].T.reshape(d_c, h, d_k + d_v)  # per head
    W_a = T["kv_a_proj_with_mqa.weight"].T  # (d_model, d_c + d_r)
    latent = {} if s["d_cq"] is None else {
        "W_DQ": T["q_a_proj.weight"].T,  # (d_model, d_cq)
        "gamma_Q": T["q_a_layernorm.weight"]}  # (d_cq,)
    return LatentWeights(
        W_DKV=W_a[:, :d_c], W_KR=W_a[:, d_c:],
        W_UK=W_kv[:, :, :d_k].transpose(1, 0, 2),  # (h, d_c, d_k)
        W_UV=W_kv[:, :, d_k:].transpose(1, 0, 2),  # (h, d_c, d_v)
        W_Q=W_q[:, :, :d_k].transpose(1, 0, 2),  # (h, d_q, d_k)
        W_QR=W_q[:, :, d_k:].transpose(1, 0, 2),  # (h, d_q, d_r)
        W_O=T["o_proj.weight"].T,  # (h*d_v, d_model)
        gamma_KV=T["kv_a_layernorm.weight"], **latent,
        eps=1e-6, interleaved=bool(config.get("rope_interleave", True)),
        rope_scaling=config.get("rope_scaling"))
