"""Benchmark prefill and cached decoding of a 12-layer GPT-2-sized stack against the roofline.

    python benchmarks/serving.py                 # full run (a few minutes on 2 cores)
    python benchmarks/serving.py --quick         # fewer runs and batches
    python benchmarks/serving.py --plot serving.png

GPT-2 small's sizes (12 layers, d_model 768, 12 heads of 64, d_ff 3072, vocabulary 50,257,
tied output layer), random weights, float32; 495 MB of weights, more than the caches of the
machine benchmarks/README.md records, so there a decoding step streams them from main memory
as a real model's does. Measured in one run:

0. The machine's limits: a large float32 matrix product (FLOP/s) and the read bandwidth of
   main memory (a matrix-vector product over 256 MiB, and a copy on one core).
1. Prefill: ``KVCache.extend`` of 1,024 tokens against ``multi_head_attention`` on the same
   rows (one layer), alternating runs. Target: at most 1.1x.
2. One decoding step of the whole stack at cache length 1,024, batch 1, against its memory
   floor (every weight once and every layer's cache once, divided by the bandwidth) and
   against PyTorch doing the same cached step. Targets: at most 1.3x the floor; faster than
   PyTorch.
3. Batched decoding: tokens per second for batches of 1 .. 64 sequences, at a short context
   (128 tokens, where the weights are most of the traffic) and at 1,024 (where the caches
   are), next to the roofline's prediction from the rates of step 0. Target: batch 16 at least
   8x the tokens per second of batch 1. Prints where the measured curve bends.
4. The forward pass at GPT-2 small's attention shape: the fast path's multiply-adds per second
   against the matrix product's. Target: at least 0.7.

Speed targets live here and in benchmarks/README.md, never in the tests. Progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from attention import alternate, progress, set_threads, thread_report, torch

from mha_lit import Dims, KVCache, init_weights, multi_head_attention, roofline
from mha_lit.decoder import Decoder, init_gpt_weights
from mha_lit.fast import BLOCK_ROWS

GPT2 = Dims(d_model=768, d_k=64, d_v=64, heads=12)
LAYERS, D_FF, VOCAB = 12, 3072, 50257


def stack_bytes(G) -> int:
    """Bytes of every array a decoding step reads once: all weights (E once, tied)."""
    total = G.E.nbytes + G.P.itemsize * G.d_model + G.gamma_f.nbytes + G.beta_f.nbytes
    for b in G.blocks:
        total += sum(a.nbytes for a in b.arrays().values())
    return total


def cache_bytes(G, tokens: int) -> int:
    """Bytes of one sequence's keys and values in every layer (h d_k + h d_v per token)."""
    a = G.blocks[0].attn
    return G.layers * tokens * a.heads * (a.d_k + a.d_v) * G.E.itemsize


def step_flops(G, tokens: int) -> int:
    """FLOPs of one decoding step of one sequence against ``tokens`` cached rows."""
    a = G.blocks[0].attn
    d, f = G.d_model, G.blocks[0].d_ff
    per_layer = d * a.heads * (2 * a.d_k + a.d_v) + a.heads * a.d_v * d + 2 * d * f \
        + a.heads * tokens * (a.d_k + a.d_v)
    return 2 * (G.layers * per_layer + d * G.vocab_size)


