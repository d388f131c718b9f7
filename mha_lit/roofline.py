"""The roofline model: how fast a product can run, on a CPU and on a GPU.

Book: chapter 13 "From CPU to GPU" (everything here), chapter 12
"Computing it efficiently" (``matmul_intensity``, ``measure_rates``,
``attention_traffic``, ``attention_traffic_fa2``) and chapter 20 "What
the backward pass costs" (``backward_traffic``, ``backward_traffic_fa2``).

A product of an (a x b) and a (b x c) matrix does a b c multiply-adds,
2 a b c FLOPs. It must at least read both factors and write the result:
s (a b + b c + a c) bytes with s bytes per number. Its *arithmetic
intensity* I is the ratio, FLOPs per byte. A machine that does at most pi
FLOP/s and moves at most beta bytes/s from main memory cannot finish the
product faster than

    max(FLOPs / pi, bytes / beta),

so the rate it can reach is min(pi, I * beta) (Williams et al. 2009).
The two limits meet at the *ridge point* I* = pi / beta: products of lower
intensity are bound by memory, products of higher intensity by arithmetic.

The accelerators' rates are published specifications (``ACCELERATORS``,
each with its datasheet's key in the book's bibliography): numbers derived
from them are derived, not measured. The CPU's rates are measured on the
machine that runs ``measure_rates``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from . import checks
from .models import TransformerConfig, check_config

__all__ = [
    "Accelerator",
    "ACCELERATORS",
    "matmul_intensity",
    "attainable_flops",
    "roofline_seconds",
    "Product",
    "layer_products",
    "rows_at_ridge",
    "compute_bound_batch",
    "attention_traffic",
    "attention_traffic_fa2",
    "backward_traffic",
    "backward_traffic_fa2",
    "training_flops",
    "training_days",
    "measure_rates",
]


@dataclass(frozen=True)
class Accelerator:
    """One accelerator's published limits (dense, no structured sparsity).

    ``peak_flops`` (pi): FLOP/s of its matrix units in ``precision``;
    ``bandwidth`` (beta): bytes/s of its main memory (HBM); ``memory``:
    bytes of HBM; ``l2``: bytes of L2 cache; ``sram_per_sm``: bytes of
    shared memory one streaming multiprocessor (SM) can use;
    ``registers_per_sm``: bytes of its register file; ``sms``: number of
    SMs; ``source``: key of the datasheet in ``references.bib``. Capacities
    on the chip are binary (a datasheet's "50 MB" of L2 is 50 MiB), HBM
    capacities decimal, as the datasheets print them.
    """

    name: str
    peak_flops: float
    precision: str
    bandwidth: float
    memory: float
    l2: float
    sram_per_sm: float
    registers_per_sm: float
    sms: int
    source: str

    @property
    def ridge_point(self) -> float:
        """I* = pi / beta: FLOPs per byte at which memory and arithmetic
        take equal time."""
        return self.peak_flops / self.bandwidth


# Published specifications, SXM boards (data, not measurements). Tensor-core
# rates are the dense 16-bit figures: the datasheets of A100, H100 and H200
# print twice as much "with sparsity" (2:4 structured sparsity), which dense
# matrices cannot use, and H100/H200 twice as much again in fp8. V100: the
# GPU GPT-3 was trained on (Brown et al. 2020, section 2.3); its tensor
# cores take fp16 (bf16 came with A100). Every SM of these GPUs has 65,536
# 32-bit registers (the architecture whitepapers).
ACCELERATORS: dict[str, Accelerator] = {
    "V100": Accelerator("NVIDIA V100 SXM2 32 GB", 125e12, "fp16", 900e9,
                        32e9, 6 * 2**20, 96 * 2**10, 256 * 2**10, 80,
                        "nvidia2017v100"),
    "A100": Accelerator("NVIDIA A100 SXM4 80 GB", 312e12, "bf16", 2039e9,
                        80e9, 40 * 2**20, 164 * 2**10, 256 * 2**10, 108,
                        "nvidia2020a100"),
    "H100": Accelerator("NVIDIA H100 SXM5 80 GB", 989e12, "bf16", 3.35e12,
                        80e9, 50 * 2**20, 228 * 2**10, 256 * 2**10, 132,
                        "nvidia2022h100"),
    "H200": Accelerator("NVIDIA H200 SXM 141 GB", 989e12, "bf16", 4.8e12,
                        141e9, 50 * 2**20, 228 * 2**10, 256 * 2**10, 132,
                        "nvidia2024h200"),
}


def matmul_intensity(a: int, b: int, c: int, bytes_per_value: float) -> float:
    """FLOPs per byte of an (a x b) @ (b x c) product.

    Book: chapter 13, equation (eq-intensity). 2 a b c FLOPs over
    s (a b + b c + a c) bytes, s = ``bytes_per_value``: both factors read
    once, the result written once, nothing read twice. For a few rows
    (a much smaller than b and c) it is close to 2 a / s: a matrix-vector
    product (a = 1) in float32 does one multiply-add per 4-byte weight.
    """
    a, b, c = (checks.positive_int(v, name)
               for v, name in ((a, "a"), (b, "b"), (c, "c")))
    if not bytes_per_value > 0:
        raise ValueError(
            f"bytes_per_value must be positive, got {bytes_per_value}")
    return 2 * a * b * c / (bytes_per_value * (a * b + b * c + a * c))


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roofline: min(pi, I * beta), in FLOP/s.

    Book: chapter 13. ``intensity`` may be an array (FLOPs per byte).
    """
    return np.minimum(peak_flops, np.asarray(intensity) * bandwidth)


def roofline_seconds(flops: float, nbytes: float, peak_flops: float,
                     bandwidth: float) -> float:
    """The least time the roofline allows: max(FLOPs / pi, bytes / beta).

    Book: chapter 13.
    """
    return max(flops / peak_flops, nbytes / bandwidth)


@dataclass(frozen=True)
class Product:
    """One kind of product in a layer: ``count`` times (a x b) @ (b x c).

    Book: chapter 13. ``flops`` and ``bytes`` are totals over the count,
    with every operand read once and the result written once.
    """

    name: str
    a: int
    b: int
    c: int
    count: int
    bytes_per_value: float

    @property
    def flops(self) -> int:
        return 2 * self.count * self.a * self.b * self.c

    @property
    def bytes(self) -> float:
        a, b, c = self.a, self.b, self.c
        return self.count * self.bytes_per_value * (a * b + b * c + a * c)

    @property
    def intensity(self) -> float:
        """FLOPs per byte, as ``matmul_intensity``."""
        return matmul_intensity(self.a, self.b, self.c, self.bytes_per_value)


def layer_products(cfg: TransformerConfig, new_tokens: int, context: int,
                   batch: int = 1,
                   bytes_per_value: float = 2) -> list[Product]:
    """The matrix products of one GPT layer, heads fused, for a batch.

    Book: chapter 13. ``new_tokens`` rows per sequence are computed against
    ``context`` keys (the new ones included): prefill of an n-token prompt
    is ``new_tokens = context = n``; one decoding step with n cached tokens
    is ``new_tokens = 1, context = n + 1``. The weight products see all
    ``batch * new_tokens`` rows at once (the weights are shared); Q K^T and
    S V are one product per sequence and head (every sequence has its own
    keys and values). Scores are counted in full (no causal skipping); S is
    counted as written out and read back. G = GELU(X W_1 + b_1).
    """
    c = check_config(cfg, TransformerConfig, "layer_products")
    t = checks.positive_int(new_tokens, "new_tokens")
    n = checks.positive_int(context, "context")
    B = checks.positive_int(batch, "batch")
    if t > n:
        raise ValueError(f"new_tokens = {t} exceeds context = {n}: the new "
                         "tokens are part of the context")
    d, f, h, d_k = c.d_model, c.d_ff, c.heads, c.d_k
    rows, s = B * t, bytes_per_value
    return [
        Product("X W_QKV", rows, d, 3 * d, 1, s),
        Product("Q K^T", t, d_k, n, B * h, s),
        Product("S V", t, n, d_k, B * h, s),
        Product("Concat W_O", rows, d, d, 1, s),
        Product("X W_1", rows, d, f, 1, s),
        Product("G W_2", rows, f, d, 1, s),
    ]


def rows_at_ridge(b: int, c: int, acc: Accelerator,
                  bytes_per_value: float = 2) -> int:
    """Fewest rows a for which an (a x b) @ (b x c) product reaches the ridge.

    Book: chapter 13. The intensity matmul_intensity(a, b, c, s) grows with
    a towards 2 b c / (s (b + c)); the returned a is the first at which it
    is at least ``acc``'s ridge point I* (about s I* / 2 when b and c are
    large next to a). The rows are whatever shares the weight matrix
    (b x c): the sequences of a decoding step, or every prompt token of
    every sequence in a prefill. A ValueError if the limit stays below I*.
    """
    b = checks.positive_int(b, "b")
    c = checks.positive_int(c, "c")
    ridge = acc.ridge_point
    limit = 2 * b * c / (bytes_per_value * (b + c))  # as a -> infinity
    if limit <= ridge:
        raise ValueError(
            f"a {b} x {c} weight product never reaches {acc.name}'s ridge "
            f"point of {ridge:.0f} FLOPs/byte at {bytes_per_value} bytes "
            "per value, whatever the number of rows")
    lo, hi = 1, 1
    while matmul_intensity(hi, b, c, bytes_per_value) < ridge:
        lo, hi = hi, 2 * hi
    while lo < hi:  # the intensity grows with the rows: bisect
        mid = (lo + hi) // 2
        if matmul_intensity(mid, b, c, bytes_per_value) < ridge:
            lo = mid + 1
        else:
            hi = mid
    return lo


def compute_bound_batch(cfg: TransformerConfig, acc: Accelerator,
                        bytes_per_value: float = 2) -> int:
    """Smallest decoding batch whose weight products reach ``acc``'s ridge.

    Book: chapter 13. In a decoding step every sequence adds one row to
    each weight product; the smallest weight product (W_O, d_model x
    d_model) is the last to reach the ridge point I*, at
    rows_at_ridge(d_model, d_model) rows (about s I* / 2 for a wide model,
    s = ``bytes_per_value``). The products against the KV cache (Q K^T,
    S V) do not take part: every sequence reads its own cache, so their
    intensity does not grow with B. The same count of rows holds for a
    prefill, whose weight products see every prompt token of the batch.
    """
    c = check_config(cfg, TransformerConfig, "compute_bound_batch")
    return rows_at_ridge(c.d_model, c.d_model, acc, bytes_per_value)


def attention_traffic(n: int, d_k: int, sram_values: int | None = None
                      ) -> int:
    """Numbers moved between main memory and the chip by one head's attention.

    Book: chapter 12 and chapter 13, after Dao et al. (2022), who count the
    accesses to a GPU's high-bandwidth memory (HBM) of one head with n
    tokens and head width d_k (their N and d). Their S and P are the
    book's scores Z and weights S.

    ``sram_values=None``: the standard computation (their Algorithm 0):
    read Q and K, write Z = Q K^T / sqrt(d_k) (the scale folded into Q);
    read Z, write S = softmax(Z); read S and V, write H = S V:
    4 n d_k + 4 n^2 numbers, Theta(n d_k + n^2).

    ``sram_values=M``: FlashAttention's tiled computation with on-chip
    memory of M numbers (their Algorithm 1, the loop order of
    FlashAttention-1: key blocks outside, query blocks inside). The output
    O and the row statistics l and m are first written, initialised to
    O = 0, l = 0 and m = -inf (n d_k + 2 n); blocks of B_c = ceil(M / 4 d_k)
    keys and values are read once (2 n d_k); for each of the
    T_c = ceil(n / B_c) key blocks every query block reads its queries and
    partial output and writes the output back, and reads and writes m and
    l (3 n d_k + 4 n).
    Theta(n^2 d_k^2 / M): Z and S never leave the chip. As n grows the
    ratio of the two counts tends to M / (3 d_k^2).
    """
    n = checks.positive_int(n, "n")
    d_k = checks.positive_int(d_k, "d_k")
    if sram_values is None:
        return 4 * n * d_k + 4 * n * n
    M = checks.positive_int(sram_values, "sram_values")
    if M < 4 * d_k:
        raise ValueError(f"on-chip memory of {M} numbers cannot hold a block "
                         f"of one key, value and query row of width "
                         f"d_k = {d_k}")
    block_keys = math.ceil(M / (4 * d_k))
    key_blocks = math.ceil(n / block_keys)
    return (n * d_k + 2 * n + 2 * n * d_k
            + key_blocks * (3 * n * d_k + 4 * n))


def attention_traffic_fa2(n: int, d_k: int, sram_values: int) -> int:
    """Numbers moved by one head's attention in FlashAttention-2's loop order.

    Book: chapter 12, after Dao (2024), Algorithm 1 (forward pass): query
    blocks outside, key blocks inside. Each block of B_r queries is read
    once and keeps its running m, l and output rows on the chip; every
    block of keys and values is read once per query block, T_r =
    ceil(n / B_r) times; at the end the output block is written once,
    with one number per row (L = m + log l, kept for the backward pass).
    That is 2 n d_k + n + T_r * 2 n d_k numbers. The paper tunes B_r; here
    B_r = ceil(M / 4 d_k) for on-chip memory of M = ``sram_values``
    numbers, the size Algorithm 1 of FlashAttention-1 gives its blocks of
    keys, so that the two loop orders share their on-chip memory alike.
    As n grows the ratio to the standard count tends to M / (2 d_k^2).
    """
    n = checks.positive_int(n, "n")
    d_k = checks.positive_int(d_k, "d_k")
    M = checks.positive_int(sram_values, "sram_values")
    if M < 4 * d_k:
        raise ValueError(f"on-chip memory of {M} numbers cannot hold a block "
                         f"of one query, output, key and value row of width "
                         f"d_k = {d_k}")
    block_queries = math.ceil(M / (4 * d_k))
    query_blocks = math.ceil(n / block_queries)
    return 2 * n * d_k + n + query_blocks * 2 * n * d_k


def _key_blocks(n: int, d_k: int, sram_values: int) -> int:
    """T_c = ceil(n / B_c), blocks of B_c = ceil(M / 4 d_k) keys."""
    M = checks.positive_int(sram_values, "sram_values")
    if M < 4 * d_k:
        raise ValueError(f"on-chip memory of {M} numbers cannot hold a block "
                         f"of one key, value and their gradients' rows of "
                         f"width d_k = {d_k}")
    return math.ceil(n / math.ceil(M / (4 * d_k)))


def backward_traffic(n: int, d_k: int, sram_values: int | None = None
                     ) -> int:
    """Numbers moved between main memory and the chip by one head's backward.

    Book: chapter 20, after Dao et al. (2022), Appendix B.4 (their N and
    d; their P, dP, dS are the book's S, dS, dZ). ``sram_values=None``:
    the standard backward pass (their Algorithm 3), given S from the
    forward: read S and dH, write dV; read dH and V, write dS; read S and
    dS, write dZ; read dZ and K, write dQ; read dZ and Q, write dK:
    8 n d_k + 7 n^2 numbers by this count, Theta(n d_k + n^2) as their
    Theorem 5 states (the paper gives the Theta bounds only).

    ``sram_values=M``: FlashAttention's backward pass (their Algorithm 4;
    key blocks outside, as in FlashAttention-2). dQ, dK, dV are first
    written as zeros (3 n d_k); blocks of B_c = ceil(M / 4 d_k) keys and
    values are read once (2 n d_k); for each of the T_c = ceil(n / B_c) key
    blocks every query block reads Q, H, dH and dQ and the row statistics
    l and m, and writes dQ back (5 n d_k + 2 n); dK and dV are written
    once (2 n d_k). Theta(n^2 d_k^2 / M): S, dS and dZ never leave the
    chip. As n grows the ratio of the two counts tends to
    7 B_c / (5 d_k + 2), about 7 M / (20 d_k^2).
    """
    n = checks.positive_int(n, "n")
    d_k = checks.positive_int(d_k, "d_k")
    if sram_values is None:
        return 8 * n * d_k + 7 * n * n
    key_blocks = _key_blocks(n, d_k, sram_values)
    return 7 * n * d_k + key_blocks * (5 * n * d_k + 2 * n)


def backward_traffic_fa2(n: int, d_k: int, sram_values: int, *,
                         read_output: bool = False) -> int:
    """Numbers moved by one head's backward pass in FlashAttention-2's order.

    Book: chapter 20, after Dao (2024), Algorithm 2 (backward pass): the
    loop order of FlashAttention-1's backward, key blocks outside. dQ is
    first written as zeros (n d_k); Delta = rowsum(dH * H) is computed once,
    reading dH and H and writing Delta (2 n d_k + n); blocks of B_c keys
    and values are read once (2 n d_k); for each of the T_c key blocks
    every query block reads Q, dH, dQ, the log-sum-exp lambda and Delta
    and writes dQ back (4 n d_k + 2 n; the block of dQ, dQ_i, listed on
    both line 9 and line 15, is counted once); dK and dV are written once
    (2 n d_k). Line 9 of the algorithm also loads the output block, which
    nothing after line 4 reads; ``read_output=True`` counts it (n d_k more
    per key block). The paper tunes B_c; here, as in ``backward_traffic``,
    B_c = ceil(M / 4 d_k). As n grows the ratio to the standard count
    tends to 7 B_c / (4 d_k + 2), about 7 M / (16 d_k^2)
    (7 B_c / (5 d_k + 2), about 7 M / (20 d_k^2), with ``read_output``).
    """
    n = checks.positive_int(n, "n")
    d_k = checks.positive_int(d_k, "d_k")
    key_blocks = _key_blocks(n, d_k, sram_values)
    per_block = (5 if read_output else 4) * n * d_k + 2 * n
    return 7 * n * d_k + n + key_blocks * per_block


def training_flops(params: float, tokens: float) -> float:
    """C = 6 N D: training FLOPs for N parameters and D tokens.

    Book: chapter 13. Per token and parameter, 2 FLOPs forward and 4
    backward (gradients with respect to activations and to weights)
    (Kaplan et al. 2020).
    """
    return 6.0 * params * tokens


def training_days(flops: float, acc: Accelerator, gpus: int,
                  mfu: float) -> float:
    """Days to do ``flops`` on ``gpus`` copies of ``acc`` at MFU ``mfu``.

    Book: chapter 13. Model FLOPs utilisation (MFU) is the share of the
    peak rate pi that the model's own FLOPs reach; the book counts them as
    6 N per token, without the attention term that Chowdhery et al. (2022)
    add.
    """
    gpus = checks.positive_int(gpus, "gpus")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must lie in (0, 1], got {mfu}")
    return flops / (gpus * acc.peak_flops * mfu) / 86400


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_rates(dtype=np.float32, size: int = 1024,
                  stream_bytes: int = 256 * 2**20, repeats: int = 5,
                  seed: int = 0) -> dict[str, float]:
    """This machine's limits, measured in one run: FLOP/s and bytes/s.

    Book: chapter 12 and chapter 13. Returns

    - ``"matmul"``: FLOP/s of a (size x size) @ (size x size) product;
    - ``"matvec"``: FLOP/s of a matrix of ``stream_bytes`` bytes times a
      vector (every weight read once, for one multiply-add; from main
      memory only where ``stream_bytes`` is several times the last-level
      cache, else partly or wholly from that cache);
    - ``"bandwidth"``: bytes/s of that matrix-vector product's weights;
    - ``"copy"``: bytes/s of copying ``stream_bytes`` bytes (read + write,
      counted as in the STREAM benchmark), one core.

    Each is the best of ``repeats`` runs after a warm-up. The values
    depend on the machine and on what else runs on it.
    """
    dtype = np.dtype(dtype)
    size = checks.positive_int(size, "size")
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((size, size)).astype(dtype)  # (size, size)
    B = rng.standard_normal((size, size)).astype(dtype)  # (size, size)
    t_mm = _best_seconds(lambda: A @ B, repeats)
    cols = 1024
    rows = max(1, stream_bytes // (cols * dtype.itemsize))
    M = rng.standard_normal((rows, cols), dtype=np.float32).astype(dtype)
    x = rng.standard_normal(cols).astype(dtype)  # (cols,)
    t_mv = _best_seconds(lambda: M @ x, repeats)
    dst = np.empty_like(M)
    t_cp = _best_seconds(lambda: np.copyto(dst, M), repeats)
    return {"matmul": 2 * size**3 / t_mm, "matvec": 2 * M.size / t_mv,
            "bandwidth": M.nbytes / t_mv, "copy": 2 * M.nbytes / t_cp}
