"""A small GPT trained with Adam to continue repeated random tokens.

Book: Part IV, chapter 21 "A model that learns". A sequence is
half_length random tokens followed by the same tokens once more
(``repeat_sequences``); predicting the repeated half needs a head that
finds where the current token occurred before and copies the token that
came after it, an induction head built on a previous-token head (Olsson
et al. 2022). ``train_repeat`` trains ``decoder.GPTWeights`` for it with
``grad.loss_and_grads`` and Adam (Kingma and Ba 2015), in float64;
``repeat_accuracy`` scores the greedy predictions of ``gpt_forward`` on
fresh sequences, and ``attention_maps`` returns the weights S of every
layer and head, computed with the book's own functions.

A fixed half length would leave a shortcut open: the token to predict
would always stand half_length - 1 positions back, and a head attending
by position alone could find it. So each training sequence repeats its
first k tokens for a period k drawn between ``SHORTEST_PERIOD`` and
half_length (``periodic_sequences``); the loss counts the positions
t >= k, whose current token is a copy of the one k positions earlier,
followed there by the answer (``counted_positions``).

Letters in shape comments: B sequences, n positions (tokens), k a
period, d_model, n_vocab vocabulary entries, L layers, h heads.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import checks, masks
from .attention import attention_weights
from .block import BlockWeights, gpt_block, layer_norm
from .decoder import GPTWeights, gpt_forward, init_gpt_weights
from .grad import loss_and_grads
from .shapes import Dims, Weights

__all__ = ["periodic_sequences", "repeat_sequences", "parameters",
           "with_parameters", "AdamState", "adam_start", "adam_step",
           "SIZES", "D_FF", "counted_positions", "learning_rate",
           "init_repeat_model", "train_repeat", "greedy_predictions",
           "repeat_accuracy", "attention_maps"]

# --- the data ------------------------------------------------------------


def _generator(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator, got "
                        f"{type(rng).__name__}")
    return rng


def periodic_sequences(rng, periods, vocab_size: int,
                       length: int) -> np.ndarray:
    """Random tokens that repeat: row b is its first k_b tokens, over again.

    Book: chapter 21, "A shortcut, closed". ``periods`` (B,) holds each
    row's period k_b >= 1; its first k_b tokens are drawn uniformly, with
    replacement, from 0 .. vocab_size - 1, and token j of the row is
    token j mod k_b. Returns (B, length) int64 ids.
    """
    rng = _generator(rng)
    V = checks.positive_int(vocab_size, "vocab_size")
    length = checks.positive_int(length, "length")
    k = np.asarray(periods)
    if k.ndim != 1 or k.dtype == np.bool_ or not np.issubdtype(
            k.dtype, np.integer) or (k.size and k.min() < 1):
        raise ValueError("periods must be a 1-D array of integers >= 1, "
                         f"one per sequence; got {k!r}")
    first = rng.integers(0, V, (len(k), int(k.max(initial=1))))  # (B, k)
    j = np.arange(length)  # positions 0 .. length - 1
    return np.take_along_axis(first, j % k[:, None], axis=1)  # (B, n)


def repeat_sequences(rng, batch: int, vocab_size: int,
                     half_length: int) -> np.ndarray:
    """``batch`` sequences of half_length random tokens, then the same again.

    Book: chapter 21, "The task: continue a repeated sequence". Each of the
    first half_length tokens is
    drawn uniformly, with replacement, from 0 .. vocab_size - 1; the
    second half repeats them, with no separator. Returns
    (batch, 2 half_length) int64 ids.
    """
    batch = checks.positive_int(batch, "batch")
    half = checks.positive_int(half_length, "half_length")
    periods = np.full(batch, half)  # (B,): the period is the half
    return periodic_sequences(rng, periods, vocab_size, 2 * half)


# --- Adam over the arrays of a GPT ---------------------------------------

_ATTENTION = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")


def parameters(G: GPTWeights) -> dict[str, np.ndarray]:
    """Every array of G by name: E, P, gamma_f, beta_f, "1 W_Q", ...

    Book: chapter 21, "Training with Adam". A block's arrays are named by
    the block's
    number (from 1) and ``BlockWeights.arrays``' names.
    """
    if not isinstance(G, GPTWeights):
        raise TypeError(
            f"G must be mha_lit.GPTWeights, got {type(G).__name__}")
    arrays = {"E": G.E, "P": G.P, "gamma_f": G.gamma_f, "beta_f": G.beta_f}
    for number, block in enumerate(G.blocks, start=1):
        arrays |= {f"{number} {name}": a
                   for name, a in block.arrays().items()}
    return arrays


def with_parameters(G: GPTWeights, arrays: dict) -> GPTWeights:
    """A GPTWeights shaped like G, holding ``arrays`` (named as by
    ``parameters``). Book: chapter 21, "Training with Adam"."""
    names = parameters(G).keys()
    if set(arrays) != set(names):
        missing, extra = set(names) - set(arrays), set(arrays) - set(names)
        raise ValueError(f"arrays must be named as parameters(G) names "
                         f"them; missing {sorted(missing)}, extra "
                         f"{sorted(extra)}")
    blocks = []
    for number, block in enumerate(G.blocks, start=1):
        own = {name: arrays[f"{number} {name}"] for name in block.arrays()}
        attn = Weights(**{k: a for k, a in own.items() if k in _ATTENTION})
        blocks.append(BlockWeights(attn=attn, **{
            k: a for k, a in own.items() if k not in _ATTENTION}))
    return GPTWeights(E=arrays["E"], P=arrays["P"], blocks=tuple(blocks),
                      gamma_f=arrays["gamma_f"], beta_f=arrays["beta_f"])


@dataclass(frozen=True, eq=False)
class AdamState:
    """Adam's running means m and v of every array, and the steps taken.

    Book: chapter 21, "Training with Adam". m and v are dicts named as by
    ``parameters``; ``adam_step`` returns a new state, never changes one.
    """

    steps: int
    m: dict
    v: dict


def adam_start(G: GPTWeights) -> AdamState:
    """Adam's state before its first step: m = v = 0. Book: chapter 21."""
    zeros = {name: np.zeros_like(a) for name, a in parameters(G).items()}
    return AdamState(0, zeros, dict(zeros))


