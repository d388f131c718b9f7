"""Attention sinks and stacks of local and global layers (Part III, chapter 16).

Floats are compared with TOL = 1e-12 (rounding only): the masked attention over all keys and
plain attention over the kept keys compute the same real numbers with sums of different
lengths. Masks, patterns, token counts and bytes are integers or booleans and compare exactly.
"""

from fractions import Fraction

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mha_lit import (  # noqa: E402
    Dims,
    attention,
    counting,
    init_weights,
    masks,
    models,
    multi_head_attention,
)
from mha_lit.plots import local_global_cache, sink_band_mask  # noqa: E402

TOL = 1e-12
SMALLEST_TEXT_PT = 7  # as tests/test_plots.py


def _sink_band(n, w, k, m=None):
    """The definition: query position p (the last n of m) sees key u < m when u <= p and
    (u < k or p - u < w), positions from 0."""
    m = n if m is None else m
    return np.array([[u <= p and (u < k or p - u < w) for u in range(m)]
                     for p in range(m - n, m)])


def _kept(p, w, k):
    """The keys query position p keeps: the first k and the last w up to p, in order."""
    return sorted(set(range(min(k, p + 1))) | set(range(max(0, p - w + 1), p + 1)))


# --- the mask ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n, w, k, m", [(19, 3, 2, None), (13, 5, 4, None), (7, 2, 3, 11),
                                        (1, 1, 0, 1), (5, 7, 2, None), (11, 1, 1, 23),
                                        (3, 2, 5, 3)])
def test_sink_band_is_its_definition(n, w, k, m):
    assert np.array_equal(masks.sink_band(n, w, k, m), _sink_band(n, w, k, m))


@given(n=st.integers(1, 30), w=st.integers(1, 30), k=st.integers(0, 30))
def test_every_query_sees_min_of_t_and_sinks_plus_window_keys(n, w, k):
    seen = masks.sink_band(n, w, k).sum(axis=1)  # query t = 1 .. n
    assert seen.tolist() == [counting.sink_tokens_held(t, w, k) for t in range(1, n + 1)]
    assert seen.tolist() == [min(t, k + w) for t in range(1, n + 1)]


@pytest.mark.parametrize("n, w", [(19, 3), (8, 1), (5, 9)])
def test_no_sinks_is_the_band_and_a_long_window_or_many_sinks_is_causal(n, w):
    assert np.array_equal(masks.sink_band(n, w, 0), masks.band(n, w))
    assert np.array_equal(masks.sink_band(n, n, 2), masks.causal(n))
    assert np.array_equal(masks.sink_band(n, w, n), masks.causal(n))
    # the sinks only add keys: the band is inside, and nothing after t
    assert np.all(masks.sink_band(n, w, 2) >= masks.band(n, w))
    assert not np.any(masks.sink_band(n, w, 2) & ~masks.causal(n))


def test_the_kept_keys_stop_being_one_run_after_sinks_plus_window():
    w, k = 3, 2
    for t in range(1, 20):  # query t, from 1
        kept = np.flatnonzero(masks.sink_band(19, w, k)[t - 1])
        contiguous = np.array_equal(kept, np.arange(kept[0], kept[-1] + 1))
        assert contiguous == (t <= k + w)


# --- the mask in the one kernel equals attention on the kept keys ------------------------------

SINK_DIMS = [Dims(tokens=19, d_model=5, d_k=7, d_v=11, heads=2),
             Dims(tokens=13, d_model=3, d_k=5, d_v=2, heads=1),
             Dims(tokens=23, d_model=7, d_k=3, d_v=13, heads=3)]


