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


# --- DeepSeek-V3's attention exactly as released (chapter 17, last section) --------------

import dataclasses  # noqa: E402
import math  # noqa: E402

from mha_lit import rope  # noqa: E402
from mha_lit.latent import (  # noqa: E402
    CHECKPOINT_NAMES,
    checkpoint_shapes,
    from_checkpoint,
    query_rows,
    rms_norm,
)

# DeepSeek-V3's config.json (published data): the values the attention reads
V3_CONFIG = {
    "hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "max_position_embeddings": 163840, "attention_bias": False,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
}
# HF's names (the safetensors files) -> DeepSeek's inference/model.py names (its convert.py)
DEEPSEEK_NAMES = {"q_a_proj": "wq_a", "q_a_layernorm": "q_norm", "q_b_proj": "wq_b",
                  "kv_a_proj_with_mqa": "wkv_a", "kv_a_layernorm": "kv_norm",
                  "kv_b_proj": "wkv_b", "o_proj": "wo", "q_proj": "wq"}


def _small_config(**change):
    """A DeepSeek-V3 config.json with small, distinct sizes; YaRN with a short trained length."""
    cfg = {"hidden_size": 11, "num_attention_heads": 3, "q_lora_rank": 13, "kv_lora_rank": 17,
           "qk_nope_head_dim": 5, "qk_rope_head_dim": 8, "v_head_dim": 7, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "max_position_embeddings": 40 * 64, "attention_bias": False,
           "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                            "mscale": 1.0, "mscale_all_dim": 1.0,
                            "original_max_position_embeddings": 64}}
    return cfg | change


SMALL_CONFIGS = {
    "v3-like": _small_config(),
    "half-split": _small_config(rope_interleave=False),
    "no-query-latent": _small_config(q_lora_rank=None),
    "no-scaling": _small_config(rope_scaling=None, rope_theta=500.0),
    "mscale-differs": _small_config(rope_scaling={
        "rope_type": "yarn", "factor": 16.0, "mscale": 0.5, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 8}, max_position_embeddings=16 * 8,
        hidden_size=6, num_attention_heads=2, qk_rope_head_dim=6),
    "linear": _small_config(rope_scaling={"type": "linear", "factor": 4.0}),
}


