"""Benchmark mha_lit's multi-head attention against PyTorch's CPU scaled_dot_product_attention.

    python benchmarks/attention.py            # full run (a few minutes on 2 cores)
    python benchmarks/attention.py --quick    # short run
    python benchmarks/attention.py --plot attention.png

Three measurements, each printed as a table (progress goes to stderr):

1. Forward pass at GPT-2 small's attention shape (1024 tokens, d_model 768, 12 heads of 64,
   float32, causal): mha_lit's reference, mha_lit's fast path and PyTorch (fused projection,
   causal SDPA, output projection), run in turn (alternating), medians and ratios to PyTorch.
2. A long sequence (8192 tokens) through the fast path in a fresh subprocess: time, peak of the
   NumPy allocations seen by tracemalloc and growth of the RSS high-water mark, against the
   size of the inputs and outputs and against the h x n x n score tensor it never builds.
3. KV-cache decoding of 256 tokens against recomputing the whole prefix at every step, next to
   the ratio of their multiply-add counts.

Threads: NumPy's BLAS and PyTorch are set to the same count (``--threads``, default: the
machine's cores) with threadpoolctl when it is installed, else NumPy keeps what its BLAS was
started with (OPENBLAS_NUM_THREADS) and the table says so. PyTorch is optional (the ``bench``
extra); without it the PyTorch rows are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

import numpy as np

from mha_lit import (
    Dims,
    KVCache,
    init_weights,
    multi_head_attention,
    multi_head_attention_reference,
)
from mha_lit.fast import fused_weights

try:
    import torch
except ImportError:  # PyTorch is an optional extra
    torch = None
try:
    import threadpoolctl
except ImportError:
    threadpoolctl = None

GPT2 = Dims(tokens=1024, d_model=768, d_k=64, d_v=64, heads=12)
PAUSE = 0.1  # seconds between timed runs: lets the idle thread pool of the other library sleep


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- threads ------------------------------------------------------------------------------

def set_threads(n: int) -> None:
    """Give NumPy's BLAS and PyTorch the same number of threads."""
    if threadpoolctl is not None:
        threadpoolctl.threadpool_limits(n, user_api="blas")
    if torch is not None:
        torch.set_num_threads(n)


def thread_report() -> list[str]:
    lines = [f"cores: {os.cpu_count()}"]
    if threadpoolctl is not None:
        for lib in threadpoolctl.threadpool_info():
            if lib["user_api"] == "blas":
                lines.append(f"NumPy BLAS: {lib['internal_api']} {lib.get('version')}, kernel "
                             f"{lib.get('architecture')}, {lib['num_threads']} threads "
                             "(set with threadpoolctl)")
    else:
        lines.append("NumPy BLAS: threadpoolctl not installed; threads as started "
                     f"(OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    if torch is not None:
        lines.append(f"PyTorch {torch.__version__}: {torch.get_num_threads()} threads")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        lines.append(f"{var}={os.environ.get(var, 'unset')}")
    return lines


# --- timing -------------------------------------------------------------------------------

def alternate(functions: dict, runs: int, label: str,
              pause: float = PAUSE) -> dict[str, list[float]]:
    """Time each function ``runs`` times, taking them in turn; returns seconds per run.

    One untimed call of each first; a pause of ``pause`` seconds before every timed call."""
    times = {name: [] for name in functions}
    for f in functions.values():
        f()  # warm up: first-call allocations, weight fusion, thread start
    start = time.perf_counter()
    for r in range(runs):
        for name, f in functions.items():
            time.sleep(pause)
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
        if time.perf_counter() - start > 3:
            progress(f"  {label}: run {r + 1}/{runs}")
    return times


def torch_forward(X: np.ndarray, W) -> callable:
    """PyTorch: one fused projection GEMM, causal SDPA, output projection."""
    n, h, d_k, d_v = X.shape[0], W.heads, W.d_k, W.d_v
    W_QKV = np.concatenate([w.transpose(1, 0, 2).reshape(W.d_model, -1)
                            for w in (W.W_Q, W.W_K, W.W_V)], axis=1)  # (d_model, h(2d_k+d_v))
    tX, tW, tO = (torch.from_numpy(np.array(a)) for a in (X, W_QKV, W.W_O))  # writable copies

    def run():
        with torch.inference_mode():
            QKV = tX @ tW  # (n, h(2 d_k + d_v))
            Q = QKV[:, : h * d_k].view(n, h, d_k).transpose(0, 1)  # (h, n, d_k)
            K = QKV[:, h * d_k: 2 * h * d_k].view(n, h, d_k).transpose(0, 1)  # (h, n, d_k)
            V = QKV[:, 2 * h * d_k:].view(n, h, d_v).transpose(0, 1)  # (h, n, d_v)
            H = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True)
            return (H.transpose(0, 1).reshape(n, h * d_v) @ tO).numpy()  # (n, d_model)
    return run


