"""Counting matrix products: closed forms, presets, and the instrumented count agree."""

import numpy as np
import pytest
from shapes_for_tests import PRIME_DIMS

import mha_lit
from mha_lit import Dims, counting, init_weights
from mha_lit.counting import TransformerConfig


def _X(dims, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal((dims.tokens, dims.d_model)).astype(dtype)


# --- closed forms -----------------------------------------------------------------------------

@pytest.mark.parametrize("heads, expected", [(1, 6), (2, 11), (12, 61), (96, 481)])
def test_matmuls_per_attention_layer(heads, expected):
    assert counting.matmuls_per_attention_layer(heads) == expected


@pytest.mark.parametrize("bad", [0, -3])
def test_matmuls_per_attention_layer_refuses_non_positive(bad):
    with pytest.raises(ValueError, match=str(bad)):
        counting.matmuls_per_attention_layer(bad)


@pytest.mark.parametrize("bad", [2.0, True, "12"])
def test_matmuls_per_attention_layer_refuses_non_integers(bad):
    with pytest.raises(TypeError):
        counting.matmuls_per_attention_layer(bad)


def test_one_hot_times_embedding_is_indexing():
    rng = np.random.default_rng(3)
    E = rng.standard_normal((13, 5))  # (V, d_model)
    ids = np.array([2, 7, 11, 7])
    O = counting.one_hot(ids, 13)
    assert O.shape == (4, 13) and np.array_equal(O.sum(axis=1), np.ones(4))
    assert np.array_equal(O @ E, E[ids])


@pytest.mark.parametrize("ids, match", [([0, 13], "0 .. 12"), ([-1], "0 .. 12"),
                                        ([[1, 2]], "1-D"), ([1.5], "integers")])
def test_one_hot_refuses_bad_ids(ids, match):
    with pytest.raises(ValueError, match=match):
        counting.one_hot(np.array(ids), 13)


# --- configurations ---------------------------------------------------------------------------

def test_config_d_head():
    assert TransformerConfig(3, 35, 5, 77, 13, 11).d_head == 7


@pytest.mark.parametrize("field_index", range(6))
@pytest.mark.parametrize("bad", [0, -2])
def test_config_refuses_non_positive_sizes(field_index, bad):
    args = [3, 35, 5, 77, 13, 11]
    args[field_index] = bad
    with pytest.raises(ValueError, match=str(bad)):
        TransformerConfig(*args)


def test_config_refuses_indivisible_d_model():
    with pytest.raises(ValueError, match="d_model = 5140 is not divisible by n_heads = 40"):
        TransformerConfig(40, 5140, 40, 4 * 5140, 50257, 2048)


def test_config_refuses_float_sizes():
    with pytest.raises(TypeError, match="d_model"):
        TransformerConfig(3, 35.0, 5, 77, 13, 11)


def test_gpt3_175b_preset_matches_the_paper():
    c = counting.PRESETS["gpt3-175b"]
    assert (c.n_layers, c.d_model, c.n_heads, c.d_head) == (96, 12288, 96, 128)
    assert (c.d_ff, c.context_length, c.vocab_size) == (49152, 2048, 50257)


def test_presets_are_configs_with_published_sizes():
    assert set(counting.PRESETS) == set(counting.PUBLISHED_PARAMS)
    assert all(isinstance(c, TransformerConfig) for c in counting.PRESETS.values())


# --- parameters -------------------------------------------------------------------------------

def test_gpt2_small_parameter_count_is_exact():
    assert counting.param_count(counting.PRESETS["gpt2-small"]) == 124_439_808


@pytest.mark.parametrize("name", ["gpt2-small", "gpt3-175b", "gpt2-medium", "gpt2-large",
                                  "gpt3-large", "gpt3-6.7b"])
def test_parameter_counts_within_one_percent_of_published(name):
    ours = counting.param_count(counting.PRESETS[name])
    assert abs(ours / counting.PUBLISHED_PARAMS[name] - 1) < 0.01


def test_every_preset_within_four_percent_of_published():
    for name, cfg in counting.PRESETS.items():
        assert abs(counting.param_count(cfg) / counting.PUBLISHED_PARAMS[name] - 1) < 0.04, name


def test_param_count_matches_12_L_d_squared_rule():
    cfg = TransformerConfig(7, 55, 5, 220, 13, 11)
    per_layer = 12 * 55**2 + 13 * 55  # attention 4d^2 + 4d, FFN 8d^2 + 5d, two norms 4d
    assert counting.param_count(cfg) == 7 * per_layer + 13 * 55 + 11 * 55 + 2 * 55


def test_param_count_agrees_with_block_weights_when_block_exists():
    block = pytest.importorskip("mha_lit.block")
    dims = Dims(tokens=3, d_model=15, d_k=5, d_v=5, heads=3)  # d_k = d_v = d_model / h
    B = block.init_block_weights(dims, d_ff=17, seed=0)
    cfg = TransformerConfig(1, 15, 3, 17, 13, 11)
    per_layer = sum(a.size for a in B.arrays().values())
    attention_biases = 4 * 15  # GPT adds biases to W_Q, W_K, W_V, W_O; the book's block has none
    bd = counting.param_breakdown(cfg)
    assert per_layer + attention_biases == (bd["attention (W_Q, W_K, W_V, W_O, biases)"]
                                            + bd["feed-forward (W_1, b_1, W_2, b_2)"]
                                            + bd["layer norms"] - 2 * 15)


# --- matmul counts ----------------------------------------------------------------------------

def test_matmul_count_rules():
    cfg = TransformerConfig(7, 33, 3, 13, 11, 5)
    assert counting.matmul_count(cfg) == 7 * (5 * 3 + 1 + 2) + 2
    assert counting.matmul_count(cfg, fused=True) == 7 * 6 + 2


def test_gpt3_forward_pass_matmul_count():
    cfg = counting.PRESETS["gpt3-175b"]
    assert counting.matmul_count(cfg) == 96 * (481 + 2) + 2 == 46_370
    assert counting.matmul_count(cfg, fused=True) == 578


def test_matmul_breakdown_uses_the_per_layer_formula():
    for cfg in counting.PRESETS.values():
        bd = counting.matmul_breakdown(cfg)
        attn = bd["Q, K, V projections"] + bd["Q K^T"] + bd["S V"] + bd["output projection W_O"]
        assert attn == cfg.n_layers * counting.matmuls_per_attention_layer(cfg.n_heads)


def test_counts_refuse_non_configs():
    with pytest.raises(TypeError, match="TransformerConfig"):
        counting.matmul_count((12, 768))


# --- FLOPs ------------------------------------------------------------------------------------

def test_forward_flops_against_kaplan_rule():
    """2 N + 4 L n d (QK^T and SV per token) + 2 d V, with N the non-embedding parameters."""
    cfg = counting.PRESETS["gpt2-small"]
    n, L, d = 1024, cfg.n_layers, cfg.d_model
    N = 2 * d * L * (2 * d + cfg.d_ff)  # Kaplan et al.'s non-embedding parameters, no biases
    expected = n * (2 * N + 4 * L * n * d + 2 * d * cfg.vocab_size)
    assert counting.forward_flops(cfg, n) == expected


def test_forward_flops_equals_traced_multiply_adds_of_one_layer():
    dims = Dims(tokens=7, d_model=15, d_k=5, d_v=5, heads=3)
    W = init_weights(dims, seed=2)
    with counting.record_matmuls() as log:
        mha_lit.multi_head_attention_reference(log.track(_X(dims)), W)
    bd = counting.flops_breakdown(TransformerConfig(1, 15, 3, 1, 1, 7), 7)
    attn = bd["Q, K, V projections"] + bd["Q K^T"] + bd["S V"] + bd["output projection W_O"]
    assert attn == 2 * log.multiply_adds


def test_forward_flops_refuses_bad_length():
    with pytest.raises(ValueError, match="seq_len"):
        counting.forward_flops(counting.PRESETS["gpt2-small"], 0)


def test_attention_crossover_is_two_d_model():
    for cfg in counting.PRESETS.values():
        n = counting.attention_crossover(cfg)
        assert n == 2 * cfg.d_model
        assert counting.attention_crossover(cfg, include_ffn=True) == 6 * cfg.d_model
        bd = counting.flops_breakdown(cfg, int(n))
        assert bd["Q K^T"] + bd["S V"] == bd["Q, K, V projections"] + bd["output projection W_O"]


# --- instrumented runs ------------------------------------------------------------------------

@pytest.mark.parametrize("dims", PRIME_DIMS)
def test_instrumented_count_equals_closed_form(dims):
    W = init_weights(dims, seed=1)
    with counting.record_matmuls() as log:
        Y = mha_lit.multi_head_attention_reference(log.track(_X(dims)), W)
    assert len(log) == counting.matmuls_per_attention_layer(dims.heads)
    labels = counting.label_attention_products(log, W)
    for head in range(1, dims.heads + 1):
        assert [name for h, name in labels if h == head] == ["X W_Q", "X W_K", "X W_V",
                                                             "Q K^T", "S V"]
    assert labels[-1] == (0, "Concat W_O")
    assert Y.shape == (dims.tokens, dims.d_model)


@pytest.mark.parametrize("heads", [1, 2, 3, 5, 7, 12])
def test_instrumented_count_for_many_head_counts(heads):
    dims = Dims(tokens=3, d_model=5, d_k=7, d_v=11, heads=heads)
    W = init_weights(dims, seed=0)
    with counting.record_matmuls() as log:
        mha_lit.multi_head_attention_reference(log.track(_X(dims)), W)
    assert log.calls == log.products == 5 * heads + 1


@pytest.mark.parametrize("dims", PRIME_DIMS)
def test_instrumented_shapes_and_multiply_adds(dims):
    n, d, dk, dv, h = dims.tokens, dims.d_model, dims.d_k, dims.d_v, dims.heads
    W = init_weights(dims, seed=4)
    with counting.record_matmuls() as log:
        mha_lit.multi_head_attention_reference(log.track(_X(dims)), W)
    head = [((n, d), (d, dk)), ((n, d), (d, dk)), ((n, d), (d, dv)), ((n, dk), (dk, n)),
            ((n, n), (n, dv))]
    assert [(r.a_shape, r.b_shape) for r in log.records] == head * h + [((n, h * dv), (h * dv, d))]
    assert log.multiply_adds == h * (n * d * (2 * dk + dv) + n * n * (dk + dv)) + n * h * dv * d


@pytest.mark.parametrize("dims", PRIME_DIMS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tracking_changes_no_result(dims, causal, dtype):
    W = init_weights(dims, seed=5)
    X = _X(dims, dtype=dtype)
    plain = mha_lit.multi_head_attention_reference(X, W, causal)
    with counting.record_matmuls() as log:
        traced = mha_lit.multi_head_attention_reference(log.track(X), W, causal)
    assert traced.dtype == plain.dtype
    tol = 1e-12 if plain.dtype == np.float64 else 1e-5  # the same products, to rounding
    assert np.allclose(np.asarray(traced), plain, rtol=0, atol=tol)
    assert type(plain) is np.ndarray


def test_track_is_a_view_and_leaves_input_untouched():
    X = _X(Dims())
    before = X.copy()
    with counting.record_matmuls() as log:
        T = log.track(X)
        assert np.shares_memory(T, X)
        T @ np.ones((5, 2))
    assert np.array_equal(X, before) and len(log) == 1


def test_recording_stops_after_the_block():
    X = _X(Dims())
    with counting.record_matmuls() as log:
        T = log.track(X)
        T @ np.ones((5, 2))
    T @ np.ones((5, 2))
    assert len(log) == 1


def test_batched_call_counts_once_with_all_products():
    rng = np.random.default_rng(0)
    Q = rng.standard_normal((3, 5, 7))  # (h, n, d_k)
    K = rng.standard_normal((3, 5, 7))
    with counting.record_matmuls() as log:
        S = log.track(Q) @ K.transpose(0, 2, 1)  # (h, n, n)
    assert S.shape == (3, 5, 5)
    assert log.calls == 1 and log.products == 3 and log.multiply_adds == 3 * 5 * 7 * 5


def test_vector_products_are_not_matrix_products():
    with counting.record_matmuls() as log:
        log.track(np.ones(5)) @ np.ones(5)
    assert len(log) == 0


@pytest.mark.parametrize("fn", [lambda a: np.dot(a, a.T), lambda a: np.einsum("ij,kj->ik", a, a),
                                lambda a: np.tensordot(a, a.T, 1)])
def test_other_product_functions_are_refused_not_silently_missed(fn):
    with counting.record_matmuls() as log:
        with pytest.raises(TypeError, match="np.matmul only"):
            fn(log.track(np.ones((3, 5))))


def test_feed_forward_is_counted_as_two_products():
    block = pytest.importorskip("mha_lit.block")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 5))  # (n, d_model)
    W_1, W_2 = rng.standard_normal((5, 17)), rng.standard_normal((17, 5))
    b_1, b_2 = rng.standard_normal(17), rng.standard_normal(5)
    plain = block.feed_forward(X, W_1, b_1, W_2, b_2)
    with counting.record_matmuls() as log:
        traced = block.feed_forward(log.track(X), W_1, b_1, W_2, b_2)
    assert np.allclose(np.asarray(traced), plain, rtol=0, atol=1e-12)  # the same products
    assert [(r.a_shape, r.b_shape) for r in log.records] == [((3, 5), (5, 17)), ((3, 17), (17, 5))]