def adam_step(G: GPTWeights, dG: GPTWeights, state: AdamState,
              lr: float = 1e-3, beta_m: float = 0.9, beta_v: float = 0.999,
              eps: float = 1e-8) -> tuple[GPTWeights, AdamState]:
    """One step of Adam: new weights and state.

    Book: chapter 21, "Training with Adam".

    Kingma and Ba (2015), Algorithm 1, for every array theta of G with
    gradient g (the same array of dG), step s = state.steps + 1:

        m <- beta_m m + (1 - beta_m) g,    v <- beta_v v + (1 - beta_v) g^2
        theta <- theta - lr m_hat / (sqrt(v_hat) + eps),
        m_hat = m / (1 - beta_m^s),        v_hat = v / (1 - beta_v^s)

    entry by entry. The paper calls the decay rates beta_1 and beta_2
    (here the layer norms' shifts); the defaults are the paper's.
    """
    theta, grads = parameters(G), parameters(dG)
    if not isinstance(state, AdamState):
        raise TypeError(f"state must be an AdamState, got "
                        f"{type(state).__name__}")
    for name, a in theta.items():
        g = grads.get(name)
        if g is None or g.shape != a.shape or state.m[name].shape != a.shape:
            raise ValueError(
                f"{name} is {a.shape} in G, but "
                f"{None if g is None else g.shape} in dG and "
                f"{state.m[name].shape} in the state: they must match")
    if not (lr > 0 and 0 <= beta_m < 1 and 0 <= beta_v < 1 and eps > 0):
        raise ValueError(f"Adam needs lr > 0, 0 <= beta_m, beta_v < 1 and "
                         f"eps > 0; got lr={lr}, beta_m={beta_m}, "
                         f"beta_v={beta_v}, eps={eps}")
    s = state.steps + 1
    m = {k: beta_m * state.m[k] + (1 - beta_m) * g for k, g in grads.items()}
    v = {k: beta_v * state.v[k] + (1 - beta_v) * g * g
         for k, g in grads.items()}
    new = {k: a - lr * (m[k] / (1 - beta_m ** s))
           / (np.sqrt(v[k] / (1 - beta_v ** s)) + eps)
           for k, a in theta.items()}
    return with_parameters(G, new), AdamState(s, m, v)


