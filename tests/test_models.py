"""The model sizes: GPT presets and published decoders, as their sources print them."""

import dataclasses
import pprint

import pytest

from mha_lit import models
from mha_lit.models import (
    MODELS,
    DecoderConfig,
    LatentKV,
    ModelSizes,
    MoE,
    TransformerConfig,
)

# --- GPT configurations (chapter 10) ----------------------------------------------------------

def test_config_d_k_is_d_model_over_heads():
    assert TransformerConfig(3, 35, 5, 77, 13, 11).d_k == 7


@pytest.mark.parametrize("field_index", range(6))
@pytest.mark.parametrize("bad", [0, -2])
def test_config_refuses_non_positive_sizes(field_index, bad):
    args = [3, 35, 5, 77, 13, 11]
    args[field_index] = bad
    with pytest.raises(ValueError, match=str(bad)):
        TransformerConfig(*args)


def test_config_refuses_indivisible_d_model():
    with pytest.raises(ValueError, match="d_model = 5140 is not divisible by heads = 40"):
        TransformerConfig(40, 5140, 40, 4 * 5140, 50257, 2048)


def test_config_refuses_float_sizes():
    with pytest.raises(TypeError, match="d_model"):
        TransformerConfig(3, 35.0, 5, 77, 13, 11)


def test_gpt3_175b_preset_matches_the_paper():
    c = models.PRESETS["gpt3-175b"]
    assert (c.layers, c.d_model, c.heads, c.d_k) == (96, 12288, 96, 128)
    assert (c.d_ff, c.context_length, c.vocab_size) == (49152, 2048, 50257)


def test_presets_are_configs_with_published_sizes():
    assert set(models.PRESETS) == set(models.PUBLISHED_PARAMS)
    assert all(isinstance(c, TransformerConfig) for c in models.PRESETS.values())


def test_gpt_presets_print_as_before():
    """Chapter 10 pretty-prints GPT-3's configuration: its six fields, one a line."""
    printed = pprint.pformat(models.PRESETS["gpt3-175b"], width=77)
    assert printed == ("TransformerConfig(layers=96,\n                  d_model=12288,\n"
                       "                  heads=96,\n                  d_ff=49152,\n"
                       "                  vocab_size=50257,\n                  context_length=2048)")


# (layers, d_model, heads, d_ff, vocab_size, context_length), as published.
# GPT-2: Radford et al. 2019, Table 2 (layers, d_model); section 2.2 (vocabulary 50,257,
#   context 1024); heads from the released models (d_k 64).
# GPT-3: Brown et al. 2020, Table 2.1 (layers, d_model, heads); section 2.1 (n_ctx = 2048,
#   d_ff = 4 d_model). Two rows are kept as PRESETS' comment explains: XL with 16 heads of 128
#   (the table prints 24 heads, which 2048 cannot hold) and 13B with d_model 5120 (the table
#   prints 5140, 40 heads of 128 = 5120).
PUBLISHED_SHAPES = {
    "gpt2-small": (12, 768, 12, 3072, 50257, 1024),
    "gpt2-medium": (24, 1024, 16, 4096, 50257, 1024),
    "gpt2-large": (36, 1280, 20, 5120, 50257, 1024),
    "gpt2-xl": (48, 1600, 25, 6400, 50257, 1024),
    "gpt3-small": (12, 768, 12, 3072, 50257, 2048),
    "gpt3-medium": (24, 1024, 16, 4096, 50257, 2048),
    "gpt3-large": (24, 1536, 16, 6144, 50257, 2048),
    "gpt3-xl": (24, 2048, 16, 8192, 50257, 2048),
    "gpt3-2.7b": (32, 2560, 32, 10240, 50257, 2048),
    "gpt3-6.7b": (32, 4096, 32, 16384, 50257, 2048),
    "gpt3-13b": (40, 5120, 40, 20480, 50257, 2048),
    "gpt3-175b": (96, 12288, 96, 49152, 50257, 2048),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_SHAPES))
def test_every_preset_has_its_published_shape(name):
    """Every field of every preset, exactly (counting-114, counting-131): a context one token
    off changes the parameter count by only d_model, far inside the 1 % tolerances."""
    c = models.PRESETS[name]
    assert type(c) is TransformerConfig
    assert (c.layers, c.d_model, c.heads, c.d_ff, c.vocab_size,
            c.context_length) == PUBLISHED_SHAPES[name]
    assert set(models.PRESETS) == set(PUBLISHED_SHAPES)