@pytest.mark.parametrize("dims", SINK_DIMS)
@pytest.mark.parametrize("w, k", [(3, 2), (4, 1), (2, 5), (1, 1)])
def test_masked_attention_equals_plain_attention_on_the_kept_keys(dims, w, k):
    rng = np.random.default_rng(dims.tokens + 7 * w + k)
    n = dims.tokens
    Q = rng.standard_normal((n, dims.d_k))  # (n, d_k)
    K = rng.standard_normal((n, dims.d_k))  # (n, d_k)
    V = rng.standard_normal((n, dims.d_v))  # (n, d_v)
    H = attention(Q, K, V, masks.sink_band(n, w, k))  # (n, d_v)
    for p in range(n):
        keep = _kept(p, w, k)
        H_p = attention(Q[p:p + 1], K[keep], V[keep])  # (1, d_v), no mask
        assert np.allclose(H[p], H_p[0], rtol=0, atol=TOL)


@pytest.mark.parametrize("n, m, w, k", [(1, 19, 3, 2), (4, 17, 5, 3), (6, 6, 2, 1)])
def test_queries_after_earlier_keys_use_the_same_rule(n, m, w, k):
    """The last n of m positions, as a cache supplies m - n earlier keys."""
    rng = np.random.default_rng(m)
    Q = rng.standard_normal((n, 7))  # (n, 7)
    K = rng.standard_normal((m, 7))  # (m, 7)
    V = rng.standard_normal((m, 11))  # (m, 11)
    H = attention(Q, K, V, masks.sink_band(n, w, k, m))  # (n, 11)
    for row, p in enumerate(range(m - n, m)):
        keep = _kept(p, w, k)
        assert np.allclose(H[row], attention(Q[row:row + 1], K[keep], V[keep])[0],
                           rtol=0, atol=TOL)


def test_the_sinks_change_the_output_where_they_are_hidden_from_the_window():
    rng = np.random.default_rng(3)
    Q, K, V = (rng.standard_normal((19, 7)) for _ in range(3))  # (19, 7) each
    with_sinks = attention(Q, K, V, masks.sink_band(19, 3, 2))  # (19, 7)
    window = attention(Q, K, V, masks.band(19, 3))  # (19, 7)
    moved = np.abs(with_sinks - window).max(axis=1) > TOL  # (19,)
    assert moved.tolist() == [t > 3 for t in range(1, 20)]  # keys 1 and 2 left the window


@pytest.mark.parametrize("sinks, window", [(2, 3), (4, 4092)])
def test_sink_cache_counts(sinks, window):
    for n in (1, sinks, sinks + window - 1, sinks + window, sinks + window + 1, 10**6):
        held = counting.sink_tokens_held(n, window, sinks)
        assert held == (n if n <= sinks + window else sinks + window)
    assert counting.sink_tokens_held(4_194_304, 4092, 4) == 4096


# --- stacks of local and global layers ---------------------------------------------------------


@pytest.mark.parametrize("n, w, L", [(19, 3, 1), (19, 3, 4), (13, 5, 3), (7, 2, 6)])
def test_an_all_local_stack_reaches_as_window_reach(n, w, L):
    kinds = ["local"] * L
    assert np.array_equal(masks.stack_reach(n, kinds, w), masks.window_reach(n, w, L))
    for t in range(1, n + 1):
        assert counting.stack_receptive_field(kinds, w, t) == min(t, L * (w - 1) + 1)


@pytest.mark.parametrize("kinds", [["global"], ["local", "global"], ["global", "local"],
                                   ["local", "local", "global", "local"]])
@pytest.mark.parametrize("n, w", [(19, 3), (11, 1), (5, 2)])
def test_one_global_layer_reaches_the_first_token(kinds, n, w):
    R = masks.stack_reach(n, kinds, w)
    assert np.array_equal(R, masks.causal(n))
    assert [counting.stack_receptive_field(kinds, w, t) for t in range(1, n + 1)] == \
        R.sum(axis=1).tolist() == list(range(1, n + 1))


@pytest.mark.parametrize("kinds", [("local", "global"), ("local", "local"), ("global",),
                                   ("local", "local", "local")])
