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
   PyTorch. Then the same step for attention alone (12 attention layers, no feed-forward
   networks, no output layer) and for the full stack, at batch 1 and 16, each against
   PyTorch's same step, with where each millisecond goes: the weight products timed alone,
   the products against the caches timed alone, and the rest (the difference).
3. Batched decoding: tokens per second for batches of 1 .. 64 sequences, at a short context
   (128 tokens, where the weights are most of the traffic) and at 1,024 (where the caches
   are), next to the roofline's prediction from the rates of step 0. Target: batch 16 at least
   8x the tokens per second of batch 1. Prints where the measured curve bends, and what
   the weight products alone allow: the step of 16 sequences cannot be faster than its
   products timed alone plus the time its caches take to read at the measured bandwidth, so
   16 x (time of a batch-1 step) / (products of 16 rows + cache floor) bounds the gain
   whatever the rest of the step costs. The products of 16 rows are timed as the package
   computes them and, with threadpoolctl, with each weight matrix split in halves of its
   rows, one Python thread and one BLAS thread each; the batch-1 step alternates with them.
4. The forward pass at GPT-2 small's attention shape: the fast path's multiply-adds per second
   against the matrix product's. Target: at least 0.6. Its parts are timed alone, and the
   products inside the attention loop without the softmax between them, which bounds the
   share the products allow.

Speed targets live here and in benchmarks/README.md, never in the tests. Progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from attention import (
    alternate,
    progress,
    set_threads,
    thread_report,
    threadpoolctl,
    torch,
)

from mha_lit import (
    Dims,
    KVCache,
    fast,
    init_weights,
    multi_head_attention,
    roofline,
)
from mha_lit.attention import attention
from mha_lit.decoder import Decoder, init_gpt_weights
from mha_lit.fast import BLOCK_ROWS, few_rows_product

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

def _t(a) -> "torch.Tensor":
    return torch.from_numpy(np.array(a))  # a writable copy


def torch_attention(a) -> list:
    """One attention layer's weights as PyTorch tensors: W_QKV (d, 3 h d_k), b_QKV, W_O, b_O."""
    W_QKV = np.concatenate([w.transpose(1, 0, 2).reshape(a.d_model, -1)
                            for w in (a.W_Q, a.W_K, a.W_V)], axis=1)  # (d, 3 h d_k)
    b_QKV = np.concatenate([b.reshape(-1) for b in (a.b_Q, a.b_K, a.b_V)])
    return [_t(W_QKV), _t(b_QKV), _t(a.W_O), _t(a.b_O)]


def torch_cache(cache: KVCache, extra: int = 64) -> list:
    """Copies of a cache's keys and values, (B, h, n + extra, d), for PyTorch to append to."""
    keys, values = cache.keys, cache.values
    keys, values = keys.reshape((-1,) + keys.shape[-3:]), values.reshape((-1,) + values.shape[-3:])
    B, h, n, d = keys.shape
    K, V = torch.zeros(B, h, n + extra, d), torch.zeros(B, h, n + extra, values.shape[-1])
    K[:, :, :n], V[:, :, :n] = _t(keys), _t(values)
    return [K, V]


