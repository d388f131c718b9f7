import numpy as np
import pytest

from mha_lit import (
    Dims,
    KVCache,
    init_weights,
    multi_head_attention,
    softmax,
    trace,
)
from mha_lit.variants import reference
from tests.shapes_for_tests import PRIME_DIMS


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_steps_equal_full_recomputation(dims):
    W = init_weights(dims, seed=7)
    X = np.random.default_rng(8).standard_normal((dims.tokens + 20, dims.d_model))
    cache = KVCache(W, capacity=1)  # forces several buffer doublings
    Y_steps = np.stack([cache.step(x) for x in X])
    assert np.allclose(Y_steps, multi_head_attention(X, W), atol=1e-12)
    assert len(cache) == len(X)
    assert cache.keys.shape == (dims.heads, len(X), dims.d_k)
    assert cache.values.shape == (dims.heads, len(X), dims.d_v)


def test_cached_keys_and_values_are_the_rows_of_K_and_V():
    W = init_weights(seed=0)
    X = np.random.default_rng(0).standard_normal((4, 5))
    cache = KVCache(W)
    cache.extend(X)
    for i in range(W.heads):
        assert np.allclose(cache.keys[i], X @ W.W_K[i])
        assert np.allclose(cache.values[i], X @ W.W_V[i])
    with pytest.raises(ValueError):
        cache.keys[0, 0, 0] = 1.0  # read-only


def test_extend_equals_steps_and_appending_keeps_earlier_outputs():
    W = init_weights(seed=1)
    X = np.random.default_rng(1).standard_normal((4, 5))
    cache = KVCache(W)
    first = cache.extend(X[:3])
    y4 = cache.step(X[3])
    assert np.allclose(first, multi_head_attention(X[:3], W))
    assert np.allclose(y4, multi_head_attention(X, W)[3])
    assert cache.extend(np.empty((0, 5))).shape == (0, 5)


def test_float32_cache():
    W = init_weights(seed=2, dtype=np.float32)
    X = np.random.default_rng(2).standard_normal((6, 5)).astype(np.float32)
    cache = KVCache(W)
    Y = cache.extend(X)
    assert Y.dtype == np.float32 and cache.keys.dtype == np.float32
    assert np.allclose(Y, multi_head_attention(X, W), atol=1e-5)


@pytest.mark.parametrize(
    "x, error, message",
    [
        (np.ones(4), ValueError, r"one row x \(d_model,\), with d_model = 5, got shape \(4,\)"),
        (np.ones((1, 5)), ValueError, r"got shape \(1, 5\)"),
        (np.array([1.0, np.nan, 0, 0, 0]), ValueError, r"x of shape \(5,\) holds 1 NaN"),
        (np.array([1.0, np.inf, 0, 0, 0]), ValueError, r"holds 1 NaN or infinite"),
        (np.array(list("abcde")), TypeError, r"x must hold real numbers"),
    ],
)
def test_refused_step_leaves_the_cache_unchanged(x, error, message):
    W = init_weights(seed=3)
    X = np.random.default_rng(3).standard_normal((3, 5))
    cache = KVCache(W, capacity=3)  # full: a bad step must not even grow the buffers
    cache.extend(X)
    keys, values = cache.keys.copy(), cache.values.copy()
    with pytest.raises(error, match=message):
        cache.step(x)
    assert len(cache) == 3
    assert np.array_equal(cache.keys, keys) and np.array_equal(cache.values, values)
    x4 = np.random.default_rng(4).standard_normal(5)
    assert np.allclose(cache.step(x4), multi_head_attention(np.vstack([X, x4]), W)[3])


def test_extend_refuses_a_bad_block_whole():
    cache = KVCache(init_weights(seed=4))
    X = np.ones((3, 5))
    X[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"X of shape \(3, 5\) holds 1 NaN"):
        cache.extend(X)
    assert len(cache) == 0
    with pytest.raises(ValueError, match=r"\(m, d_model\), with d_model = 5, got shape \(3, 4\)"):
        cache.extend(np.ones((3, 4)))