def median_step_seconds(step, count: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def prefilled(G, batch: int | None, tokens: int, seed: int = 0) -> Decoder:
    rng = np.random.default_rng(seed)
    shape = (tokens,) if batch is None else (batch, tokens)
    dec = Decoder(G, batch=batch, capacity=tokens + 64)
    dec.prefill(rng.integers(0, G.vocab_size, shape))
    return dec


# --- 1. prefill ----------------------------------------------------------------------------

def bench_prefill(runs: int) -> dict:
    W = init_weights(GPT2, seed=0, dtype=np.float32, biases=True)
    X = np.random.default_rng(1).standard_normal((1024, 768)).astype(np.float32)
    Y = multi_head_attention(X, W)
    assert np.allclose(KVCache(W).extend(X), Y, rtol=0, atol=1e-4)
    times = alternate({"extend": lambda: KVCache(W, capacity=1024).extend(X),
                       "forward": lambda: multi_head_attention(X, W)}, runs, "prefill")
    t_ext, t_fwd = statistics.median(times["extend"]), statistics.median(times["forward"])
    return {"extend_ms": 1e3 * t_ext, "forward_ms": 1e3 * t_fwd, "ratio": t_ext / t_fwd}


# --- 2. one decoding step, against the memory floor and PyTorch -------------------------------

def torch_step(G, dec: Decoder):
    """PyTorch doing the same cached step of the same stack, from a copy of dec's caches."""
    F = torch.nn.functional
    t = lambda a: torch.from_numpy(np.array(a))  # noqa: E731 (a writable copy)
    n = int(dec.lengths[0])
    layers = []
    for block, cache in zip(G.blocks, dec.caches, strict=True):
        a = block.attn
        W_QKV = np.concatenate([w.transpose(1, 0, 2).reshape(G.d_model, -1)
                                for w in (a.W_Q, a.W_K, a.W_V)], axis=1)  # (d, 3 h d_k)
        b_QKV = np.concatenate([b.reshape(-1) for b in (a.b_Q, a.b_K, a.b_V)])
        K = torch.zeros(1, a.heads, n + 64, a.d_k)
        V = torch.zeros(1, a.heads, n + 64, a.d_v)
        K[0, :, :n], V[0, :, :n] = t(cache.keys), t(cache.values)
        layers.append([t(W_QKV), t(b_QKV), t(a.W_O), t(a.b_O), t(block.gamma_1),
                       t(block.beta_1), t(block.gamma_2), t(block.beta_2), t(block.W_1),
                       t(block.b_1), t(block.W_2), t(block.b_2), K, V])
    E, P, gf, bf = t(G.E), t(G.P), t(G.gamma_f), t(G.beta_f)
    h, dk = G.blocks[0].attn.heads, G.blocks[0].attn.d_k
    d = G.d_model
    state = {"pos": n}

    def step(token: int):
        p = state["pos"]
        with torch.inference_mode():
            x = (E[token] + P[p])[None]  # (1, d)
            for (W_QKV, b_QKV, W_O, b_O, g1, be1, g2, be2, W1, b1, W2, b2, K, V) in layers:
                qkv = F.layer_norm(x, (d,), g1, be1, 1e-5) @ W_QKV + b_QKV  # (1, 3d)
                q = qkv[:, :d].view(1, h, 1, dk)
                K[0, :, p] = qkv[0, d:2 * d].view(h, dk)
                V[0, :, p] = qkv[0, 2 * d:].view(h, dk)
                att = F.scaled_dot_product_attention(q, K[:, :, :p + 1], V[:, :, :p + 1])
                x = x + att.reshape(1, d) @ W_O + b_O
                f = F.layer_norm(x, (d,), g2, be2, 1e-5)
                x = x + F.gelu(f @ W1 + b1, approximate="tanh") @ W2 + b2
            logits = F.layer_norm(x, (d,), gf, bf, 1e-5) @ E.T  # (1, V)
        state["pos"] = p + 1
        return logits[0].numpy()
    return step


def bench_decode(G, bandwidth: float, steps: int) -> dict:
    """Steps at cache lengths 1,024 .. 1,024 + steps, mha_lit and PyTorch alternating."""
    dec = prefilled(G, None, 1024)
    functions = {"mha_lit": dec.decode_step}
    if torch is not None:
        tstep = torch_step(G, dec)  # the same caches, copied
        token = int(dec.logits.argmax())
        assert dec.decode_step() == token  # both now hold 1,025 tokens
        assert np.allclose(tstep(token), dec.logits, rtol=0, atol=2e-3)
        functions["PyTorch"] = lambda: tstep(token)
    times = alternate(functions, steps, "decoding step")
    n_first, n_last = 1024, int(dec.lengths[0])
    n_mean = (n_first + n_last) // 2
    read = stack_bytes(G) + cache_bytes(G, n_mean)
    result = {"ours_ms": 1e3 * statistics.median(times["mha_lit"]), "bytes": read,
              "floor_ms": 1e3 * read / bandwidth, "cache_lens": (n_first, n_last)}
    if "PyTorch" in times:
        result["torch_ms"] = 1e3 * statistics.median(times["PyTorch"])
    result["floor_ratio"] = result["ours_ms"] / result["floor_ms"]
    return result


# --- 3. batches --------------------------------------------------------------------------------

def bench_batches(G, batches, context: int, peak: float, bandwidth: float, steps: int) -> list:
    rows = []
    for B in batches:
        progress(f"  batch {B}, context {context}")
        dec = prefilled(G, B, context, seed=B)
        t = median_step_seconds(dec.decode_step, steps)
        flops = B * step_flops(G, context)
        read = stack_bytes(G) + B * cache_bytes(G, context)
        predicted = roofline.roofline_seconds(flops, read, peak, bandwidth)
        rows.append({"B": B, "ms": 1e3 * t, "tokens_per_s": B / t,
                     "predicted_tokens_per_s": B / predicted,
                     "intensity": flops / read, "gflops": flops / t / 1e9})
        del dec
    return rows


def bend(rows, G, context: int, peak: float, bandwidth: float) -> tuple[float, float]:
    """Where the batch curve bends: measured and predicted, in sequences.

    Measured: the effective bandwidth of batch 1 (bytes / time) and the effective rate of the
    largest batch (FLOPs / time) give two lines; the bend is where they cross. That is only a
    bend if the largest batch lies right of the ridge (else it is still bound by memory, and
    the measured value is None). Predicted: the same with the machine's own matrix-product
    rate and bandwidth (inf: the caches grow with the batch as fast as the arithmetic)."""
    flops1, w, c = step_flops(G, context), stack_bytes(G), cache_bytes(G, context)
    bw_eff = w + c
    bw_eff /= rows[0]["ms"] / 1e3
    peak_eff = rows[-1]["gflops"] * 1e9
    if rows[-1]["intensity"] < peak / bandwidth:
        return None, crossing_of(flops1, w, c, peak, bandwidth)
    return crossing_of(flops1, w, c, peak_eff, bw_eff), crossing_of(flops1, w, c, peak,
                                                                   bandwidth)


def crossing_of(flops1: float, w: float, c: float, p: float, b: float) -> float:
    """The batch B at which B flops1 / p = (w + B c) / b (inf if never)."""
    denom = flops1 / p - c / b
    return w / b / denom if denom > 0 else float("inf")


# --- 4. the forward pass against the matrix-product rate ---------------------------------------

def forward_macs(dims: Dims, n: int) -> int:
    """Multiply-adds the fast path does at n tokens: projections, the causal blocks it computes
    (equation eq-causal-blocks), W_O."""
    d, h, dk, dv = dims.d_model, dims.heads, dims.d_k, dims.d_v
    keys = sum(min(r0 + BLOCK_ROWS, n) * (min(r0 + BLOCK_ROWS, n) - r0)
               for r0 in range(0, n, BLOCK_ROWS))  # score entries computed
    return n * d * h * (2 * dk + dv) + h * keys * (dk + dv) + n * h * dv * d


def bench_forward_rate(runs: int, peak: float) -> dict:
    """The forward pass, and its three parts timed alone: projections, attention loop
    (score products, softmax passes, S V), output product."""
    from mha_lit import fast, masks

    W = init_weights(GPT2, seed=0, dtype=np.float32)
    X = np.random.default_rng(3).standard_normal((1024, 768)).astype(np.float32)
    Q_T, K_T, V_T = fast.project_heads(X, W)
    Q, K, V = (A.transpose(0, 2, 1) for A in (Q_T, K_T, V_T))  # (h, n, d)
    p = np.arange(1024)  # the positions of queries and keys
    concat = np.empty((1024, GPT2.heads, GPT2.d_v), np.float32)
    _, W_O = fast.fused_weights(W)
    parts = {"forward": lambda: multi_head_attention(X, W),
             "projections": lambda: fast.project_heads(X, W),
             "attention loop": lambda: fast.attend(Q, K, V, p, p, masks.visible,
                                                   out=concat.transpose(1, 0, 2)),
             "output product": lambda: concat.reshape(1024, -1) @ W_O}
    times = {k: statistics.median(v) for k, v in alternate(parts, runs, "forward").items()}
    rate = 2 * forward_macs(GPT2, 1024) / times["forward"]
    return {"ms": 1e3 * times["forward"], "gflops": rate / 1e9, "share": rate / peak,
            "parts_ms": {k: 1e3 * v for k, v in times.items() if k != "forward"}}


# --- report --------------------------------------------------------------------------------------

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and batches")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--plot", metavar="FILE", help="save a roofline-style figure")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    runs, steps = (5, 8) if args.quick else (15, 20)
    batches = (1, 4, 16) if args.quick else (1, 2, 4, 8, 16, 32, 64)

    print("# Serving benchmark:", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    for line in thread_report():
        print("-", line)
    progress("machine limits")
    rates = roofline.measure_rates(np.float32, size=2048)
    # the floor takes the faster of the two ways of reading memory: the strictest target
    peak, bandwidth = rates["matmul"], max(rates["bandwidth"], rates["copy"])
    print(f"\n## Machine (float32, this run)\n\n| matrix product | matrix-vector read | copy, one core "
          f"| ridge |\n|---|---|---|---|\n| {peak / 1e9:.1f} GFLOP/s | "
          f"{rates['bandwidth'] / 1e9:.1f} GB/s | {rates['copy'] / 1e9:.1f} GB/s | "
          f"{peak / bandwidth:.1f} FLOPs/byte |")

    progress("prefill")
    pre = bench_prefill(runs)
    print(f"\n## 1. Prefill, 1,024 tokens, one layer\n\n| extend | multi_head_attention | "
          f"ratio (target <= 1.1) |\n|---|---|---|\n| {pre['extend_ms']:.1f} ms | "
          f"{pre['forward_ms']:.1f} ms | **{pre['ratio']:.2f}** |")

    progress("building the 12-layer stack")
    G = init_gpt_weights(GPT2, LAYERS, VOCAB, 2048, D_FF, seed=0, dtype=np.float32)
    print(f"\nStack: {LAYERS} layers, {stack_bytes(G) / 1e6:.0f} MB of weights (float32)")

    progress("one decoding step")
    dec = bench_decode(G, bandwidth, steps)
    torch_cell = (f"{dec['torch_ms']:.1f} ms ({dec['ours_ms'] / dec['torch_ms']:.2f})"
                  if "torch_ms" in dec else "not installed")
    lo, hi = dec["cache_lens"]
    print(f"\n## 2. One decoding step, batch 1, cache lengths {lo} to {hi}\n\n"
          f"| mha_lit | bytes read | memory floor | step / floor (target <= 1.3) | "
          f"PyTorch (mha_lit / PyTorch) |\n|---|---|---|---|---|\n"
          f"| {dec['ours_ms']:.1f} ms | {dec['bytes'] / 1e6:.0f} MB | {dec['floor_ms']:.1f} ms "
          f"| **{dec['floor_ratio']:.2f}** | {torch_cell} |")

    curves = {}
    for context in (128, 1024):
        progress(f"batches at context {context}")
        rows = bench_batches(G, batches, context, peak, bandwidth, max(4, steps // 2))
        measured, predicted = bend(rows, G, context, peak, bandwidth)
        curves[context] = rows
        print(f"\n## 3. Batched decoding, context {context}\n\n| B | ms per step | tokens/s | "
              "vs B = 1 | roofline tokens/s | FLOPs/byte |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['B']} | {r['ms']:.1f} | {r['tokens_per_s']:.0f} | "
                  f"{r['tokens_per_s'] / rows[0]['tokens_per_s']:.1f}x | "
                  f"{r['predicted_tokens_per_s']:.0f} | {r['intensity']:.2f} |")
        said = ("not reached: the largest batch is still left of the ridge"
                if measured is None else f"B = {measured:.0f}")
        pred = ("never: the caches grow with the batch as fast as the arithmetic"
                if predicted == float("inf") else f"B = {predicted:.0f}")
        print(f"\nBend of the curve: measured {said}; roofline prediction {pred}.")
        if 16 in [r["B"] for r in rows]:
            r16 = next(r for r in rows if r["B"] == 16)
            print(f"Batch 16 / batch 1 tokens per second: **"
                  f"{r16['tokens_per_s'] / rows[0]['tokens_per_s']:.1f}x** (target >= 8x).")

    progress("forward pass rate")
    fwd = bench_forward_rate(runs, peak)
    print(f"\n## 4. Forward pass, GPT-2 small attention, 1,024 tokens\n\n| time | multiply-adds "
          f"done, as GFLOP/s | share of the matrix product's rate (target >= 0.7) |\n"
          f"|---|---|---|\n| {fwd['ms']:.1f} ms | {fwd['gflops']:.1f} | **{fwd['share']:.2f}** |")
    print("\nThe parts timed alone: " + ", ".join(
        f"{k} {v:.1f} ms" for k, v in fwd["parts_ms"].items()) + ".")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from mha_lit import plots

        points = {f"decode B={r['B']}, n={c}": (r["intensity"], "this CPU")
                  for c, rows in curves.items() for r in rows}
        fig = plots.roofline({"this CPU": (peak, bandwidth)}, points,
                             title="Decoding on the roofline (measured rates)")
        ax = fig.axes[0]
        for c, rows in curves.items():
            ax.plot([r["intensity"] for r in rows], [r["gflops"] * 1e9 for r in rows],
                    "k--" if c == 1024 else "k:", lw=1, label=f"achieved, context {c}")
        ax.legend(fontsize=6.5, loc="lower right")
        fig.savefig(args.plot, dpi=120)
        plt.close(fig)
        progress(f"saved {args.plot}")


if __name__ == "__main__":
    main()
