"""Grouped-query and multi-query attention across mha_lit (Part III, chapter 14).

Query head i uses key/value head i // g, g = h / h_kv. The laws: h_kv = h is the book's
multi-head attention (the same sizes and weights, exactly; the same outputs, to rounding); in general the layer equals multi-head attention with every
key/value head repeated g times; reference and fast path agree; rows stay causal; the KV cache
keeps h_kv heads and equals full recomputation; the fast path never copies K or V per query
head; bad shapes are refused with the shapes named.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from shapes_for_tests import PRIME_DIMS  # noqa: E402

from mha_lit import (  # noqa: E402
    Dims,
    KVCache,
    Weights,
    attention,
    fast,
    init_weights,
    masks,
    multi_head_attention,
    plots,
    variants,
)
from mha_lit.fast import multi_head_attention_fast  # noqa: E402
from mha_lit.trace import record_matmuls  # noqa: E402
from mha_lit.variants import reference

TOL = {np.float64: 1e-12, np.float32: 2e-5}

# (tokens, d_model, d_k, d_v, heads, kv_heads): distinct sizes, grouped, with d_k != d_v
GQA_DIMS = [
    Dims(13, 5, 7, 11, heads=6, kv_heads=2),  # the chapter's example
    Dims(3, 5, 7, 11, heads=2, kv_heads=1),  # the book's sizes, multi-query
    Dims(5, 7, 3, 13, heads=6, kv_heads=3),
    Dims(7, 11, 13, 2, heads=10, kv_heads=5),
    Dims(2, 3, 5, 7, heads=4, kv_heads=2),
    Dims(11, 2, 3, 5, heads=9, kv_heads=3),
    Dims(17, 13, 2, 3, heads=8, kv_heads=1),
]


def _x(dims, seed=0, dtype=np.float64, batch=None):
    shape = (dims.tokens, dims.d_model) if batch is None else (batch, dims.tokens, dims.d_model)
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _repeated(W):
    """Multi-head weights with K/V head i // g given to query head i (biases too)."""
    g = W.group
    rep = {"W_Q": W.W_Q, "W_K": np.repeat(W.W_K, g, axis=0),
           "W_V": np.repeat(W.W_V, g, axis=0), "W_O": W.W_O}
    if W.has_biases:
        rep |= {"b_Q": W.bias("b_Q"), "b_K": np.repeat(W.bias("b_K"), g, axis=0),
                "b_V": np.repeat(W.bias("b_V"), g, axis=0), "b_O": W.bias("b_O")}
    return Weights(**rep)


def _close(A, B, dtype=np.float64):
    return A.shape == B.shape and np.allclose(A, B, rtol=0, atol=TOL[dtype])


# --- h_kv = h is the book's multi-head attention --------------------------------------------

@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
@pytest.mark.parametrize("biases", [False, True])
def test_kv_heads_equal_to_heads_is_multi_head_attention(dims, biases):
    same = Dims(dims.tokens, dims.d_model, dims.d_k, dims.d_v, dims.heads, kv_heads=dims.heads)
    assert same == dims and repr(same) == repr(dims) and same.group == 1
    W, W_same = init_weights(dims, seed=3, biases=biases), init_weights(same, seed=3, biases=biases)
    # the same draws: equal arrays, compared exactly
    assert W.arrays().keys() == W_same.arrays().keys()
    assert all(np.array_equal(W.arrays()[k], W_same.arrays()[k]) for k in W.arrays())
    X = _x(dims, seed=1)
    # Part I's multi-head attention written out: head i with its own K_i and V_i
    b_Q, b_K, b_V = W.bias("b_Q"), W.bias("b_K"), W.bias("b_V")  # zeros without biases
    for causal in (True, False):
        mask = masks.causal(dims.tokens) if causal else None
        heads = [attention(X @ W.W_Q[i] + b_Q[i], X @ W.W_K[i] + b_K[i], X @ W.W_V[i] + b_V[i],
                           mask) for i in range(dims.heads)]
        Y = np.concatenate(heads, axis=1) @ W.W_O + W.bias("b_O")
        for run in (multi_head_attention, reference):
            assert _close(run(X, W, causal), Y) and _close(run(X, W_same, causal), Y)