def test_cache_refuses_bad_construction():
    with pytest.raises(TypeError, match="KVCache needs mha_lit.Weights"):
        KVCache(Dims())
    with pytest.raises(ValueError, match="capacity must be a positive integer, got 0"):
        KVCache(init_weights(), capacity=0)


def test_step_reads_the_cache_instead_of_recomputing_the_prefix():
    """The cache keeps no input rows, so a step cannot recompute the prefix: it must use the
    cached keys and values, and changing a cached value changes the next output."""
    W = init_weights(seed=5)
    rng = np.random.default_rng(5)
    X = rng.standard_normal((50, 5))
    x = rng.standard_normal(5)
    honest, tampered = KVCache(W), KVCache(W)
    honest.extend(X)
    tampered.extend(X)
    held = [a for a in vars(tampered).values() if isinstance(a, np.ndarray) and a.ndim > 1]
    rows = [a for a in held if a.dtype.kind == "f"]  # every array of numbers: keys and values only
    assert len(rows) == 2 and all(a.shape[-1] in (W.d_k, W.d_v) and a.shape[:2] == (1, W.heads)
                                  for a in rows)
    # the rest: which position each slot holds, integers (1, capacity)
    assert all(a.dtype.kind == "i" and a.shape == (1, tampered.capacity) for a in held if a.dtype.kind != "f")
    tampered._V[:, :, 0] += 1.0  # corrupt the cached value row of token 1 in every head
    assert not np.allclose(tampered.step(x), honest.step(x))
    assert np.allclose(honest.step(x), multi_head_attention(np.vstack([X, x, x]), W)[-1])


# --- Part I, chapter 7: multiply-add counts ------------------------------------------------


def _counted_forward(X, W, rows):
    """The last `rows` output rows of multi-head attention, every product counted.

    Keys and values of the earlier rows are computed without counting, as a cache would
    already hold them. Returns (Y_rows, sum of a*b*c over the products (a x b) @ (b x c))."""
    count = 0

    def mm(A, B):
        nonlocal count
        (a, b), (b2, c) = A.shape, B.shape
        assert b == b2
        count += a * b * c
        return A @ B

    n = len(X)
    old, new = X[: n - rows], X[n - rows:]  # cached rows, rows to compute
    later = np.arange(n)[None, :] > np.arange(n - rows, n)[:, None]  # (rows, n) masked keys
    H = []
    for i in range(W.heads):
        Q = mm(new, W.W_Q[i])
        K = np.vstack([old @ W.W_K[i], mm(new, W.W_K[i])])
        V = np.vstack([old @ W.W_V[i], mm(new, W.W_V[i])])
        scores = mm(Q, K.T) / np.sqrt(W.d_k)
        H.append(mm(softmax(np.where(later, -np.inf, scores)), V))
    return mm(np.concatenate(H, axis=1), W.W_O), count


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_multiply_add_counts_match_the_products_performed(dims, n):
    from mha_lit.kv_cache import recompute_multiply_adds, step_multiply_adds

    W = init_weights(dims, seed=n)
    X = np.random.default_rng(n).standard_normal((n, dims.d_model))
    Y_full, full_count = _counted_forward(X, W, rows=n)
    y_new, step_count = _counted_forward(X, W, rows=1)
    assert np.allclose(Y_full, multi_head_attention(X, W), atol=1e-12)
    assert np.allclose(y_new[0], KVCache(W).extend(X)[-1], atol=1e-12)
    assert recompute_multiply_adds(n, dims) == full_count
    assert step_multiply_adds(n, dims) == step_count


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_step_cost_is_linear_and_recompute_cost_quadratic(dims):
    from mha_lit.kv_cache import recompute_multiply_adds, step_multiply_adds

    h, d, dk, dv = dims.heads, dims.d_model, dims.d_k, dims.d_v
    step = [step_multiply_adds(n, dims) for n in range(1, 12)]
    full = [recompute_multiply_adds(n, dims) for n in range(1, 12)]
    assert set(np.diff(step)) == {h * (dk + dv)}  # one more key and value to read per token
    assert set(np.diff(full, n=2)) == {2 * h * (dk + dv)}
    assert step[0] == full[0]  # with one token there is nothing to reuse
    assert all(s < f for s, f in zip(step[1:], full[1:]))
    assert step_multiply_adds(1, dims) == h * d * (2 * dk + dv) + h * (dk + dv) + h * dv * d


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                        (True, TypeError), ("4", TypeError)])
def test_multiply_add_counts_refuse_bad_n(bad, error):
    from mha_lit.kv_cache import (
        products,
        recompute_multiply_adds,
        step_multiply_adds,
    )

    for f in (step_multiply_adds, recompute_multiply_adds):
        with pytest.raises(error, match="n must be a positive integer"):
            f(bad, Dims())
    with pytest.raises(error, match="n must be a positive integer"):
        products(1, bad, Dims())
    with pytest.raises(error, match="rows must be a positive integer"):
        products(bad, 3, Dims())


