"""Measure alternatives to NumPy + OpenBLAS for the two bounds of a cached decoding step.

    python benchmarks/alternatives.py            # full run
    python benchmarks/alternatives.py --quick    # fewer runs (under about 3 minutes on 2 cores)
    python benchmarks/alternatives.py --threads 1

A cached decoding step of a GPT-2-small-sized stack (12 layers, d_model 768, 12 heads of 64,
d_ff 3072, vocabulary 50,257, float32; 495 MB of weights) spends its time in two operations
(benchmarks/README.md, "Serving"): products of a few rows, one per sequence, with every weight
matrix, which stream the weights from main memory; and every head's one query against all of
its cached keys and values, which streams the caches. Whether a library other than NumPy and
OpenBLAS would do either faster is a question of numbers on this machine, so this script runs
the candidates side by side, in one process, on the same arrays, in alternating order (round
robin, a pause of 0.05 s before each timed run so that the idle threads of the library run
before can go to sleep; part 4 measures what they cost while they do not), and reports
medians:

1. Few-rows weight products X (B, k) @ W for B = 1, 4, 16 over all the stack's matrices, each
   as the step reads it, transposed and C-contiguous: per layer W_QKV^T (2304 x 768), W_O^T
   (768 x 768), W_1^T (3072 x 768), W_2^T (768 x 3072), and the output layer E (50257 x 768).
   Candidates: ``mha_lit.fast.few_rows_product`` (what the package uses), plain NumPy
   ``X @ W_T.T``, PyTorch, BLIS (the ``blis`` package) and a Numba kernel
   (``numba_kernels.rows_product``). Reported: time for all the matrices, weights read per
   second, FLOP/s and the ratio to ``few_rows_product``. For B = 16 also one 256 x 768 panel
   (768 KiB, held in the cache) multiplied many times: the arithmetic rate without memory.
2. Decode attention, one query per sequence and head against every cached key, 12 layers, at
   (B, context) = (1, 1024) and (16, 128), the caches shaped (B, 12, context + 64, 64) and
   used through views of their first rows as the package's KVCache passes them. Candidates:
   ``mha_lit.attention.attention``, the fused Numba kernel (``numba_kernels.attend_one``) and
   PyTorch's ``scaled_dot_product_attention``. Reported: time and bytes of cache read per
   second.
3. The package's own decoding step (``Decoder.decode_step``), unchanged against the same
   step with the Numba kernels swapped in (attention through a wrapper of
   ``KVCache._attend_rows``; products of two rows or more through a wrapper of
   ``few_rows_product``, in ``mha_lit.decoder`` (FFN, output layer) and ``mha_lit.fast``
   (projections, W_O)), decoders alternating in one process. Next to each measured time
   stands the time expected from parts 1 and 2 (the unchanged step, less the time of the
   operation replaced, plus that of its replacement): a measured time well above it is the
   cost of running two thread pools in turn (Numba's and OpenBLAS's); the variant with one
   Numba thread runs Numba's kernels on the calling thread alone.
4. Why, for batch 1 at context 1024: part 2's attention and part 3's step, unchanged against
   Numba attention, each in a fresh process under one setting of how idle threads wait
   (Numba's threading layer, OpenMP's wait policy, OpenBLAS's busy-wait timeout); these
   are read when a library starts its threads, hence the fresh processes.

Every candidate's result is checked against NumPy's before it is timed (rtol and atol 1e-4
in float32, atol relative to the root mean square of the result; logits of the swapped
steps rtol and atol 1e-3).

Threads: NumPy's BLAS, PyTorch and Numba get ``--threads`` (default: the machine's cores);
BLIS as packaged runs on one thread. Optional libraries (``pip install numba blis``, and
PyTorch, the ``bench`` extra) are skipped with a note when absent. Markdown tables on
stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import warnings
from datetime import datetime, timezone

import numpy as np
from attention import alternate, progress, set_threads, thread_report, torch
from serving import prefilled, stack_bytes

import mha_lit.decoder
import mha_lit.fast
from mha_lit import Dims
from mha_lit.attention import attention
from mha_lit.decoder import init_gpt_weights
from mha_lit.fast import few_rows_product, fused_weights
from mha_lit.kv_cache import KVCache

try:
    import numba
    import numba_kernels as nk
except ImportError:  # Numba is optional
    numba = nk = None
try:
    import blis.py as blis_py
except ImportError:  # BLIS is optional
    blis_py = None

GPT2 = Dims(d_model=768, d_k=64, d_v=64, heads=12)
LAYERS, D_FF, VOCAB = 12, 3072, 50257
PAUSE = 0.05  # seconds before each timed run, for the idle threads of the run before to sleep
RTOL = ATOL = 1e-4  # agreement with NumPy, float32 (atol times the result's RMS)
STEP_TOL = 1e-3  # agreement of a swapped step's logits with the unchanged step's
PANEL = 256  # rows of the cache-resident panel: 256 x 768 float32 = 768 KiB

if torch is not None:  # from_numpy on the package's read-only weights: never written
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def agree(got, want, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Assert got equals want to rtol, and to atol times want's root mean square."""
    want = np.asarray(want)
    rms = float(np.sqrt(np.mean(np.square(want, dtype=np.float64))))
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=atol * rms,
                               err_msg=what)


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(t) for name, t in times.items()}


