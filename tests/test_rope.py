"""Rotary positions (mha_lit.rope) and attention with ``rope_base``: chapter 15's laws."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mha_lit import (  # noqa: E402
    Dims,
    KVCache,
    attention,
    init_weights,
    masks,
    multi_head_attention,
    plots,
    rope,
)
from mha_lit.shapes import Weights  # noqa: E402
from mha_lit.variants import reference

# even d_k (RoPE turns pairs), twice a prime where possible; the chapter's is the first
ROPE_DIMS = [
    Dims(d_k=14),                                              # the chapter: 7 planes
    Dims(tokens=2, d_model=3, d_k=2, d_v=7, heads=1),
    Dims(tokens=5, d_model=7, d_k=6, d_v=13, heads=3),
    Dims(tokens=7, d_model=11, d_k=22, d_v=2, heads=5),
    Dims(tokens=1, d_model=2, d_k=10, d_v=5, heads=7),
    Dims(tokens=13, d_model=17, d_k=26, d_v=23, heads=2),
    Dims(tokens=131, d_model=11, d_k=10, d_v=5, heads=3),      # more rows than one block
    Dims(tokens=11, d_model=7, d_k=10, d_v=3, heads=6, kv_heads=2),  # grouped queries
    Dims(tokens=19, d_model=5, d_k=6, d_v=11, heads=3, kv_heads=1),  # one K/V head
]
TOL = {np.float64: 1e-12, np.float32: 1e-5}
BASE = 10000.0

even_widths = st.integers(1, 13).map(lambda P: 2 * P)
bases = st.sampled_from([1.5, 100.0, 10000.0, 500000.0])


def _rows(seed, shape, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _plane_matrix(alpha):
    """Row-vector rotation: (a, b) @ R = (a cos - b sin, a sin + b cos)."""
    c, s = np.cos(alpha), np.sin(alpha)
    return np.array([[c, s], [-s, c]])


def _block_diagonal(p, d, base):
    """R_p for adjacent pairs (RoFormer): one 2 x 2 rotation per plane, written out."""
    R = np.zeros((d, d))
    for j in range(d // 2):
        R[2 * j:2 * j + 2, 2 * j:2 * j + 2] = _plane_matrix(p * base ** (-2 * j / d))
    return R


# --- rope.frequencies, rope.angles ------------------------------------------------------------

@pytest.mark.parametrize("d", [2, 6, 14, 128])
@pytest.mark.parametrize("base", [2.0, 10000.0, 500000.0])
def test_frequencies_are_base_to_minus_2i_over_d(d, base):
    omega = rope.frequencies(d, base)
    assert omega.shape == (d // 2,) and omega.dtype == np.float64
    assert omega[0] == 1.0  # base ** 0, exactly
    for i, w in enumerate(omega):
        assert abs(w - base ** (-2 * i / d)) <= 1e-15 * base ** (-2 * i / d) + 1e-300
    assert np.all(np.diff(omega) < 0)  # each plane turns slower than the one before
    assert np.allclose(omega[1:] / omega[:-1], base ** (-2 / d), rtol=1e-12, atol=0)


def test_angles_are_position_times_frequency():
    p = np.array([[0, 3, 7], [2, 5, 11]])  # (B, n)
    theta = rope.angles(p, 14)
    assert theta.shape == (2, 3, 7)
    assert np.array_equal(theta[..., 0], p)  # plane 1 turns one radian per position
    assert np.allclose(theta, p[..., None] * rope.frequencies(14), rtol=1e-15, atol=0)


# --- rope.rotate: the laws --------------------------------------------------------------------

@given(d=even_widths, n=st.integers(1, 9), base=bases, seed=st.integers(0, 10**6),
       interleaved=st.booleans())
def test_rotation_keeps_the_length_of_every_plane(d, n, base, seed, interleaved):
    x = _rows(seed, (n, d)) * 3
    p = np.random.default_rng(seed + 1).integers(-50, 5000, n)
    y = rope.rotate(x, p, base, interleaved=interleaved)
    P = d // 2
    pairs = (lambda r: (r[:, 0::2], r[:, 1::2])) if interleaved else \
        (lambda r: (r[:, :P], r[:, P:]))
    (a, b), (ra, rb) = pairs(x), pairs(y)
    assert np.allclose(ra**2 + rb**2, a**2 + b**2, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape", [(1, 2), (3, 14), (2, 5, 4, 6)])
def test_position_zero_is_exactly_the_identity(dtype, interleaved, shape):
    # cos 0 = 1 and sin 0 = 0 exactly, so a cos - b sin = a and a sin + b cos = b
    x = _rows(3, shape, dtype)
    y = rope.rotate(x, np.zeros(shape[-2], dtype=int), interleaved=interleaved)
    assert y.dtype == dtype and y.shape == x.shape
    assert np.array_equal(y, x)
    assert y is not x  # a new array


@given(d=even_widths, n=st.integers(1, 7), base=bases, seed=st.integers(0, 10**6),
       interleaved=st.booleans())
def test_rotating_by_p_then_q_is_rotating_by_p_plus_q(d, n, base, seed, interleaved):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    p, q = rng.integers(0, 3000, n), rng.integers(-3000, 3000, n)
    twice = rope.rotate(rope.rotate(x, p, base, interleaved), q, base, interleaved)
    # the angles (p + q) omega are rounded once, p omega and q omega separately: 1e-12 covers it
    assert np.allclose(twice, rope.rotate(x, p + q, base, interleaved), rtol=0, atol=1e-11)
    # and back: a rotation by -p undoes one by p
    back = rope.rotate(rope.rotate(x, p, base, interleaved), -p, base, interleaved)
    assert np.allclose(back, x, rtol=0, atol=1e-11)


@pytest.mark.parametrize("d", [2, 6, 14])
@pytest.mark.parametrize("p", [0, 1, 5, 1234])
def test_adjacent_pairs_are_the_block_diagonal_rotation_matrix(d, p):
    x = _rows(d + p, (4, d))
    expected = x @ _block_diagonal(p, d, BASE)  # (4, d), every plane written out
    assert np.allclose(rope.rotate(x, [p] * 4, interleaved=True), expected,
                       rtol=0, atol=1e-12)


@given(d=even_widths, base=bases, seed=st.integers(0, 10**6),
       m=st.integers(0, 4000), n=st.integers(0, 4000), shift=st.integers(-2000, 2000),
       interleaved=st.booleans())
def test_a_score_depends_on_the_difference_of_positions_only(d, base, seed, m, n, shift,
                                                             interleaved):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((1, d)), rng.standard_normal((1, d))

    def score(a, b):
        return float(rope.rotate(q, [a], base, interleaved)[0]
                     @ rope.rotate(k, [b], base, interleaved)[0])

    # the formula of one plane, summed: (q_a k_a + q_b k_b) cos + (q_a k_b - q_b k_a) sin
    P, omega = d // 2, rope.frequencies(d, base)
    (qa, qb), (ka, kb) = [((v[0, 0::2], v[0, 1::2]) if interleaved else (v[0, :P], v[0, P:]))
                          for v in (q, k)]
    angle = (m - n) * omega
    formula = np.sum((qa * ka + qb * kb) * np.cos(angle) + (qa * kb - qb * ka) * np.sin(angle))
    scale = np.abs(q).sum() * np.abs(k).sum()
    assert abs(score(m, n) - formula) <= 1e-11 * scale
    assert abs(score(m + shift, n + shift) - score(m, n)) <= 1e-11 * scale


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d", [2, 6, 14, 22, 128])
def test_the_two_conventions_differ_by_one_permutation_exactly(dtype, d):
    perm = rope.half_split_permutation(d)
    assert sorted(perm.tolist()) == list(range(d))  # a permutation
    assert perm.tolist() == list(range(0, d, 2)) + list(range(1, d, 2))
    x = _rows(d, (2, 3, 5, d), dtype) * 7
    p = np.random.default_rng(d).integers(0, 100_000, (2, 1, 5))  # a batch at its own offsets
    # the same products and sums of the same numbers: exactly equal, on any machine
    assert np.array_equal(rope.rotate(x[..., perm], p),
                          rope.rotate(x, p, interleaved=True)[..., perm])
    # moved into the weights: permuting both factors' columns leaves the scores as they were
    q, k = _rows(1, (5, d)), _rows(2, (5, d))
    s_adjacent = rope.rotate(q, np.arange(5), interleaved=True) @ \
        rope.rotate(k, np.arange(5), interleaved=True).T
    s_half = rope.rotate(q[:, perm], np.arange(5)) @ rope.rotate(k[:, perm], np.arange(5)).T
    assert np.allclose(s_half, s_adjacent, rtol=0, atol=1e-12)


def test_rotate_keeps_float32_and_turns_integers_into_float64():
    assert rope.rotate(np.ones((2, 4), np.float32), [0, 1]).dtype == np.float32
    y = rope.rotate(np.ones((2, 4), int), [0, 1])
    assert y.dtype == np.float64 and np.array_equal(y[0], np.ones(4))


# --- rope: refusals ----------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda: rope.rotate(np.ones((3, 7)), [0, 1, 2]),
    lambda: rope.frequencies(7),
    lambda: rope.angles([0, 1], 13),
    lambda: rope.half_split_permutation(5),
])
def test_an_odd_width_is_refused(call):
    with pytest.raises(ValueError, match=r"even"):
        call()


@pytest.mark.parametrize("positions, shown", [
    (np.arange(4), r"\(4,\)"),
    (np.arange(3)[:, None], r"\(3, 1\)"),  # would broadcast x to (3, 3, 14)
    (np.zeros((2, 3)), r"\(2, 3\)"),
])
def test_positions_that_do_not_fit_the_rows_are_refused_naming_both_shapes(positions, shown):
    with pytest.raises(ValueError, match=shown + r".*\(3, 14\).*shape \(3,\)"):
        rope.rotate(np.ones((3, 14)), positions)


@pytest.mark.parametrize("x, error, message", [
    (np.ones(14), ValueError, r"x \(\.\.\., n, d\), got shape \(14,\)"),
    (np.ones((3, 0)), ValueError, r"RoPE width d must be a positive integer, got 0"),
    (np.array([[True, False]]), TypeError, r"real numbers, got dtype bool"),
])
def test_bad_rows_are_refused(x, error, message):
    with pytest.raises(error, match=message):
        rope.rotate(x, [0] * (x.shape[0] if x.ndim > 1 else 1))


@pytest.mark.parametrize("positions, error", [
    ([0.0, np.nan, 1.0], ValueError), ([0, np.inf, 1], ValueError),
    (["a", "b", "c"], TypeError), ([True, False, True], TypeError),
])
def test_positions_must_be_finite_numbers(positions, error):
    with pytest.raises(error, match=r"positions"):
        rope.rotate(np.ones((3, 4)), positions)


@pytest.mark.parametrize("base", [1, 1.0, 0.5, 0, -10000.0, np.nan, np.inf, True, "10000"])
def test_a_base_that_is_not_a_real_number_above_1_is_refused(base):
    with pytest.raises(ValueError, match=r"base must be a real number > 1"):
        rope.check_base(base)
    with pytest.raises(ValueError, match=r"base must be a real number > 1"):
        rope.rotate(np.ones((1, 2)), [1], base)
    W = init_weights(Dims(d_k=14), seed=0)
    with pytest.raises(ValueError, match=r"base must be a real number > 1"):
        multi_head_attention(np.ones((3, 5)), W, rope_base=base)
    with pytest.raises(ValueError, match=r"base must be a real number > 1"):
        KVCache(W, rope_base=base)


def test_attention_with_rope_refuses_an_odd_d_k_naming_the_shape():
    W = init_weights(Dims(), seed=0)  # d_k = 7
    for run in (multi_head_attention, reference):
        with pytest.raises(ValueError, match=r"d_k must be even.*\(2, 5, 7\).*d_k = 7"):
            run(np.ones((3, 5)), W, rope_base=BASE)
    with pytest.raises(ValueError, match=r"even"):
        KVCache(W, rope_base=BASE)


# --- multi-head attention with rope_base -------------------------------------------------------

def _case(dims, seed=0, dtype=np.float64, biases=False, scale=1.0):
    W = init_weights(dims, seed=seed, dtype=dtype, biases=biases)
    X = (_rows(seed + 1, (dims.tokens, dims.d_model)) * scale).astype(dtype)
    return X, W


def _by_hand(X, W, base, offset=0, causal=True):
    """The chapter's definition, head by head: rotate Q_i and K_i after the bias, then attend.

    Positions offset .. offset + n - 1; query head i uses K/V head i // g.
    """
    positions = offset + np.arange(len(X))  # (n,)
    mask = masks.causal(len(X)) if causal else None
    heads = []
    for i in range(W.heads):
        j = i // W.group
        Q = X @ W.W_Q[i] + (W.b_Q[i] if W.has_biases else 0)  # (n, d_k)
        K = X @ W.W_K[j] + (W.b_K[j] if W.has_biases else 0)  # (n, d_k)
        V = X @ W.W_V[j] + (W.b_V[j] if W.has_biases else 0)  # (n, d_v): no rotation
        heads.append(attention(rope.rotate(Q, positions, base),
                               rope.rotate(K, positions, base), V, mask))
    return np.concatenate(heads, axis=1) @ W.W_O + (W.b_O if W.has_biases else 0)


@pytest.mark.parametrize("dims", ROPE_DIMS, ids=str)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("biases", [False, True])
def test_reference_fast_and_the_definition_agree(dims, causal, biases):
    X, W = _case(dims, seed=dims.tokens, biases=biases)
    Y = multi_head_attention(X, W, causal, rope_base=BASE)
    Y_ref = reference(X, W, causal, rope_base=BASE)
    assert Y.shape == X.shape
    assert np.allclose(Y, Y_ref, rtol=0, atol=1e-12)
    assert np.allclose(Y_ref, _by_hand(X, W, BASE, causal=causal), rtol=0, atol=1e-12)
    if dims.tokens > 1:  # the rotation is applied: some row differs from attention without it
        assert not np.allclose(Y, multi_head_attention(X, W, causal), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dims", ROPE_DIMS[:4], ids=str)
def test_float32_with_rope(dims):
    X, W = _case(dims, seed=3, dtype=np.float32)
    Y = multi_head_attention(X, W, rope_base=BASE)
    assert Y.dtype == np.float32
    assert np.allclose(Y, reference(X.astype(np.float64),
                                                         W.astype(np.float64),
                                                         rope_base=BASE), atol=1e-5)


@pytest.mark.parametrize("dims", [d for d in ROPE_DIMS if d.tokens >= 3], ids=str)
def test_rope_attention_stays_causal(dims):
    X, W = _case(dims, seed=5)
    Y = multi_head_attention(X, W, rope_base=BASE)
    t = dims.tokens // 2  # change every row after t
    X2 = X.copy()
    X2[t + 1:] = _rows(6, X2[t + 1:].shape)
    Y2 = multi_head_attention(X2, W, rope_base=BASE)
    assert np.allclose(Y2[:t + 1], Y[:t + 1], rtol=0, atol=1e-12)
    assert not np.allclose(Y2[t + 1:], Y[t + 1:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("dims", ROPE_DIMS, ids=str)
@pytest.mark.parametrize("offset", [1, 17, 1000, 10**5])
def test_shifting_every_position_leaves_the_output_unchanged(dims, offset):
    X, W = _case(dims, seed=7, biases=True)
    Y = multi_head_attention(X, W, rope_base=BASE)
    # angles near 1e5 radians carry rounding of about 1e5 * 2^-53; 1e-9 covers it
    assert np.allclose(_by_hand(X, W, BASE, offset=offset), Y, rtol=0, atol=1e-9)


@pytest.mark.parametrize("dims", ROPE_DIMS[:6], ids=str)
def test_half_split_with_permuted_W_Q_W_K_is_the_adjacent_pairs_model(dims):
    X, W = _case(dims, seed=11, biases=True)
    perm = rope.half_split_permutation(dims.d_k)
    positions = np.arange(dims.tokens)
    heads = []  # the adjacent-pairs (RoFormer) model, written out with W as it is
    for i in range(W.heads):
        Q = rope.rotate(X @ W.W_Q[i] + W.b_Q[i], positions, BASE, interleaved=True)
        K = rope.rotate(X @ W.W_K[i] + W.b_K[i], positions, BASE, interleaved=True)
        heads.append(attention(Q, K, X @ W.W_V[i] + W.b_V[i], masks.causal(len(X))))
    Y_adjacent = np.concatenate(heads, axis=1) @ W.W_O + W.b_O
    W_half = Weights(W.W_Q[..., perm], W.W_K[..., perm], W.W_V, W.W_O,
                     W.b_Q[..., perm], W.b_K[..., perm], W.b_V, W.b_O)
    assert np.allclose(multi_head_attention(X, W_half, rope_base=BASE), Y_adjacent,
                       rtol=0, atol=1e-12)
    if dims.tokens > 1 and dims.d_k > 2:  # without the permutation they differ (d = 2: none)
        assert not np.allclose(multi_head_attention(X, W, rope_base=BASE), Y_adjacent,
                               rtol=0, atol=1e-6)


def test_a_batch_with_a_key_mask_counts_positions_over_real_tokens():
    dims = Dims(tokens=6, d_model=5, d_k=14, d_v=11, heads=2)
    W = init_weights(dims, seed=13, biases=True)
    X = _rows(14, (3, 6, 5))
    mask = np.array([[True] * 6, [False, False, True, True, True, True],
                     [True, True, False, True, False, True]])
    for run in (multi_head_attention, reference):
        Y = run(X, W, key_mask=mask, rope_base=BASE)
        for b in range(3):
            real = mask[b]
            # a token's position is the number of real tokens before it: 0, 1, 2, ...
            assert np.allclose(Y[b][real], _by_hand(X[b][real], W, BASE), rtol=0, atol=1e-12)
            assert np.array_equal(Y[b][~real], np.zeros(((~real).sum(), 5)))


# --- the KV cache keeps rotated keys -----------------------------------------------------------

@pytest.mark.parametrize("dims", ROPE_DIMS, ids=str)
def test_cache_steps_and_extend_equal_full_recomputation(dims):
    X, W = _case(dims, seed=17, biases=True)
    X = np.concatenate([X, _rows(18, (9, dims.d_model))])  # a few more tokens
    full = multi_head_attention(X, W, rope_base=BASE)
    steps = KVCache(W, capacity=1, rope_base=BASE)  # forces the buffers to grow
    assert np.allclose(np.stack([steps.step(x) for x in X]), full, rtol=0, atol=1e-12)
    mixed = KVCache(W, rope_base=BASE)
    m = len(X) // 2
    Y = np.concatenate([mixed.extend(X[:m]), mixed.step(X[m])[None], mixed.extend(X[m + 1:])])
    assert np.allclose(Y, full, rtol=0, atol=1e-12)
    # each key rotated once, at its own position, and stored so
    positions = np.arange(len(X))
    for cache in (steps, mixed):
        assert len(cache) == len(X) and cache.keys.shape == (W.kv_heads, len(X), dims.d_k)
        for j in range(W.kv_heads):
            K = rope.rotate(X @ W.W_K[j] + W.b_K[j], positions, BASE)
            assert np.allclose(cache.keys[j], K, rtol=0, atol=1e-12)
            assert np.allclose(cache.values[j], X @ W.W_V[j] + W.b_V[j], rtol=0, atol=1e-12)


def test_cache_without_rope_base_is_not_rotated():
    X, W = _case(Dims(d_k=14), seed=19)
    cache = KVCache(W)
    assert not np.allclose(cache.extend(X), multi_head_attention(X, W, rope_base=BASE),
                           rtol=0, atol=1e-6)


@pytest.mark.parametrize("dims", [Dims(d_k=14),
                                  Dims(tokens=5, d_model=7, d_k=6, d_v=13, heads=6, kv_heads=3)],
                         ids=str)
def test_batched_cache_with_a_key_mask_equals_each_sequence_recomputed(dims):
    W = init_weights(dims, seed=23, biases=True)
    B, m = 3, 5
    prompt = _rows(24, (B, m, dims.d_model))
    mask = np.array([[True] * 5, [False, False, True, True, True], [False] * 4 + [True]])
    cache = KVCache(W, capacity=2, batch=B, rope_base=BASE)
    out = cache.extend(prompt, key_mask=mask)
    later = _rows(25, (4, B, dims.d_model))  # four steps, one row per sequence each
    steps = np.stack([cache.step(x) for x in later], axis=1)  # (B, 4, d_model)
    for b in range(B):
        real = mask[b]
        seq = np.concatenate([prompt[b][real], later[:, b]])  # what sequence b has seen
        full = multi_head_attention(seq, W, rope_base=BASE)  # positions 0, 1, ...
        assert np.allclose(out[b][real], full[:real.sum()], rtol=0, atol=1e-12)
        assert np.array_equal(out[b][~real], np.zeros(((~real).sum(), dims.d_model)))
        assert np.allclose(steps[b], full[real.sum():], rtol=0, atol=1e-12)
    # the same outputs as the batched full computation with the mask
    X_all = np.concatenate([prompt, later.transpose(1, 0, 2)], axis=1)  # (B, m + 4, d_model)
    mask_all = np.concatenate([mask, np.ones((B, 4), bool)], axis=1)
    Y_all = multi_head_attention(X_all, W, key_mask=mask_all, rope_base=BASE)
    assert np.allclose(Y_all[:, m:], steps, rtol=0, atol=1e-12)


# --- the figure ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cols, error", [(0, ValueError), (2.0, TypeError), (True, TypeError)])
def test_rope_planes_refuses_a_bad_number_of_columns(cols, error):
    with pytest.raises(error, match="cols must be a positive integer"):
        plots.rope_planes(4, [0, 1], cols=cols)


@pytest.mark.parametrize("d, positions, cols", [(14, range(11), 4), (6, [0, 3, 5, 40], 2),
                                                (2, [7], 4)])
def test_rope_planes_draws_each_plane_at_each_position(d, positions, cols):
    fig = plots.rope_planes(d, positions, cols=cols)
    assert isinstance(fig, plt.Figure)
    P, pos = d // 2, np.asarray(positions)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.collections
              and ax.collections[0].get_gid() == "positions"]
    assert len(panels) == P
    omega = BASE ** (-2 * np.arange(P) / d)  # the formula, not rope.frequencies
    for j, ax in enumerate(panels):
        dots = ax.collections[0].get_offsets()  # (n, 2)
        assert dots.shape == (len(pos), 2)
        assert np.allclose(dots, np.c_[np.cos(pos * omega[j]), np.sin(pos * omega[j])],
                           rtol=0, atol=1e-12)
        assert np.array_equal(ax.collections[0].get_array(), pos)  # coloured by position
        title = ax.get_title()
        assert title.startswith(f"plane {j + 1}\n") and f"{omega[j]:.3g}" in title
        assert [ln.get_gid() for ln in ax.lines].count("circle") == 1
    hidden = [ax for ax in fig.axes if not ax.get_visible()]
    assert len(hidden) == -(-P // min(cols, P)) * min(cols, P) - P  # unused grid cells
    plt.close(fig)


def test_rope_planes_titles_give_the_wavelength():
    fig = plots.rope_planes(14, range(3))
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert titles[0].endswith("2π/ω = 6.3")  # plane 1: one radian a position, 2 pi a turn
    assert titles[-1].endswith(f"2π/ω = {2 * np.pi * 10000 ** (12 / 14):,.0f}")
    plt.close(fig)


@pytest.mark.parametrize("kwargs, message", [
    (dict(d=7), r"even"), (dict(positions=[]), r"non-empty 1-D.*\(0,\)"),
    (dict(positions=np.zeros((2, 3))), r"\(2, 3\)"), (dict(cols=0), r"cols"),
    (dict(base=1.0), r"base"),
])
def test_rope_planes_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plots.rope_planes(**kwargs)
