"""Counting matrix products, parameters and bytes: closed forms against sizes and records."""

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

import mha_lit
from mha_lit import Dims, counting, init_weights, models, trace
from mha_lit.models import (
    MODELS,
    DecoderConfig,
    LatentKV,
    MoE,
    TransformerConfig,
)


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


@pytest.mark.parametrize("ids, error, match", [([0, 13], ValueError, "0 .. 12"),
                                               ([-1], ValueError, "0 .. 12"),
                                               ([[1, 2]], ValueError, "1-D"),
                                               ([1.5], TypeError, "integer token ids")])
def test_one_hot_refuses_bad_ids(ids, error, match):
    with pytest.raises(error, match=match):
        counting.one_hot(np.array(ids), 13)


@pytest.mark.parametrize("ids, match", [([0, 13], r"got ids 0 \.\. 13$"), ([5, -1, 3], r"got ids -1 \.\. 5$"),
                                        ([20, 14], r"got ids 14 \.\. 20$")])
def test_one_hot_names_the_smallest_and_largest_bad_id(ids, match):
    """The message ends with the ids' range, min .. max (counting-388)."""
    with pytest.raises(ValueError, match=r"token_ids must lie in 0 \.\. 12 \(vocab_size = 13\), " + match):
        counting.one_hot(np.array(ids), 13)


# --- parameters -------------------------------------------------------------------------------

def test_gpt2_small_parameter_count_is_exact():
    assert counting.param_count(models.PRESETS["gpt2-small"]) == 124_439_808


@pytest.mark.parametrize("name", ["gpt2-small", "gpt3-175b", "gpt2-medium", "gpt2-large",
                                  "gpt3-large", "gpt3-6.7b"])
def test_parameter_counts_within_one_percent_of_published(name):
    ours = counting.param_count(models.PRESETS[name])
    assert abs(ours / models.PUBLISHED_PARAMS[name] - 1) < 0.01


def test_every_preset_within_four_percent_of_published():
    for name, cfg in models.PRESETS.items():
        assert abs(counting.param_count(cfg) / models.PUBLISHED_PARAMS[name] - 1) < 0.04, name


# Published counts as printed: GPT-2's released checkpoints are named by their size in millions
# (openai/gpt-2: 124M, 355M, 774M, 1558M); GPT-3's are Brown et al. 2020, Table D.1, "Params (M)".
COUNTS_PUBLISHED_M = {"gpt2-small": 124, "gpt2-medium": 355, "gpt2-large": 774, "gpt2-xl": 1558,
                      "gpt3-small": 125, "gpt3-medium": 356, "gpt3-large": 760, "gpt3-xl": 1320,
                      "gpt3-2.7b": 2650, "gpt3-6.7b": 6660, "gpt3-13b": 12850, "gpt3-175b": 174600}


def _to_printed_digits(count, millions):
    """count rounded to the digits of ``millions`` (174600 -> hundreds of millions)."""
    step = 10 ** (len(str(millions)) - len(str(millions).rstrip("0")))
    return round(count / 1e6 / step) * step


@pytest.mark.parametrize("name", sorted(COUNTS_PUBLISHED_M))
def test_tied_count_is_the_published_count_to_its_printed_digits(name):
    """Chapter 10: every tied count rounds to the published one; GPT-3's untied counts do not,
    which is how Table D.1 shows that GPT-3 ties its output layer to the embedding."""
    cfg, published = models.PRESETS[name], COUNTS_PUBLISHED_M[name]
    assert _to_printed_digits(counting.param_count(cfg), published) == published
    assert _to_printed_digits(counting.param_count(cfg, tied=False), published) != published
    assert set(COUNTS_PUBLISHED_M) == set(models.PRESETS)


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
    cfg = models.PRESETS["gpt3-175b"]
    assert counting.matmul_count(cfg) == 96 * (481 + 2) + 2 == 46_370
    assert counting.matmul_count(cfg, fused=True) == 578