@pytest.mark.parametrize("dims", PRIME_DIMS + [Dims(tokens=5, d_model=7, d_k=3, d_v=13, heads=6, kv_heads=2)],
                         ids=str)
@pytest.mark.parametrize("rows, n", [(1, 1), (1, 9), (4, 9), (9, 9)])
def test_products_are_the_shapes_of_each_head_then_W_O(dims, rows, n):
    from mha_lit.kv_cache import (
        products,
        recompute_multiply_adds,
        step_multiply_adds,
    )

    d, dk, dv, h, h_kv = dims.d_model, dims.d_k, dims.d_v, dims.heads, dims.kv_heads
    shapes = products(rows, n, dims)
    assert shapes == ([(rows, d, dk), (rows, dk, n), (rows, n, dv)] * h
                      + [(rows, d, dk), (rows, d, dv)] * h_kv + [(rows, h * dv, d)])
    work = sum(a * b * c for a, b, c in shapes)
    if rows == 1:
        assert work == step_multiply_adds(n, dims)
    if rows == n:
        assert work == recompute_multiply_adds(n, dims)



@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_a_real_step_does_work_linear_in_the_cache_length(dims):
    """Watch the matrix products an actual KVCache.step performs (the projections
    and W_O are matrix-vector products, the same for every n): the only products
    that touch the cache are one row of scores and one weighted sum of values per
    head, h (n + 1)(d_k + d_v) multiply-adds, so a step is O(n d), never O(n^2 d)."""
    W = init_weights(dims, seed=11)
    rng = np.random.default_rng(11)
    X = rng.standard_normal((30, dims.d_model))
    for n in (0, 1, 6, 29):
        cache = KVCache(W)
        if n:  # (an empty block is test_extend_equals_steps_and_appending_keeps_earlier_outputs's)
            cache.extend(X[:n])  # n rows cached
        with trace.record_matmuls() as log:
            y = cache.step(log.track(X[n]))
        assert len(cache) == n + 1
        shapes = [r.out_shape for r in log.records]
        assert shapes == [(1, dims.heads, 1, n + 1), (1, dims.heads, 1, dims.d_v)]
        assert log.multiply_adds == dims.heads * (n + 1) * (dims.d_k + dims.d_v)
        assert np.allclose(y, multi_head_attention(X[: n + 1], W)[-1], atol=1e-12)


# --- chapter 8: GPT-2's biases ----------------------------------------------------------------

