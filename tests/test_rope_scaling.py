"""RoPE scaling rules (chapter 15, "Beyond the trained length").

Each rule against values computed by hand from its paper's formula, the released code's
differences from the papers, the attention of a Llama-style layer as Hugging Face's
LlamaAttention computes it (transcribed here independently, float64), the cache, and
refusals that name the key.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_lit import KVCache, multi_head_attention, rope, variants
from mha_lit.shapes import Dims, init_weights

LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
DEEPSEEK_V3 = {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
               "mscale": 1.0, "mscale_all_dim": 1.0,
               "original_max_position_embeddings": 4096}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
LINEAR = {"type": "linear", "factor": 4.0}
# Hugging Face's "dynamic" reads L0 from the model config's max_position_embeddings, not
# from rope_scaling; rope.frequencies reads it from the dictionary, so DYNAMIC carries the
# max_position_embeddings of the config that hf_llama_attention is given
MAX_POSITION_EMBEDDINGS = 8
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0,
           "original_max_position_embeddings": MAX_POSITION_EMBEDDINGS}
# Llama 3.1's rule with a trained length short enough for 13 positions and base 500
LLAMA_SMALL = {**LLAMA31, "original_max_position_embeddings": 16}
RULES = [LLAMA_SMALL, DEEPSEEK_V3, YARN, LINEAR, DYNAMIC]


def test_no_rule_is_the_plain_frequencies():
    assert np.array_equal(rope.frequencies(14, 10000.0, None), rope.frequencies(14))


def test_linear_divides_every_frequency_by_the_factor():
    # Chen et al. 2023: position p read as p / s, so p omega_i / s
    omega = 10000.0 ** (-np.arange(0, 14, 2) / 14)
    np.testing.assert_allclose(rope.frequencies(14, 10000.0, LINEAR), omega / 4,
                               rtol=1e-15)


def test_dynamic_raises_the_base_from_the_current_length():
    # d = 4, base 1e4, s = 2, L0 = 100, L = 300: base' = 1e4 (2*3 - 1)^(4/2) = 250,000
    cfg = {"type": "dynamic", "factor": 2, "original_max_position_embeddings": 100}
    np.testing.assert_allclose(rope.frequencies(4, 1e4, cfg, length=300),
                               [1.0, 250_000 ** -0.5], rtol=1e-14)
    # up to the trained length the frequencies are the trained ones
    for L in (0, 1, 50, 100):
        np.testing.assert_allclose(rope.frequencies(4, 1e4, cfg, length=L),
                                   rope.frequencies(4, 1e4), rtol=1e-15)
    with pytest.raises(ValueError, match="length="):
        rope.frequencies(4, 1e4, cfg)


def test_llama3_by_wavelength():
    # Llama 3.1: d 128, base 500,000; wavelengths below 8192/4 kept, above 8192/1 divided
    # by 8, between them blended with a = (8192 / wavelength - 1) / (4 - 1)
    omega = 500_000.0 ** (-np.arange(0, 128, 2) / 128)
    got = rope.frequencies(128, 500_000.0, LLAMA31)
    for i, w in enumerate(omega):
        lam = 2 * math.pi / w
        if lam < 2048:
            expect = w
        elif lam > 8192:
            expect = w / 8
        else:
            a = (8192 / lam - 1) / 3
            expect = (1 - a) * w / 8 + a * w
        assert got[i] == pytest.approx(expect, rel=1e-14), i
    kept = int((2 * math.pi / omega < 2048).sum())
    divided = int((2 * math.pi / omega > 8192).sum())
    assert (kept, divided) == (29, 29)  # and 6 blended: the 64 planes of Llama 3.1


def test_yarn_released_ramp_and_the_papers_ramp():
    # the released code: boundary planes floor(i(beta_fast)), ceil(i(beta_slow)) where
    # i(r) = d ln(L0 / (2 pi r)) / (2 ln base), then a linear ramp over the plane index
    d, base, s, L0 = 64, 10000.0, 40.0, 4096
    got = rope.frequencies(d, base, DEEPSEEK_V3)
    omega = base ** (-np.arange(0, d, 2) / d)

    def plane(r):
        return d * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(base))
    low, high = math.floor(plane(32)), math.ceil(plane(1))
    assert (low, high) == (10, 23)
    for i, w in enumerate(omega):
        ramp = min(max((i - low) / (high - low), 0), 1)
        assert got[i] == pytest.approx(w / s * ramp + w * (1 - ramp), rel=1e-14)
    # Peng et al. 2023, eq. 18-19: gamma(r) by turns r = L0 / wavelength, alpha 1, beta 32
    r = L0 * omega / (2 * math.pi)
    gamma = np.clip((r - 1) / (32 - 1), 0, 1)
    paper = (1 - gamma) * omega / s + gamma * omega
    # both keep the fast planes and divide the slow ones; between they differ
    fast, slow = r > 32, r < 1
    np.testing.assert_allclose(got[fast], paper[fast], rtol=1e-14)
    np.testing.assert_allclose(got[slow], paper[slow], rtol=1e-14)
    assert np.abs(got - paper).max() > 1e-3 * omega.min()


def test_yarn_attention_factor():
    # Peng et al.: sqrt(1/t) = 0.1 ln s + 1; the scores carry 1/t
    assert rope.attention_factor(YARN) == pytest.approx((0.1 * math.log(4) + 1) ** 2)
    # DeepSeek-V3's dictionary: mscale / mscale_all_dim = 1 on cos and sin
    assert rope.attention_factor(DEEPSEEK_V3) == 1.0
    assert rope.yarn_mscale(40, 1.0) ** 2 == pytest.approx(1.8739, abs=5e-5)
    assert rope.attention_factor({**YARN, "attention_factor": 0.5}) == 0.25
    for cfg in (LLAMA31, LINEAR, DYNAMIC, None):
        assert rope.attention_factor(cfg) == 1.0
    assert rope.yarn_mscale(1.0) == 1.0 and rope.yarn_mscale(0.5) == 1.0


@pytest.mark.parametrize("bad, key", [
    ({"rope_type": "llama3", "factor": 8.0}, "low_freq_factor"),
    ({"type": "yarn", "factor": 4}, "original_max_position_embeddings"),
    # a released "dynamic" dictionary: the message says where Hugging Face finds L0
    ({"type": "dynamic", "factor": 2.0}, "model config's max_position_embeddings"),
    ({"rope_type": "ntk", "factor": 2}, "rope_type"),
    ({"factor": 2}, "rope_type"),
    ({"type": "linear", "factor": 0.5}, "factor"),
    ({"type": "linear", "factor": "8"}, "factor"),
    ({"type": "linear", "factor": 2, "beta_fast": 32}, "beta_fast"),
    ({"rope_type": "linear", "type": "yarn", "factor": 2}, "two rules"),
    ({**LLAMA31, "high_freq_factor": 1.0}, "high_freq_factor"),
    ({**YARN, "original_max_position_embeddings": 32.5}, "original_max_position"),
    ({**YARN, "truncate": 1}, "truncate"),
])
def test_bad_configurations_are_refused_naming_the_key(bad, key):
    with pytest.raises(ValueError, match=key):
        rope.frequencies(8, 10000.0, bad, length=10)


def test_not_a_dict_and_no_base_are_refused():
    with pytest.raises(TypeError, match="dict"):
        rope.frequencies(8, 10000.0, "llama3")
    W = init_weights(Dims(d_k=8), seed=1)
    with pytest.raises(ValueError, match="rope_base"):
        multi_head_attention(np.ones((3, 5)), W, rope_scaling=LINEAR)


def hf_llama_attention(X, W, base, cfg, max_position_embeddings):
    """Hugging Face's LlamaAttention (eager, causal), transcribed: q_proj, k_proj,
    v_proj as (out, in) matrices, cos and sin of cat(freqs, freqs) times the rule's
    attention scaling, rotate_half, scores / sqrt(head_dim), softmax, o_proj.
    ``max_position_embeddings`` is the model config's, which "dynamic" reads."""
    n, d = X.shape[0], W.d_k
    inv_freq, scaling = hf_inv_freq(d, base, cfg, n, max_position_embeddings)
    freqs = np.arange(n)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb) * scaling, np.sin(emb) * scaling

    def rotate_half(x):
        return np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    q_proj = np.concatenate(list(W.W_Q), axis=1).T  # (h d, d_model)
    k_proj = np.concatenate(list(W.W_K), axis=1).T
    v_proj = np.concatenate(list(W.W_V), axis=1).T
    q = (X @ q_proj.T).reshape(n, W.heads, d).transpose(1, 0, 2)
    k = (X @ k_proj.T).reshape(n, W.kv_heads, d).transpose(1, 0, 2)
    v = (X @ v_proj.T).reshape(n, W.kv_heads, W.d_v).transpose(1, 0, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    g = W.heads // W.kv_heads
    k, v = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)
    z = q @ k.transpose(0, 2, 1) / math.sqrt(d)
    z = np.where(np.tril(np.ones((n, n), bool)), z, -np.inf)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = (p @ v).transpose(1, 0, 2).reshape(n, -1)
    return out @ W.W_O


