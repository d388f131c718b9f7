"""A small GPT that generates text: prefill, then one token at a time.

Book: chapter 12 "Computing it efficiently", section "Prefill, then one
token at a time". Part II's pipeline (chapter 9) made to generate:

    X = E[tokens] + P[positions]                 embedding and positions
    X <- block_l(X), l = 1 .. L                  GPT-2's pre-LN blocks
    logits = LN_f(X) E^T                         output layer, tied to E

The blocks are GPT-2's at inference: no dropout (chapter 8, "Dropout:
in training only"). ``gpt_forward`` computes it from scratch for a whole
sequence.
``Decoder`` keeps one ``KVCache`` per layer: ``prefill`` sends the prompt
through every layer at once (matrix products), ``decode_step`` chooses
the next token greedily (the largest logit) and sends that one token
through the stack. Both give what ``gpt_forward`` gives on the tokens so
far, to rounding; the tests check it token for token.

Letters in shape comments: n tokens, m new tokens, B sequences, d_model,
n_vocab vocabulary entries, L layers.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from . import checks
from .block import (
    BlockWeights,
    feed_forward_rows,
    gelu_values,
    gpt_block,
    init_block_weights,
    layer_norm,
    layer_norm_rows,
)
from .fast import few_rows_product
from .kv_cache import KVCache
from .shapes import Dims, read_only_copy

__all__ = ["GPTWeights", "init_gpt_weights", "gpt_forward", "Decoder"]


@dataclass(frozen=True, eq=False)
class GPTWeights:
    """Every array of a small GPT. Book: chapter 12.

        E                (n_vocab, d_model) token embedding, and the output
                                           layer (tied, as in GPT-2)
        P                (n_ctx, d_model)  learned position vectors
        blocks           L BlockWeights    GPT-2's pre-LN blocks
        gamma_f, beta_f  (d_model,)        the final layer norm

    Shapes are checked on construction; arrays become read-only copies.
    """

    E: np.ndarray
    P: np.ndarray
    blocks: tuple
    gamma_f: np.ndarray
    beta_f: np.ndarray

    def __post_init__(self) -> None:
        blocks = tuple(self.blocks)
        if not blocks or not all(isinstance(b, BlockWeights) for b in blocks):
            raise TypeError("blocks must be a non-empty sequence of "
                            "mha_lit.BlockWeights")
        d = blocks[0].d_model
        arrs = {"E": checks.float_array(self.E, "E", ndim=2),
                "P": checks.float_array(self.P, "P", ndim=2),
                "gamma_f": checks.float_array(self.gamma_f, "gamma_f", ndim=1),
                "beta_f": checks.float_array(self.beta_f, "beta_f", ndim=1)}
        for name, arr in arrs.items():
            if arr.shape[-1] != d:
                raise ValueError(f"{name} has shape {arr.shape}, but the "
                                 f"blocks have d_model = {d}")
        widths = [b.d_model for b in blocks]
        if len(set(widths)) != 1:
            raise ValueError(
                f"every block needs the same d_model, got {widths}")
        dtypes = {a.dtype for a in arrs.values()} | {
            a.dtype for b in blocks for a in b.arrays().values()}
        if len(dtypes) != 1:
            raise TypeError("every array of a GPT must have one float type, "
                            f"got {sorted(str(d) for d in dtypes)}")
        for name, arr in arrs.items():
            object.__setattr__(self, name, read_only_copy(arr, arr.dtype))
        object.__setattr__(self, "blocks", blocks)

    @property
    def d_model(self) -> int:
        return self.E.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.E.shape[0]

    @property
    def context_length(self) -> int:
        return self.P.shape[0]

    @property
    def layers(self) -> int:
        return len(self.blocks)

    @property
    def dtype(self) -> np.dtype:
        return self.E.dtype

    def __repr__(self) -> str:
        return (f"GPTWeights(L={self.layers}, d_model={self.d_model}, "
                f"vocab={self.vocab_size}, context={self.context_length}, "
                f"blocks={self.blocks[0]!r})")


def init_gpt_weights(dims: Dims | None = None, layers: int = 2,
                     vocab_size: int = 13, context_length: int = 19,
                     d_ff: int = 17, seed: int = 0, *,
                     attn_biases: bool = True,
                     dtype=np.float64) -> GPTWeights:
    """Random weights of a small GPT. Book: chapter 12.

    Block l is ``init_block_weights(dims, d_ff, seed=1000 * seed + l)``
    (each block its own seed), with GPT-2's attention biases by default.
    E is N(0, 1), so that the tied output layer separates the logits
    clearly; P is N(0, 0.1^2); the final layer norm has gains near 1 and
    biases near 0. The book's defaults keep its primes: vocabulary 13,
    d_ff 17 and a context of 19 positions.
    """
    dims = Dims() if dims is None else dims
    for name, value in (("layers", layers), ("vocab_size", vocab_size),
                        ("context_length", context_length)):
        checks.positive_int(value, name)
    rng = np.random.default_rng([seed, 12])
    d = dims.d_model
    blocks = [init_block_weights(dims, d_ff, seed=seed * 1000 + layer,
                                 attn_biases=attn_biases, dtype=dtype)
              for layer in range(layers)]
    return GPTWeights(
        E=rng.standard_normal((vocab_size, d)).astype(dtype),  # (n_vocab, d)
        P=(0.1 * rng.standard_normal((context_length, d))).astype(dtype),
        blocks=tuple(blocks),
        gamma_f=(1 + 0.1 * rng.standard_normal(d)).astype(dtype),  # (d,)
        beta_f=(0.1 * rng.standard_normal(d)).astype(dtype))  # (d,)


def _check_tokens(tokens, G: GPTWeights, batch: int | None) -> np.ndarray:
    """tokens (m,) or (B, m) as ids of G's vocabulary, reshaped (B, m)."""
    t = checks.token_ids(tokens, G.vocab_size)
    if t.ndim != (1 if batch is None else 2) or (
            batch is not None and t.shape[0] != batch):
        want = "(m,)" if batch is None else f"(B, m) with B = {batch}"
        raise ValueError(f"tokens must be integers of shape {want}, got "
                         f"shape {t.shape}")
    return t.reshape(-1, t.shape[-1])