@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
def test_steps_with_biases_equal_reference_and_fast_path(dims, dtype, tol):
    """Random non-zero biases: reference = fast path = KV cache, step by step (to rounding)."""
    from mha_lit.variants import reference

    W = init_weights(dims, seed=31, dtype=dtype, biases=True)
    assert all(np.any(b != 0) for b in (W.b_Q, W.b_K, W.b_V, W.b_O))
    X = np.random.default_rng(32).standard_normal((dims.tokens + 4, dims.d_model)).astype(dtype)
    cache = KVCache(W, capacity=2)
    Y_steps = np.stack([cache.step(x) for x in X])
    Y_ref = reference(X, W)
    assert Y_steps.dtype == dtype
    assert np.allclose(Y_steps, Y_ref, rtol=0, atol=tol)
    assert np.allclose(multi_head_attention(X, W), Y_ref, rtol=0, atol=tol)
    for i in range(dims.heads):  # the cached rows are the biased K and V
        assert np.allclose(cache.keys[i], X @ W.W_K[i] + W.b_K[i], rtol=0, atol=tol)
        assert np.allclose(cache.values[i], X @ W.W_V[i] + W.b_V[i], rtol=0, atol=tol)


def test_a_step_with_biases_records_the_same_products():
    """Adding a bias is not a matrix product: a step still makes the same two products."""
    W = init_weights(seed=33, biases=True)
    X = np.random.default_rng(33).standard_normal((4, 5))
    cache = KVCache(W)
    cache.extend(X[:3])
    with trace.record_matmuls() as log:
        y = cache.step(log.track(X[3]))
    assert [r.out_shape for r in log.records] == [(1, 2, 1, 4), (1, 2, 1, 11)]
    assert np.allclose(y, multi_head_attention(X, W)[-1], rtol=0, atol=1e-12)


# --- chapter 12: prefill, batches, one dtype rule ------------------------------------------


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
@pytest.mark.parametrize("biases", [False, True])
def test_extend_is_a_prefill_equal_to_the_forward_pass(dims, biases, monkeypatch):
    """A block appended at once, after a cached prefix, gives the last rows of the forward pass,
    with matrix products: extend never falls back to one step per row."""
    W = init_weights(dims, seed=41, biases=biases)
    X = np.random.default_rng(41).standard_normal((3 * dims.tokens + 5, dims.d_model))
    monkeypatch.setattr(KVCache, "step", lambda *a: pytest.fail("extend called step"))
    cache = KVCache(W, capacity=2)
    cut = dims.tokens + 2
    first, second = cache.extend(X[:cut]), cache.extend(X[cut:])
    Y = multi_head_attention(X, W)
    assert np.allclose(first, Y[:cut], rtol=0, atol=1e-12)
    assert np.allclose(second, Y[cut:], rtol=0, atol=1e-12)
    assert len(cache) == len(X)
    K = np.stack([X @ W.W_K[i] + (W.b_K[i] if biases else 0) for i in range(W.heads)])
    assert np.allclose(cache.keys, K, rtol=0, atol=1e-12)


def test_extend_takes_the_tiled_path_for_long_blocks(monkeypatch):
    from mha_lit import fast

    W = init_weights(Dims(d_model=7, d_k=3, d_v=5, heads=2), seed=42)
    X = np.random.default_rng(42).standard_normal((70, 7))
    monkeypatch.setattr(fast, "SCORES_LIMIT_BYTES", 100)
    ran = []
    real = fast.attend_tiled
    monkeypatch.setattr(fast, "attend_tiled", lambda *a, **k: ran.append(1) or real(*a, **k))
    cache = KVCache(W)
    cache.extend(X[:20])
    assert np.allclose(cache.extend(X[20:]), multi_head_attention(X, W)[20:], rtol=0, atol=1e-12)
    assert ran  # the tiled path did run