def bench_forward(dims: Dims, runs: int) -> dict:
    W = init_weights(dims, seed=0, dtype=np.float32)
    X = np.random.default_rng(1).standard_normal((dims.tokens, dims.d_model)).astype(np.float32)
    functions = {"mha_lit reference": lambda: multi_head_attention_reference(X, W),
                 "mha_lit fast": lambda: multi_head_attention(X, W)}
    if torch is not None:
        functions["PyTorch SDPA"] = torch_forward(X, W)
    Y = {name: f() for name, f in functions.items()}
    for name, y in Y.items():  # every contender computes the same Y
        assert np.allclose(y, Y["mha_lit reference"], atol=1e-4), name
    times = alternate(functions, runs, "forward")
    return {name: statistics.median(t) for name, t in times.items()} | {"runs": runs,
                                                                        "all": times}


# --- long sequences: memory ---------------------------------------------------------------

LONG_CHILD = """
import json, sys, time, tracemalloc
import numpy as np
from mha_lit import Dims, init_weights, multi_head_attention
n, d, h, dk = (int(a) for a in sys.argv[1:5])
W = init_weights(Dims(n, d, dk, dk, h), seed=0, dtype=np.float32)
X = np.random.default_rng(1).standard_normal((n, d)).astype(np.float32)
def status(key):  # kB from /proc/self/status (Linux)
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))
multi_head_attention(X[:256], W)  # warm up (fuses the weights once)
open("/proc/self/clear_refs", "w").write("5")  # reset the RSS high-water mark to the current RSS
rss0 = status("VmRSS:")
t0 = time.perf_counter(); Y = multi_head_attention(X, W); seconds = time.perf_counter() - t0
rss1 = status("VmHWM:")
del Y
tracemalloc.start(); Y = multi_head_attention(X, W); peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"seconds": seconds, "traced_peak": peak, "rss_growth": (rss1 - rss0) * 1024,
                  "io_bytes": X.nbytes + Y.nbytes, "scores_bytes": h * n * n * 4}))
"""