# --- chapter 8: biases are parameters, but adding them is not a product ----------------------

@pytest.mark.parametrize("dims", PRIME_DIMS)
def test_biases_add_no_recorded_product(dims):
    W = init_weights(dims, seed=6)
    Wb = init_weights(dims, seed=6, biases=True)
    X = _X(dims)
    with counting.record_matmuls() as log:
        plain = mha_lit.multi_head_attention_reference(log.track(X), W)
    with counting.record_matmuls() as log_b:
        biased = mha_lit.multi_head_attention_reference(log_b.track(X), Wb)
    assert len(log_b) == counting.matmuls_per_attention_layer(dims.heads)
    assert [(r.a_shape, r.b_shape) for r in log_b.records] == [(r.a_shape, r.b_shape)
                                                               for r in log.records]
    assert log_b.multiply_adds == log.multiply_adds
    assert counting.label_attention_products(log_b, Wb) == counting.label_attention_products(log, W)
    assert not np.allclose(np.asarray(biased), np.asarray(plain), rtol=0, atol=1e-3)


def test_block_with_biases_counts_its_parameters_like_the_config():
    """With attention biases a block's arrays are exactly a GPT layer's parameters."""
    block = pytest.importorskip("mha_lit.block")
    dims = Dims(tokens=3, d_model=15, d_k=5, d_v=5, heads=3)  # d_k = d_v = d_model / h
    B = block.init_block_weights(dims, d_ff=17, seed=0, attn_biases=True)
    bd = counting.param_breakdown(TransformerConfig(1, 15, 3, 17, 13, 11))
    per_layer = bd["attention (W_Q, W_K, W_V, W_O, biases)"] + bd["feed-forward (W_1, b_1, W_2, b_2)"]
    per_layer += bd["layer norms"] - 2 * 15  # the final layer norm is not a block's
    assert sum(a.size for a in B.arrays().values()) == per_layer