def test_batched_cache_equals_one_cache_per_sequence():
    dims = Dims(d_model=5, d_k=7, d_v=11, heads=2)
    W = init_weights(dims, seed=43, biases=True)
    rng = np.random.default_rng(43)
    B, m = 4, 6
    X = rng.standard_normal((B, m, 5))
    steps = rng.standard_normal((3, B, 5))
    batched = KVCache(W, batch=B)
    Y = batched.extend(X)
    assert Y.shape == (B, m, 5)
    outs = [batched.step(x) for x in steps]  # (B, 5) each
    for b in range(B):
        single = KVCache(W)
        assert np.allclose(Y[b], single.extend(X[b]), rtol=0, atol=1e-12)
        for j, x in enumerate(steps):
            assert np.allclose(outs[j][b], single.step(x[b]), rtol=0, atol=1e-12)
    assert batched.lengths.tolist() == [m + 3] * B and len(batched) == m + 3
    assert batched.keys.shape == (B, 2, m + 3, 7)


def test_prompts_of_different_lengths_with_a_key_mask():
    W = init_weights(seed=44, biases=True)
    rng = np.random.default_rng(44)
    lengths = [5, 2, 0, 3]
    m = max(lengths)
    X = rng.standard_normal((4, m, 5))
    mask = np.arange(m)[None, :] < np.array(lengths)[:, None]  # (4, 5), real tokens first
    cache = KVCache(W, batch=4)
    Y = cache.extend(X, key_mask=mask)
    assert np.array_equal(Y[~mask], np.zeros(((~mask).sum(), 5)))  # padded rows are 0
    assert cache.lengths.tolist() == lengths
    nxt = rng.standard_normal((2, 4, 5))
    outs = [cache.step(x) for x in nxt]
    for b, n in enumerate(lengths):
        seq = np.vstack([X[b, :n], nxt[0, b], nxt[1, b]])  # this sequence's own rows
        full = multi_head_attention(seq, W)
        assert np.allclose(Y[b, :n], full[:n], rtol=0, atol=1e-12)
        assert np.allclose(outs[0][b], full[n], rtol=0, atol=1e-12)
        assert np.allclose(outs[1][b], full[n + 1], rtol=0, atol=1e-12)
    assert cache.lengths.tolist() == [n + 2 for n in lengths]
    # the unused rows of shorter sequences stay 0 in the keys the cache shows
    assert np.all(cache.keys[1, :, lengths[1] + 2:] == 0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c: c.step(np.ones(5)), r"x \(B, d_model\), with d_model = 5 and B = 3, got shape \(5,\)"),
        (lambda c: c.step(np.ones((2, 5))), r"B = 3, got shape \(2, 5\)"),
        (lambda c: c.step(np.full((3, 5), np.nan)), r"x of shape \(3, 5\) holds 15 NaN"),
        (lambda c: c.extend(np.ones((3, 4, 6))), r"X \(B, m, d_model\), with d_model = 5 and B = 3"),
        (lambda c: c.extend(np.ones((3, 4, 5)), key_mask=np.ones((3, 5), bool)),
         r"key_mask has shape \(3, 5\) but needs one entry per token of X \(3, 4, 5\), shape \(3, 4\)"),
        (lambda c: c.extend(np.ones((3, 4, 5)), key_mask=np.ones((3, 4))),
         r"key_mask must be boolean .* got dtype float64 \(shape \(3, 4\)\)"),
    ],
)
def test_a_refused_batch_input_leaves_every_cache_intact(call, message):
    W = init_weights(seed=45)
    rng = np.random.default_rng(45)
    cache = KVCache(W, capacity=2, batch=3)
    X = rng.standard_normal((3, 2, 5))
    cache.extend(X)
    keys, values, lengths = cache.keys.copy(), cache.values.copy(), cache.lengths
    with pytest.raises((ValueError, TypeError), match=message):
        call(cache)
    assert np.array_equal(cache.keys, keys) and np.array_equal(cache.values, values)
    assert np.array_equal(cache.lengths, lengths) and cache._K.shape[2] == 2
    x = rng.standard_normal((3, 5))
    Y = cache.step(x)
    for b in range(3):
        assert np.allclose(Y[b], multi_head_attention(np.vstack([X[b], x[b]]), W)[-1],
                           rtol=0, atol=1e-12)