# --- decoders of today's kind, and the published ones (chapter 18) -------------------------

# Every field of MODELS' configurations, from the sources their comments cite (counting-286).
PUBLISHED_MODELS = {
    # Brown et al. 2020, Table 2.1
    "gpt3-175b": ("GPT-3 175B", "brown2020language", 175e9, None,
                  TransformerConfig(layers=96, d_model=12288, heads=96, d_ff=49152,
                                    vocab_size=50257, context_length=2048)),
    # Touvron et al. 2023b, Table 1 (4k context, GQA) and the released configuration
    "llama2-70b": ("Llama 2 70B", "touvron2023llama2", 70e9, None,
                   DecoderConfig(layers=80, d_model=8192, heads=64, d_ff=28672,
                                 vocab_size=32000, context_length=4096, kv_heads=8)),
    # Grattafiori et al. 2024, Table 3; 128K = 131,072 tokens; released vocabulary 128,256
    "llama3-8b": ("Llama 3 8B", "grattafiori2024llama3", 8e9, None,
                  DecoderConfig(layers=32, d_model=4096, heads=32, d_ff=14336,
                                vocab_size=128256, context_length=131072, kv_heads=8)),
    # Jiang et al. 2023, Table 1
    "mistral-7b": ("Mistral 7B", "jiang2023mistral", 7e9, None,
                   DecoderConfig(layers=32, d_model=4096, heads=32, d_ff=14336,
                                 vocab_size=32000, context_length=8192, kv_heads=8,
                                 d_k=128, window=4096)),
    # DeepSeek-AI 2024, sections 2.1.2, 4.2 and 4.3; dense width and vocabulary released
    "deepseek-v3": ("DeepSeek-V3", "deepseek2024v3", 671e9, 37e9,
                    DecoderConfig(layers=61, d_model=7168, heads=128, d_ff=18432,
                                  vocab_size=129280, context_length=131072, d_k=128,
                                  latent=LatentKV(d_c=512, d_r=64, d_cq=1536),
                                  moe=MoE(n_routed=256, n_active=8, d_expert=2048, n_shared=1,
                                          first_dense=3, router_bias=True))),
}


@pytest.mark.parametrize("key", sorted(PUBLISHED_MODELS))
def test_every_model_has_its_published_configuration(key):
    name, source, params, active, config = PUBLISHED_MODELS[key]
    m = MODELS[key]
    assert (m.name, m.source, m.params, m.active_params) == (name, source, params, active)
    assert type(m.config) is type(config)
    assert dataclasses.asdict(m.config) == dataclasses.asdict(config)  # every field, exactly
    assert set(MODELS) == set(PUBLISHED_MODELS)


def test_models_are_the_five_of_the_chapter():
    assert set(MODELS) == set(PUBLISHED_MODELS)
    assert MODELS["gpt3-175b"].config is models.PRESETS["gpt3-175b"]
    assert all(m.source and m.name for m in MODELS.values())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kv_heads=3), ValueError, "8 query heads cannot be split into 3 equal groups"),
    (dict(kv_heads=16), ValueError, "kv_heads must divide heads .got heads = 8, kv_heads = 16"),
    (dict(kv_heads=0), ValueError, "kv_heads must be a positive integer, got 0"),
    (dict(window=0), ValueError, "window must be a positive integer"),
    (dict(d_k=2.0), TypeError, "d_k must be a positive integer"),
    (dict(latent=LatentKV(4, 2), kv_heads=2), ValueError, "MLA caches one latent"),
    (dict(latent=(4, 2)), TypeError, "latent must be a LatentKV"),
    (dict(moe=MoE(4, 2, 3, first_dense=5)), ValueError, "no expert layer among layers = 5"),
])
def test_decoder_config_refuses_bad_sizes(kwargs, error, match):
    with pytest.raises(error, match=match):
        DecoderConfig(5, 24, 8, 7, 13, 11, **kwargs)