def test_gpt2_small_attention_weights_have_the_configs_parameter_count():
    cfg = counting.PRESETS["gpt2-small"]
    d = cfg.d_model
    rng = np.random.default_rng(0)
    W = mha_lit.gpt2_attention_weights(rng.standard_normal((d, 3 * d)), rng.standard_normal(3 * d),
                                       rng.standard_normal((d, d)), rng.standard_normal(d),
                                       cfg.n_heads)
    per_layer = counting.param_breakdown(cfg)["attention (W_Q, W_K, W_V, W_O, biases)"] // cfg.n_layers
    assert sum(a.size for a in W.arrays().values()) == per_layer == 4 * d * d + 4 * d


def test_untied_output_layer_adds_one_embedding_matrix():
    cfg = counting.TransformerConfig(2, 15, 3, 17, 13, 11)
    tied, untied = counting.param_count(cfg), counting.param_count(cfg, tied=False)
    assert untied - tied == 15 * 13
    assert "output layer (untied)" in counting.param_breakdown(cfg, tied=False)
    assert "output layer (untied)" not in counting.param_breakdown(cfg)


def test_gpt3_tying_evidence_comes_from_the_small_model():
    # Brown et al. 2020, Table 2.1: 125M and 175.0B; untied small is far off, tied close
    small, big = counting.PRESETS["gpt3-small"], counting.PRESETS["gpt3-175b"]
    assert abs(counting.param_count(small) / 125e6 - 1) < 0.01
    assert counting.param_count(small, tied=False) / 125e6 - 1 > 0.3
    assert abs(counting.param_count(big) / 175e9 - 1) < 0.003
    assert abs(counting.param_count(big, tied=False) / 175e9 - 1) < 0.002


def test_non_embedding_params_is_12_L_d_squared_for_gpt_shapes():
    for cfg in counting.PRESETS.values():
        assert counting.non_embedding_params(cfg) == 12 * cfg.n_layers * cfg.d_model**2
    odd = counting.TransformerConfig(2, 15, 3, 17, 13, 11)  # d_ff not 4 d_model
    assert counting.non_embedding_params(odd) == 2 * (4 * 15 * 15 + 2 * 15 * 17)


def test_kv_cache_bytes_gpt3_fp16():
    gpt3 = counting.PRESETS["gpt3-175b"]
    assert counting.kv_cache_bytes(gpt3) == 2 * 96 * 12288 * 2 == 4_718_592
    assert counting.kv_cache_bytes(gpt3, 2048) == 2048 * 4_718_592
    assert counting.kv_cache_bytes(gpt3, 3, bytes_per_value=4) == 3 * 2 * 96 * 12288 * 4
    with pytest.raises(ValueError, match="tokens"):
        counting.kv_cache_bytes(gpt3, 0)
    with pytest.raises(TypeError, match="bytes_per_value"):
        counting.kv_cache_bytes(gpt3, 1, bytes_per_value=2.0)