def test_batch_must_be_a_positive_integer():
    for bad, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError),
                       ("2", TypeError)):
        with pytest.raises(error, match="batch must be a positive integer"):
            KVCache(init_weights(), batch=bad)


def test_capacity_must_be_a_positive_integer():
    for bad, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError),
                       (None, TypeError)):
        with pytest.raises(error, match="capacity must be a positive integer"):
            KVCache(init_weights(), capacity=bad)
    assert KVCache(init_weights(), capacity=np.int64(3)).capacity == 3


@pytest.mark.parametrize("x_dtype, w_dtype", [(np.float64, np.float32), (np.float32, np.float64),
                                              (np.float32, np.float32)])
def test_one_dtype_rule_with_multi_head_attention(x_dtype, w_dtype):
    """Computed in the wider of the two float types, returned in the input's: as
    multi_head_attention does, so the two agree to the rounding of that type."""
    W = init_weights(seed=46, dtype=w_dtype)
    X = np.random.default_rng(46).standard_normal((6, 5)).astype(x_dtype)
    Y = multi_head_attention(X, W)
    cache = KVCache(W)
    first = cache.extend(X[:4])
    rows = [cache.step(x) for x in X[4:]]
    assert first.dtype == rows[0].dtype == Y.dtype == x_dtype
    tol = 1e-12 if np.result_type(x_dtype, w_dtype) == np.float64 else 1e-5
    assert np.allclose(np.vstack([first, rows]), Y, rtol=0, atol=tol)
    if x_dtype == np.float64:  # float64 keys: nothing was rounded to float32 on the way
        assert cache.keys.dtype == np.float64