def bench_long(n: int, dims: Dims, threads: int) -> dict:
    """Run the fast path on n tokens in a fresh process; time and memory."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
    args = [str(a) for a in (n, dims.d_model, dims.heads, dims.d_k)]
    out = subprocess.run([sys.executable, "-c", LONG_CHILD, *args], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


# --- KV cache -----------------------------------------------------------------------------

def multiply_adds(dims: Dims, tokens: int) -> tuple[int, int]:
    """Multiply-adds of decoding ``tokens`` tokens with a cache and by recomputing every prefix.

    Row p (p keys) with the cache: projections d(2 h d_k + h d_v) + scores and weighted sum
    h p (d_k + d_v) + output h d_v d. Recomputing the prefix of p rows: p times the projections
    and output, plus the dense p x p scores and S V, h p^2 (d_k + d_v).
    """
    d, h, dk, dv = dims.d_model, dims.heads, dims.d_k, dims.d_v
    per_row = d * h * (2 * dk + dv) + h * dv * d
    cache = sum(per_row + h * p * (dk + dv) for p in range(1, tokens + 1))
    recompute = sum(p * per_row + h * p * p * (dk + dv) for p in range(1, tokens + 1))
    return cache, recompute


def bench_kv(dims: Dims, tokens: int, runs: int) -> dict:
    W = init_weights(dims, seed=0, dtype=np.float32)
    X = np.random.default_rng(2).standard_normal((tokens, dims.d_model)).astype(np.float32)

    def cached():
        cache = KVCache(W, capacity=tokens)
        return np.stack([cache.step(x) for x in X])  # (tokens, d_model)

    def recompute():
        return np.stack([multi_head_attention(X[: p + 1], W)[-1] for p in range(tokens)])

    assert np.allclose(cached(), recompute(), atol=1e-4)
    times = alternate({"KV cache": cached, "recompute prefix": recompute}, runs, "KV cache")
    t_cache, t_full = (statistics.median(times[k]) for k in ("KV cache", "recompute prefix"))
    macs_cache, macs_full = multiply_adds(dims, tokens)
    W_QKV_T, W_O = fused_weights(W)
    cache_bytes = sum(dims.heads * p * (dims.d_k + dims.d_v) * X.itemsize
                      for p in range(1, tokens + 1))  # keys and values read at step p
    step_bytes = (W_QKV_T.nbytes + W_O.nbytes) * tokens + cache_bytes  # read per decode
    return {"t_cache": t_cache, "t_full": t_full, "speedup": t_full / t_cache,
            "macs_cache": macs_cache, "macs_full": macs_full,
            "macs_ratio": macs_full / macs_cache, "runs": runs,
            "cache_GBps": step_bytes / t_cache / 1e9, "cache_GMACps": macs_cache / t_cache / 1e9,
            "full_GMACps": macs_full / t_full / 1e9,
            "bytes_per_mac": step_bytes / macs_cache}


# --- report -------------------------------------------------------------------------------

def report(fwd: dict, long: dict, long_n: int, kv: dict, dims: Dims, tokens: int) -> None:
    print(f"\n## Forward, n={dims.tokens}, d_model={dims.d_model}, {dims.heads} heads of "
          f"{dims.d_k}, float32, causal ({fwd['runs']} alternating runs, medians)")
    base = fwd.get("PyTorch SDPA")
    print(f"{'':22}{'median ms':>10}{'min ms':>9}{'/ PyTorch':>11}")
    for name in fwd["all"]:
        ratio = f"{fwd[name] / base:11.2f}" if base else f"{'-':>11}"
        print(f"{name:22}{fwd[name] * 1e3:10.1f}{min(fwd['all'][name]) * 1e3:9.1f}{ratio}")
    print(f"\n## Long sequence, n={long_n}, fast path, fresh process")
    print(f"time                          {long['seconds']:8.2f} s")
    io = long["io_bytes"]
    for label, key in (("peak NumPy memory (tracemalloc)", "traced_peak"),
                       ("RSS high-water growth", "rss_growth")):
        print(f"{label:30}{long[key] / 2**20:8.1f} MiB = {long[key] / io:5.2f} x inputs+outputs")
    print(f"inputs + outputs (X, Y)       {io / 2**20:8.1f} MiB")
    print(f"h x n x n scores (not built)  {long['scores_bytes'] / 2**20:8.1f} MiB")
    print(f"\n## KV-cache decoding of {tokens} tokens ({kv['runs']} alternating runs, medians)")
    print(f"KV cache                      {kv['t_cache']:8.3f} s  {kv['cache_GMACps']:6.1f} G "
          f"multiply-adds/s, {kv['cache_GBps']:5.1f} GB/s of weights+cache read")
    print(f"recompute prefix every step   {kv['t_full']:8.3f} s  {kv['full_GMACps']:6.1f} G "
          "multiply-adds/s")
    print(f"speedup {kv['speedup']:.1f}x; multiply-add ratio {kv['macs_ratio']:.1f}x; "
          f"speedup / ratio = {kv['speedup'] / kv['macs_ratio']:.2f}")
    print(f"a cached step reads {kv['bytes_per_mac']:.1f} bytes per multiply-add "
          "(matrix-vector products: memory-bound)")


def plot(fwd: dict, kv: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    names = list(fwd["all"])
    a.boxplot([np.array(fwd["all"][k]) * 1e3 for k in names], tick_labels=names)
    a.set_ylabel("ms per forward pass")
    a.set_title("Forward, GPT-2 small attention (1024 tokens)")
    b.bar(["KV cache", "recompute prefix"], [kv["t_cache"], kv["t_full"]], color=["C2", "C3"])
    b.set_yscale("log")
    b.set_ylabel("seconds for the whole decode")
    b.set_title(f"Decoding: speedup {kv['speedup']:.0f}x, multiply-adds {kv['macs_ratio']:.0f}x")
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, shorter sequences")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="threads for NumPy's BLAS and PyTorch (default: all cores)")
    parser.add_argument("--runs", type=int, help="alternating runs of the forward pass")
    parser.add_argument("--plot", metavar="FILE", help="save a plot of the results")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    runs = args.runs or (5 if args.quick else 21)
    long_n, tokens, kv_runs = (4096, 64, 2) if args.quick else (8192, 256, 3)

    print(f"# mha_lit attention benchmark, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print("\n".join(thread_report()))
    progress("forward pass ...")
    fwd = bench_forward(GPT2, runs)
    progress(f"long sequence n={long_n} ...")
    long = bench_long(long_n, GPT2, args.threads)
    progress(f"KV-cache decoding of {tokens} tokens ...")
    kv = bench_kv(GPT2, tokens, kv_runs)
    report(fwd, long, long_n, kv, GPT2, tokens)
    if args.plot:
        plot(fwd, kv, args.plot)
        print(f"\nplot saved to {args.plot}")


if __name__ == "__main__":
    main()