def torch_attend(x, W_QKV, b_QKV, W_O, b_O, K, V, p: int, h: int):
    """PyTorch's cached attention step for rows x (B, d) at position p: Y (B, d)."""
    F = torch.nn.functional
    B, d = x.shape
    qkv = x @ W_QKV + b_QKV  # (B, 3 d)
    q = qkv[:, :d].view(B, h, 1, d // h)
    K[:, :, p] = qkv[:, d:2 * d].view(B, h, d // h)
    V[:, :, p] = qkv[:, 2 * d:].view(B, h, d // h)
    att = F.scaled_dot_product_attention(q, K[:, :, :p + 1], V[:, :, :p + 1])  # (B, h, 1, d_k)
    return att.reshape(B, d) @ W_O + b_O


def torch_step(G, dec: Decoder):
    """PyTorch doing the same cached step of the same stack, from a copy of dec's caches.

    The step takes one token per sequence (an int, or (B,) ints) and returns the logits."""
    F = torch.nn.functional
    n = int(dec.lengths[0])
    layers = []
    for block, cache in zip(G.blocks, dec.caches, strict=True):
        layers.append(torch_attention(block.attn) + [
            _t(block.gamma_1), _t(block.beta_1), _t(block.gamma_2), _t(block.beta_2),
            _t(block.W_1), _t(block.b_1), _t(block.W_2), _t(block.b_2)] + torch_cache(cache))
    E, P, gf, bf = _t(G.E), _t(G.P), _t(G.gamma_f), _t(G.beta_f)
    h, d = G.blocks[0].attn.heads, G.d_model
    state = {"pos": n}

    def step(tokens):
        p = state["pos"]
        with torch.inference_mode():
            x = E[torch.as_tensor(np.atleast_1d(tokens))] + P[p]  # (B, d)
            for (W_QKV, b_QKV, W_O, b_O, g1, be1, g2, be2, W1, b1, W2, b2, K, V) in layers:
                x = x + torch_attend(F.layer_norm(x, (d,), g1, be1, 1e-5), W_QKV, b_QKV, W_O,
                                     b_O, K, V, p, h)
                f = F.layer_norm(x, (d,), g2, be2, 1e-5)
                x = x + F.gelu(f @ W1 + b1, approximate="tanh") @ W2 + b2
            logits = F.layer_norm(x, (d,), gf, bf, 1e-5) @ E.T  # (B, V)
        state["pos"] = p + 1
        return logits.numpy()
    return step


def bench_decode(G, bandwidth: float, steps: int) -> dict:
    """Steps at cache lengths 1,024 .. 1,024 + steps, mha_lit and PyTorch alternating."""
    dec = prefilled(G, None, 1024)
    functions = {"mha_lit": dec.decode_step}
    if torch is not None:
        tstep = torch_step(G, dec)  # the same caches, copied
        token = int(dec.logits.argmax())
        assert dec.decode_step() == token  # both now hold 1,025 tokens
        assert np.allclose(tstep(token)[0], dec.logits, rtol=0, atol=2e-3)
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


# --- 2b. where a step's time goes: attention alone and the full stack, batch 1 and 16 -----------

class AttentionStack:
    """Attention alone: rows x <- x + MHA_l(x) through 12 layers, one KV cache per layer."""

    def __init__(self, Ws, batch, tokens: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        lead = () if batch is None else (batch,)
        self.Ws = Ws
        self.caches = [KVCache(W, capacity=tokens + 64, batch=batch) for W in Ws]
        X = rng.standard_normal(lead + (tokens, GPT2.d_model)).astype(np.float32)
        for cache in self.caches:  # the prompt, prefilled layer by layer
            X = X + cache.extend(X)
        self.x = rng.standard_normal(lead + (GPT2.d_model,)).astype(np.float32)

    def step(self) -> np.ndarray:
        x = self.x
        for cache in self.caches:
            x = x + cache.step(x)
        return x

    def torch_step(self):
        """PyTorch's same step, from copies of the caches: returns (B, d_model)."""
        layers = [torch_attention(W) + torch_cache(c) for W, c in zip(self.Ws, self.caches,
                                                                        strict=True)]
        x = _t(self.x.reshape(-1, GPT2.d_model))
        state = {"pos": len(self.caches[0])}

        def step():
            p = state["pos"]
            with torch.inference_mode():
                y = x
                for W_QKV, b_QKV, W_O, b_O, K, V in layers:
                    y = y + torch_attend(y, W_QKV, b_QKV, W_O, b_O, K, V, p, GPT2.heads)
            state["pos"] = p + 1
            return y.numpy()
        return step


def our_parts(Ws, caches, blocks=None, E=None):
    """A step's weight products timed alone (with their bias additions), and its products
    against the caches timed alone: chapter 3's kernel on every layer's keys and values (public
    copies, the same bytes as the views a step reads)."""
    B = caches[0].batch or 1
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, GPT2.d_model)).astype(np.float32)
    c = rng.standard_normal((B, GPT2.heads * GPT2.d_v)).astype(np.float32)
    q = (rng.standard_normal((B, GPT2.heads, 1, GPT2.d_k)) / 8).astype(np.float32)
    kv = [(cache.keys.reshape((B,) + cache.keys.shape[-3:]),
           cache.values.reshape((B,) + cache.values.shape[-3:])) for cache in caches]

    def weights():
        for layer, W in enumerate(Ws):
            fast.project_heads(x, W)
            fast.output_projection(c, W)
            if blocks is not None:
                W_1T, W_2T = blocks[layer].transposed_ffn
                few_rows_product(W_2T, few_rows_product(W_1T, x))
        if E is not None:
            few_rows_product(E, x)

    def cache_reads():
        for K, V in kv:
            attention(q, K, V, scale=1.0)
    return weights, cache_reads


def torch_parts(Ws, caches, blocks=None, E=None):
    """The same two parts of PyTorch's step: its weight products, and SDPA on the caches."""
    F = torch.nn.functional
    B = caches[0].batch or 1
    x, c = torch.randn(B, GPT2.d_model), torch.randn(B, GPT2.heads * GPT2.d_v)
    q = torch.randn(B, GPT2.heads, 1, GPT2.d_k)
    layers = [torch_attention(W) for W in Ws]
    ffn = None if blocks is None else [(_t(b.W_1), _t(b.b_1), _t(b.W_2), _t(b.b_2))
                                       for b in blocks]
    E_t = None if E is None else _t(E)
    kv = [torch_cache(cache, extra=0) for cache in caches]

    def weights():
        with torch.inference_mode():
            for layer, (W_QKV, b_QKV, W_O, b_O) in enumerate(layers):
                x @ W_QKV + b_QKV
                c @ W_O + b_O
                if ffn is not None:
                    W1, b1, W2, b2 = ffn[layer]
                    (x @ W1 + b1) @ W2 + b2
            if E_t is not None:
                x @ E_t.T

    def cache_reads():
        with torch.inference_mode():
            for K, V in kv:
                F.scaled_dot_product_attention(q, K, V)
    return weights, cache_reads


def bench_breakdown(G, Ws, steps: int) -> list:
    """Attention alone and the full stack, batch 1 (cache 1,024) and 16 (cache 128): each
    step against PyTorch's, and the parts of both timed alone, all alternating in one run."""
    rows = []
    for what in ("attention alone", "full stack"):
        for B, tokens in ((None, 1024), (16, 128)):
            progress(f"  {what}, batch {B or 1}, cache {tokens}")
            if what == "attention alone":
                stack = AttentionStack(Ws, B, tokens)
                ours, caches, blocks, E = stack.step, stack.caches, None, None
                if torch is not None:
                    theirs = stack.torch_step()
                    y_theirs, y_ours = theirs(), ours()  # both at the same position
                    # float32 through 12 residual layers: equal to 1e-4 of the largest entry
                    assert np.allclose(y_theirs.reshape(y_ours.shape), y_ours, rtol=0,
                                       atol=1e-4 * np.abs(y_ours).max())
            else:
                dec = prefilled(G, B, tokens, seed=7)
                caches, blocks, E = dec.caches, [b for b in G.blocks], G.E
                if torch is not None:
                    tstep = torch_step(G, dec)
                    tokens_now = np.atleast_1d(dec.logits.argmax(axis=-1))
                    dec.decode_step()
                    assert np.allclose(tstep(tokens_now).reshape(dec.logits.shape),
                                       dec.logits, rtol=0, atol=2e-3)
                    theirs = lambda t=tokens_now, f=tstep: f(t)  # noqa: E731
                ours = dec.decode_step
            functions = {"mha_lit": ours}
            functions["mha_lit weights"], functions["mha_lit cache"] = our_parts(
                [b.attn for b in G.blocks] if what == "full stack" else Ws, caches, blocks, E)
            if torch is not None:
                functions["PyTorch"] = theirs
                functions["PyTorch weights"], functions["PyTorch cache"] = torch_parts(
                    [b.attn for b in G.blocks] if what == "full stack" else Ws, caches,
                    blocks, E)
            ms = {k: 1e3 * statistics.median(v)
                  for k, v in alternate(functions, steps, f"{what}, B={B}").items()}
            rows.append({"what": what, "B": B or 1, "tokens": tokens, "ms": ms})
    return rows


def bench_bound(G, context: int, steps: int) -> dict:
    """The products of a step of 16 rows, weights streamed from memory and, for one panel
    that stays in the cache, with no traffic from memory; next to the products of one row and
    a whole step of batch 1 at ``context`` cached tokens, all alternating.

    The 16 rows are timed twice: as the package computes them (``few_rows_product``, OpenBLAS
    on its threads) and, when threadpoolctl is installed, with every weight matrix split in
    two halves of its rows (output features), each half times all 16 rows in its own Python
    thread calling OpenBLAS on one thread (no hand-off between OpenBLAS's threads inside a
    product)."""
    rng = np.random.default_rng(9)
    x1 = rng.standard_normal((1, G.d_model)).astype(np.float32)
    x16 = rng.standard_normal((16, G.d_model)).astype(np.float32)
    h16 = rng.standard_normal((16, G.blocks[0].d_ff)).astype(np.float32)

    def products(x):
        def run():
            for block in G.blocks:
                fast.project_heads(x, block.attn)
                fast.output_projection(x, block.attn)
                W_1T, W_2T = block.transposed_ffn
                few_rows_product(W_2T, few_rows_product(W_1T, x))
            few_rows_product(G.E, x)
        return run
    panel = np.ascontiguousarray(G.blocks[0].transposed_ffn[0][:256])  # 768 KiB, in cache
    repeats = 50

    def in_cache():
        for _ in range(repeats):
            few_rows_product(panel, x16)
    dec = prefilled(G, 1, context, seed=1)
    runs = {"step, batch 1": dec.decode_step, "1 row": products(x1), "16 rows": products(x16),
            "16 rows, one panel in cache": in_cache}
    if threadpoolctl is not None:
        import threading

        matrices = []  # (W^T, its input) of every product of a step
        for block in G.blocks:
            W_QKV_T, W_O = fast.fused_weights(block.attn, np.float32)
            W_1T, W_2T = block.transposed_ffn
            matrices += [(W_QKV_T, x16), (np.ascontiguousarray(W_O.T), x16), (W_1T, x16),
                         (W_2T, h16)]
        matrices.append((G.E, x16))
        halves = [[(W_T[:len(W_T) // 2], X) for W_T, X in matrices],
                  [(W_T[len(W_T) // 2:], X) for W_T, X in matrices]]

        def half(jobs):
            for W_T, X in jobs:
                few_rows_product(W_T, X)

        def two_threads():
            with threadpoolctl.threadpool_limits(1, user_api="blas"):
                threads = [threading.Thread(target=half, args=(jobs,)) for jobs in halves]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        runs["16 rows, one core each half"] = two_threads
    t = {k: statistics.median(v) for k, v in alternate(runs, steps, "products alone").items()}
    weights = sum(b.attn.W_Q.size + b.attn.W_K.size + b.attn.W_V.size + b.attn.W_O.size
                  + b.W_1.size + b.W_2.size for b in G.blocks) + G.E.size
    out = {"step_1": 1e3 * t["step, batch 1"], "ms_1": 1e3 * t["1 row"],
           "ms_16": 1e3 * t["16 rows"],
           "gflops_16": 2 * 16 * weights / t["16 rows"] / 1e9,
           "gflops_cache": 2 * 16 * panel.size * repeats / t["16 rows, one panel in cache"] / 1e9}
    if "16 rows, one core each half" in t:
        out["ms_16_split"] = 1e3 * t["16 rows, one core each half"]
    return out


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
             "output product": lambda: concat.reshape(1024, -1) @ W_O,
             "loop's products alone": lambda: [
                 (Q[:, r0:r0 + BLOCK_ROWS] @ K_T[:, :, :r0 + BLOCK_ROWS]) @ V[:, :r0 + BLOCK_ROWS]
                 for r0 in range(0, 1024, BLOCK_ROWS)]}
    times = {k: statistics.median(v) for k, v in alternate(parts, runs, "forward").items()}
    rate = 2 * forward_macs(GPT2, 1024) / times["forward"]
    products = times["projections"] + times["output product"] + times["loop's products alone"]
    return {"ms": 1e3 * times["forward"], "gflops": rate / 1e9, "share": rate / peak,
            "products_share": 2 * forward_macs(GPT2, 1024) / products / peak,
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

    progress("where a step's time goes")
    Ws = [b.attn for b in G.blocks]
    parts = bench_breakdown(G, Ws, max(5, steps // 2))
    print("\n## 2b. Where a step's time goes, against PyTorch (medians, alternating)\n\n"
          "| step | library | step | weight products alone | products against the caches "
          "alone | rest (difference) | mha_lit / PyTorch |\n|---|---|---|---|---|---|---|")
    for r in parts:
        ms = r["ms"]
        for lib in ("mha_lit", "PyTorch"):
            if lib not in ms:
                continue
            rest = ms[lib] - ms[f"{lib} weights"] - ms[f"{lib} cache"]
            ratio = (f"**{ms['mha_lit'] / ms['PyTorch']:.2f}**"
                     if lib == "mha_lit" and "PyTorch" in ms else "")
            print(f"| {r['what']}, B = {r['B']}, cache {r['tokens']} | {lib} | {ms[lib]:.1f} ms "
                  f"| {ms[f'{lib} weights']:.1f} | {ms[f'{lib} cache']:.1f} | {rest:.1f} "
                  f"| {ratio} |")

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
            if context == 128:
                bound = bench_bound(G, context, max(5, steps // 2))
                floor = 1e3 * 16 * cache_bytes(G, context) / bandwidth
                fastest = min(bound["ms_16"], bound.get("ms_16_split", float("inf")))
                split = (f"; each matrix split in halves of its rows, one Python thread and one "
                         f"BLAS thread each, "
                         f"{bound['ms_16_split']:.1f} ms" if "ms_16_split" in bound else "")
                print(f"\nTimed alone, alternating with a step of batch 1 "
                      f"({bound['step_1']:.1f} ms): the weight products of one step of one row "
                      f"{bound['ms_1']:.1f} ms, of 16 rows {bound['ms_16']:.1f} ms "
                      f"({bound['gflops_16']:.0f} GFLOP/s{split}); one 768 KiB panel kept in "
                      f"the cache runs 16 rows at {bound['gflops_cache']:.0f} GFLOP/s. Batch 16 "
                      f"also reads its caches, {16 * cache_bytes(G, context) / 1e6:.0f} MB, at "
                      f"least {floor:.1f} ms at this run's bandwidth. So a step of 16 sequences "
                      f"takes at least {fastest:.1f} + {floor:.1f} ms, and batch 16 gives at most"
                      f" **{16 * bound['step_1'] / (fastest + floor):.1f}x** the tokens per "
                      "second of batch 1 with these product kernels, whatever the rest costs.")

    progress("forward pass rate")
    fwd = bench_forward_rate(runs, peak)
    print(f"\n## 4. Forward pass, GPT-2 small attention, 1,024 tokens\n\n| time | multiply-adds "
          f"done, as GFLOP/s | share of the matrix product's rate (target >= 0.6) |\n"
          f"|---|---|---|\n| {fwd['ms']:.1f} ms | {fwd['gflops']:.1f} | **{fwd['share']:.2f}** |")
    print("\nThe parts timed alone: " + ", ".join(
        f"{k} {v:.1f} ms" for k, v in fwd["parts_ms"].items()) + ".")
    print(f"The products alone (projections, output, the loop's products without the softmax "
          f"between them) would give a share of **{fwd['products_share']:.2f}**: the bound on "
          "the forward pass's share while the softmax passes cost anything.")

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