def test_float16_online_softmax_sums_in_float32(monkeypatch):
    """Values 0 for the first half of 8192 keys and 1 for the second, equal scores: the last
    output is their mean, 0.5. Running sums kept in float16 over tiles of 3 keys stall
    (they would give about 0.58); kept in float32 they do not."""
    from mha_lit import Weights, fast

    d = 2
    W = Weights(W_Q=np.zeros((1, d, 1)), W_K=np.zeros((1, d, 1)),
                W_V=np.array([[[1.0], [0.0]]]), W_O=np.eye(1, d)).astype(np.float16)
    n = 8192
    X = np.zeros((n, d), np.float16)
    X[n // 2:, 0] = 1
    monkeypatch.setattr(fast, "SCORES_LIMIT_BYTES", 1000)
    monkeypatch.setattr(fast, "TILE_KEYS", 3)
    tiles = []
    real = fast.attend_tiled
    monkeypatch.setattr(fast, "attend_tiled", lambda *a, **k: tiles.append(a[-1]) or real(*a, **k))
    cache = KVCache(W)
    y = cache.extend(X)[-1, 0]
    assert tiles and set(tiles) == {3}  # the online softmax ran, in tiles of 3 keys
    assert y.dtype == np.float16 and abs(float(y) - 0.5) < 2e-3
    x = np.zeros(d, np.float16)  # one more step: a 0 value, mean 4096 / 8193
    assert abs(float(cache.step(x)[0]) - 4096 / 8193) < 2e-3


def test_key_mask_without_a_batch_and_padding_anywhere():
    """Padding may sit anywhere in a block (left, middle, right): the real rows are
    cached in order, and every output equals the forward pass of the real rows alone."""
    W = init_weights(seed=48, biases=True)
    rng = np.random.default_rng(48)
    X = rng.standard_normal((7, 5))
    mask = np.array([False, True, True, False, True, False, True])  # left, middle, right pads
    cache = KVCache(W)
    Y = cache.extend(X, key_mask=mask)
    real = multi_head_attention(X[mask], W)
    assert np.allclose(Y[mask], real, rtol=0, atol=1e-12) and not Y[~mask].any()
    assert len(cache) == mask.sum()
    x = rng.standard_normal(5)  # a step after a masked block
    assert np.allclose(cache.step(x), multi_head_attention(np.vstack([X[mask], x]), W)[-1],
                       rtol=0, atol=1e-12)
    # a masked block after steps, in a batch whose sequences have different lengths
    B = KVCache(W, capacity=1, batch=2)  # capacity 1: the buffers grow on the way
    first = rng.standard_normal((2, 3, 5))
    B.extend(first, key_mask=np.array([[True, True, True], [False, True, False]]))
    steps = rng.standard_normal((2, 5))
    B.step(steps)
    more = rng.standard_normal((2, 4, 5))
    m2 = np.array([[True, False, True, True], [True, True, True, True]])
    out = B.extend(more, key_mask=m2)
    seqs = [np.vstack([first[0], steps[0], more[0][m2[0]]]),
            np.vstack([first[1][1:2], steps[1], more[1]])]
    for b in range(2):
        full = multi_head_attention(seqs[b], W)
        assert np.allclose(out[b][m2[b]], full[-m2[b].sum():], rtol=0, atol=1e-12)
    assert B.lengths.tolist() == [7, 6]


def test_truncate_and_reset():
    W = init_weights(seed=49)
    X = np.random.default_rng(49).standard_normal((6, 5))
    cache = KVCache(W)
    cache.extend(X)
    cache.truncate(4)
    assert len(cache) == 4 and not cache._K[:, :, 4:].any()
    assert np.allclose(cache.step(X[5]), multi_head_attention(np.vstack([X[:4], X[5]]), W)[-1],
                       rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"lengths must be integers in 0 \.\. \[5\]"):
        cache.truncate(6)
    cache.reset()
    assert len(cache) == 0 and np.allclose(cache.extend(X[:2]), multi_head_attention(X[:2], W),
                                           rtol=0, atol=1e-12)


def test_repr_names_rows_heads_and_the_variants():
    W = init_weights(seed=50)
    cache = KVCache(W)
    assert repr(cache) == "KVCache(rows=0, heads=2, d_k=7, d_v=11)"
    cache.extend(np.ones((3, 5)))
    assert repr(cache) == "KVCache(rows=3, heads=2, d_k=7, d_v=11)"
    G = init_weights(Dims(d_model=5, d_k=6, d_v=11, heads=4, kv_heads=2), seed=50)
    batched = KVCache(G, batch=2, rope_base=10000.0, window=4)
    batched.extend(np.ones((2, 2, 5)), key_mask=np.array([[True, True], [True, False]]))
    assert repr(batched) == ("KVCache(batch=2, rows=[2, 1], heads=4, kv_heads=2, d_k=6, d_v=11, "
                             "rope_base=10000, window=4)")


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("failing", ["attention", "output_projection"])
def test_a_step_that_fails_late_leaves_the_cache_exactly_as_it_was(window, failing, monkeypatch):
    """A failure after the keys were stored (in the attention or in W_O) puts back every slot,
    the ring buffer's overwritten one included."""
    from mha_lit import fast, kv_cache
    W = init_weights(Dims(), seed=0)
    X = np.random.default_rng(8).standard_normal((6, 5))
    cache = KVCache(W, window=window)
    cache.extend(X[:4])
    keys, values, n = cache.keys.copy(), cache.values.copy(), len(cache)

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    with monkeypatch.context() as m:
        for module in (fast, kv_cache):  # the kernel, called by either
            if hasattr(module, failing):
                m.setattr(module, failing, boom)
        with pytest.raises(RuntimeError, match="boom"):
            cache.step(X[4])
    # exact: the same stored numbers, put back
    assert len(cache) == n and np.array_equal(cache.keys, keys) and np.array_equal(cache.values, values)
    assert np.allclose(cache.step(X[4]), reference(X[:5], W, window=window)[-1], rtol=0, atol=1e-12)