# --- grouped = multi-head with repeated K and V ------------------------------------------

@pytest.mark.parametrize("dims", GQA_DIMS, ids=str)
@pytest.mark.parametrize("biases", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_equals_multi_head_with_repeated_keys_and_values(dims, biases, causal):
    W = init_weights(dims, seed=5, biases=biases)
    W_rep = _repeated(W)
    assert (W_rep.heads, W_rep.kv_heads) == (dims.heads, dims.heads)
    for i in range(dims.heads):  # query head i gets a copy of K/V head i // g
        assert np.array_equal(W_rep.W_K[i], W.W_K[i // dims.group])
    X = _x(dims, seed=2)
    assert _close(multi_head_attention(X, W, causal), multi_head_attention(X, W_rep, causal))
    assert _close(reference(X, W, causal),
                  reference(X, W_rep, causal))


@pytest.mark.parametrize("dims", GQA_DIMS, ids=str)
@pytest.mark.parametrize("biases", [False, True])
def test_repeat_kv_gives_query_head_i_the_kv_head_i_over_g(dims, biases):
    W = init_weights(dims, seed=5, biases=biases)
    R = variants.repeat_kv(W)
    assert (R.heads, R.kv_heads, R.has_biases) == (dims.heads, dims.heads, biases)
    expected = _repeated(W)  # the test's own repeat, written out
    assert R.arrays().keys() == expected.arrays().keys()
    assert all(np.array_equal(R.arrays()[k], expected.arrays()[k]) for k in R.arrays())
    assert np.array_equal(R.W_Q, W.W_Q) and np.array_equal(R.W_O, W.W_O)  # untouched
    W_mha = init_weights(Dims(dims.tokens, dims.d_model, dims.d_k, dims.d_v, dims.heads), seed=5)
    assert variants.repeat_kv(W_mha) is W_mha  # no groups: as it is


def test_grouping_changes_the_output_when_the_heads_differ():
    """The repeated-weights law is not vacuous: other K/V heads give another output."""
    dims = GQA_DIMS[0]
    W = init_weights(dims, seed=5)
    other = Weights(W_Q=W.W_Q, W_K=W.W_K[::-1], W_V=W.W_V, W_O=W.W_O)  # groups swap keys
    X = _x(dims)
    assert np.abs(multi_head_attention(X, W) - multi_head_attention(X, other)).max() > 1e-3


@pytest.mark.parametrize("dims", GQA_DIMS[:4], ids=str)
def test_batch_with_key_mask_equals_repeated_and_each_sequence_alone(dims):
    W = init_weights(dims, seed=7, biases=True)
    X = _x(dims, seed=3, batch=3)
    lengths = [dims.tokens, max(1, dims.tokens - 2), 1]
    mask = np.arange(dims.tokens)[None, :] < np.array(lengths)[:, None]  # (3, n), right padding
    Y = multi_head_attention(X, W, key_mask=mask)
    assert _close(Y, multi_head_attention(X, _repeated(W), key_mask=mask))
    assert _close(Y, reference(X, W, key_mask=mask))
    for b, m in enumerate(lengths):
        assert _close(Y[b, :m], multi_head_attention(X[b, :m], W))
        assert not Y[b, m:].any()  # padded rows output 0


# --- reference == fast ------------------------------------------------------------------------

@pytest.mark.parametrize("dims", GQA_DIMS, ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [True, False])
def test_fast_path_equals_reference(dims, dtype, causal):
    W = init_weights(dims, seed=11, dtype=dtype, biases=True)
    X = _x(dims, seed=4, dtype=dtype)
    Y = multi_head_attention(X, W, causal)
    assert Y.dtype == dtype
    assert _close(Y, reference(X, W, causal), dtype)


@given(n=st.integers(1, 30), groups=st.sampled_from([(6, 2), (6, 1), (4, 4), (9, 3), (8, 2)]),
       block=st.integers(1, 9), tile=st.one_of(st.none(), st.integers(1, 7)),
       causal=st.booleans(), seed=st.integers(0, 1000))
def test_any_block_and_tile_agree_with_reference(n, groups, block, tile, causal, seed):
    heads, kv = groups
    W = init_weights(Dims(n, 5, 7, 3, heads=heads, kv_heads=kv), seed=seed, biases=True)
    X = np.random.default_rng(seed).standard_normal((n, 5))
    Y = multi_head_attention_fast(X, W, causal, block=block, tile=tile)
    assert _close(Y, reference(X, W, causal))


# --- causality -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [d for d in GQA_DIMS if d.tokens > 2], ids=str)
def test_rows_depend_only_on_earlier_rows(dims):
    W = init_weights(dims, seed=13, biases=True)
    X = _x(dims, seed=5)
    t = dims.tokens // 2
    X2 = X.copy()
    X2[t:] += 10 * np.random.default_rng(9).standard_normal(X2[t:].shape)  # change rows t+1 ..
    for f in (multi_head_attention, reference):
        Y, Y2 = f(X, W), f(X2, W)
        assert np.allclose(Y[:t], Y2[:t], rtol=0, atol=TOL[np.float64])  # rows 1 .. t unmoved
        assert np.abs(Y[t:] - Y2[t:]).max() > 1e-3  # the changed rows did move


# --- the KV cache ------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", GQA_DIMS, ids=str)
def test_cache_steps_keep_kv_heads_and_equal_full_recomputation(dims):
    W = init_weights(dims, seed=17, biases=True)
    X = _x(dims, seed=6)
    cache = KVCache(W, capacity=2)  # small: the buffers must grow
    Y = np.stack([cache.step(x) for x in X])
    assert _close(Y, multi_head_attention(X, W))
    assert cache.keys.shape == (dims.kv_heads, dims.tokens, dims.d_k)
    assert cache.values.shape == (dims.kv_heads, dims.tokens, dims.d_v)
    # the cached rows are the key/value heads' own projections, not per query head
    K0 = X @ W.W_K[0] + W.bias("b_K")[0]
    assert np.allclose(cache.keys[0], K0, rtol=0, atol=TOL[np.float64])


@pytest.mark.parametrize("dims", GQA_DIMS, ids=str)
def test_cache_extend_then_step_equals_full_recomputation(dims):
    W = init_weights(dims, seed=19)
    X = _x(dims, seed=7)
    p = (dims.tokens + 1) // 2
    cache = KVCache(W)
    out = [cache.extend(X[:p])] + [cache.step(x)[None] for x in X[p:]]
    assert _close(np.concatenate(out), multi_head_attention(X, W))
    assert cache.keys.shape == (dims.kv_heads, dims.tokens, dims.d_k)


@given(groups=st.sampled_from([(6, 2), (6, 3), (4, 1), (9, 3)]),
       lengths=st.lists(st.integers(0, 6), min_size=1, max_size=3).filter(lambda ls: max(ls) > 0), steps=st.integers(1, 4),
       seed=st.integers(0, 1000))
def test_batched_cache_with_key_mask_equals_each_sequence_alone(groups, lengths, steps, seed):
    heads, kv = groups
    dims = Dims(6, 5, 7, 3, heads=heads, kv_heads=kv)
    W = init_weights(dims, seed=seed, biases=True)
    B, m = len(lengths), max(lengths)
    rng = np.random.default_rng(seed)
    prompts = rng.standard_normal((B, m, 5))
    mask = np.arange(m)[None, :] < np.array(lengths)[:, None]  # (B, m)
    new = rng.standard_normal((steps, B, 5))
    cache = KVCache(W, batch=B)
    first = cache.extend(prompts, key_mask=mask)  # (B, m, 5)
    later = np.stack([cache.step(x) for x in new], axis=1)  # (B, steps, 5)
    for b, n_b in enumerate(lengths):
        rows = np.concatenate([prompts[b, :n_b], new[:, b]])  # (n_b + steps, 5)
        Y = multi_head_attention(rows, W)
        assert _close(first[b, :n_b], Y[:n_b]) and not first[b, n_b:].any()
        assert _close(later[b], Y[n_b:])
    assert cache.keys.shape == (B, kv, m + steps, 7)


# --- no copy of K or V per query head --------------------------------------------------------

def _batched_products(f):
    """(left shape, right shape) of every product with a batch axis that f computes."""
    with record_matmuls() as log:
        f(log)
    return [(r.a_shape, r.b_shape) for r in log.records if len(r.b_shape) > 2]


@pytest.mark.parametrize("dims", [d for d in GQA_DIMS if d.group > 1], ids=str)
@pytest.mark.parametrize("tile", [None, 2])
def test_fast_path_multiplies_each_kv_head_once_against_its_stacked_queries(dims, tile):
    W = init_weights(dims, seed=23)
    X = _x(dims, seed=8)
    n, h_kv, g = dims.tokens, dims.kv_heads, dims.group
    shapes = _batched_products(
        lambda log: multi_head_attention_fast(log.track(X), W, True, block=n, tile=tile))
    assert shapes, "the fast path's Q K^T and S V were not recorded"
    for a, b in shapes:  # every Q K^T and S V: h_kv heads, g*n stacked query rows
        assert a[0] == b[0] == h_kv and a[1] == g * n
    # the same layer with its K/V heads copied per query head has h heads in these products
    rep = _batched_products(lambda log: multi_head_attention(log.track(X), _repeated(W)))
    assert rep and all(a[0] == b[0] == dims.heads and a[1] == n for a, b in rep)


@pytest.mark.parametrize("lead", [(), (3,)], ids=["one sequence", "a stack of 3"])
@pytest.mark.parametrize("tile", [None, 2])
@pytest.mark.parametrize("dims", [d for d in GQA_DIMS if d.group > 1], ids=str)
def test_the_kernel_multiplies_each_kv_head_once_against_its_stacked_queries(dims, tile, lead):
    """fast.attend after fast.group_queries, as the forward pass and the cache call it: leading
    axes of sequences, then h_kv K/V heads, each against g*n stacked query rows; never h heads."""
    rng = np.random.default_rng(31)
    n, h, h_kv, g = dims.tokens, dims.heads, dims.kv_heads, dims.group
    Q = rng.standard_normal(lead + (h, n, dims.d_k))
    K = rng.standard_normal(lead + (h_kv, n, dims.d_k))
    V = rng.standard_normal(lead + (h_kv, n, dims.d_v))
    pos = np.broadcast_to(np.arange(n), lead + (n,))
    with record_matmuls() as log:
        Qg, pos_g = fast.group_queries(log.track(Q), pos, h_kv)
        H = fast.ungroup(fast.attend(Qg, K, V, pos_g, pos, masks.visible, block=g * n, tile=tile), h)
    assert log.records, "the kernel's Q K^T and S V were not recorded"
    for r in log.records:  # every Q K^T and S V
        assert r.a_shape[:-2] == r.b_shape[:-2] == lead + (h_kv,) and r.a_shape[-2] == g * n
    # chapter 3's kernel with K/V head i // g repeated for query head i (Q already scaled)
    assert np.allclose(H, attention(Q, np.repeat(K, g, axis=-3), np.repeat(V, g, axis=-3),
                                    masks.causal(n), scale=1.0), rtol=0, atol=1e-12)
    # the same heads with K and V repeated per query head: h heads, n rows each
    with record_matmuls() as rep_log:
        fast.attend(rep_log.track(Q), np.repeat(K, g, axis=-3), np.repeat(V, g, axis=-3), pos, pos,
                    masks.visible, block=n, tile=tile)
    assert rep_log.records and all(r.a_shape[:-2] == lead + (h,) and r.a_shape[-2] == n
                                   for r in rep_log.records)


@pytest.mark.parametrize("dims", [d for d in GQA_DIMS if d.group > 1], ids=str)
def test_cache_step_multiplies_the_cached_kv_heads_as_they_are(dims):
    W = init_weights(dims, seed=29)
    X = _x(dims, seed=9)
    n, h_kv, g = dims.tokens, dims.kv_heads, dims.group
    cache = KVCache(W)
    if n > 1:
        cache.extend(X[:-1])
    shapes = _batched_products(lambda log: cache.step(log.track(X[-1])))
    scores, values = shapes  # q K^T, then e V
    assert scores == ((1, h_kv, g, dims.d_k), (1, h_kv, dims.d_k, n))
    assert values == ((1, h_kv, g, n), (1, h_kv, n, dims.d_v))


# --- bad input ---------------------------------------------------------------------------------

def test_kv_heads_that_do_not_divide_heads_are_refused():
    with pytest.raises(ValueError, match=r"6 query heads cannot be split into 4 equal groups"):
        Dims(13, 5, 7, 11, heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="kv_heads must be a positive integer, got 0"):
        Dims(heads=6, kv_heads=0)
    with pytest.raises(ValueError, match=r"W_K has shape \(4, 5, 7\) but W_Q has shape \(6, 5, 7\)"):
        Weights(W_Q=np.ones((6, 5, 7)), W_K=np.ones((4, 5, 7)), W_V=np.ones((4, 5, 11)),
                W_O=np.ones((66, 5)))


def test_key_and_value_head_counts_that_disagree_are_refused():
    with pytest.raises(ValueError, match=r"W_V has shape \(3, 5, 11\) but W_K has shape \(2, 5, 7\)"):
        Weights(W_Q=np.ones((6, 5, 7)), W_K=np.ones((2, 5, 7)), W_V=np.ones((3, 5, 11)),
                W_O=np.ones((66, 5)))
    with pytest.raises(ValueError, match=r"b_K has shape \(6, 7\)"):
        Weights(W_Q=np.ones((6, 5, 7)), W_K=np.ones((2, 5, 7)), W_V=np.ones((2, 5, 11)),
                W_O=np.ones((66, 5)), b_K=np.ones((6, 7)))
    with pytest.raises(ValueError, match=r"W_O has shape \(22, 5\)"):  # W_O follows query heads
        Weights(W_Q=np.ones((6, 5, 7)), W_K=np.ones((2, 5, 7)), W_V=np.ones((2, 5, 11)),
                W_O=np.ones((22, 5)))


# --- the figure --------------------------------------------------------------------------------

@pytest.mark.parametrize("heads,kv_heads", [(6, [6, 2, 1]), (4, 2), (9, [3]), (8, [1, 4])])
def test_head_groups_joins_every_query_head_to_its_kv_head(heads, kv_heads):
    counts = [kv_heads] if isinstance(kv_heads, int) else kv_heads
    fig = plots.head_groups(heads, kv_heads)
    assert isinstance(fig, plt.Figure) and len(fig.axes) == len(counts)
    for ax, h_kv in zip(fig.axes, counts):
        g = heads // h_kv
        patches = {p.get_gid(): p for p in ax.patches}
        assert sorted(patches) == sorted([f"query:{i}" for i in range(1, heads + 1)]
                                         + [f"kv:{j}" for j in range(1, h_kv + 1)])
        lines = {ln.get_gid(): ln for ln in ax.lines}
        assert sorted(lines) == sorted(f"uses:{i}->{(i - 1) // g + 1}" for i in range(1, heads + 1))
        for gid, line in lines.items():
            i, j = map(int, gid.removeprefix("uses:").split("->"))
            q, kv = patches[f"query:{i}"], patches[f"kv:{j}"]
            (x0, x1), (y0, y1) = line.get_xdata(), line.get_ydata()
            assert x0 == pytest.approx(q.get_x() + q.get_width() / 2) and y0 == pytest.approx(q.get_y())
            assert x1 == pytest.approx(kv.get_x() + kv.get_width() / 2)
            assert y1 == pytest.approx(kv.get_y() + kv.get_height())
            to_rgb = matplotlib.colors.to_rgb  # one colour per group
            assert to_rgb(line.get_color()) == to_rgb(kv.get_edgecolor()) == to_rgb(q.get_edgecolor())
        kind = "multi-head" if h_kv == heads else "multi-query" if h_kv == 1 else "grouped-query"
        assert ax.get_title().startswith(kind)
    plt.close(fig)


def test_head_groups_refuses_bad_counts():
    with pytest.raises(ValueError, match="6 query heads cannot be split into 4 equal groups"):
        plots.head_groups(6, 4)
    with pytest.raises(ValueError, match="kv_heads must be a positive integer, got 0"):
        plots.head_groups(6, [2, 0])
    with pytest.raises(TypeError, match="heads must be a positive integer, got True"):
        plots.head_groups(True, 1)
    with pytest.raises(ValueError, match="at least one"):
        plots.head_groups(6, [])