def test_the_pattern_is_what_moves_through_real_layers(kinds):
    """Change each input row of a stack of the book's layers; the output rows that move
    beyond rounding are exactly the pattern of stack_reach."""
    dims, w = Dims(tokens=11, d_model=5, d_k=7, d_v=11, heads=2), 2
    layers = [init_weights(dims, seed=s) for s in range(len(kinds))]
    rng = np.random.default_rng(5)

    def stack(X):
        for kind, W in zip(kinds, layers, strict=True):
            X = multi_head_attention(X, W, window=w if kind == "local" else None)
        return X

    X = rng.standard_normal((dims.tokens, dims.d_model))  # (11, 5)
    Y = stack(X)  # (11, 5)
    moved = np.zeros((11, 11), dtype=bool)
    for u in range(11):
        X_changed = X.copy()
        X_changed[u] += rng.standard_normal(dims.d_model)
        change = np.abs(stack(X_changed) - Y).max(axis=1)  # (11,)
        assert np.all((change <= TOL) | (change > 1e-9)), change
        moved[:, u] = change > TOL
    assert np.array_equal(moved, masks.stack_reach(11, kinds, w))


def test_tokens_held_layer_by_layer():
    kinds = ("local", "global", "local")
    assert counting.stack_tokens_held(kinds, 4, 3) == [3, 3, 3]
    assert counting.stack_tokens_held(kinds, 4, 4) == [4, 4, 4]
    assert counting.stack_tokens_held(kinds, 4, 10) == [4, 10, 4]


# Gemma 2 as released (published data): layers, d_model, heads, key/value heads, head_dim,
# sliding_window, max_position_embeddings of google/gemma-2-2b, -9b, -27b's config.json.
GEMMA2 = {"gemma2-2b": (26, 2304, 8, 4, 256), "gemma2-9b": (42, 3584, 16, 8, 256),
          "gemma2-27b": (46, 4608, 32, 16, 128)}


@pytest.mark.parametrize("key", sorted(GEMMA2))
def test_gemma2_data_alternates_local_and_global_from_a_local_first_layer(key):
    g = models.LOCAL_GLOBAL[key]
    assert (g.layers, g.d_model, g.heads, g.kv_heads, g.d_k) == GEMMA2[key]
    assert (g.window, g.context_length, g.source) == (4096, 8192, "gemma2024gemma2")
    assert g.kinds == tuple("local" if i % 2 == 0 else "global" for i in range(g.layers))
    assert key not in models.MODELS  # chapter 18's table is unchanged
    assert g.all_global().kinds == ("global",) * g.layers


@pytest.mark.parametrize("key", sorted(GEMMA2))
def test_gemma2_cache_against_hand_counts(key):
    L, _, _, h_kv, d_k = GEMMA2[key]
    g = models.LOCAL_GLOBAL[key]
    per_row = 2 * h_kv * d_k * 2  # a key and a value row of every key/value head, 16-bit
    for n in (1, 4095, 4096, 4097, 8192, 32768, 131072):
        released = counting.stack_kv_cache_bytes(g, n)
        full = counting.stack_kv_cache_bytes(g.all_global(), n)
        assert released == (L // 2) * (min(n, 4096) + n) * per_row
        assert full == L * n * per_row
        if n >= 4096:  # (1/2)(1 + w/n), exactly
            assert Fraction(released, full) == Fraction(1, 2) * (1 + Fraction(4096, n))
        else:
            assert released == full
    assert counting.stack_kv_cache_bytes(g, 8192, bytes_per_value=1) * 2 == \
        counting.stack_kv_cache_bytes(g, 8192)


def test_gemma2_9b_at_8k_by_hand():
    g = models.LOCAL_GLOBAL["gemma2-9b"]
    # 21 local layers of 4,096 rows, 21 global of 8,192; 2 * 8 * 256 * 2 bytes a row
    assert counting.stack_kv_cache_bytes(g, 8192) == 21 * (4096 + 8192) * 8192
    assert counting.stack_kv_cache_bytes(g, 8192) / 2**30 == 1.96875  # exact in binary
    assert counting.stack_kv_cache_bytes(g.all_global(), 8192) / 2**30 == 2.625
    assert counting.stack_receptive_field(g.kinds, g.window, 8192) == 8192
    assert counting.stack_receptive_field(("local",) * 42, 4096, 10**6) == 42 * 4095 + 1


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, error, message", [
    ((19, 0, 2), ValueError, "window must be a positive integer, got 0"),
    ((19, 3, -1), ValueError, "sinks must be a whole number >= 0, got -1"),
    ((19, 3, 2.5), TypeError, "sinks must be a whole number >= 0, got 2.5"),
    ((19, 2.0, 2), TypeError, "window must be a positive integer, got 2.0"),
    ((0, 3, 2), ValueError, "n must be a positive integer, got 0"),
    ((5, 3, 2, 4), ValueError, "5 queries cannot be the last of only 4 positions"),
])
def test_sink_band_refuses_bad_sizes(args, error, message):
    with pytest.raises(error, match=message):
        masks.sink_band(*args)