def gpt_forward(tokens, G: GPTWeights) -> np.ndarray:
    """Logits (n, n_vocab) of every position, computed from scratch.

    Book: chapter 12 (the pipeline of chapter 9, with GPT-2's blocks of
    chapter 8). Row t scores every vocabulary entry as token t + 1.
    """
    if not isinstance(G, GPTWeights):
        raise TypeError(
            f"G must be mha_lit.GPTWeights, got {type(G).__name__}")
    t = _check_tokens(tokens, G, None)[0]  # (n,)
    n = len(t)
    if not 1 <= n <= G.context_length:
        raise ValueError(f"a sequence of {n} tokens does not fit: it needs "
                         f"1 .. {G.context_length} (the context length)")
    X = G.E[t] + G.P[:n]  # (n, d_model)
    for block in G.blocks:
        X = gpt_block(X, block, pre_ln=True)  # (n, d_model)
    return layer_norm(X, G.gamma_f, G.beta_f) @ G.E.T  # (n, n_vocab)


class Decoder:
    """Greedy generation with one KV cache per layer. Book: chapter 12.

    ``prefill(tokens)`` sends a prompt through every layer at once and
    returns the logits of its last position; ``decode_step()`` picks the
    largest of the latest logits (on a tie, the smallest token id, as
    ``argmax`` does), sends that token through the stack, and returns it.
    Calls continue the sequence the Decoder holds; ``reset()`` starts over.
    With ``batch=B`` every call handles B sequences: ``prefill`` takes
    (B, m) tokens and an optional ``key_mask`` (B, m) for prompts of
    different lengths (True = real token; padded ids are not used but must
    be valid ids), ``decode_step`` returns B tokens. A refused call, even
    one refused by a layer deep in the stack (an overflow to inf), leaves
    every cache as it was.
    """

    def __init__(self, G: GPTWeights, *, batch: int | None = None,
                 capacity: int = 16):
        if not isinstance(G, GPTWeights):
            raise TypeError(f"Decoder needs mha_lit.GPTWeights, got "
                            f"{type(G).__name__}")
        self.G = G
        self.batch = batch
        self.caches = [KVCache(block.attn, capacity, batch=batch)
                       for block in G.blocks]
        self._logits = None  # (B, n_vocab): the latest position's, each

    def reset(self) -> None:
        """Forget every sequence: empty caches, no logits."""
        for cache in self.caches:
            cache.reset()
        self._logits = None

    def _all_or_nothing(self, run):
        """run(), or, if any layer refuses, every cache as it was before."""
        lengths, logits = self.lengths, self._logits
        try:
            return run()
        except Exception:
            for cache in self.caches:
                cache.truncate(np.minimum(cache.lengths, lengths))
            self._logits = logits
            raise

    @property
    def lengths(self) -> np.ndarray:
        """Tokens seen by each sequence, (B,)."""
        return self.caches[0].lengths

    @property
    def logits(self) -> np.ndarray:
        """Logits of each sequence's latest token (a copy).

        (n_vocab,), or (B, n_vocab) with a batch.
        """
        if self._logits is None:
            raise RuntimeError("no tokens yet: call prefill first")
        return (self._logits[0] if self.batch is None else self._logits).copy()

    def _layers(self, X: np.ndarray, run_attention, few: bool) -> np.ndarray:
        """X (rows, d_model) through every block; attention by the caches.

        ``few``: a decoding step's rows, one per sequence
        (``few_rows_product``)."""
        for block, cache in zip(self.G.blocks, self.caches, strict=True):
            a = layer_norm_rows(X, block.gamma_1, block.beta_1)
            X = X + run_attention(cache, a)  # X' = X + MHA(LN_1(X))
            f = layer_norm_rows(X, block.gamma_2, block.beta_2)
            if few:  # the same FFN, each weight read once for all rows
                W_1T, W_2T = block.transposed_ffn
                hidden = gelu_values(few_rows_product(W_1T, f) + block.b_1)
                X = X + (few_rows_product(W_2T, hidden) + block.b_2)
            else:
                X = X + feed_forward_rows(f, block.W_1, block.b_1, block.W_2,
                                          block.b_2)  # X' + FFN(LN_2(X'))
        return X

    def _output(self, X: np.ndarray) -> np.ndarray:
        """Logits (rows, n_vocab) of the last hidden rows X (rows, d_model).

        LN_f(X) E^T, the output layer tied to the embedding.
        """
        G = self.G
        return few_rows_product(G.E, layer_norm_rows(X, G.gamma_f, G.beta_f))

    def prefill(self, tokens, key_mask=None) -> np.ndarray:
        """Feed a prompt at once; return the logits of its last token."""
        G, B = self.G, self.batch
        t = _check_tokens(tokens, G, B)  # (B, m)
        nb, m = t.shape
        want = (m,) if B is None else (nb, m)
        mask = checks.key_mask(key_mask, want, of="the prompt")
        mask = np.ones((nb, m), bool) if mask is None else mask.reshape(nb, m)
        counts = mask.sum(axis=1)  # (B,) real tokens per sequence
        start = self.lengths  # (B,)
        if (counts == 0).any():
            raise ValueError("every sequence needs at least one real token "
                             f"in its prompt, got {counts.tolist()}")
        if (start + counts > G.context_length).any():
            raise ValueError(
                f"prompts of {counts.tolist()} tokens after "
                f"{start.tolist()} do not fit the context of "
                f"{G.context_length} positions")
        # each real token's position: its sequence's next free ones
        positions = start[:, None] + np.cumsum(mask, axis=1) - 1  # (B, m)
        positions = np.where(mask, positions, 0)
        X = G.E[t] + G.P[positions]  # (B, m, d_model)
        d = G.d_model
        Xs = X.reshape(nb * m, d)

        def attention(cache, a):  # a (B*m, d_model), one block per sequence
            blocks = a.reshape(nb, m, d)
            out = cache.extend(blocks if B is not None else blocks[0],
                               key_mask=mask if B is not None else mask[0])
            return out.reshape(nb * m, d)

        def run():
            X_out = self._layers(Xs, attention, few=False).reshape(nb, m, d)
            last = np.array([np.flatnonzero(row)[-1] for row in mask])  # (B,)
            return self._output(X_out[np.arange(nb), last])  # (B, n_vocab)

        self._logits = self._all_or_nothing(run)
        return self.logits

    def decode_step(self, tokens=None):
        """Feed each sequence's next token; by default the greedy choice.

        ``tokens=None`` takes the largest of the latest logits; a token
        (an int, or (B,) ints with a batch) feeds that one instead, as when
        a known text is read one token at a time. Returns the tokens fed.
        """
        G = self.G
        if self._logits is None:
            raise RuntimeError("no tokens yet: call prefill first")
        positions = self.lengths  # (B,)
        if (positions >= G.context_length).any():
            raise ValueError(f"the context of {G.context_length} positions "
                             f"is full: sequences hold {positions.tolist()}")
        if tokens is None:
            chosen = self._logits.argmax(axis=1)  # (B,) greedy
        else:
            want = () if self.batch is None else (self.batch,)
            chosen = checks.token_ids(tokens, G.vocab_size)
            if chosen.shape != want:
                raise ValueError(f"tokens must be integers of shape {want}, "
                                 f"got shape {chosen.shape}")
            chosen = chosen.reshape(-1)  # (B,)
        X = G.E[chosen] + G.P[positions]  # (B, d_model)

        def attention(cache, a):  # a (B, d_model): one row per sequence
            return cache.step(a if self.batch is not None else a[0]).reshape(
                a.shape)

        self._logits = self._all_or_nothing(
            lambda: self._output(self._layers(X, attention, few=True)))
        return int(chosen[0]) if self.batch is None else chosen

    def generate(self, tokens, steps: int, key_mask=None) -> np.ndarray:
        """Prefill ``tokens``, then ``steps`` greedy tokens.

        Returns (steps,) token ids, or (B, steps) with a batch.

        Continues what the Decoder already holds (``reset()`` first to
        start a new text)."""
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral):
            raise TypeError(f"steps must be a non-negative integer, got "
                            f"{steps!r}")
        if steps < 0:
            raise ValueError(f"steps must be a non-negative integer, got "
                             f"{steps}")
        self.prefill(tokens, key_mask)
        out = [self.decode_step() for _ in range(steps)]
        if self.batch is None:
            return np.array(out, dtype=np.int64)
        if not out:
            return np.empty((self.batch, 0), np.int64)
        return np.stack(out, axis=1)  # (B, steps)
