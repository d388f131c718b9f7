import math

import numpy as np
import pytest

from mha_lit.encoding import embed, sinusoidal_encoding
from tests.shapes_for_tests import PRIME_DIMS


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_sinusoidal_encoding_shape_and_formula(dims):
    n, d = dims.tokens, dims.d_model
    P = sinusoidal_encoding(n, d)
    assert P.shape == (n, d)
    for pos in range(n):
        for j in range(d):
            angle = pos / 10000 ** (2 * (j // 2) / d)
            expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert P[pos, j] == pytest.approx(expected, abs=1e-15)


def test_sinusoidal_encoding_first_position_alternates_zero_one():
    P = sinusoidal_encoding(3, 5)
    assert np.array_equal(P[0], [0.0, 1.0, 0.0, 1.0, 0.0])
    assert np.all(np.abs(P) <= 1.0)
    # column pairs (sin, cos) of the same frequency lie on the unit circle
    assert np.allclose(P[:, 0] ** 2 + P[:, 1] ** 2, 1.0)
    assert np.allclose(P[:, 2] ** 2 + P[:, 3] ** 2, 1.0)


def test_sinusoidal_encoding_refuses_bad_sizes():
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_encoding(3, 0)
    with pytest.raises(ValueError, match="n must be a positive integer, got -1"):
        sinusoidal_encoding(-1, 5)
    with pytest.raises(TypeError, match="n must be a positive integer, got 3.0"):
        sinusoidal_encoding(3.0, 5)
    assert sinusoidal_encoding(np.int64(3), np.int32(5)).shape == (3, 5)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_encoding(3, 5, base=0)


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_embed_adds_rows_and_positions(dims):
    rng = np.random.default_rng(1)
    table = rng.standard_normal((13, dims.d_model))
    ids = rng.integers(0, 13, size=dims.tokens)
    X = embed(ids, table)
    assert X.shape == (dims.tokens, dims.d_model)
    for pos, t in enumerate(ids):
        assert np.allclose(X[pos] - table[t], sinusoidal_encoding(dims.tokens, dims.d_model)[pos])


def test_embed_same_token_different_positions_differ():
    table = np.zeros((2, 5))
    X = embed([1, 1, 1], table)
    assert not np.allclose(X[0], X[1]) and not np.allclose(X[1], X[2])


def test_embed_refuses_bad_ids_and_tables():
    table = np.ones((13, 5))
    with pytest.raises(ValueError, match=r"token_ids must lie in 0 \.\. 12 \(vocab_size = 13\), "
                       r"got ids -1 \.\. 14"):
        embed([0, 14, -1, 13], table)
    with pytest.raises(ValueError, match="token_ids must be 1-D"):
        embed([[0, 1]], table)
    with pytest.raises(TypeError, match="token_ids must be integer token ids"):
        embed([0.5], table)
    with pytest.raises(ValueError, match="token_ids must hold at least one token"):
        embed([], table)
    with pytest.raises(ValueError, match="2-D"):
        embed([0], np.ones(5))


def test_running_example_vocabulary_table_and_sentence():
    from mha_lit import VOCABULARY, embed, example_table, sentence

    assert len(VOCABULARY) == 13 and len(set(VOCABULARY)) == 13
    table = example_table(np.random.default_rng(2), 5)
    assert table.shape == (13, 5)
    assert np.array_equal(table, example_table(np.random.default_rng(2), 5))
    X = sentence(["the", "cat", "sat"], table)
    ids = [VOCABULARY.index(w) for w in ("the", "cat", "sat")]
    assert X.shape == (3, 5)
    assert np.array_equal(X, embed(ids, table))  # the same call on the same ids: identical
    # 4 positions against 3: elementwise sin and cos on arrays of other lengths, to rounding
    assert np.allclose(sentence(["the", "cat", "sat", "on"], table)[:3], X, rtol=0, atol=1e-15)


def test_running_example_refuses_bad_input():
    from mha_lit import example_table, sentence

    with pytest.raises(ValueError, match=r"words not in the vocabulary: \['dragon'\]"):
        sentence(["the", "dragon"], example_table(np.random.default_rng(0)))
    with pytest.raises(TypeError, match="numpy Generator, got int"):
        example_table(2)