def test_matmul_breakdown_uses_the_per_layer_formula():
    for cfg in models.PRESETS.values():
        bd = counting.matmul_breakdown(cfg)
        attn = bd["Q, K, V projections"] + bd["Q K^T"] + bd["S V"] + bd["output projection W_O"]
        assert attn == cfg.layers * counting.matmuls_per_attention_layer(cfg.heads)


def test_counts_refuse_non_configs():
    with pytest.raises(TypeError, match="matmul_breakdown needs a TransformerConfig"):
        counting.matmul_count((12, 768))
    with pytest.raises(TypeError, match="param_breakdown needs a TransformerConfig"):
        counting.param_breakdown(MODELS["llama2-70b"].config)


# --- FLOPs ------------------------------------------------------------------------------------

def test_forward_flops_against_kaplan_rule():
    """2 N + 4 L n d (QK^T and SV per token) + 2 d V, with N the non-embedding parameters."""
    cfg = models.PRESETS["gpt2-small"]
    n, L, d = 1024, cfg.layers, cfg.d_model
    N = 2 * d * L * (2 * d + cfg.d_ff)  # Kaplan et al.'s non-embedding parameters, no biases
    expected = n * (2 * N + 4 * L * n * d + 2 * d * cfg.vocab_size)
    assert counting.forward_flops(cfg, n) == expected


def test_forward_flops_equals_traced_multiply_adds_of_one_layer():
    dims = Dims(tokens=7, d_model=15, d_k=5, d_v=5, heads=3)
    W = init_weights(dims, seed=2)
    with trace.record_matmuls() as log:
        mha_lit.multi_head_attention_reference(log.track(_X(dims)), W)
    bd = counting.flops_breakdown(TransformerConfig(1, 15, 3, 1, 1, 7), 7)
    attn = bd["Q, K, V projections"] + bd["Q K^T"] + bd["S V"] + bd["output projection W_O"]
    assert attn == 2 * log.multiply_adds


def test_forward_flops_refuses_bad_length():
    with pytest.raises(ValueError, match="tokens"):
        counting.forward_flops(models.PRESETS["gpt2-small"], 0)


def test_attention_crossover_is_two_d_model():
    for cfg in models.PRESETS.values():
        n = counting.attention_crossover(cfg)
        assert n == 2 * cfg.d_model
        assert counting.attention_crossover(cfg, include_ffn=True) == 6 * cfg.d_model
        bd = counting.flops_breakdown(cfg, int(n))
        assert bd["Q K^T"] + bd["S V"] == bd["Q, K, V projections"] + bd["output projection W_O"]


# --- chapter 8: a block's arrays are a GPT layer's parameters ----------------------------------

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
    cfg = models.PRESETS["gpt2-small"]
    d = cfg.d_model
    rng = np.random.default_rng(0)
    W = mha_lit.gpt2_attention_weights(rng.standard_normal((d, 3 * d)), rng.standard_normal(3 * d),
                                       rng.standard_normal((d, d)), rng.standard_normal(d),
                                       cfg.heads)
    per_layer = counting.param_breakdown(cfg)["attention (W_Q, W_K, W_V, W_O, biases)"] // cfg.layers
    assert sum(a.size for a in W.arrays().values()) == per_layer == 4 * d * d + 4 * d


def test_untied_output_layer_adds_one_embedding_matrix():
    cfg = TransformerConfig(2, 15, 3, 17, 13, 11)
    tied, untied = counting.param_count(cfg), counting.param_count(cfg, tied=False)
    assert untied - tied == 15 * 13
    assert "output layer (untied)" in counting.param_breakdown(cfg, tied=False)
    assert "output layer (untied)" not in counting.param_breakdown(cfg)


def test_gpt3_tying_evidence_comes_from_the_small_model():
    # Brown et al. 2020, Table 2.1: 125M and 175.0B; untied small is far off, tied close
    small, big = models.PRESETS["gpt3-small"], models.PRESETS["gpt3-175b"]
    assert abs(counting.param_count(small) / 125e6 - 1) < 0.01
    assert counting.param_count(small, tied=False) / 125e6 - 1 > 0.3
    assert abs(counting.param_count(big) / 175e9 - 1) < 0.003
    assert abs(counting.param_count(big, tied=False) / 175e9 - 1) < 0.002


