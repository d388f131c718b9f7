"""Multi-head latent attention (chapter 17): both computations, the cache, the costs."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import sympy as sp  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mha_lit import (  # noqa: E402
    Dims,
    Weights,
    counting,
    models,
    multi_head_attention,
    plots,
    symbolic,
)
from mha_lit.kv_cache import step_multiply_adds  # noqa: E402
from mha_lit.latent import (  # noqa: E402
    PUBLISHED,
    LatentDims,
    LatentKVCache,
    LatentWeights,
    init_latent_weights,
    latent_attend,
    latent_attention,
    latent_cache_bytes,
    latent_multiply_adds,
    latent_rows,
    mha_cache_bytes,
)
from mha_lit.rope import rotate  # noqa: E402
from mha_lit.trace import record_matmuls  # noqa: E402

TOL = 1e-12  # float64 rounding of sums of a few dozen terms of size about 1

# the book's sizes, and others of distinct primes (d_r even, as RoPE needs)
LATENT_DIMS = [
    LatentDims(),  # d_model 5, 2 heads, d_k 7, d_v 11, d_c 23, d_r 8
    LatentDims(d_model=3, heads=1, d_k=5, d_v=7, d_c=11, d_r=2),
    LatentDims(d_model=7, heads=3, d_k=2, d_v=13, d_c=5, d_r=4),
    LatentDims(d_model=11, heads=5, d_k=13, d_v=3, d_c=17, d_r=6),
    LatentDims(d_model=2, heads=7, d_k=3, d_v=5, d_c=19, d_r=10),
]


def _inputs(n, dims, seed=0):
    return np.random.default_rng(seed).standard_normal((n, dims.d_model))


@pytest.mark.parametrize("dims", LATENT_DIMS, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_absorbed_equals_rebuilt_keys_and_values(dims, causal):
    W = init_latent_weights(dims, seed=3)
    X = _inputs(9, dims, seed=4)
    Y_abs = latent_attention(X, W, causal, absorbed=True)
    Y_reb = latent_attention(X, W, causal, absorbed=False)
    assert Y_abs.shape == X.shape
    assert np.allclose(Y_abs, Y_reb, rtol=0, atol=TOL)
    assert not np.allclose(Y_abs, 0)


def test_batch_is_each_sequence_from_position_0():
    W = init_latent_weights(seed=1)
    X = np.random.default_rng(2).standard_normal((3, 4, 5))
    Y = latent_attention(X, W)
    assert Y.shape == (3, 4, 5)
    for b in range(3):
        assert np.allclose(Y[b], latent_attention(X[b], W), rtol=0, atol=TOL)


@pytest.mark.parametrize("dims", LATENT_DIMS, ids=str)
@pytest.mark.parametrize("absorbed", [True, False])
def test_cache_steps_equal_full_recomputation(dims, absorbed):
    W = init_latent_weights(dims, seed=5)
    X = _inputs(12, dims, seed=6)
    cache = LatentKVCache(W, capacity=1, absorbed=absorbed)  # forces growth
    Y_steps = np.stack([cache.step(x) for x in X])
    assert np.allclose(Y_steps, latent_attention(X, W), rtol=0, atol=TOL)
    # only [c | k_R] per token: the latent, then the rotary key at its position
    assert cache.rows.shape == (12, dims.d_c + dims.d_r) and len(cache) == 12
    assert np.allclose(cache.rows[:, :dims.d_c], X @ W.W_DKV, rtol=0, atol=TOL)
    assert np.allclose(cache.rows[:, dims.d_c:], rotate(X @ W.W_KR, np.arange(12)),
                       rtol=0, atol=TOL)
    with pytest.raises(ValueError):
        cache.rows[0, 0] = 1.0  # read-only


def test_extend_in_blocks_equals_full_computation():
    W = init_latent_weights(seed=7)
    X = _inputs(10, W.dims, seed=8)
    cache = LatentKVCache(W, capacity=2)
    Y = np.concatenate([cache.extend(X[:4]), cache.step(X[4])[None], cache.extend(X[5:])])
    assert np.allclose(Y, latent_attention(X, W), rtol=0, atol=TOL)
    assert np.allclose(cache.rows, latent_rows(X, W, np.arange(10)), rtol=0, atol=TOL)


def test_float32_input_and_weights():
    W = init_latent_weights(seed=9, dtype=np.float32)
    X = _inputs(5, W.dims, seed=1).astype(np.float32)
    cache = LatentKVCache(W)
    Y = cache.extend(X)
    assert Y.dtype == np.float32 and latent_attention(X, W).dtype == np.float32
    assert np.allclose(Y, latent_attention(X.astype(np.float64), W), atol=1e-5)
    assert cache.bytes_per_token() == 31 * 4


@given(n=st.integers(2, 9), cut=st.integers(1, 8), seed=st.integers(0, 2**16),
       absorbed=st.booleans())
def test_causality_row_t_depends_on_rows_up_to_t_only(n, cut, seed, absorbed):
    cut = min(cut, n - 1)  # rows 1..cut kept, rows cut+1..n perturbed
    W = init_latent_weights(seed=seed % 7)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 5))
    X2 = X.copy()
    X2[cut:] += rng.standard_normal((n - cut, 5))
    Y, Y2 = (latent_attention(A, W, absorbed=absorbed) for A in (X, X2))
    assert np.allclose(Y[:cut], Y2[:cut], rtol=0, atol=TOL)
    assert not np.allclose(Y[cut:], Y2[cut:], rtol=0, atol=TOL)


def test_without_the_rotary_part_it_is_multi_head_attention_with_product_weights():
    # W_QR = 0: the rotary scores vanish and MLA is MHA with W_K = W_DKV W_UK, W_V = W_DKV W_UV
    W = init_latent_weights(seed=11)
    s = W.dims
    W0 = LatentWeights(**{**W.arrays(), "W_QR": np.zeros_like(W.W_QR)})
    scale = np.sqrt(s.d_k / (s.d_k + s.d_r))  # MHA scales by 1/sqrt(d_k) instead
    W_mha = Weights(W_Q=W.W_Q * scale, W_K=W.W_DKV @ W.W_UK, W_V=W.W_DKV @ W.W_UV, W_O=W.W_O)
    X = _inputs(6, s, seed=12)
    assert np.allclose(latent_attention(X, W0), multi_head_attention(X, W_mha), rtol=0, atol=TOL)
    assert not np.allclose(latent_attention(X, W), multi_head_attention(X, W_mha), atol=1e-3)


def _step_log(W, X, absorbed):
    """Record the products of the decoding step for the last row of X."""
    cache = LatentKVCache(W)
    cache.extend(X[:-1])
    n = len(X)
    with record_matmuls() as log:
        x = log.track(X[-1:])  # (1, d_model)
        new = latent_rows(x, W, [n - 1])  # (1, d_c + d_r)
        L = np.concatenate([cache.rows, new])  # (n, d_c + d_r)
        y = latent_attend(x, L, W, absorbed=absorbed)
    return np.asarray(y)[0], log


@pytest.mark.parametrize("absorbed", [True, False])
def test_products_of_the_absorbed_path_never_form_a_key_or_value(absorbed):
    W = init_latent_weights(seed=13)
    s = W.dims
    X = _inputs(6, s, seed=14)
    y, log = _step_log(W, X, absorbed)
    assert np.allclose(y, latent_attention(X, W)[-1], rtol=0, atol=TOL)
    up = {W.W_UK[i].__array_interface__["data"][0]: "K" for i in range(s.heads)}
    up |= {W.W_UV[i].__array_interface__["data"][0]: "V" for i in range(s.heads)}
    # a key or value is rebuilt by (n, d_c) @ (d_c, d_k or d_v), W_UK or W_UV untransposed
    rebuilt = [r for r in log.records
               if r.b_address in up and r.a_shape == (6, s.d_c) and not r.b_transposed]
    if absorbed:
        assert rebuilt == []
        # W_UK is used transposed on the query side: (1, d_k) @ (d_k, d_c)
        assert sum(r.b_address in up and r.b_transposed for r in log.records) == s.heads
        assert all(r.out_shape[-2] == 1 for r in log.records)  # only the new row's products
    else:
        assert len(rebuilt) == 2 * s.heads  # K_i and V_i of every head


@pytest.mark.parametrize("dims", LATENT_DIMS[:3], ids=str)
@pytest.mark.parametrize("absorbed", [True, False])
def test_multiply_adds_formula_equals_recorded_products(dims, absorbed):
    W = init_latent_weights(dims, seed=15)
    X = _inputs(7, dims, seed=16)
    _, log = _step_log(W, X, absorbed)
    assert log.multiply_adds == latent_multiply_adds(1, 7, dims, absorbed)
    with record_matmuls() as full:
        latent_attention(full.track(X), W, absorbed=absorbed)
    assert full.multiply_adds == latent_multiply_adds(7, 7, dims, absorbed)


def test_absorption_costs_more_in_prefill_and_less_in_decoding_exactly():
    for dims in LATENT_DIMS + [PUBLISHED["deepseek-v3"]]:
        for mm, nn in [(1, 1), (1, 50), (3, 3), (40, 40)]:
            gap = latent_multiply_adds(mm, nn, dims, False) - latent_multiply_adds(mm, nn, dims, True)
            if mm == nn:  # prefill: the rebuilt keys' cost equals the query-side cost
                assert gap == nn * nn * dims.heads * (dims.d_k + dims.d_v - 2 * dims.d_c)
            else:  # one decoding step
                assert gap == dims.heads * (
                    (nn - 1) * dims.d_c * (dims.d_k + dims.d_v)
                    - nn * (2 * dims.d_c - dims.d_k - dims.d_v))


def test_associativity_behind_absorption_exactly():
    # scores: q (C W_UK)^T = (q W_UK^T) C^T; outputs: S (C W_UV) = (S C) W_UV
    q, C = symbolic.matrix("q", 1, 7), symbolic.matrix("c", 3, 23)
    W_UK, W_UV, S = symbolic.matrix("a", 23, 7), symbolic.matrix("b", 23, 11), symbolic.matrix("s", 3, 3)
    assert sp.expand(q * (C * W_UK).T - (q * W_UK.T) * C.T) == sp.zeros(1, 3)
    assert sp.expand(S * (C * W_UV) - (S * C) * W_UV) == sp.zeros(3, 11)
    # the same with integers in NumPy: exact, every partial sum is an integer
    rng = np.random.default_rng(0)
    qi, Ci, Wi = rng.integers(-9, 10, (1, 7)), rng.integers(-9, 10, (3, 23)), rng.integers(-9, 10, (23, 7))
    assert np.array_equal(qi @ (Ci @ Wi).T, (qi @ Wi.T) @ Ci.T)


def test_cache_bytes_for_published_sizes_and_consistency_with_chapter_12():
    v3 = PUBLISHED["deepseek-v3"]
    assert (v3.layers, v3.heads, v3.d_c, v3.d_r, v3.d_k, v3.d_v) == (61, 128, 512, 64, 128, 128)
    assert latent_cache_bytes(v3) == 61 * (512 + 64) * 2
    assert mha_cache_bytes(v3) == 2 * 61 * 128 * 128 * 2
    assert latent_cache_bytes(v3, tokens=1000, bytes_per_value=1) == 1000 * 61 * 576
    # multi-head attention's count is chapter 12's kv_cache_bytes for a GPT model
    gpt3 = models.PRESETS["gpt3-175b"]
    as_latent = LatentDims(d_model=gpt3.d_model, heads=gpt3.heads, d_k=gpt3.d_k,
                           d_v=gpt3.d_k, d_c=512, d_r=64, layers=gpt3.layers)
    assert mha_cache_bytes(as_latent, 2048) == counting.kv_cache_bytes(gpt3, 2048)
    # one decoding step of MHA: chapter 7's count, so the three can be compared
    d = Dims(tokens=1, d_model=5, d_k=7, d_v=11, heads=2)
    assert step_multiply_adds(4, d) == 2 * (5 * (2 * 7 + 11) + 4 * 18) + 2 * 11 * 5
    with pytest.raises(ValueError, match="tokens must be a positive integer"):
        latent_cache_bytes(v3, tokens=0)


def test_deepseek_v2_has_v3s_attention_sizes_in_a_narrower_shallower_model():
    v2, v3 = PUBLISHED["deepseek-v2"], PUBLISHED["deepseek-v3"]
    assert (v2.heads, v2.d_k, v2.d_v, v2.d_c, v2.d_r) == (v3.heads, v3.d_k, v3.d_v, v3.d_c, v3.d_r)
    assert (v2.layers, v2.d_model) == (60, 5120)


def test_latent_dims_of_a_configuration_needs_mla():
    cfg = models.DecoderConfig(3, 35, 5, 77, 13, 11, d_k=6, latent=models.LatentKV(d_c=9, d_r=4))
    assert LatentDims.of(cfg) == LatentDims(d_model=35, heads=5, d_k=6, d_v=6, d_c=9, d_r=4, layers=3)
    with pytest.raises(TypeError, match="needs the DecoderConfig of an MLA model, got GQA"):
        LatentDims.of(models.MODELS["llama3-8b"].config)
    with pytest.raises(TypeError, match="got MHA"):
        LatentDims.of(models.PRESETS["gpt3-175b"])


def test_init_is_reproducible_and_scaled_by_fan_in():
    dims = LatentDims(d_model=64, heads=3, d_k=32, d_v=16, d_c=256, d_r=8)
    W, W2 = init_latent_weights(dims, seed=1), init_latent_weights(dims, seed=1)
    assert all(np.array_equal(a, W2.arrays()[k]) for k, a in W.arrays().items())
    assert not np.array_equal(W.W_UK, init_latent_weights(dims, seed=2).W_UK)
    for name, fan_in in [("W_DKV", 64), ("W_UK", 256), ("W_UV", 256), ("W_Q", 64), ("W_O", 48)]:
        std = getattr(W, name).std()
        assert abs(std * np.sqrt(fan_in) - 1) < 0.1, name
    assert W.dims == dims.__class__(**{**dims.__dict__, "layers": 1})
    assert repr(W) == ("LatentWeights(d_model=64, heads=3, d_k=32, d_v=16, d_c=256, d_r=8, "
                       "dtype=float64)")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"W_UK": np.ones((2, 23, 6))}, r"W_Q has shape \(2, 5, 7\) but must be \(h, d_model, d_k\) = \(2, 5, 6\)"),
        ({"W_O": np.ones((21, 5))}, r"W_O has shape \(21, 5\) but must be \(h\*d_v, d_model\) = \(22, 5\)"),
        ({"W_KR": np.ones((5, 7)), "W_QR": np.ones((2, 5, 7))}, r"even d_r .* W_KR \(5, 7\)"),
        ({"W_DKV": np.ones((5, 23, 1))}, r"W_DKV must be 2-D, got shape \(5, 23, 1\)"),
        ({"W_UV": np.ones((3, 23, 11))}, r"W_UV has shape \(3, 23, 11\) but must be"),
    ],
)
def test_bad_weights_refused_with_shapes_named(change, message):
    arrays = init_latent_weights(seed=0).arrays()
    with pytest.raises(ValueError, match=message):
        LatentWeights(**{**arrays, **change})


def test_bad_sizes_refused():
    with pytest.raises(ValueError, match="d_r = 7 is odd"):
        LatentDims(d_r=7)
    with pytest.raises(ValueError, match="LatentDims.d_c must be a positive integer"):
        LatentDims(d_c=0)
    with pytest.raises(TypeError, match="dims must be LatentDims"):
        init_latent_weights(Dims())


@pytest.mark.parametrize(
    "X, error, message",
    [
        (np.ones((3, 4)), ValueError, r"X must be \(rows >= 1, d_model = 5\) to meet W_DKV \(5, 23\), got shape \(3, 4\)"),
        (np.ones(5), ValueError, r"X must be \(n, d_model\) or \(B, n, d_model\), got shape \(5,\)"),
        (np.ones((2, 3, 4)), ValueError, r"X must be \(B, n >= 1, d_model = 5\) .* got shape \(2, 3, 4\)"),
        (np.ones((2, 0, 5)), ValueError, r"got shape \(2, 0, 5\)"),
        (np.ones((0, 5)), ValueError, r"got shape \(0, 5\)"),
        (np.array([[1.0, np.nan, 0, 0, 0]]), ValueError, r"X of shape \(1, 5\) holds 1 NaN"),
        (np.array([list("abcde")]), TypeError, r"X must hold real numbers"),
    ],
)
def test_bad_input_refused_with_shapes_named(X, error, message):
    with pytest.raises(error, match=message):
        latent_attention(X, init_latent_weights(seed=0))


def test_bad_cache_input_refused_and_cache_unchanged():
    W = init_latent_weights(seed=0)
    cache = LatentKVCache(W)
    cache.extend(_inputs(3, W.dims))
    before = cache.rows.copy()
    for x, message in [(np.ones(4), r"one row x \(d_model,\) with d_model = 5, got shape \(4,\)"),
                       (np.ones((1, 5)), r"got shape \(1, 5\)")]:
        with pytest.raises(ValueError, match=message):
            cache.step(x)
    with pytest.raises(ValueError, match=r"X of shape \(2, 5\) holds 1 NaN"):
        cache.extend(np.array([[0.0] * 5, [np.nan] + [0.0] * 4]))
    assert len(cache) == 3 and np.array_equal(cache.rows, before)
    with pytest.raises(ValueError, match=r"rows must be \(n >= 3, d_c \+ d_r = 31\) for X \(3, 5\)"):
        latent_attend(np.ones((3, 5)), np.ones((2, 31)), W)
    with pytest.raises(ValueError, match=r"got rows of shape \(\)"):
        latent_attend(np.ones((3, 5)), 1.0, W)
    with pytest.raises(TypeError, match="W must be mha_lit.latent.LatentWeights"):
        latent_attention(np.ones((2, 3, 5)), W.arrays())
    with pytest.raises(TypeError, match="LatentKVCache needs LatentWeights"):
        LatentKVCache(W.arrays())
    with pytest.raises(ValueError, match="capacity must be a positive integer"):
        LatentKVCache(W, capacity=0)
    with pytest.raises(ValueError, match="RoPE base"):
        LatentKVCache(W, rope_base=1.0)


@pytest.mark.parametrize("heads,d_k,d_v,d_c,d_r", [(2, 7, 11, 23, 8), (1, 3, 5, 2, 4), (3, 2, 5, 7, 2)])
def test_latent_cache_cells_draws_one_cell_per_cached_number(heads, d_k, d_v, d_c, d_r):
    fig = plots.latent_cache_cells(heads, d_k, d_v, d_c, d_r)
    assert isinstance(fig, plt.Figure) and len(fig.axes) == 1
    ax = fig.axes[0]
    gids = [p.get_gid() for p in ax.patches]
    assert gids.count("key") == heads * d_k and gids.count("value") == heads * d_v
    assert gids.count("latent") == d_c and gids.count("rotary") == d_r
    assert len(gids) == heads * (d_k + d_v) + d_c + d_r
    texts = [t.get_text() for t in ax.texts]
    assert f"{heads * (d_k + d_v)} numbers" in texts and f"{d_c + d_r} numbers" in texts
    assert f"$c$ ({d_c})" in texts and f"$k_R$ ({d_r})" in texts
    assert f"$v_{{{heads}}}$ ({d_v})" in texts
    plt.close(fig)


def test_latent_cache_cells_refuses_bad_sizes():
    with pytest.raises(ValueError, match="d_c must be a positive integer, got 0"):
        plots.latent_cache_cells(d_c=0)
    with pytest.raises(TypeError, match="heads must be a positive integer, got True"):
        plots.latent_cache_cells(heads=True)
    with pytest.raises(ValueError, match="too long"):
        plots.latent_cache_cells(heads=128, d_k=128, d_v=128, d_c=512, d_r=64)


# --- mutation-test gaps (shared/reviews/mutation.md): a refusal and the 120-cell limit -------

def test_latent_multiply_adds_refuses_more_query_rows_than_positions():
    """n_new query rows attend to n >= n_new positions (latent-46); n_new = n, the prefill, is allowed."""
    dims = LatentDims()
    with pytest.raises(ValueError, match=r"n_new = 3 query rows need at least as many positions, got n = 2"):
        latent_multiply_adds(3, 2, dims)
    with pytest.raises(ValueError, match=r"got n = 1"):
        latent_multiply_adds(2, 1, dims, absorbed=False)
    assert latent_multiply_adds(3, 3, dims) > latent_multiply_adds(1, 3, dims) > 0


@pytest.mark.parametrize("sizes, mha, mla", [
    (dict(heads=2, d_k=30, d_v=30, d_c=8, d_r=8), 120, 16),  # MHA's row: exactly 120
    (dict(heads=1, d_k=3, d_v=5, d_c=112, d_r=8), 8, 120),  # MLA's row: exactly 120
])
def test_latent_cache_cells_draws_rows_of_exactly_120_cells(sizes, mha, mla):
    """The docstring: "At most 120 cells a row", so 120 is drawn (plots.part3-76)."""
    fig = plots.latent_cache_cells(**sizes)
    gids = [p.get_gid() for p in fig.axes[0].patches]
    assert gids.count("key") + gids.count("value") == mha
    assert gids.count("latent") + gids.count("rotary") == mla
    plt.close(fig)


@pytest.mark.parametrize("sizes, message", [
    (dict(heads=1, d_k=60, d_v=61, d_c=8, d_r=8), r"rows of 121 and 16 cells are too long \(at most 120\)"),
    (dict(heads=1, d_k=3, d_v=5, d_c=113, d_r=8), r"rows of 8 and 121 cells are too long \(at most 120\)"),
])
def test_latent_cache_cells_refuses_121_cells(sizes, message):
    with pytest.raises(ValueError, match=message):
        plots.latent_cache_cells(**sizes)