# --- 1. few-rows weight products ----------------------------------------------------------

def stack_matrices(G) -> list[np.ndarray]:
    """Every weight matrix a decoding step multiplies, transposed (n, k), C-contiguous.

    The package's own arrays where it keeps them (fused W_QKV^T, W_1^T, W_2^T, E); W_O^T is
    a C-contiguous copy, as the package makes it for its products of few rows.
    """
    mats = []
    for block in G.blocks:
        W_QKV_T, W_O = fused_weights(block.attn, np.float32)  # (2304, 768), (768, 768)
        W_1T, W_2T = block.transposed_ffn  # (3072, 768), (768, 3072)
        mats += [W_QKV_T, np.ascontiguousarray(W_O.T), W_1T, W_2T]
    return mats + [G.E]  # E: (50257, 768)


def product_candidates() -> tuple[dict, list[str]]:
    """name -> f(W_T, X) = X @ W_T.T (B, n); and notes on the candidates left out."""
    def numpy_plain(W_T, X):
        return X @ W_T.T

    cands = {"few_rows_product": few_rows_product, "NumPy X @ W_T.T": numpy_plain}
    notes = []
    if torch is not None:
        def torch_product(W_T, X):
            with torch.inference_mode():
                return (torch.from_numpy(X) @ torch.from_numpy(W_T).T).numpy()
        cands["PyTorch"] = torch_product
    else:
        notes.append("PyTorch not installed: left out")
    if blis_py is not None:
        def blis_product(W_T, X):
            return blis_py.gemm(X, W_T, trans2=True)  # (B, k) @ (n, k)^T
        cands["BLIS"] = blis_product
    else:
        notes.append("blis not installed (pip install blis): left out")
    if nk is not None:
        def numba_product(W_T, X):
            out = np.empty((len(X), len(W_T)), np.float32)  # (B, n)
            nk.rows_product(W_T, X, out)
            return out
        cands["Numba rows_product"] = numba_product
    else:
        notes.append("numba not installed (pip install numba): left out")
    return cands, notes