def test_non_embedding_params_is_12_L_d_squared_for_gpt_shapes():
    for cfg in models.PRESETS.values():
        assert counting.non_embedding_params(cfg) == 12 * cfg.layers * cfg.d_model**2
    odd = TransformerConfig(2, 15, 3, 17, 13, 11)  # d_ff not 4 d_model
    assert counting.non_embedding_params(odd) == 2 * (4 * 15 * 15 + 2 * 15 * 17)


def test_kv_cache_bytes_gpt3_fp16():
    gpt3 = models.PRESETS["gpt3-175b"]
    assert counting.kv_cache_bytes(gpt3) == 2 * 96 * 12288 * 2 == 4_718_592
    assert counting.kv_cache_bytes(gpt3, 2048) == 2048 * 4_718_592
    assert counting.kv_cache_bytes(gpt3, 3, bytes_per_value=4) == 3 * 2 * 96 * 12288 * 4
    with pytest.raises(ValueError, match="tokens"):
        counting.kv_cache_bytes(gpt3, 0)
    with pytest.raises(TypeError, match="bytes_per_value"):
        counting.kv_cache_bytes(gpt3, 1, bytes_per_value=2.0)


# --- Part III, chapter 18: published configurations, caches, parameters ------------------

# Each published size is a rounded figure or a name; the tolerance says how far the count may be.
#   GPT-3 175B: Table 2.1 prints 175.0B; the count is 174.6B (chapter 10): 0.3 %.
#   Llama 2 70B: a name; the released weights hold 69.0B: 2 %.
#   Llama 3 8B: a name; the released weights hold 8.03B: 1 %.
#   Mistral 7B: a name ("7.3B" in its announcement); the released weights hold 7.24B: 4 %.
#   DeepSeek-V3: "671B total", three digits: 0.1 %.
PARAM_TOLERANCE = {"gpt3-175b": 0.003, "llama2-70b": 0.02, "llama3-8b": 0.01,
                   "mistral-7b": 0.04, "deepseek-v3": 0.001}


@pytest.mark.parametrize("key", sorted(PARAM_TOLERANCE))
def test_each_model_counts_to_its_published_size(key):
    m = MODELS[key]
    assert abs(counting.param_count(m.config) / m.params - 1) < PARAM_TOLERANCE[key]


def test_deepseek_v3_activated_parameters_against_the_paper():
    """37B "activated for each token": two digits, so within 0.5B (1.35 %)."""
    m = MODELS["deepseek-v3"]
    active = counting.active_param_count(m.config)
    assert abs(active - m.active_params) < 0.5e9
    assert active < 0.06 * counting.param_count(m.config)
    # the paper's 37B leaves the embedding table out: with it the count would round to 38B
    embedding = m.config.vocab_size * m.config.d_model
    assert round(active / 1e9) == 37 and round((active + embedding) / 1e9) == 38


@pytest.mark.parametrize("key, exact", [("llama3-8b", 8_030_261_248), ("mistral-7b", 7_241_732_096),
                                        ("llama2-70b", 68_976_648_192)])
def test_dense_counts_equal_the_released_checkpoints_totals(key, exact):
    """Parameter totals of the released weights: Llama 3.1 8B, Mistral 7B v0.1, Llama 2 70B.

    (Llama 2 70B's converted files also store 80 x 64 rotary frequencies, 5,120 numbers that
    are a computed buffer, not parameters.)
    """
    assert counting.param_count(MODELS[key].config) == exact


def _llama_tensors(L, d, h, h_kv, dh, f, V):
    """Every weight matrix and norm of a Llama-style checkpoint, as its files list them."""
    layer = [(h * dh, d), (h_kv * dh, d), (h_kv * dh, d), (d, h * dh),  # q, k, v, o
             (f, d), (f, d), (d, f),  # gate, up, down
             (d,), (d,)]  # the two RMSNorm scales
    return [(V, d)] + layer * L + [(d,), (V, d)]  # embedding, layers, final norm, output