# --- training ------------------------------------------------------------

# The trained model's sizes: the residual stream has room for a direction
# per word as the token (16) and as the token before it (16), and 11 more
# for the position; a head matches or copies one of n_vocab = 16 tokens,
# so d_k and d_v exceed 16. Primes, as elsewhere in the book.
SIZES = Dims(d_model=43, d_k=19, d_v=23, heads=1)
D_FF = 17
SHORTEST_PERIOD = 4  # periods k = 4 .. half_length in training
BATCH = 16  # sequences per step
STEPS = 3000  # the default number of steps
LEARNING_RATE = 5e-3  # at the start; it falls to 0 on a cosine
BETA_V = 0.99  # Adam's decay of v (the paper's default: 0.999)


def counted_positions(periods, length: int) -> np.ndarray:
    """(B, length) booleans: True at the positions t >= k_b of row b.

    Book: chapter 21, "A shortcut, closed". Input position t (from 0) of
    a row of period k predicts token t + 1, which repeats token
    t + 1 - k. For t >= k the current token t is a copy of token t - k,
    and the token after that copy is the answer. Position k - 1 is not
    counted: its next token is a copy too, but no earlier copy of the
    current token points to it; only the position and the range of
    periods do.
    """
    k = np.asarray(periods)[:, None]  # (B, 1)
    return np.arange(length)[None, :] >= k  # (B, n)


def learning_rate(step: int, steps: int) -> float:
    """Step 1 .. steps: LEARNING_RATE (1 + cos(pi (step - 1) / steps)) / 2.

    Book: chapter 21, "Training with Adam". A cosine from LEARNING_RATE at
    the first step down towards 0, which the step after the last would
    reach.
    """
    return LEARNING_RATE * (1 + math.cos(math.pi * (step - 1) / steps)) / 2


def init_repeat_model(vocab_size: int, half_length: int, n_layers: int,
                      seed: int) -> GPTWeights:
    """The untrained model: ``init_gpt_weights`` at SIZES, D_FF, with a
    context of 2 half_length - 1 positions. Book: chapter 21."""
    return init_gpt_weights(SIZES, layers=n_layers, vocab_size=vocab_size,
                            context_length=2 * half_length - 1, d_ff=D_FF,
                            seed=seed)


def _task_sizes(vocab_size, half_length) -> tuple[int, int]:
    V = checks.positive_int(vocab_size, "vocab_size")
    h = checks.positive_int(half_length, "half_length")
    if V < 2 or h < 2:
        raise ValueError(
            "the task needs vocab_size >= 2 (one token repeated is no "
            "copy) and half_length >= 2 (a position to predict after the "
            f"repeat's first token); got vocab_size={V}, half_length={h}")
    return V, h