def bench_products(mats, batches, runs: int, seed: int = 1) -> dict:
    """Per B: candidate -> median seconds for all of ``mats``; plus bytes and FLOPs."""
    cands, notes = product_candidates()
    rng = np.random.default_rng(seed)
    weight_bytes = sum(W.nbytes for W in mats)
    results = {"notes": notes, "bytes": weight_bytes, "B": {}}
    shapes = {W.shape: W for W in mats}  # one matrix of each shape, for the check
    for B in batches:
        progress(f"products, B = {B}")
        X = {k: rng.standard_normal((B, k)).astype(np.float32)
             for k in {W.shape[1] for W in mats}}  # (B, k) for each k
        for name, f in cands.items():  # same result as NumPy before any timing
            for W_T in shapes.values():
                agree(f(W_T, X[W_T.shape[1]]), X[W_T.shape[1]] @ W_T.T,
                      f"{name}, B={B}, W_T {W_T.shape}")

        def all_matrices(f, X=X):
            for W_T in mats:
                f(W_T, X[W_T.shape[1]])

        timed = {name: (lambda f=f: all_matrices(f)) for name, f in cands.items()}
        t = medians(alternate(timed, runs, f"products B={B}", pause=PAUSE))
        results["B"][B] = {"seconds": t, "flops": 2 * B * weight_bytes // 4}  # float32
    return results


def bench_panel(mats, B: int, runs: int, repeats: int, seed: int = 2) -> dict:
    """One 256 x 768 panel of W_1^T, held in the cache, times X (B, 768), ``repeats`` times."""
    panel = np.ascontiguousarray(mats[2][:PANEL])  # (256, 768): 768 KiB
    X = np.random.default_rng(seed).standard_normal((B, panel.shape[1])).astype(np.float32)
    X_T = X.T.copy()  # (768, B), as few_rows_product passes it
    out_T = np.empty((PANEL, B), np.float32)  # (256, B)

    def openblas():
        for _ in range(repeats):
            np.matmul(panel, X_T, out=out_T)  # (256, 768) @ (768, B)

    functions = {"OpenBLAS (few_rows_product's call)": openblas}
    agree((panel @ X_T).T, X @ panel.T, "OpenBLAS panel")
    if nk is not None:
        out = np.empty((B, PANEL), np.float32)

        def numba_panel():
            for _ in range(repeats):
                nk.rows_product(panel, X, out)

        nk.rows_product(panel, X, out)
        agree(out, X @ panel.T, "Numba panel")
        functions["Numba rows_product"] = numba_panel
    t = medians(alternate(functions, runs, "panel", pause=PAUSE))
    return {"seconds": t, "flops": 2 * B * panel.size * repeats, "calls": repeats,
            "bytes": panel.nbytes}


# --- 2. decode attention ------------------------------------------------------------------

def attention_caches(B: int, context: int, seed: int):
    """12 layers of (q (B, h, 1, d_k), K, V (B, h, context + 64, d)), float32, unit scale."""
    rng = np.random.default_rng(seed)
    h, d = GPT2.heads, GPT2.d_k
    layers = []
    for _ in range(LAYERS):
        q = (rng.standard_normal((B, h, 1, d)) / np.sqrt(d)).astype(np.float32)
        K, V = (rng.standard_normal((B, h, context + 64, d), dtype=np.float32)
                for _ in "KV")
        layers.append((q, K, V))
    return layers


def bench_attention(B: int, context: int, runs: int, seed: int = 3) -> dict:
    layers = attention_caches(B, context, seed)
    h, d = GPT2.heads, GPT2.d_k
    n = context
    want = [attention(q, K[:, :, :n], V[:, :, :n], scale=1.0) for q, K, V in layers]

    def ours():
        for q, K, V in layers:
            attention(q, K[:, :, :n], V[:, :, :n], scale=1.0)  # (B, h, 1, d_v)

    functions = {"mha_lit attention": ours}
    if nk is not None:
        q3 = [np.ascontiguousarray(q[:, :, 0]) for q, _, _ in layers]  # (B, h, d_k)
        out = np.empty((B, h, d), np.float32)  # (B, h, d_v)
        for (_, K, V), q, w in zip(layers, q3, want, strict=True):
            nk.attend_one(q, K, V, n, out)
            agree(out, w[:, :, 0], f"Numba attend_one B={B} context={n}")

        def fused(threads=None):
            def run():
                before = numba.get_num_threads()
                if threads is not None:
                    numba.set_num_threads(threads)
                for (_, K, V), q in zip(layers, q3, strict=True):
                    nk.attend_one(q, K, V, n, out)
                numba.set_num_threads(before)
            return run

        functions["Numba attend_one"] = fused()
        if numba.get_num_threads() > 1:
            functions["Numba attend_one, 1 thread"] = fused(1)
    if torch is not None:
        F = torch.nn.functional
        tl = [(torch.from_numpy(q.copy()), torch.from_numpy(K.copy())[:, :, :n],
               torch.from_numpy(V.copy())[:, :, :n]) for q, K, V in layers]  # copies

        def sdpa():
            with torch.inference_mode():
                for q, K, V in tl:
                    F.scaled_dot_product_attention(q, K, V, scale=1.0)

        with torch.inference_mode():
            for (q, K, V), w in zip(tl, want, strict=True):
                agree(F.scaled_dot_product_attention(q, K, V, scale=1.0).numpy(), w,
                      f"PyTorch SDPA B={B} context={n}")
        functions["PyTorch SDPA"] = sdpa
    t = medians(alternate(functions, runs, f"attention B={B}", pause=PAUSE))
    read = LAYERS * B * h * n * 2 * d * 4  # every layer's keys and values, once
    return {"seconds": t, "bytes": read}


# --- 3. the swap inside a real step -------------------------------------------------------

class Swap:
    """Which Numba kernels the wrapped package functions use (toggled between steps)."""

    attention = False
    products = False


_attend_rows = KVCache._attend_rows
_few_rows_product = few_rows_product


def _leading_rows(A: np.ndarray):
    """(buffer, m) with buffer C-contiguous and A == buffer[:, :, :m]; else a copy of A."""
    base = A.base
    if (isinstance(base, np.ndarray) and base.flags.c_contiguous and base.ndim == 4
            and base.shape[:2] == A.shape[:2] and base.shape[3] == A.shape[3]
            and base.strides == A.strides
            and base.__array_interface__["data"][0] == A.__array_interface__["data"][0]):
        return base, A.shape[2]
    return np.ascontiguousarray(A), A.shape[2]


def swapped_attend_rows(self, Q, K, V, at, at_k, seen, block, tile):
    """KVCache._attend_rows through Numba's attend_one where it applies, else the original.

    It applies to a decoding step (one new row per sequence, Q (B, h, 1, d_k)) that hides no
    key (``seen is None``), takes whole rows (``tile is None``), has no grouped heads and is
    float32 throughout.
    """
    if not (Swap.attention and seen is None and tile is None and Q.ndim == 4
            and Q.shape[-2] == 1 and self.W.group == 1
            and Q.dtype == K.dtype == V.dtype == np.float32):
        return _attend_rows(self, Q, K, V, at, at_k, seen, block, tile)
    K_buf, m = _leading_rows(K)  # (B, h, cap, d_k), first m rows used
    V_buf, _ = _leading_rows(V)
    B, h = Q.shape[:2]
    out = np.empty((B, h, V.shape[3]), np.float32)  # (B, h, d_v)
    nk.attend_one(np.ascontiguousarray(Q[:, :, 0]), K_buf, V_buf, m, out)
    return out[:, :, None]  # (B, h, 1, d_v)


def swapped_few_rows_product(W_T, X):
    """few_rows_product through Numba's rows_product for two rows or more, float32.

    The result has the original's layout: the transpose of a C-contiguous (n, B) array.
    """
    if not (Swap.products and len(X) >= 2 and W_T.dtype == X.dtype == np.float32
            and W_T.flags.c_contiguous):
        return _few_rows_product(W_T, X)
    out_T = np.empty((len(W_T), len(X)), np.float32)  # (n, B)
    nk.rows_product(W_T, np.ascontiguousarray(X), out_T.T)
    return out_T.T  # (B, n)


def install_swaps() -> None:
    KVCache._attend_rows = swapped_attend_rows
    mha_lit.fast.few_rows_product = swapped_few_rows_product  # projections, W_O
    mha_lit.decoder.few_rows_product = swapped_few_rows_product  # FFN, output layer


def remove_swaps() -> None:
    KVCache._attend_rows = _attend_rows
    mha_lit.fast.few_rows_product = _few_rows_product
    mha_lit.decoder.few_rows_product = _few_rows_product


UNCHANGED = "unchanged (NumPy + OpenBLAS)"


def step_variants(B, threads: int, only_two: bool = False) -> dict:
    """name -> (attention swapped, products swapped, Numba threads)."""
    v = {UNCHANGED: (False, False, None), "Numba attention": (True, False, None)}
    if only_two:
        return v
    if threads > 1:
        v["Numba attention, 1 Numba thread"] = (True, False, 1)
    if B is not None:  # with one row the products stay matrix-vector products
        v["Numba products (rows >= 2)"] = (False, True, None)
        v["Numba attention + products"] = (True, True, None)
    return v


def bench_step(G, B, context: int, runs: int, threads: int, only_two: bool = False) -> dict:
    """Each variant its own Decoder, prefilled alike; their steps alternate."""
    variants = step_variants(B, threads, only_two)
    decoders = {}
    for name in variants:
        progress(f"  prefill {context} tokens, B = {B}: {name}")
        decoders[name] = prefilled(G, B, context, seed=7)

    def step(name):
        attn, prods, nthreads = variants[name]
        dec = decoders[name]

        def run():
            Swap.attention, Swap.products = attn, prods
            before = numba.get_num_threads()
            if nthreads is not None:
                numba.set_num_threads(nthreads)
            try:
                return dec.decode_step()
            finally:
                Swap.attention = Swap.products = False
                numba.set_num_threads(before)
        return run

    functions = {name: step(name) for name in variants}
    first = {name: f() for name, f in functions.items()}  # compiles; then compare
    base = next(iter(variants))
    for name in variants:
        assert np.array_equal(first[name], first[base]), f"{name}: other tokens"
        agree(decoders[name].logits, decoders[base].logits, f"step logits, {name}",
              rtol=STEP_TOL, atol=STEP_TOL)
    held = int(decoders[base].lengths[0])  # before alternate's untimed step
    t = medians(alternate(functions, runs, f"step B={B}", pause=PAUSE))
    # the timed steps attend to held + 2 .. held + runs + 1 keys (their own included)
    return {"seconds": t, "variants": variants, "keys": (held + 2, held + runs + 1)}


def expected_step(step: dict, name: str, prods: dict | None, attn: dict) -> float | None:
    """The unchanged step, less the replaced operations' times (parts 1 and 2), plus their
    replacements'."""
    a, p, nthreads = step["variants"][name]
    t = step["seconds"][UNCHANGED]
    if a:
        key = "Numba attend_one" + (", 1 thread" if nthreads == 1 else "")
        if key not in attn["seconds"]:
            return None
        t += attn["seconds"][key] - attn["seconds"]["mha_lit attention"]
    if p:
        if prods is None:
            return None
        t += prods["Numba rows_product"] - prods["few_rows_product"]
    return t


# --- 4. how the thread pools wait: fresh processes ------------------------------------------

# Each setting changes how long an idle thread keeps the processor before it sleeps; all are
# read when a library starts its threads, so each runs in a fresh process.
WAIT_SETTINGS = (
    ("none (as in part 3)", {}),
    ("NUMBA_THREADING_LAYER=workqueue", {"NUMBA_THREADING_LAYER": "workqueue"}),
    ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("OPENBLAS_THREAD_TIMEOUT=4", {"OPENBLAS_THREAD_TIMEOUT": "4"}),
)


def step_child(threads: int, runs: int) -> None:
    """In a fresh process: part 2's first case, then part 3's first case, unchanged against
    Numba attention; the medians as JSON on stdout."""
    alone = bench_attention(1, 1024, runs)["seconds"]
    G = init_gpt_weights(GPT2, LAYERS, VOCAB, 2048, D_FF, seed=0, dtype=np.float32)
    install_swaps()
    r = bench_step(G, None, 1024, runs, threads, only_two=True)
    print(json.dumps({"seconds": r["seconds"], "alone": alone, "keys": r["keys"],
                      "layer": numba.threading_layer()}))


def bench_wait_settings(threads: int, runs: int) -> list[dict]:
    rows = []
    for label, env in WAIT_SETTINGS:
        progress(f"fresh process, {label}")
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--step-child", "--threads",
             str(threads), "--step-runs", str(runs)],
            env=dict(os.environ, **env), capture_output=True, text=True)
        if out.returncode != 0:
            rows.append({"label": label, "error": out.stderr.strip().splitlines()[-1]})
            continue
        rows.append({"label": label, **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows


# --- report -------------------------------------------------------------------------------

def print_products(res: dict) -> None:
    gb = res["bytes"] / 1e9
    print(f"\n## 1. Few-rows weight products, all {LAYERS} layers' matrices and E "
          f"({res['bytes'] / 1e6:.0f} MB, float32, from main memory)")
    if res["notes"]:
        print("\n" + "\n".join(f"- {note}" for note in res["notes"]))
    print("\n| B | candidate | ms | GB/s of weights | GFLOP/s | / few_rows_product |\n"
          "|---|---|---|---|---|---|")
    for B, r in res["B"].items():
        base = r["seconds"]["few_rows_product"]
        for name, s in r["seconds"].items():
            print(f"| {B} | {name} | {1e3 * s:.1f} | {gb / s:.1f} | {r['flops'] / s / 1e9:.1f} "
                  f"| {s / base:.2f} |")


def print_panel(res: dict, B: int) -> None:
    print(f"\n### Cache-resident: one {PANEL} x 768 panel ({res['bytes'] / 2**10:.0f} KiB), "
          f"B = {B}, {res['calls']} products per run\n\n"
          "| candidate | us per product | GFLOP/s |\n|---|---|---|")
    for name, s in res["seconds"].items():
        print(f"| {name} | {1e6 * s / res['calls']:.1f} | {res['flops'] / s / 1e9:.1f} |")


def print_attention(results: dict) -> None:
    print(f"\n## 2. Decode attention, one query per sequence and head, {LAYERS} layers, "
          "12 heads of 64, float32\n\n| B | context | candidate | ms | GB/s of cache "
          "| / mha_lit |\n|---|---|---|---|---|---|")
    for (B, n), r in results.items():
        base = r["seconds"]["mha_lit attention"]
        for name, s in r["seconds"].items():
            print(f"| {B} | {n} | {name} | {1e3 * s:.2f} | {r['bytes'] / s / 1e9:.1f} "
                  f"| {s / base:.2f} |")


def print_step(results: dict, prods: dict, attn: dict, weight_bytes: int) -> None:
    print(f"\n## 3. The package's decoding step ({LAYERS} layers, "
          f"{weight_bytes / 1e6:.0f} MB of weights), Numba kernels swapped in\n\n"
          "Expected: the unchanged step less the replaced operations' median times of parts "
          "1 and 2, plus their replacements'.\n\n"
          "| B | keys attended | variant | ms | / unchanged | expected ms | measured / "
          "expected |\n|---|---|---|---|---|---|---|")
    findings = []
    for (B, context), r in results.items():
        base = r["seconds"][UNCHANGED]
        Bn = 1 if B is None else B
        p = prods["B"].get(Bn, {}).get("seconds")
        a = attn.get((Bn, context))
        lo, hi = r["keys"]
        for name, s in r["seconds"].items():
            e = expected_step(r, name, p, a) if a is not None else None
            cells = (f"{1e3 * e:.1f} | {s / e:.2f}" if e is not None and e > 0
                     else "- | -")
            print(f"| {'None' if B is None else B} | {lo} to {hi} | {name} | {1e3 * s:.1f} | "
                  f"{s / base:.2f} | {cells} |")
            if e is not None and e > 0 and name != UNCHANGED:
                findings.append((s / e, B, context, name))
    if findings:
        worst = max(findings)
        best = min(findings)
        print(f"\nMeasured / expected ranges from {best[0]:.2f} ({best[3]}, B = {best[1]}, "
              f"context {best[2]}) to {worst[0]:.2f} ({worst[3]}, B = {worst[1]}, context "
              f"{worst[2]}). Near 1: the kernels keep in the step the speed they have alone; "
              "well above 1: running Numba's and OpenBLAS's thread pools in turn costs the "
              "difference.")


def print_wait_settings(rows: list[dict]) -> None:
    print("\n## 4. Batch 1, context 1024, in fresh processes, the thread pools told to wait "
          "differently\n\nAttention alone: part 2's 12 layers; step: part 3's.\n\n"
          "| setting | Numba threading layer | attention alone, mha_lit / Numba ms | step "
          "unchanged ms | step with Numba attention ms | step Numba / unchanged |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['label']} | failed: {r['error']} | - | - | - | - |")
            continue
        a, b = r["seconds"][UNCHANGED], r["seconds"]["Numba attention"]
        ours, fused = r["alone"]["mha_lit attention"], r["alone"]["Numba attend_one"]
        print(f"| {r['label']} | {r['layer']} | {1e3 * ours:.2f} / {1e3 * fused:.2f} | "
              f"{1e3 * a:.1f} | {1e3 * b:.1f} | {b / a:.2f} |")
    ok = [r["label"] for r in rows if "error" not in r
          and r["seconds"]["Numba attention"] <= 1.1 * r["seconds"][UNCHANGED]]
    print("\nSettings under which the step with Numba attention takes at most 1.1x the "
          "unchanged step: " + (", ".join(ok) if ok else "none") + ".")


def load() -> str:
    return "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg()) + \
        " (1 / 5 / 15 minutes)"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="threads for NumPy's BLAS, PyTorch and Numba (default: all cores)")
    parser.add_argument("--step-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--step-runs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    runs, step_runs, repeats = (5, 6, 200) if args.quick else (15, 20, 1000)
    step_runs = args.step_runs or step_runs
    if args.step_child:
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        return step_child(args.threads, step_runs)
    if nk is not None:
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        progress("compiling and checking the Numba kernels")
        nk.check()  # ragged shapes against NumPy; compiles (or loads the cached code)

    print(f"# Alternatives benchmark: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    for line in thread_report():
        print("-", line)
    print(f"- {load()} at the start")
    print(f"- numpy {np.__version__}; torch {version('torch')}; blis {version('blis')}"
          + ("" if blis_py is None else " (one thread)")
          + f"; numba {version('numba')}" + ("" if numba is None else
                                             f" ({plural(numba.get_num_threads(), 'thread')}, "
                                             f"threading layer {numba.threading_layer()})"))

    progress("building the 12-layer stack")
    G = init_gpt_weights(GPT2, LAYERS, VOCAB, 2048, D_FF, seed=0, dtype=np.float32)
    mats = stack_matrices(G)
    prods = bench_products(mats, (1, 4, 16), runs)
    print_products(prods)
    progress("cache-resident panel")
    print_panel(bench_panel(mats, 16, runs, repeats), 16)

    attn = {}
    for B, context in ((1, 1024), (16, 128)):
        progress(f"attention, B = {B}, context {context}")
        attn[(B, context)] = bench_attention(B, context, runs)
    print_attention(attn)

    if nk is None:
        print("\n## 3. The package's decoding step\n\nnumba not installed: nothing to swap in.")
        return
    steps = {}
    install_swaps()
    try:
        for B, context in ((None, 1024), (16, 128)):
            progress(f"decoding step, B = {B}, context {context}")
            steps[(B, context)] = bench_step(G, B, context, step_runs, args.threads)
    finally:
        remove_swaps()
    print_step(steps, prods, attn, stack_bytes(G))
    del G, mats, steps
    print_wait_settings(bench_wait_settings(args.threads, step_runs))
    print(f"\n{load()} at the end.")


if __name__ == "__main__":
    main()