@pytest.mark.parametrize("key, sizes", [
    ("llama2-70b", (80, 8192, 64, 8, 128, 28672, 32000)),
    ("llama3-8b", (32, 4096, 32, 8, 128, 14336, 128256)),
    ("mistral-7b", (32, 4096, 32, 8, 128, 14336, 32000)),
])
def test_dense_counts_equal_the_sum_over_a_checkpoints_tensors(key, sizes):
    total = sum(int(np.prod(shape)) for shape in _llama_tensors(*sizes))
    assert counting.param_count(MODELS[key].config) == total


def test_deepseek_v3_count_equals_the_sum_over_its_tensors():
    d, h, dh, dr, dc, dcq, V = 7168, 128, 128, 64, 512, 1536, 129280
    attention = [(dcq, d), (dcq,), (h * (dh + dr), dcq),  # W_DQ, its norm, W_UQ
                 (dc + dr, d), (dc,), (h * 2 * dh, dc),  # W_DKV with W_KR, its norm, W_UK with W_UV
                 (d, h * dh), (d,), (d,)]  # W_O, the two block norms
    expert = [(2048, d), (2048, d), (d, 2048)]
    dense = attention + [(18432, d), (18432, d), (d, 18432)]
    router = [(256, d), (256,)]  # its matrix, and the bias that only steers the choice
    moe = attention + expert * (256 + 1) + router  # routed and shared experts, router
    tensors = [(V, d)] + dense * 3 + moe * 58 + [(d,), (V, d)]
    total = sum(int(np.prod(s)) for s in tensors)
    cfg = MODELS["deepseek-v3"].config
    assert counting.param_count(cfg) == total
    # one token: no embedding table (it reads one row), 1 shared + 8 routed experts, the output layer
    used = dense * 3 + (attention + expert * 9 + router) * 58 + [(d,), (V, d)]
    assert counting.active_param_count(cfg) == sum(int(np.prod(s)) for s in used)
    assert counting.active_param_count(cfg) == total - V * d - 58 * 248 * 3 * d * 2048


@pytest.mark.parametrize("key, per_token", [
    ("gpt3-175b", 2 * 96 * 96 * 128 * 2),  # K and V, 96 layers, 96 heads of 128, 2 bytes
    ("llama2-70b", 2 * 80 * 8 * 128 * 2),  # 8 key/value heads
    ("llama3-8b", 2 * 32 * 8 * 128 * 2),
    ("mistral-7b", 2 * 32 * 8 * 128 * 2),
    ("deepseek-v3", 61 * (512 + 64) * 2),  # one latent and one RoPE key per layer
])
def test_kv_bytes_per_token_by_hand(key, per_token):
    cfg = MODELS[key].config
    assert counting.kv_cache_bytes(cfg) == per_token
    assert counting.kv_values_per_token(cfg) * 2 == per_token


@pytest.mark.parametrize("L, d, h, h_kv, n, s", [(3, 35, 5, 1, 7, 2), (2, 91, 13, 13, 11, 4),
                                                 (5, 60, 6, 2, 3, 1), (1, 21, 7, 7, 1, 2)])