def test_decoder_config_needs_d_k_when_d_model_does_not_split():
    with pytest.raises(ValueError, match="d_model = 25 is not divisible by heads = 4: give d_k"):
        DecoderConfig(2, 25, 4, 7, 13, 11)
    assert DecoderConfig(2, 25, 4, 7, 13, 11, d_k=6).d_k == 6


@pytest.mark.parametrize("args, error, match", [
    ((2, 3, 5), ValueError, "n_active = 3 experts per token exceeds n_routed = 2"),
    ((2, 1, 5, -1), ValueError, "n_shared must be a whole number >= 0, got -1"),
    ((2, 1, 5, 1, 1.5), TypeError, "first_dense must be a whole number >= 0, got 1.5"),
    ((2, 1, 5, 1, 0, 1), TypeError, "router_bias must be True or False, got 1"),
    ((0, 1, 5), ValueError, "n_routed must be a positive integer")])
def test_moe_refuses_bad_layouts(args, error, match):
    with pytest.raises(error, match=match):
        MoE(*args)


def test_latent_refuses_bad_sizes():
    with pytest.raises(ValueError, match="d_c must be a positive integer"):
        LatentKV(0, 64)
    with pytest.raises(ValueError, match="d_cq must be a positive integer"):
        LatentKV(512, 64, d_cq=0)


# --- one base of sizes, two siblings -----------------------------------------------------------

def test_gpt_and_decoder_configs_are_siblings_on_one_base_of_sizes():
    assert issubclass(TransformerConfig, ModelSizes) and issubclass(DecoderConfig, ModelSizes)
    assert not issubclass(DecoderConfig, TransformerConfig)
    assert not issubclass(TransformerConfig, DecoderConfig)
    base = [f.name for f in dataclasses.fields(ModelSizes)]
    assert base == ["layers", "d_model", "heads", "d_ff", "vocab_size", "context_length"]
    assert [f.name for f in dataclasses.fields(TransformerConfig)] == base
    assert [f.name for f in dataclasses.fields(DecoderConfig)] == base + [
        "kv_heads", "d_k", "window", "latent", "moe"]


@pytest.mark.parametrize("sizes", [(3, 35, 5, 77, 13, 11), (2, 91, 13, 17, 29, 7), (5, 12, 6, 1, 2, 3)])
def test_both_kinds_give_the_same_sizes_by_the_same_names(sizes):
    gpt, decoder = TransformerConfig(*sizes), DecoderConfig(*sizes)
    for name in ("layers", "d_model", "heads", "d_ff", "vocab_size", "context_length",
                 "d_k", "kv_heads", "attention_kind"):
        assert getattr(gpt, name) == getattr(decoder, name), name
    assert gpt.d_k == sizes[1] // sizes[2] and gpt.kv_heads == sizes[2]
    assert (gpt.ffn_kind, decoder.ffn_kind) == ("GELU", "SwiGLU")


def test_decoder_config_fills_in_kv_heads_and_d_k_but_not_for_a_latent():
    """None means "as many as query heads" and "d_model / heads"; MLA has no key/value heads."""
    plain = DecoderConfig(2, 24, 6, 7, 13, 11)
    assert (plain.kv_heads, plain.d_k) == (6, 4)
    assert plain == DecoderConfig(2, 24, 6, 7, 13, 11, kv_heads=6, d_k=4)
    mla = DecoderConfig(2, 24, 6, 7, 13, 11, latent=LatentKV(8, 4))
    assert (mla.kv_heads, mla.d_k, mla.attention_kind) == (None, 4, "MLA")
    assert dataclasses.replace(MODELS["llama3-8b"].config, kv_heads=1).attention_kind == "MQA"


def test_check_config_names_the_caller_and_the_kind_it_needs():
    gpt, llama = models.PRESETS["gpt2-small"], MODELS["llama3-8b"].config
    assert models.check_config(gpt, TransformerConfig, "f") is gpt
    assert models.check_config(llama) is llama  # any model
    with pytest.raises(TypeError, match=r"^f needs a TransformerConfig \(the GPT block .*\), "
                                        r"got DecoderConfig$"):
        models.check_config(llama, TransformerConfig, "f")
    with pytest.raises(TypeError, match=r"^g needs a DecoderConfig \(a decoder of today's kind, "
                                        r"chapter 18\), got TransformerConfig$"):
        models.check_config(gpt, DecoderConfig, "g")