@pytest.mark.parametrize("kinds, error, message", [
    (["local", "glob"], ValueError, r"kinds\[1\] must be 'local' or 'global', got 'glob'"),
    ([], ValueError, "kinds must name at least one layer"),
    ("local", TypeError, "kinds must be a sequence of layer kinds"),
    ([None], ValueError, r"kinds\[0\] must be 'local' or 'global', got None"),
])
def test_layer_kinds_are_refused_with_the_entry_named(kinds, error, message):
    with pytest.raises(error, match=message):
        masks.stack_reach(5, kinds, 2)
    with pytest.raises(error, match=message):
        counting.stack_receptive_field(kinds, 2, 3)
    with pytest.raises(error, match=message):
        counting.stack_tokens_held(kinds, 2, 3)


def test_counts_refuse_bad_sizes_and_configurations():
    with pytest.raises(ValueError, match="window must be a positive integer, got 0"):
        counting.sink_tokens_held(10, 0, 4)
    with pytest.raises(ValueError, match="sinks must be a whole number >= 0, got -4"):
        counting.sink_tokens_held(10, 3, -4)
    with pytest.raises(ValueError, match="tokens must be a positive integer, got 0"):
        counting.sink_tokens_held(0, 3, 4)
    with pytest.raises(ValueError, match="t must be a positive integer, got 0"):
        counting.stack_receptive_field(["local"], 3, 0)
    with pytest.raises(ValueError, match="window must be a positive integer, got -2"):
        counting.stack_tokens_held(["local"], -2, 5)
    with pytest.raises(TypeError, match="stack_kv_cache_bytes needs a LocalGlobal, got "
                                        "DecoderConfig"):
        counting.stack_kv_cache_bytes(models.MODELS["mistral-7b"].config, 8192)
    g = models.LOCAL_GLOBAL["gemma2-2b"]
    with pytest.raises(ValueError, match="bytes_per_value must be a positive integer"):
        counting.stack_kv_cache_bytes(g, 8192, bytes_per_value=0)
    with pytest.raises(ValueError, match="kv_heads must divide heads"):
        models.LocalGlobal("x", ("local",), 8, 8, 3, 2, 4, 16, "none")
    with pytest.raises(ValueError, match=r"kinds\[0\] must be 'local' or 'global'"):
        models.LocalGlobal("x", ("sliding",), 8, 8, 4, 2, 4, 16, "none")
    with pytest.raises(ValueError, match="window must be a positive integer, got 0"):
        models.LocalGlobal("x", ("local",), 8, 8, 4, 2, 0, 16, "none")


# --- the figures -------------------------------------------------------------------------------