def _released_tensors(cfg, seed=0):
    """Random tensors in the released layout: (out, in) weights, norm scales near 1."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in checkpoint_shapes(cfg).items():
        if name.endswith("layernorm.weight"):
            out[name] = rng.uniform(0.5, 1.5, shape)
        else:
            out[name] = rng.standard_normal(shape) / np.sqrt(shape[1])
    return out


def _hf_rms_norm(h, weight, eps=1e-6):
    """DeepseekV3RMSNorm.forward: h * rsqrt(mean(h^2) + eps), then weight * h."""
    variance = np.mean(h**2, axis=-1, keepdims=True)
    return weight * (h * (1.0 / np.sqrt(variance + eps)))


def _hf_inv_freq(cfg):
    """transformers' ROPE_INIT_FUNCTIONS (default, linear, _compute_yarn_parameters), float64."""
    dim, base = cfg["qk_rope_head_dim"], float(cfg["rope_theta"])
    pos_freqs = base ** (np.arange(0, dim, 2) / dim)
    rs = cfg.get("rope_scaling")
    if rs is None:
        return 1.0 / pos_freqs, 1.0
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return 1.0 / pos_freqs / rs["factor"], 1.0
    assert kind == "yarn"
    orig = rs["original_max_position_embeddings"]
    factor = cfg["max_position_embeddings"] / orig  # as HF: the ratio stands for `factor`
    mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    else:
        attention_factor = get_mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def find_correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(find_correction_dim(beta_fast)), 0)
    high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, attention_factor


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _hf_attention(x, t, cfg):
    """A line-by-line NumPy transcription of transformers' DeepseekV3Attention.forward
    (eager attention, causal mask, one sequence at positions 0 .. n-1)."""
    n = len(x)
    H, nope, rope_d, v_d = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"],
                            cfg["qk_rope_head_dim"], cfg["v_head_dim"])
    kv_lora, qk = cfg["kv_lora_rank"], nope + rope_d
    if cfg["q_lora_rank"] is None:
        q_states = x @ t["q_proj.weight"].T
    else:
        q_states = _hf_rms_norm(x @ t["q_a_proj.weight"].T, t["q_a_layernorm.weight"]) @ (
            t["q_b_proj.weight"].T)
    q_states = q_states.reshape(n, H, qk).transpose(1, 0, 2)  # (H, n, qk)
    q_pass, q_rot = q_states[..., :nope], q_states[..., nope:]
    compressed_kv = x @ t["kv_a_proj_with_mqa.weight"].T
    k_pass, k_rot = compressed_kv[:, :kv_lora], compressed_kv[:, kv_lora:]
    k_pass = (_hf_rms_norm(k_pass, t["kv_a_layernorm.weight"]) @ t["kv_b_proj.weight"].T)
    k_pass = k_pass.reshape(n, H, nope + v_d).transpose(1, 0, 2)
    k_pass, value_states = k_pass[..., :nope], k_pass[..., nope:]
    k_rot = k_rot[None]  # (1, n, rope)
    inv_freq, attention_scaling = _hf_inv_freq(cfg)
    freqs = np.arange(n)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb) * attention_scaling, np.sin(emb) * attention_scaling
    if cfg.get("rope_interleave", True):  # apply_rotary_pos_emb_interleave
        q_rot = q_rot.reshape(H, n, rope_d // 2, 2).swapaxes(-1, -2).reshape(H, n, rope_d)
        k_rot = k_rot.reshape(1, n, rope_d // 2, 2).swapaxes(-1, -2).reshape(1, n, rope_d)
    q_rot = q_rot * cos + _rotate_half(q_rot) * sin
    k_rot = k_rot * cos + _rotate_half(k_rot) * sin
    k_rot = np.broadcast_to(k_rot, (H, n, rope_d))
    query_states = np.concatenate([q_pass, q_rot], axis=-1)
    key_states = np.concatenate([k_pass, k_rot], axis=-1)
    scaling = qk ** (-0.5)
    rs = cfg.get("rope_scaling")
    if rs is not None:
        mscale_all_dim = rs.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = 0.1 * mscale_all_dim * math.log(rs["factor"]) + 1.0  # yarn_get_mscale
            scaling = scaling * m * m
    attn = query_states @ key_states.swapaxes(-1, -2) * scaling
    attn = attn + np.triu(np.full((n, n), -np.inf), 1)
    attn = np.exp(attn - attn.max(axis=-1, keepdims=True))
    attn = attn / attn.sum(axis=-1, keepdims=True)
    out = (attn @ value_states).transpose(1, 0, 2).reshape(n, H * v_d)
    return out @ t["o_proj.weight"].T


def _deepseek_absorb(x, t, cfg, mscale=1.0, max_seq_len=4096 * 4):
    """A NumPy transcription of DeepSeek-V3's inference/model.py, MLA with attn_impl "absorb"
    (complex rotation of adjacent pairs, YaRN from precompute_freqs_cis, its softmax_scale)."""
    w = {DEEPSEEK_NAMES[k.split(".")[0]]: v for k, v in t.items()}
    n = len(x)
    H, nope, rope_d, v_d = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"],
                            cfg["qk_rope_head_dim"], cfg["v_head_dim"])
    kv_lora, rs = cfg["kv_lora_rank"], cfg["rope_scaling"]
    base, factor = float(cfg["rope_theta"]), rs["factor"]
    orig, beta_fast, beta_slow = (rs["original_max_position_embeddings"], rs["beta_fast"],
                                  rs["beta_slow"])

    def find_correction_dim(num_rotations):
        return rope_d * math.log(orig / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    freqs = 1.0 / (base ** (np.arange(0, rope_d, 2) / rope_d))
    if max_seq_len > orig:
        low = max(math.floor(find_correction_dim(beta_fast)), 0)
        high = min(math.ceil(find_correction_dim(beta_slow)), rope_d - 1)
        if low == high:
            high += 0.001
        smooth = 1 - np.clip((np.arange(rope_d // 2) - low) / (high - low), 0, 1)
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    freqs_cis = np.exp(1j * np.outer(np.arange(n), freqs))  # (n, rope/2)

    def apply_rotary_emb(a, f):  # a (n, ..., rope): adjacent pairs as complex numbers
        z = (a[..., 0::2] + 1j * a[..., 1::2]) * f
        return np.stack([z.real, z.imag], axis=-1).reshape(a.shape)

    def rms(a, weight, eps=1e-6):  # F.rms_norm
        return a / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + eps) * weight

    softmax_scale = (nope + rope_d) ** -0.5
    if max_seq_len > orig:
        softmax_scale *= (0.1 * mscale * math.log(factor) + 1.0) ** 2
    q = (x @ w["wq"].T if cfg["q_lora_rank"] is None
         else rms(x @ w["wq_a"].T, w["q_norm"]) @ w["wq_b"].T).reshape(n, H, nope + rope_d)
    q_nope, q_pe = q[..., :nope], apply_rotary_emb(q[..., nope:], freqs_cis[:, None, :])
    kv = x @ w["wkv_a"].T
    kv, k_pe = kv[:, :kv_lora], apply_rotary_emb(kv[:, kv_lora:], freqs_cis)
    wkv_b = w["wkv_b"].reshape(H, -1, kv_lora)
    q_nope = np.einsum("shd,hdc->shc", q_nope, wkv_b[:, :nope])
    kv_cache, pe_cache = rms(kv, w["kv_norm"]), k_pe
    scores = (np.einsum("shc,tc->sht", q_nope, kv_cache)
              + np.einsum("shr,tr->sht", q_pe, pe_cache)) * softmax_scale
    scores = scores + np.triu(np.full((n, n), -np.inf), 1)[:, None, :]
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores = scores / scores.sum(axis=-1, keepdims=True)
    out = np.einsum("sht,tc->shc", scores, kv_cache)
    out = np.einsum("shc,hdc->shd", out, wkv_b[:, -v_d:])
    return out.reshape(n, H * v_d) @ w["wo"].T


@pytest.mark.parametrize("name", list(SMALL_CONFIGS))
@pytest.mark.parametrize("absorbed", [True, False])
def test_from_checkpoint_computes_what_hugging_faces_deepseek_v3_attention_computes(name, absorbed):
    cfg = SMALL_CONFIGS[name]
    t = _released_tensors(cfg, seed=21)
    X = np.random.default_rng(22).standard_normal((12, cfg["hidden_size"]))
    W = from_checkpoint(t, cfg)
    Y_hf = _hf_attention(X, t, cfg)
    Y = latent_attention(X, W, absorbed=absorbed, rope_base=cfg["rope_theta"])
    assert np.allclose(Y, Y_hf, rtol=0, atol=TOL), np.abs(Y - Y_hf).max()
    assert np.abs(Y_hf).max() > 0.1  # not a comparison of two near-zero arrays


@pytest.mark.parametrize("absorbed", [True, False])
def test_cache_of_a_released_layer_equals_hugging_faces_full_computation(absorbed):
    cfg = SMALL_CONFIGS["v3-like"]
    t = _released_tensors(cfg, seed=23)
    X = np.random.default_rng(24).standard_normal((11, cfg["hidden_size"]))
    cache = LatentKVCache(from_checkpoint(t, cfg), capacity=2, absorbed=absorbed,
                          rope_base=cfg["rope_theta"])
    Y = np.concatenate([cache.extend(X[:4]), cache.step(X[4])[None], cache.extend(X[5:])])
    assert np.allclose(Y, _hf_attention(X, t, cfg), rtol=0, atol=TOL)


@pytest.mark.parametrize("name", ["v3-like", "no-query-latent"])
def test_deepseeks_own_absorbed_code_agrees_for_v3s_settings(name):
    # inference/model.py: interleaved pairs as complex numbers, its own mscale (1.0 by default)
    cfg = SMALL_CONFIGS[name]
    t = _released_tensors(cfg, seed=25)
    X = np.random.default_rng(26).standard_normal((9, cfg["hidden_size"]))
    Y_ds = _deepseek_absorb(X, t, cfg)
    assert np.allclose(Y_ds, _hf_attention(X, t, cfg), rtol=0, atol=TOL)
    Y = latent_attention(X, from_checkpoint(t, cfg))
    assert np.allclose(Y, Y_ds, rtol=0, atol=TOL)


def test_deepseeks_code_turns_yarn_off_for_runs_within_the_trained_length():
    # its max_seq_len (16,384 by default) decides; Hugging Face's applies YaRN whenever configured
    cfg = SMALL_CONFIGS["v3-like"]  # trained length 64
    t = _released_tensors(cfg, seed=40)
    X = np.random.default_rng(41).standard_normal((9, cfg["hidden_size"]))
    off = _deepseek_absorb(X, t, cfg, max_seq_len=64)
    assert np.allclose(off, _hf_attention(X, t, {**cfg, "rope_scaling": None}), rtol=0, atol=TOL)
    assert not np.allclose(off, _hf_attention(X, t, cfg), atol=1e-3)


def test_rebuilt_absorbed_and_cache_agree_with_norms_query_latent_interleaving_and_yarn():
    dims = LatentDims(d_model=5, heads=2, d_k=7, d_v=11, d_c=23, d_r=8, d_cq=29)
    rng = np.random.default_rng(27)
    W = dataclasses.replace(
        init_latent_weights(dims, seed=28), gamma_Q=rng.uniform(0.5, 1.5, 29),
        gamma_KV=rng.uniform(0.5, 1.5, 23), interleaved=True,
        rope_scaling={"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                      "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 16})
    X = _inputs(20, dims, seed=29)
    Y_abs, Y_reb = latent_attention(X, W), latent_attention(X, W, absorbed=False)
    cache = LatentKVCache(W, capacity=1)
    Y_steps = np.stack([cache.step(x) for x in X])
    assert np.allclose(Y_abs, Y_reb, rtol=0, atol=TOL)
    assert np.allclose(Y_steps, Y_abs, rtol=0, atol=TOL)
    # the cache keeps the normalised latent and the YaRN-turned, interleaved rotary key
    C = rms_norm(X @ W.W_DKV, W.gamma_KV)
    assert np.allclose(cache.rows[:, :23], C, rtol=0, atol=TOL)
    K_R = rope.rotate_scaled(X @ W.W_KR, np.arange(20), 10000.0, dict(W.rope_scaling),
                             interleaved=True)
    assert np.allclose(cache.rows[:, 23:], K_R, rtol=0, atol=TOL)
    assert np.allclose(np.sqrt(np.mean(cache.rows[:, :23] ** 2 / W.gamma_KV**2, axis=1)), 1,
                       rtol=0, atol=1e-5)  # each row's root mean square is 1 before gamma
    # and each feature matters: leaving any out changes the output
    for change in ({"gamma_KV": None}, {"gamma_Q": None}, {"interleaved": False},
                   {"rope_scaling": None}):
        assert not np.allclose(latent_attention(X, dataclasses.replace(W, **change)), Y_abs,
                               atol=1e-6), change


def test_interleaving_is_a_permutation_of_the_rotary_columns():
    W = dataclasses.replace(init_latent_weights(seed=30), interleaved=True)
    perm = rope.half_split_permutation(W.dims.d_r)
    half = dataclasses.replace(W, W_QR=W.W_QR[..., perm], W_KR=W.W_KR[:, perm], interleaved=False)
    X = _inputs(8, W.dims, seed=31)
    assert np.allclose(latent_attention(X, W), latent_attention(X, half), rtol=0, atol=TOL)
    rows, rows_half = latent_rows(X, W, np.arange(8)), latent_rows(X, half, np.arange(8))
    assert np.array_equal(rows[:, :23], rows_half[:, :23])  # exact: the same products
    # the same rotary keys in other columns (to rounding: W_KR's columns are multiplied apart)
    assert np.allclose(rows[:, 23:][:, perm], rows_half[:, 23:], rtol=0, atol=TOL)


def test_deepseek_v3_score_scale_is_mscale_squared_over_sqrt_192():
    W = from_checkpoint(_released_tensors(SMALL_CONFIGS["v3-like"]), SMALL_CONFIGS["v3-like"])
    m = 0.1 * math.log(40) + 1
    assert W.score_scale == pytest.approx(m**2 / math.sqrt(5 + 8), rel=1e-15)
    assert abs(m**2 - 1.8739) < 5e-5 and rope.yarn_mscale(40, 1.0) == pytest.approx(m)
    assert rope.attention_factor(V3_CONFIG["rope_scaling"]) == 1.0  # no factor on cos and sin
    v3_scale = m**2 / math.sqrt(128 + 64)
    assert v3_scale == pytest.approx(0.135234, abs=1e-6)
    assert init_latent_weights().score_scale == 1 / math.sqrt(15)


def test_checkpoint_shapes_of_deepseek_v3():
    shapes = checkpoint_shapes(V3_CONFIG)
    assert list(shapes) == list(CHECKPOINT_NAMES)
    assert shapes == {"q_a_proj.weight": (1536, 7168), "q_a_layernorm.weight": (1536,),
                      "q_b_proj.weight": (128 * 192, 1536),
                      "kv_a_proj_with_mqa.weight": (576, 7168),
                      "kv_a_layernorm.weight": (512,), "kv_b_proj.weight": (128 * 256, 512),
                      "o_proj.weight": (7168, 128 * 128)}
    assert sum(math.prod(s) for s in shapes.values()) == 187_107_328
    no_q = checkpoint_shapes({**V3_CONFIG, "q_lora_rank": None})
    assert no_q["q_proj.weight"] == (128 * 192, 7168) and "q_a_proj.weight" not in no_q


def test_from_checkpoint_maps_every_tensor_to_the_books_layout():
    cfg = SMALL_CONFIGS["v3-like"]
    t = _released_tensors(cfg, seed=32)
    W = from_checkpoint(t, cfg)
    assert W.dims == LatentDims(d_model=11, heads=3, d_k=5, d_v=7, d_c=17, d_r=8, d_cq=13)
    assert repr(W.dims).endswith("d_r=8, layers=1, d_cq=13)") and "d_cq" not in repr(LatentDims())
    assert W.interleaved and W.rope_scaling["factor"] == 40 and W.eps == 1e-6
    assert np.array_equal(W.W_DQ, t["q_a_proj.weight"].T)
    assert np.array_equal(W.gamma_Q, t["q_a_layernorm.weight"])
    qb = t["q_b_proj.weight"]  # rows: head 0's [nope | rope], head 1's, ...
    assert np.array_equal(W.W_Q[1], qb[13:18].T) and np.array_equal(W.W_QR[1], qb[18:26].T)
    kva = t["kv_a_proj_with_mqa.weight"]
    assert np.array_equal(W.W_DKV, kva[:17].T) and np.array_equal(W.W_KR, kva[17:].T)
    kvb = t["kv_b_proj.weight"]  # rows: head 0's [k_nope | v], head 1's, ...
    assert np.array_equal(W.W_UK[2], kvb[24:29].T) and np.array_equal(W.W_UV[2], kvb[29:36].T)
    assert np.array_equal(W.W_O, t["o_proj.weight"].T)
    assert repr(W) == ("LatentWeights(d_model=11, heads=3, d_k=5, d_v=7, d_c=17, d_r=8, "
                       "d_cq=13, gamma_Q, gamma_KV, interleaved, rope_scaling='yarn', "
                       "dtype=float64)")
    X = np.random.default_rng(33).standard_normal((4, 11))
    assert np.allclose(query_rows(X, W), rms_norm(X @ W.W_DQ, W.gamma_Q), rtol=0, atol=TOL)


def test_fp8_block_scales_are_applied():
    cfg = _small_config(quantization_config={"weight_block_size": [4, 4]})
    t = _released_tensors(cfg, seed=34)
    rng = np.random.default_rng(35)
    scaled = dict(t)
    for name in CHECKPOINT_NAMES:
        if name.endswith("proj.weight"):
            rows, cols = t[name].shape
            s = rng.uniform(0.5, 2.0, (-(-rows // 4), -(-cols // 4)))
            scaled[name] = t[name] / np.kron(s, np.ones((4, 4)))[:rows, :cols]
            scaled[name.replace(".weight", ".weight_scale_inv")] = s
    W, W_q = from_checkpoint(t, cfg), from_checkpoint(scaled, cfg)
    for name, a in W.arrays().items():
        assert np.allclose(getattr(W_q, name), a, rtol=1e-14, atol=0), name
    bad = {**scaled, "o_proj.weight_scale_inv": np.ones((2, 2))}
    with pytest.raises(ValueError, match=r"o_proj.weight_scale_inv has shape \(2, 2\), but "
                                         r"o_proj.weight \(11, 21\) in blocks of 4 x 4"):
        from_checkpoint(bad, cfg)


@pytest.mark.parametrize("change, error, message", [
    (lambda t, c: ({k: v for k, v in t.items() if k != "kv_a_layernorm.weight"}, c),
     ValueError, r"missing \['kv_a_layernorm.weight'\]"),
    (lambda t, c: ({"model.layers.0.self_attn." + k: v for k, v in t.items()}, c),
     ValueError, r"prefix 'model.layers.<N>.self_attn.' removed.*unknown \['model.layers.0"),
    (lambda t, c: ({**t, "o_proj.weight": np.ones((11, 20))}, c),
     ValueError, r"o_proj.weight has shape \(11, 20\), but the config's sizes make it \(11, 21\)"),
    (lambda t, c: (t, {**c, "attention_bias": True}), ValueError, "'attention_bias' is true"),
    (lambda t, c: (t, {k: v for k, v in c.items() if k != "v_head_dim"}),
     ValueError, r"config has no 'v_head_dim'"),
    (lambda t, c: (_released_tensors({**c, "qk_rope_head_dim": 7}), {**c, "qk_rope_head_dim": 7}),
     ValueError, r"even d_r \(RoPE turns pairs of columns\)"),
    (lambda t, c: (t, {**c, "rope_scaling": {"type": "dynamic", "factor": 2.0,
                                             "original_max_position_embeddings": 64}}),
     ValueError, "'dynamic' changes the frequencies with the sequence's length"),
    (lambda t, c: (t, {**c, "rope_scaling": {"type": "yarn", "factor": 40}}),
     ValueError, "original_max_position_embeddings"),
    (lambda t, c: (t, {**c, "max_position_embeddings": 32 * 64}), ValueError,
     r"= 2048 / 64 is not rope_scaling's factor 40"),
    (lambda t, c: (list(t.values()), c), TypeError, "tensors must be a dict"),
    (lambda t, c: (t, None), TypeError, "config must be the dict of a config.json"),
])
def test_from_checkpoint_refuses_what_does_not_fit(change, error, message):
    cfg = SMALL_CONFIGS["v3-like"]
    tensors, config = change(_released_tensors(cfg), cfg)
    with pytest.raises(error, match=message):
        from_checkpoint(tensors, config)


@pytest.mark.parametrize("change, error, message", [
    ({"gamma_Q": np.ones(5)}, ValueError, "gamma_Q scales the query latent x W_DQ, but W_DQ is None"),
    ({"gamma_KV": np.ones(22)}, ValueError, r"gamma_KV has shape \(22,\) but must be \(d_c,\) = \(23,\)"),
    ({"W_DQ": np.ones((5, 29))}, ValueError,
     r"W_Q has shape \(2, 5, 7\) but must be \(h, d_cq, d_k\) = \(2, 29, 7\)"),
    ({"W_DQ": np.ones((4, 5))}, ValueError,
     r"W_DQ has shape \(4, 5\) but must be \(d_model, d_cq\) = \(5, 5\)"),
    ({"eps": 0.0}, ValueError, "eps, the RMSNorms' epsilon, must be a positive number, got 0.0"),
    ({"eps": True}, ValueError, "eps, the RMSNorms' epsilon"),
    ({"interleaved": "yes"}, TypeError, "interleaved must be True or False, got 'yes'"),
    ({"rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 8,
                       "betta_fast": 32}}, ValueError, r"does not use the key\(s\) \['betta_fast'\]"),
    ({"rope_scaling": [("type", "linear")]}, TypeError, "rope_scaling must be a dict"),
])
def test_bad_released_settings_refused(change, error, message):
    with pytest.raises(error, match=message):
        LatentWeights(**{**init_latent_weights(seed=0).arrays(), **change})


def test_rms_norm_by_hand_and_refusals():
    z = np.array([[3.0, 4.0], [0.0, 0.0]])
    out = rms_norm(z, np.array([1.0, 2.0]), eps=0.5)
    assert np.allclose(out, [[3 / np.sqrt(13), 8 / np.sqrt(13)], [0, 0]], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"z \(2, 2\) needs as many columns as gamma \(3,\)"):
        rms_norm(z, np.ones(3))
    with pytest.raises(ValueError, match="eps must be a positive number"):
        rms_norm(z, np.ones(2), eps=-1.0)


@pytest.mark.parametrize("absorbed", [True, False])
def test_multiply_adds_with_a_query_latent_equal_recorded_products(absorbed):
    dims = LatentDims(d_model=5, heads=2, d_k=7, d_v=11, d_c=23, d_r=8, d_cq=29)
    W = dataclasses.replace(init_latent_weights(dims, seed=36), gamma_Q=np.full(29, 2.0),
                            gamma_KV=np.full(23, 0.5))
    X = _inputs(7, dims, seed=37)
    y, log = _step_log(W, X, absorbed)
    assert np.allclose(y, latent_attention(X, W)[-1], rtol=0, atol=TOL)
    assert log.multiply_adds == latent_multiply_adds(1, 7, dims, absorbed)
    # the query latent replaces h d_model (d_k + d_r) by d_cq (d_model + h (d_k + d_r))
    plain = dataclasses.replace(dims, d_cq=None)
    assert (latent_multiply_adds(1, 7, dims, absorbed) - latent_multiply_adds(1, 7, plain, absorbed)
            == 29 * (5 + 2 * 15) - 2 * 5 * 15)


def test_float32_released_layer():
    cfg = SMALL_CONFIGS["v3-like"]
    t = _released_tensors(cfg, seed=38)
    W64 = from_checkpoint(t, cfg)
    W32 = from_checkpoint({k: v.astype(np.float32) for k, v in t.items()}, cfg)
    X = np.random.default_rng(39).standard_normal((6, 11)).astype(np.float32)
    Y = LatentKVCache(W32).extend(X)
    assert Y.dtype == np.float32 and W32.dtype == np.float32
    assert np.allclose(Y, latent_attention(X.astype(np.float64), W64), atol=1e-4)