def _seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or (
            seed < 0):
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def train_repeat(vocab_size: int, half_length: int, n_layers: int,
                 steps: int | None = None, seed: int = 0, *,
                 callback: Callable | None = None) -> GPTWeights:
    """A GPT trained with Adam to continue repeated random tokens.

    Book: chapter 21, "Training with Adam". Each step draws BATCH
    sequences of 2 half_length tokens, each repeating its first k tokens,
    with k uniform in SHORTEST_PERIOD .. half_length (k = half_length if
    that is shorter); it feeds the first 2 half_length - 1 and takes the
    next tokens as targets; the loss is the mean cross-entropy over the
    ``counted_positions``. ``steps`` None means STEPS. The data come from
    ``default_rng([seed, 21])`` and the weights from
    ``init_repeat_model(..., seed)``, so the seed fixes everything.
    ``callback(step, steps, loss)``, if given, is called after each step.
    """
    V, half = _task_sizes(vocab_size, half_length)
    L = checks.positive_int(n_layers, "n_layers")
    steps = STEPS if steps is None else checks.positive_int(steps, "steps")
    seed = _seed(seed)
    rng = np.random.default_rng([seed, 21])  # the training data
    G = init_repeat_model(V, half, L, seed)
    state = adam_start(G)
    for step in range(1, steps + 1):
        k = rng.integers(min(SHORTEST_PERIOD, half), half + 1, BATCH)  # (B,)
        seq = periodic_sequences(rng, k, V, 2 * half)  # (B, 2 half)
        counted = counted_positions(k, 2 * half - 1)  # (B, n)
        loss, dG = loss_and_grads(G, seq[:, :-1], seq[:, 1:], counted)
        G, state = adam_step(G, dG, state, learning_rate(step, steps),
                             beta_v=BETA_V)
        if callback is not None:
            callback(step, steps, loss)
    return G


# --- what the model learned ----------------------------------------------


def greedy_predictions(G: GPTWeights, tokens) -> np.ndarray:
    """The largest logit of every position, row by row of ``tokens``.

    Book: chapter 21, "What the model learned". tokens (B, n) ids; each
    row goes
    through ``gpt_forward`` by itself. Returns (B, n) ids: entry t is the
    model's guess for token t + 1.
    """
    t = checks.token_ids(tokens, G.vocab_size, ndim=2)
    return np.stack([gpt_forward(row, G).argmax(axis=1)
                     for row in t])  # (B, n)


def repeat_accuracy(G: GPTWeights, half_length: int, sequences: int = 500,
                    seed: int = 1) -> float:
    """How often the greedy guess of a repeated token is right.

    Book: chapter 21, "What the model learned". Draws ``sequences``
    fresh
    ``repeat_sequences`` from ``default_rng([seed, 22])`` (another stream
    than training's ``[seed, 21]``), feeds each its first
    2 half_length - 1 tokens and scores positions half_length ..
    2 half_length - 2 (from 0): the repeated half but its first token.
    """
    _, half = _task_sizes(G.vocab_size, half_length)
    seq = repeat_sequences(np.random.default_rng([_seed(seed), 22]),
                           sequences, G.vocab_size, half)  # (B, 2 half)
    guess = greedy_predictions(G, seq[:, :-1])  # (B, 2 half - 1)
    return float((guess[:, half:] == seq[:, half + 1:]).mean())


def attention_maps(G: GPTWeights, tokens) -> np.ndarray:
    """The weights S of every layer and head on one sequence.

    Book: chapter 21, "The two heads". tokens (n,) ids. Block by block,
    as ``gpt_forward`` computes it: the block's input X, its first layer
    norm, each head's Q_i = LN_1(X) W_Qi + b_Qi and K_i likewise, and
    chapter 3's ``attention_weights`` with the causal mask; then
    ``gpt_block`` gives the next block's input. Returns (L, h, n, n).
    """
    t = checks.token_ids(tokens, G.vocab_size, ndim=1)
    n = len(t)
    if not 1 <= n <= G.context_length:
        raise ValueError(f"a sequence of {n} tokens does not fit: it needs "
                         f"1 .. {G.context_length} (the context length)")
    X = G.E[t] + G.P[:n]  # (n, d_model)
    maps = []
    for block in G.blocks:
        W = block.attn
        a = layer_norm(X, block.gamma_1, block.beta_1)  # (n, d_model)
        Q = a @ W.W_Q + W.bias("b_Q")[:, None, :]  # (h, n, d_k)
        kv = np.arange(W.heads) // W.group  # each query head's K head
        K = (a @ W.W_K + W.bias("b_K")[:, None, :])[kv]  # (h, n, d_k)
        maps.append(attention_weights(Q, K, masks.causal(n)))  # (h, n, n)
        X = gpt_block(X, block)  # (n, d_model)
    return np.stack(maps)  # (L, h, n, n)