def test_kv_bytes_of_grouped_heads_by_formula(L, d, h, h_kv, n, s):
    cfg = DecoderConfig(L, d, h, 17, 13, 29, kv_heads=h_kv)
    assert counting.kv_cache_bytes(cfg, n, s) == 2 * L * h_kv * (d // h) * n * s
    assert counting.kv_ratio_to_mha(cfg) == Fraction(h_kv, h)
    assert cfg.attention_kind == {1: "MQA", h: "MHA"}.get(h_kv, "GQA")


@pytest.mark.parametrize("L, h, dh, dc, dr, n", [(2, 3, 5, 7, 4, 11), (61, 128, 128, 512, 64, 3),
                                                 (1, 1, 2, 3, 2, 1)])
def test_kv_bytes_of_a_latent_by_formula(L, h, dh, dc, dr, n):
    cfg = DecoderConfig(L, 17, h, 19, 13, 31, d_k=dh, latent=LatentKV(dc, dr))
    assert counting.kv_cache_bytes(cfg, n) == L * (dc + dr) * n * 2
    assert counting.kv_ratio_to_mha(cfg) == Fraction(dc + dr, 2 * h * dh)
    assert cfg.attention_kind == "MLA"


@pytest.mark.parametrize("cfg", [models.PRESETS["gpt2-small"], models.PRESETS["gpt3-175b"],
                                 DecoderConfig(4, 24, 6, 17, 13, 11),
                                 DecoderConfig(4, 24, 6, 17, 13, 11, kv_heads=6)])
def test_ratio_is_one_when_every_head_has_its_own_keys(cfg):
    assert cfg.kv_heads == cfg.heads and cfg.attention_kind == "MHA"
    assert counting.kv_ratio_to_mha(cfg) == 1


def test_published_ratios_are_exact_fractions():
    ratios = {k: counting.kv_ratio_to_mha(m.config) for k, m in MODELS.items()}
    assert ratios == {"gpt3-175b": 1, "llama2-70b": Fraction(1, 8), "llama3-8b": Fraction(1, 4),
                      "mistral-7b": Fraction(1, 4), "deepseek-v3": Fraction(576, 32768)}


def test_the_window_caps_the_cache_at_w_rows():
    mistral = MODELS["mistral-7b"].config
    per_token = counting.kv_cache_bytes(mistral)
    assert counting.kv_cache_bytes(mistral, 4095) == 4095 * per_token
    for n in (4096, 4097, 8192, 10**6):
        assert counting.kv_cache_bytes(mistral, n) == 4096 * per_token
    unwindowed = DecoderConfig(32, 4096, 32, 14336, 32000, 8192, kv_heads=8)
    assert counting.kv_cache_bytes(unwindowed, 8192) == 2 * counting.kv_cache_bytes(mistral, 8192)


def test_cache_counts_agree_with_what_kv_cache_holds():
    """The numbers a KVCache keeps (h_kv heads, at most w rows) are kv_values_per_token's."""
    dims = mha_lit.Dims(tokens=9, d_model=12, d_k=5, d_v=5, heads=6, kv_heads=2)
    W = init_weights(dims, seed=3)
    for window in (None, 4):
        cache = mha_lit.KVCache(W, window=window)
        cache.extend(_X(dims))
        held = cache.keys.size + cache.values.size
        cfg = DecoderConfig(1, 12, 6, 7, 13, 9, kv_heads=2, d_k=5, window=window)
        assert held == counting.kv_cache_bytes(cfg, 9, bytes_per_value=1)


def test_latent_counts_agree_with_chapter_17_when_present():
    latent = pytest.importorskip("mha_lit.latent")
    if not hasattr(latent, "PUBLISHED"):
        pytest.skip("mha_lit.latent has no published sizes")
    dims = latent.PUBLISHED["deepseek-v3"]
    cfg = MODELS["deepseek-v3"].config
    assert counting.kv_cache_bytes(cfg, 5) == latent.latent_cache_bytes(dims, 5)
    assert counting.kv_ratio_to_mha(cfg) == Fraction(latent.latent_cache_bytes(dims),
                                                     latent.mha_cache_bytes(dims))


def test_attention_parameters_equal_the_arrays_of_grouped_weights():
    dims = mha_lit.Dims(tokens=3, d_model=12, d_k=5, d_v=5, heads=6, kv_heads=2)
    W = init_weights(dims, seed=0)
    cfg = DecoderConfig(1, 12, 6, 7, 13, 11, kv_heads=2, d_k=5)
    assert sum(a.size for a in W.arrays().values()) == counting.decoder_param_breakdown(cfg)["attention"]


def test_a_moe_routing_every_expert_activates_everything_but_the_embedding():
    moe = MoE(n_routed=4, n_active=4, d_expert=3, n_shared=1, first_dense=1)
    cfg = DecoderConfig(3, 10, 2, 7, 13, 11, moe=moe)
    assert counting.active_param_count(cfg) == counting.param_count(cfg) - 13 * 10
    fewer = DecoderConfig(3, 10, 2, 7, 13, 11, moe=MoE(4, 1, 3, n_shared=1, first_dense=1))
    assert counting.param_count(cfg) - counting.active_param_count(fewer) == 13 * 10 + 2 * 3 * (3 * 10 * 3)


def test_tied_decoder_counts_one_embedding_matrix():
    cfg = DecoderConfig(2, 10, 2, 7, 13, 11)
    assert counting.param_count(cfg) - counting.param_count(cfg, tied=True) == 13 * 10
    assert counting.active_param_count(cfg, tied=True) == counting.param_count(cfg, tied=True)


def test_sequences_that_fit_by_hand():
    llama = MODELS["llama3-8b"].config
    weights = 2 * counting.param_count(llama)
    per_sequence = 2 * 32 * 8 * 128 * 2 * 131072
    assert counting.sequences_that_fit(llama, 141e9) == int((141e9 - weights) // per_sequence) == 7
    assert counting.sequences_that_fit(llama, 141e9, tokens=1024) == int((141e9 - weights) // (per_sequence // 128))
    with pytest.raises(ValueError, match="more than the 141.0 GB"):
        counting.sequences_that_fit(MODELS["gpt3-175b"].config, 141e9)


def test_sequences_that_fit_names_the_weights_size():
    """GPT-3 175B: 174,604,259,328 parameters (chapter 10) are 349.2 GB at 2 bytes and
    698.4 GB at 4 (counting-414)."""
    gpt3 = MODELS["gpt3-175b"].config
    assert counting.param_count(gpt3) == 174_604_259_328
    with pytest.raises(ValueError, match=r"^the weights take 349\.2 GB at 2 bytes per parameter, "
                                         r"more than the 141\.0 GB of memory$"):
        counting.sequences_that_fit(gpt3, 141e9)
    with pytest.raises(ValueError, match=r"^the weights take 698\.4 GB at 4 bytes per parameter, "
                                         r"more than the 80\.0 GB of memory$"):
        counting.sequences_that_fit(gpt3, 80e9, bytes_per_value=4)


def test_router_bias_adds_one_number_per_routed_expert_and_layer():
    plain = DecoderConfig(5, 10, 2, 7, 13, 11, moe=MoE(6, 2, 3, first_dense=2))
    biased = dataclasses.replace(plain, moe=dataclasses.replace(plain.moe, router_bias=True))
    assert counting.param_count(biased) - counting.param_count(plain) == 3 * 6
    assert counting.active_param_count(biased) - counting.active_param_count(plain) == 3 * 6


@pytest.mark.parametrize("fn", [counting.non_embedding_params, counting.matmul_count,
                                lambda c: counting.forward_flops(c, 8), counting.attention_crossover])
def test_gpt_only_counts_refuse_a_decoder_config(fn):
    """A DecoderConfig is not a TransformerConfig (they are siblings): refused by its type."""
    with pytest.raises(TypeError, match=r"needs a TransformerConfig \(the GPT block of chapters "
                                        r"10-13.*\), got DecoderConfig$"):
        fn(MODELS["llama3-8b"].config)


@pytest.mark.parametrize("fn", [counting.kv_cache_bytes, counting.kv_values_per_token,
                                counting.kv_ratio_to_mha, counting.param_count,
                                lambda c: counting.sequences_that_fit(c, 1e12)])
def test_counts_of_any_model_take_both_kinds_and_refuse_others(fn):
    assert fn(models.PRESETS["gpt2-small"]) > 0
    assert fn(MODELS["llama3-8b"].config) > 0
    with pytest.raises(TypeError, match=r"needs a ModelSizes, got tuple$"):
        fn((12, 768, 12))


def test_active_count_needs_a_decoder_config():
    with pytest.raises(TypeError, match=r"needs a DecoderConfig \(.*\), got TransformerConfig"):
        counting.active_param_count(models.PRESETS["gpt2-small"])
    with pytest.raises(TypeError, match="needs a DecoderConfig"):
        counting.decoder_param_breakdown(models.PRESETS["gpt2-small"], active=True)


# --- chapter 18's figure ------------------------------------------------------------------

def test_kv_cache_growth_draws_caches_weights_and_capacity():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mha_lit import plots
    n = np.array([1, 2, 4, 8])
    curves = {"a": (n, 3e8 * n), "b": (n[:3], [5e8, 5e8, 5e8])}
    fig = plots.kv_cache_growth(curves, weights={"a": 7e9}, capacity=("device", 2e10))
    ax = fig.axes[0]
    lines = {ln.get_gid(): ln for ln in ax.lines if ln.get_gid()}
    assert set(lines) == {"cache:a", "cache:b", "weights:a", "capacity"}
    gib = 2**30  # the axis is in GiB
    assert np.allclose(lines["cache:a"].get_ydata(), 3e8 * n / gib, rtol=1e-12, atol=0)
    assert np.isclose(lines["weights:a"].get_ydata()[0], 7e9 / gib, rtol=1e-12)
    assert np.isclose(lines["capacity"].get_ydata()[0], 2e10 / gib, rtol=1e-12)
    assert "GiB" in ax.get_ylabel()
    assert lines["weights:a"].get_color() == lines["cache:a"].get_color()
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    plt.close(fig)
    with pytest.raises(ValueError, match="shapes .4,. and .3,."):
        plots.kv_cache_growth({"a": (n, n[:3])})
    with pytest.raises(ValueError, match="'c', which has no curve"):
        plots.kv_cache_growth(curves, weights={"c": 1.0})
    with pytest.raises(ValueError, match="log axes need positive"):
        plots.kv_cache_growth({"a": (n, 0 * n)})
    with pytest.raises(ValueError, match="capacity must be positive"):
        plots.kv_cache_growth(curves, capacity=("device", 0))


# --- chapter 20: what the backward pass keeps -------------------------------------------------

GPT2, GPT3 = models.PRESETS["gpt2-small"], models.PRESETS["gpt3-175b"]


@pytest.mark.parametrize("cfg", [GPT2, GPT3, TransformerConfig(3, 35, 5, 23, 13, 19)])
def test_backward_activations_are_the_inputs_of_every_step(cfg):
    n, d, f = cfg.context_length, cfg.d_model, cfg.d_ff
    kept = counting.backward_activations(cfg, n)
    assert len(kept) == 11 and sum(kept.values()) == 8 * d + 2 * f + cfg.heads * n
    assert kept["S (h rows of n weights)"] == cfg.heads * n
    # 2 bytes a number, as Korthikanti et al. count activations
    assert counting.activation_bytes(cfg, n, 2, "none") == 2 * (8 * d + 2 * f + cfg.heads * n)
    assert counting.activation_bytes(cfg, n, 2, "book") == 2 * (8 * d + f)
    assert counting.activation_bytes(cfg, n, 2, "full") == 2 * d
    assert counting.activation_bytes(cfg, n, 8, "book") == 4 * counting.activation_bytes(
        cfg, n, 2, "book")


def test_the_book_level_is_what_the_layer_backward_keeps():
    """grad's layer cache holds X, Q, K, V and Concat; loss_and_grads keeps beside it the
    block's input, X' and LN_2(X') (d_model each) and U (d_ff): S and G are recomputed."""
    from mha_lit import grad
    cfg = TransformerConfig(1, 6, 2, 13, 11, 7)  # d_k = 3
    dims = Dims(tokens=7, d_model=6, d_k=3, d_v=3, heads=2)
    _, cache = grad._layer_forward(np.zeros((1, 7, 6)), init_weights(dims), True)
    per_token = sum(getattr(cache, f.name).size for f in dataclasses.fields(cache)) // 7
    assert per_token == 6 + 4 * 2 * 3  # LN_1(X), Q, K, V, Concat
    assert counting.activation_bytes(cfg, 7, 1, "book") == per_token + 3 * 6 + 13


@pytest.mark.parametrize("cfg", [GPT2, GPT3])
def test_korthikantis_formula_and_what_the_book_keeps_differ_by_named_arrays(cfg):
    s, h, a = cfg.context_length, cfg.d_model, cfg.heads
    paper = {r: counting.published_activation_bytes(cfg, s, 1, r)
             for r in ("none", "selective", "full")}
    ours = {r: counting.activation_bytes(cfg, s, 2, r) * s for r in counting.RECOMPUTE}
    assert paper["none"] == s * h * 34 + 5 * a * s * s  # sbh (34 + 5 a s / h), b = 1
    # theirs adds two 1-byte dropout masks of s h (attention and MLP outputs), the 1-byte
    # mask of the a s^2 weights and the 16-bit dropped-out weights (2 a s^2)
    assert paper["none"] - ours["none"] == 2 * s * h + 3 * a * s * s
    # selective: they keep GELU's output (2 x 4 h per token) and the two masks;
    # the book recomputes G from U
    assert paper["selective"] - ours["book"] == 2 * s * h + 8 * s * h
    assert paper["full"] == ours["full"] == 2 * s * h
    # a batch of b sequences: b times one
    assert counting.published_activation_bytes(cfg, s, 3) == 3 * paper["none"]


def test_training_state_is_sixteen_bytes_per_parameter():
    for cfg in (GPT2, GPT3, models.MODELS["llama2-70b"].config):
        state = counting.training_state_bytes(cfg)
        assert sum(state.values()) == 16 * counting.param_count(cfg)
        assert state["weights (16-bit)"] == state["gradients (16-bit)"]
    # Rajbhandari et al. 2020: GPT-2 with 1.5B parameters needs at least 24 GB
    assert 24e9 < sum(counting.training_state_bytes(models.PRESETS["gpt2-xl"]).values()) < 25e9


def test_activation_counts_refuse_bad_arguments():
    with pytest.raises(ValueError, match=r"recompute must be one of \('none', 'book', 'full'\)"):
        counting.activation_bytes(GPT2, 1024, 2, "selective")
    with pytest.raises(ValueError, match="recompute must be one of .*'selective'"):
        counting.published_activation_bytes(GPT2, 1024, 1, "book")
    with pytest.raises(ValueError, match="bytes_per_value must be positive"):
        counting.activation_bytes(GPT2, 1024, 0)
    with pytest.raises(ValueError, match="tokens must be a positive integer"):
        counting.backward_activations(GPT2, 0)
    with pytest.raises(TypeError, match="needs a TransformerConfig"):
        counting.activation_bytes(models.MODELS["llama2-70b"].config, 1024)


def test_training_memory_bars_stack_each_part_and_keep_its_colour():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from test_plots import SMALLEST_TEXT_PT, _text_below

    from mha_lit import plots
    budgets = {"a": {"one": {"x": 1e9, "y": 2e9}, "two": {"x": 1e9, "z": 5e8}},
               "b": {"one": {"y": 3e11}}}
    fig = plots.training_memory_bars(budgets, capacity=("device", 8e10))
    rects = {r.get_gid(): r for ax in fig.axes for r in ax.patches if r.get_gid()}
    assert set(rects) == {"a:one:x", "a:one:y", "a:two:x", "a:two:z", "b:one:y"}
    assert rects["a:one:y"].get_x() == pytest.approx(1.0)  # stacked after x, in GB
    assert rects["a:one:y"].get_width() == pytest.approx(2.0)
    assert rects["a:one:y"].get_facecolor() == rects["b:one:y"].get_facecolor()
    assert rects["a:one:x"].get_facecolor() != rects["a:one:y"].get_facecolor()
    texts = [t.get_text().strip() for t in fig.axes[0].texts]
    assert texts == ["3 GB", "1.5 GB"]
    assert [t.get_text().strip() for t in fig.axes[1].texts] == ["300 GB"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["x", "y", "z", "device"]
    assert _text_below(fig, SMALLEST_TEXT_PT) == []
    plt.close(fig)
    with pytest.raises(ValueError, match="sizes must be >= 0"):
        plots.training_memory_bars({"a": {"one": {"x": -1.0}}})
    with pytest.raises(ValueError, match="has no bar"):
        plots.training_memory_bars({"a": {}})
    with pytest.raises(ValueError, match="capacity must be positive"):
        plots.training_memory_bars(budgets, capacity=("device", 0))