def hf_inv_freq(d, base, cfg, seq_len, max_position_embeddings):
    """modeling_rope_utils' four rules, transcribed line by line (float64), as in
    recent releases. ``max_position_embeddings`` is the model config's: "dynamic"
    reads its L0 there, not from the rope_scaling dictionary."""
    inv = 1.0 / (base ** (np.arange(0, d, 2) / d))
    kind = cfg.get("rope_type", cfg.get("type"))
    if kind == "linear":
        return inv / cfg["factor"], 1.0
    if kind == "dynamic":
        L0 = max_position_embeddings  # config.max_position_embeddings, not cfg's key
        seq_len = max(seq_len, L0)
        b = base * ((cfg["factor"] * seq_len / L0) - (cfg["factor"] - 1)) ** (d / (d - 2))
        return 1.0 / (b ** (np.arange(0, d, 2) / d)), 1.0
    if kind == "llama3":
        factor, lo, hi = cfg["factor"], cfg["low_freq_factor"], cfg["high_freq_factor"]
        old = cfg["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return np.where(medium, smoothed, out), 1.0
    factor, L0 = cfg["factor"], cfg["original_max_position_embeddings"]

    def get_mscale(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
    att = cfg.get("attention_factor")
    if att is None:
        if cfg.get("mscale") and cfg.get("mscale_all_dim"):
            att = get_mscale(factor, cfg["mscale"]) / get_mscale(factor, cfg["mscale_all_dim"])
        else:
            att = get_mscale(factor)
    fast, slow = cfg.get("beta_fast") or 32, cfg.get("beta_slow") or 1

    def dim(rot):
        return (d * math.log(L0 / (rot * 2 * math.pi))) / (2 * math.log(base))
    low, high = math.floor(dim(fast)), math.ceil(dim(slow))
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    pos = base ** (np.arange(0, d, 2) / d)
    return (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra, att


@pytest.mark.parametrize("cfg", RULES, ids=lambda c: c.get("rope_type", c.get("type")))
@pytest.mark.parametrize("kv_heads", [None, 1])
def test_layer_equals_hugging_face_llama_attention(cfg, kv_heads):
    W = init_weights(Dims(tokens=13, d_model=9, d_k=16, d_v=5, heads=2, kv_heads=kv_heads),
                     seed=4)
    X = np.random.default_rng(5).standard_normal((13, 9))
    base = 500.0  # small, so that 13 positions reach the slow planes
    expect = hf_llama_attention(X, W, base, cfg, MAX_POSITION_EMBEDDINGS)
    for got in (multi_head_attention(X, W, rope_base=base, rope_scaling=cfg),
                variants.reference(X, W, rope_base=base, rope_scaling=cfg)):
        np.testing.assert_allclose(got, expect, rtol=0, atol=1e-13)
    # the rule changes the result (else the test would prove nothing)
    assert np.abs(multi_head_attention(X, W, rope_base=base) - expect).max() > 1e-6


@pytest.mark.parametrize("cfg", [LLAMA31, YARN, LINEAR], ids=["llama3", "yarn", "linear"])
def test_cache_equals_the_forward_pass(cfg):
    W = init_weights(Dims(d_k=16), seed=2)
    X = np.random.default_rng(3).standard_normal((12, 5))
    cache = KVCache(W, rope_base=500.0, rope_scaling=cfg)
    Y = np.concatenate([cache.extend(X[:5]), np.stack([cache.step(x) for x in X[5:]])])
    np.testing.assert_allclose(Y, multi_head_attention(X, W, rope_base=500.0, rope_scaling=cfg),
                               rtol=0, atol=1e-13)
    assert "llama3" in repr(KVCache(W, rope_base=1e4, rope_scaling=LLAMA31))


def test_dynamic_cache_keeps_the_keys_it_turned():
    # beyond L0 each new row is turned with the frequencies of the length reached, the
    # cached keys keep theirs: the first prefill equals the forward pass, later rows do not
    W = init_weights(Dims(d_k=16), seed=2)
    X = np.random.default_rng(3).standard_normal((14, 5))
    cache = KVCache(W, rope_base=500.0, rope_scaling=DYNAMIC)
    first = cache.extend(X[:10])
    np.testing.assert_allclose(first, multi_head_attention(X[:10], W, rope_base=500.0,
                                                          rope_scaling=DYNAMIC), atol=1e-13)
    last = [cache.step(x) for x in X[10:]][-1]
    whole = multi_head_attention(X, W, rope_base=500.0, rope_scaling=DYNAMIC)[-1]
    assert np.abs(last - whole).max() > 1e-6


def test_padded_batch_reads_the_longest_length():
    W = init_weights(Dims(d_k=16), seed=2)
    X = np.random.default_rng(3).standard_normal((2, 12, 5))
    mask = np.ones((2, 12), bool)
    mask[1, :4] = False
    got = multi_head_attention(X, W, key_mask=mask, rope_base=500.0, rope_scaling=DYNAMIC)
    ref = variants.reference(X, W, key_mask=mask, rope_base=500.0, rope_scaling=DYNAMIC)
    np.testing.assert_allclose(got, ref, atol=1e-13)


def test_rotate_scaled_multiplies_by_the_root_of_the_factor():
    x = np.random.default_rng(0).standard_normal((4, 8))
    p = np.arange(4)
    plain = rope.turn(x, p[:, None] * rope.frequencies(8, 1e4, YARN))
    np.testing.assert_allclose(rope.rotate_scaled(x, p, 1e4, YARN),
                               plain * math.sqrt(rope.attention_factor(YARN)), rtol=1e-15)
    assert np.array_equal(rope.rotate_scaled(x, p, 1e4, None), rope.rotate(x, p))
    with pytest.raises(ValueError, match=r"positions of shape \(3,\)"):
        rope.rotate_scaled(x, np.arange(3), 1e4, YARN)


# --- the figures of "Beyond the trained length" --------------------------------------------

def _texts_below(fig, points=7):
    """Visible texts of a drawn figure smaller than `points` (the book's smallest size)."""
    import matplotlib.text

    fig.canvas.draw()
    return [(t.get_text(), t.get_fontsize()) for t in fig.findobj(matplotlib.text.Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < points]


@pytest.mark.parametrize("d, base, L0, longer", [(128, 500_000.0, 8192, 32768),
                                                 (16, 500.0, 16, None), (6, 10.0, 3, 50)])
def test_rope_wavelengths_marks_the_planes_that_never_turned(d, base, L0, longer):
    import matplotlib.pyplot as plt

    from mha_lit import plots
    fig = plots.rope_wavelengths(d, base, L0, longer=longer)
    ax = fig.axes[0]
    by_gid = {c.get_gid(): c.get_offsets() for c in ax.collections}
    omega = base ** (-np.arange(0, d, 2) / d)  # the formula, not rope.frequencies
    never = (L0 - 1) * omega < 2 * math.pi
    j = np.arange(1, d // 2 + 1)
    for gid, planes in (("never turned", never), ("turned", ~never)):
        np.testing.assert_allclose(by_gid[gid], np.c_[j[planes], 2 * math.pi / omega[planes]],
                                   rtol=1e-12)
    lines = {ln.get_gid(): ln.get_ydata()[0] for ln in ax.lines}
    assert lines["trained"] == L0
    assert lines.get("longer") == longer
    assert ax.get_yscale() == "log"
    assert not _texts_below(fig)
    plt.close(fig)


def test_rope_wavelengths_counts_llama3s_29_planes():
    import matplotlib.pyplot as plt

    from mha_lit import plots
    fig = plots.rope_wavelengths(128, 500_000.0, 8192)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("(29 planes)" in label for label in labels)
    plt.close(fig)


def test_rope_scaling_frequencies_draws_each_rule_against_hugging_faces():
    import matplotlib.pyplot as plt

    from mha_lit import plots
    rules = {"llama3": LLAMA_SMALL, "yarn": DEEPSEEK_V3, "linear": LINEAR,
             "dynamic": DYNAMIC}
    d, base, n = 16, 500.0, 40
    fig = plots.rope_scaling_frequencies(d, base, rules, length=n, trained_length=16)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == list(rules)
    trained = 1.0 / base ** (np.arange(0, d, 2) / d)
    for ax, rule in zip(panels, rules.values()):
        lines = {ln.get_gid(): ln for ln in ax.lines}
        np.testing.assert_allclose(lines["trained"].get_ydata(), trained, rtol=1e-14)
        expect, _ = hf_inv_freq(d, base, rule, n, MAX_POSITION_EMBEDDINGS)  # as above
        np.testing.assert_allclose(lines["scaled"].get_ydata(), expect, rtol=1e-13)
        assert list(lines["scaled"].get_xdata()) == list(range(1, d // 2 + 1))
        assert lines["one turn"].get_ydata()[0] == pytest.approx(2 * math.pi / 16)
        assert ax.get_yscale() == "log"
    assert not _texts_below(fig)
    plt.close(fig)


def test_rope_scaling_frequencies_hides_unused_panels_and_refuses_bad_input():
    import matplotlib.pyplot as plt

    from mha_lit import plots
    fig = plots.rope_scaling_frequencies(8, 1e4, {"a": LINEAR, "b": LINEAR, "c": LINEAR})
    assert sum(ax.get_visible() for ax in fig.axes) == 3 and len(fig.axes) == 4
    assert not any(ln.get_gid() == "one turn" for ax in fig.axes for ln in ax.lines)
    plt.close(fig)
    with pytest.raises(ValueError, match="rules"):
        plots.rope_scaling_frequencies(8, 1e4, {})
    with pytest.raises(ValueError, match="low_freq_factor"):
        plots.rope_scaling_frequencies(8, 1e4, {"bad": {"rope_type": "llama3", "factor": 8}})
    with pytest.raises(ValueError, match="length="):
        plots.rope_scaling_frequencies(8, 1e4, {"dynamic": DYNAMIC})
    with pytest.raises(ValueError, match="cols"):
        plots.rope_scaling_frequencies(8, 1e4, {"a": LINEAR}, cols=0)
    with pytest.raises(ValueError, match="trained_length"):
        plots.rope_wavelengths(8, 1e4, 0)
    with pytest.raises(ValueError, match="even"):
        plots.rope_wavelengths(7, 1e4, 8)
    plt.close("all")
