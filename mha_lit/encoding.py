"""From tokens to the input X: token embeddings plus a positional encoding.

Book: Part I, chapter 2 "From input to output". Letters in shape
comments: n tokens, d_model the width of a token vector, n_vocab the number
of rows of the embedding table (13 words in the book).
"""

from __future__ import annotations

import numpy as np

from . import checks

__all__ = ["sinusoidal_encoding", "embed", "VOCABULARY", "example_table",
           "sentence"]

# The running example's vocabulary: 13 words, a prime like every size in
# the book, so the embedding table is (13, d_model).
VOCABULARY = ("<end>", "a", "cat", "dog", "mat", "on", "ran", "sat", "saw",
              "the", "to", "under", "was")


def sinusoidal_encoding(n: int, d_model: int,
                        base: float = 10000.0) -> np.ndarray:
    """Sinusoidal positional encoding. Book: chapter 2, "Positional encoding".

    P is (n, d_model), after Vaswani et al. (2017). In Python's indices,
    from 0: row p (the book's token t = p + 1) and column col hold
    sin(p / base^(2 (col // 2) / d_model)) for even col and the cosine of
    the same angle for odd col; the book's pair j is columns 2j - 2 and
    2j - 1. An odd d_model (5 in the book) simply ends on a sine column.
    """
    n = checks.positive_int(n, "n")
    d_model = checks.positive_int(d_model, "d_model")
    if not base > 0:
        raise ValueError(f"sinusoidal_encoding needs a positive base, "
                         f"got {base!r}")
    p = np.arange(n)[:, None]  # (n, 1)
    col = np.arange(d_model)[None, :]  # (1, d_model)
    angle = p / float(base) ** (2 * (col // 2) / d_model)  # (n, d_model)
    return np.where(col % 2 == 0, np.sin(angle), np.cos(angle))  # (n, d_model)


def embed(token_ids, table) -> np.ndarray:
    """X = table[token_ids] + P. Book: chapter 2, "The input X".

    ``token_ids`` is a 1-D sequence of n integer ids, ``table`` an
    (n_vocab, d_model) embedding table; the result X is (n, d_model).
    """
    table = checks.float_array(table, "embedding table", ndim=2)
    n_vocab, d_model = table.shape
    if np.size(token_ids) == 0:
        raise ValueError("token_ids must hold at least one token")
    ids = checks.token_ids(token_ids, n_vocab, "token_ids", ndim=1)
    E = table[ids]  # (n, d_model): one embedding row per token
    return E + sinusoidal_encoding(len(ids), d_model)  # (n, d_model)


def example_table(rng: np.random.Generator,
                  d_model: int = 5) -> np.ndarray:
    """The running example's embedding table, (13, d_model).

    Book: chapter 2, "Tokens become vectors". One row of N(0, 1/4)
    numbers per word of VOCABULARY, drawn from ``rng``. Chapters 2-7 draw
    it first from ``np.random.default_rng(2)``, so they share the same X.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"example_table needs a numpy Generator, got "
                        f"{type(rng).__name__}")
    return rng.standard_normal((len(VOCABULARY), d_model)) / 2  # (13, d)


def sentence(words, table) -> np.ndarray:
    """X for a sentence of VOCABULARY words. Book: chapter 2, "The input X".

    Looks each word up in VOCABULARY and returns ``embed(ids, table)``:
    embedding rows plus positions, (n, d_model).
    """
    unknown = [w for w in words if w not in VOCABULARY]
    if unknown:
        raise ValueError(f"words not in the vocabulary: {unknown}; "
                         f"VOCABULARY has {len(VOCABULARY)} words")
    ids = [VOCABULARY.index(w) for w in words]  # n token ids
    return embed(ids, table)  # (n, d_model)