def _small_text(fig):
    fig.canvas.draw()
    return [(t.get_text(), t.get_fontsize()) for t in fig.findobj(matplotlib.text.Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < SMALLEST_TEXT_PT]


@pytest.mark.parametrize("n, w, k, query", [(19, 3, 2, None), (9, 2, 1, 4), (25, 4, 3, 25),
                                            (1, 1, 0, 1)])
def test_sink_band_mask_draws_the_band_and_the_sinks(n, w, k, query):
    fig = sink_band_mask(n, w, k, query)
    q = n if query is None else query
    left, right = fig.axes
    window = np.asarray(left.collections[0].get_array()).reshape(n, n)
    kept = np.asarray(right.collections[0].get_array()).reshape(n, n)
    assert np.array_equal(window > 0, masks.band(n, w))
    assert np.array_equal(kept > 0, masks.sink_band(n, w, k))
    assert np.array_equal(kept == 2, masks.sink_band(n, w, k) & ~masks.band(n, w))
    assert f"query {q} sees {min(q, w)} keys" in left.get_title()
    assert f"{k} sinks and window w = {w}\nquery {q} sees {min(q, k + w)} keys" == \
        right.get_title()
    for ax in (left, right):
        outline = [p for p in ax.patches if p.get_gid() == "query"]
        assert len(outline) == 1 and outline[0].get_xy() == (0, q - 1)
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("key u", "query t")
    assert _small_text(fig) == []
    plt.close(fig)


@pytest.mark.parametrize("args, error, message", [
    ((19, 3, -1), ValueError, "sinks must be a whole number >= 0, got -1"),
    ((19, 0, 2), ValueError, "window must be a positive integer, got 0"),
    ((19, 3, 2, 20), ValueError, r"query must be a position 1 \.\. 19, got 20"),
    ((19, 3, 2, 0), ValueError, r"query must be a position 1 \.\. 19, got 0"),
])
def test_sink_band_mask_refuses_bad_sizes(args, error, message):
    with pytest.raises(error, match=message):
        sink_band_mask(*args)
    plt.close("all")


def test_local_global_cache_draws_each_stack_beside_all_global():
    lengths = [1024 * i for i in range(1, 33)]
    curves = {}
    for g in models.LOCAL_GLOBAL.values():
        curves[g.name] = (lengths, [counting.stack_kv_cache_bytes(g, n) for n in lengths],
                          [counting.stack_kv_cache_bytes(g.all_global(), n) for n in lengths])
    fig = local_global_cache(curves, 4096, 8192)
    ax = fig.axes[0]
    lines = {line.get_gid(): line for line in ax.get_lines()}
    for label, (n, a, b) in curves.items():
        assert np.array_equal(lines[f"stack:{label}"].get_xdata(), n)
        assert np.allclose(lines[f"stack:{label}"].get_ydata(), np.array(a) / 2**30,
                           rtol=0, atol=0)
        assert np.allclose(lines[f"global:{label}"].get_ydata(), np.array(b) / 2**30,
                           rtol=0, atol=0)
        assert lines[f"global:{label}"].get_color() == lines[f"stack:{label}"].get_color()
    assert lines["window"].get_xdata()[0] == 4096 and lines["context"].get_xdata()[0] == 8192
    assert _small_text(fig) == []
    plt.close(fig)


def test_local_global_cache_refuses_bad_curves():
    with pytest.raises(ValueError, match="curves must name at least one model"):
        local_global_cache({}, 4096, 8192)
    with pytest.raises(ValueError, match="needs two byte counts per length"):
        local_global_cache({"a": ([1, 2], [1, 2], [1])}, 4096, 8192)
    with pytest.raises(ValueError, match="holds more with its local layers"):
        local_global_cache({"a": ([1, 2], [3, 4], [1, 2])}, 4096, 8192)
    with pytest.raises(ValueError, match="context must be a positive integer, got 0"):
        local_global_cache({"a": ([1, 2], [1, 2], [1, 2])}, 4096, 0)
    plt.close("all")
