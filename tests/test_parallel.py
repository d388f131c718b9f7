"""Part V on real MPI ranks: each method equal to the one-process result.

Every ``launch`` starts real processes with MPICH's mpiexec (1 to 4 ranks; on two
cores MPI oversubscribes them) and has a timeout, so a rank that hangs fails its
test instead of hanging the suite.
"""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_lit import Dims, KVCache, grad, init_weights, models, parallel, train
from mha_lit.fast import multi_head_attention
from mha_lit.ranks import (
    RanksFailedError,
    RanksTimedOutError,
    launch,
)

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-12  # float64: the same products, summed in another order
TIMEOUT = 60  # seconds for one launch; a hang fails the test, not the suite


@pytest.fixture(autouse=True)
def _rank_programs_importable(monkeypatch):
    """The ranks import tests.rank_programs from the repository's root."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def _run(program, p, **inputs):
    return launch(program, p, timeout=TIMEOUT, **inputs)


def _rows(n, seed=0, d_model=5):
    return np.random.default_rng(seed).standard_normal((n, d_model))


# --- head shares, in one process ----------------------------------------------


@pytest.mark.parametrize(("h", "h_kv", "p", "kv_held"), [
    (2, 2, 1, 2), (2, 2, 2, 1), (12, 12, 4, 3), (8, 4, 2, 2),
    (8, 2, 4, 1), (8, 1, 8, 1), (32, 8, 16, 1)])
def test_head_shares_cover_every_query_head_once(h, h_kv, p, kv_held):
    shares = parallel.head_shares(h, h_kv, p)
    queries = [i for q, _ in shares for i in q]
    assert queries == list(range(h))
    g = h // h_kv
    for q, kv in shares:
        assert len(kv) == kv_held
        assert set(kv) == {i // g for i in q}  # exactly the K/V heads used
    held = [j for _, kv in shares for j in kv]
    assert sorted(set(held)) == list(range(h_kv))
    assert len(held) == max(h_kv, p)  # replicated p / h_kv times when fewer


@pytest.mark.parametrize(("h", "h_kv", "p", "words"), [
    (2, 2, 3, ["heads = 2", "ranks = 3"]),
    (12, 12, 5, ["heads = 12", "ranks = 5"]),
    (12, 6, 4, ["kv_heads = 6", "ranks = 4"]),
])
def test_head_shares_refuse_naming_both_numbers(h, h_kv, p, words):
    with pytest.raises(ValueError) as e:
        parallel.head_shares(h, h_kv, p)
    assert all(w in str(e.value) for w in words)


@given(st.integers(1, 4), st.sampled_from([(4, 4), (4, 2), (4, 1), (6, 3)]),
       st.booleans(), st.integers(0, 10**6))
def test_summed_shards_are_the_layer(p, heads, biases, seed):
    h, h_kv = heads
    if h % p or (h_kv % p and p % h_kv):
        return
    W = init_weights(Dims(d_model=5, d_k=3, d_v=2, heads=h, kv_heads=h_kv),
                     seed % 97, biases=biases)
    X = _rows(6, seed)
    parts = [multi_head_attention(X, parallel.head_shard(W, r, p))
             for r in range(p)]
    Y = sum(parts) + (0 if W.b_O is None else W.b_O)
    assert np.allclose(Y, multi_head_attention(X, W), rtol=0, atol=TOL)


def test_head_shard_shapes_and_refusals():
    W = init_weights(Dims(d_model=5, d_k=7, d_v=11, heads=2), 0, biases=True)
    s = parallel.head_shard(W, 1, 2)
    assert (s.W_Q.shape, s.W_K.shape, s.W_V.shape, s.W_O.shape) == (
        (1, 5, 7), (1, 5, 7), (1, 5, 11), (11, 5))
    assert s.b_O is None and s.b_Q.shape == (1, 7)
    assert np.array_equal(s.W_O, W.W_O[11:])
    with pytest.raises(ValueError, match="rank = 2 does not exist among "
                                         "ranks = 2"):
        parallel.head_shard(W, 2, 2)
    with pytest.raises(TypeError, match="mha_lit.Weights"):
        parallel.head_shard(W.W_Q, 0, 1)


# --- tensor parallelism on real ranks -----------------------------------------


@pytest.mark.parametrize(("dims", "ranks"), [
    (Dims(), (1, 2)),
    (Dims(d_model=24, d_k=5, d_v=7, heads=12), (2, 3, 4)),
    (Dims(d_model=16, d_k=4, d_v=6, heads=8, kv_heads=4), (2, 4)),
    (Dims(d_model=16, d_k=4, d_v=6, heads=8, kv_heads=2), (4,)),
], ids=lambda v: repr(v))
def test_tensor_parallel_equals_one_process(dims, ranks):
    W = init_weights(dims, 3, biases=True)
    X = _rows(9, 1, dims.d_model)
    for p in ranks:
        out = _run("tests.rank_programs:tensor_parallel_cases", p, X=X, W=W)
        assert len(out) == p
        for causal in (True, False):
            Y = multi_head_attention(X, W, causal)
            for cases in out:
                assert np.allclose(cases[causal], Y, rtol=0, atol=TOL)
    assert np.allclose(_run("tensor_parallel", 2 if dims.heads % 2 == 0
                            else 1, X=X, W=W)[0],
                       multi_head_attention(X, W), rtol=0, atol=TOL)


def test_tensor_parallel_refusal_is_raised_on_every_rank():
    W = init_weights(Dims(), 0)
    with pytest.raises(ValueError, match="heads = 2 cannot be split among "
                                         "ranks = 3") as e:
        _run("tensor_parallel", 3, X=_rows(3), W=W)
    assert "ranks [0, 1, 2] of 3" in " ".join(getattr(e.value, "__notes__",
                                                      []))


def test_tensor_parallel_refuses_inputs_that_differ_between_ranks():
    W = init_weights(Dims(), 0)
    with pytest.raises(ValueError, match=r"the shape of X differs between "
                                         r"ranks: rank 0: \(1, 5\), rank 1: "
                                         r"\(2, 5\)"):
        _run("tests.rank_programs:rank_dependent_rows", 2, X=_rows(3), W=W)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_tensor_parallel_decoding_equals_the_one_rank_cache(p):
    W = init_weights(Dims(d_model=16, d_k=4, d_v=6, heads=8, kv_heads=2), 5,
                     biases=True)
    X = _rows(11, 2, 16)
    out = _run("tensor_parallel_decode", p, X=X, W=W, prompt=4)
    cache = KVCache(W)
    want = np.concatenate([cache.extend(X[:4])] +
                          [cache.step(x)[None] for x in X[4:]])
    assert np.allclose(want, multi_head_attention(X, W), rtol=0, atol=TOL)
    for o in out:
        assert np.allclose(o["Y"], want, rtol=0, atol=TOL)
        assert o["keys"] == (max(2 // p, 1), 11, 4)
        assert o["values"] == (max(2 // p, 1), 11, 6)


def test_tensor_parallel_decoding_of_a_batch_with_rotary_keys_and_window():
    W = init_weights(Dims(d_model=12, d_k=4, d_v=3, heads=4, kv_heads=2), 1)
    X = np.random.default_rng(4).standard_normal((3, 8, 12))
    out = _run("tests.rank_programs:decode_batch", 2, X=X, W=W,
               rope_base=10000.0, window=3)
    want = multi_head_attention(X, W, rope_base=10000.0, window=3)
    for Y in out:
        assert np.allclose(Y, want, rtol=0, atol=TOL)


def test_tensor_parallel_prefill_keeps_padded_rows_zero():
    W = init_weights(Dims(d_model=12, d_k=4, d_v=3, heads=4), 1, biases=True)
    X = np.random.default_rng(4).standard_normal((2, 5, 12))
    mask = np.array([[True] * 5, [True, True, True, False, False]])
    out = _run("tests.rank_programs:padded_prefill", 2, X=X, W=W,
               key_mask=mask)
    want = multi_head_attention(X, W, key_mask=mask)
    for Y in out:
        assert np.allclose(Y, want, rtol=0, atol=TOL)
        assert np.all(Y[1, 3:] == 0)  # exact: padded rows are never summed


# --- ring attention on real ranks ---------------------------------------------


def _assembled(out, n, d_model):
    Y = np.full((n, d_model), np.nan)
    for o in out:
        Y[o["rows"]] = o["Y"]
    return Y


@pytest.mark.parametrize(("dims", "n", "ranks"), [
    (Dims(), 3, (1, 2, 3)),
    (Dims(d_model=24, d_k=5, d_v=7, heads=3), 37, (2, 3, 4)),
    (Dims(d_model=16, d_k=4, d_v=6, heads=6, kv_heads=2), 21, (2, 4)),
], ids=lambda v: repr(v))
def test_ring_equals_one_process(dims, n, ranks):
    W = init_weights(dims, 2, biases=True)
    X = _rows(n, 3, dims.d_model)
    for p in ranks:
        out = _run("tests.rank_programs:ring_cases", p, X=X, W=W)
        for (causal, layout), _ in out[0].items():
            per_rank = [cases[causal, layout] for cases in out]
            rows = np.concatenate([o["rows"] for o in per_rank])
            assert sorted(rows) == list(range(n)), layout
            assert np.allclose(_assembled(per_rank, n, dims.d_model),
                               multi_head_attention(X, W, causal),
                               rtol=0, atol=TOL), (causal, layout)
    out = _run("ring", 2, X=X, W=W, layout="zigzag")  # the book's program
    assert np.allclose(_assembled(out, n, dims.d_model),
                       multi_head_attention(X, W), rtol=0, atol=TOL)


def test_ring_takes_contiguous_blocks_of_any_sizes():
    W = init_weights(Dims(), 0, biases=True)
    X = _rows(10, 5)
    sizes = [1, 5, 4]
    out = _run("tests.rank_programs:ring_blocks", 3, X=X, W=W, sizes=sizes)
    assert np.allclose(np.concatenate(out), multi_head_attention(X, W),
                       rtol=0, atol=TOL)


def test_ring_refuses_blocks_that_do_not_fit_the_layout():
    W = init_weights(Dims(), 0)
    with pytest.raises(ValueError, match=r"the ranks hold \[1, 5, 4\] rows, "
                                         r"but the zigzag layout of n = 10 "
                                         r"rows over 3 ranks gives \[3, 3, 4\]"):
        _run("tests.rank_programs:ring_blocks", 3, X=_rows(10), W=W,
             sizes=[1, 5, 4], layout="zigzag")
    with pytest.raises(ValueError, match=r"on rank 1: X_block has no rows "
                                         r"\(shape \(0, 5\)\)") as e:
        _run("tests.rank_programs:ring_blocks", 3, X=_rows(3), W=W,
             sizes=[2, 0, 1])
    assert "on ranks [0, 1, 2] of 3" in " ".join(e.value.__notes__)


def test_sequence_blocks_cover_the_sequence():
    for n in (3, 10, 37, 1024):
        for p in (1, 2, 3, 4):
            for layout in parallel.LAYOUTS:
                blocks = parallel.sequence_blocks(n, p, layout)
                assert sorted(np.concatenate(blocks)) == list(range(n))
                sizes = [len(b) for b in blocks]
                assert max(sizes) - min(sizes) <= (1 if layout ==
                                                   "contiguous" else 2)
    assert [b.tolist() for b in parallel.sequence_blocks(8, 2, "zigzag")] \
        == [[0, 1, 6, 7], [2, 3, 4, 5]]
    with pytest.raises(ValueError, match="layout = 'striped' is none of"):
        parallel.sequence_blocks(8, 2, "striped")


def test_ring_work_counts_the_pieces():
    n, p = 1024, 4
    c = n // p
    contiguous = parallel.ring_work(n, p)
    # rank r computes blocks of ranks r, r-1, .., 0: r + 1 whole blocks
    assert np.array_equal(contiguous, np.tril(np.full((p, p), c * c)))
    zigzag = parallel.ring_work(n, p, "zigzag")
    h = c // 2  # rows of a chunk
    assert np.all(zigzag[:, 0] == 3 * h * h)  # own block: 3 of 4 pieces
    assert np.all(zigzag[:, 1:] == 2 * h * h)  # others: 2 of 4 pieces
    assert np.array_equal(parallel.ring_work(n, p, causal=False),
                          np.full((p, p), c * c))
    # every visible (query, key) pair is computed at least once
    for layout in parallel.LAYOUTS:
        assert parallel.ring_work(37, 3, layout).sum() >= 37 * 38 // 2


# --- data parallelism on real ranks -------------------------------------------


@pytest.mark.parametrize("p", [1, 2, 3])
def test_data_parallel_gradients_are_the_whole_batch_gradients(p):
    G = train.init_repeat_model(8, 4, 1, 0)
    rng = np.random.default_rng(p)
    tokens = rng.integers(0, G.vocab_size, (7, G.context_length))
    targets = rng.integers(0, G.vocab_size, tokens.shape)
    counted = rng.random(tokens.shape) < 0.6
    loss, dG = grad.loss_and_grads(G, tokens, targets, counted)
    out = _run("data_parallel", p, G=G, tokens=tokens, targets=targets,
               counted=counted)
    want = train.parameters(dG)
    state = train.adam_start(G)
    G1, _ = train.adam_step(G, dG, state, lr=1e-2)
    for loss_r, dG_r in out:
        assert abs(loss_r - loss) <= TOL
        got = train.parameters(dG_r)
        assert all(np.allclose(got[k], want[k], rtol=0, atol=TOL)
                   for k in want)
        Gr, _ = train.adam_step(G, dG_r, state, lr=1e-2)
        new, one = train.parameters(Gr), train.parameters(G1)
        # Adam divides by sqrt(v): a gradient near 0 magnifies rounding
        assert all(np.allclose(new[k], one[k], rtol=0, atol=1e-9)
                   for k in one)


# --- launch: failures are reported, never hang ---------------------------------


def test_a_rank_that_raises_stops_all_and_its_exception_is_raised():
    with pytest.raises(KeyError, match="rank 1 gave up"):
        _run("tests.rank_programs:fail_on_rank_1", 3)


def test_a_rank_that_hangs_is_stopped_and_named():
    with pytest.raises(RanksTimedOutError) as e:
        launch("tests.rank_programs:hang_on_rank_1", 3, timeout=8)
    assert "did not finish in 8 s: ranks [1] had not returned" in str(e.value)


def test_a_rank_that_exits_without_an_exception_is_reported():
    with pytest.raises(RanksFailedError, match="exit code"):
        _run("tests.rank_programs:exit_on_rank_0", 2)


def test_launch_refuses_unknown_programs_and_rank_counts():
    with pytest.raises(ValueError, match="no program named 'nope'"):
        launch("nope", 2)
    with pytest.raises(ValueError, match="ranks"):
        launch("ring", 0)


def test_measurements_return_one_time_per_size():
    sizes = [8, 4096, 1 << 16]
    pp = _run("ping_pong", 2, sizes=sizes, repeats=3)
    assert pp[1] is None and len(pp[0]) == 3 and min(pp[0]) > 0
    ar = _run("all_reduce_sweep", 3, sizes=sizes, repeats=3)
    assert all(len(t) == 3 and min(t) > 0 for t in ar)
    with pytest.raises(ValueError, match="ping_pong needs 2 ranks"):
        _run("ping_pong", 1, sizes=sizes)


# --- the counts ------------------------------------------------------------


def test_all_reduce_counts():
    assert parallel.all_reduce_bytes(1000, 1) == 0
    assert parallel.all_reduce_bytes(1000, 4) == 1500
    assert parallel.all_reduce_time(4000, 4, 1e-6, 1e9) == pytest.approx(
        6 * (1e-6 + 1e-6))
    alpha, beta = parallel.fit_alpha_beta([8, 1e6, 4e6],
                                          [2e-6 + 8 / 5e9, 2e-6 + 2e-4,
                                           2e-6 + 8e-4])
    assert alpha == pytest.approx(2e-6) and beta == pytest.approx(5e9)
    with pytest.raises(ValueError, match="at least two sizes"):
        parallel.fit_alpha_beta([8, 8], [1e-6, 2e-6])
    with pytest.raises(ValueError, match="do not grow"):
        parallel.fit_alpha_beta([8, 16], [2e-6, 1e-6])


def test_fit_alpha_beta_weighs_every_size_alike():
    """Residuals relative to each time: +-10 % noise keeps alpha's microseconds,
    which a plain least-squares line loses beside the large messages."""
    sizes = 4.0 ** np.arange(1, 13)  # 4 bytes to 16 MiB
    exact = 2e-6 + sizes / 5e9
    wobble = 1 + 0.1 * np.where(np.arange(12) % 2, 1, -1)  # -10 %, +10 %, ...
    alpha, beta = parallel.fit_alpha_beta(sizes, exact * wobble)
    assert 1.5e-6 < alpha < 2.5e-6 and 4e9 < beta < 6e9
    _, plain_alpha = np.polyfit(sizes, exact * wobble, 1)
    assert not 1.5e-6 < plain_alpha < 2.5e-6
    with pytest.raises(ValueError, match="> 0 seconds"):
        parallel.fit_alpha_beta([8, 16], [0.0, 1e-6])


def test_communication_of_published_models():
    gpt3 = models.MODELS["gpt3-175b"].config
    llama = models.MODELS["llama3-8b"].config
    # two all-reduces of 2048 x 12288 bf16 values per layer
    assert parallel.tensor_parallel_bytes(gpt3, 2048, 8) == \
        2 * 2 * 7 / 8 * 2048 * 12288 * 2
    # p - 1 blocks of n/p rows of 2 h_kv d_k values
    assert parallel.ring_bytes(llama, 8192, 4) == 3 * 2048 * 2 * 8 * 128 * 2
    assert parallel.layer_weights(gpt3) == 12 * 12288 ** 2
    ratio = parallel.tensor_parallel_comm_ratio(gpt3, 8, 989e12, 450e9)
    assert ratio == pytest.approx(7 * 2 * 989e12 / (6 * 12288 * 450e9))
    assert parallel.ring_hidden_block(llama, 989e12, 450e9, causal=False) \
        == pytest.approx(8 * 2 * 989e12 / (2 * 32 * 450e9))
    with pytest.raises(ValueError, match="heads = 96 cannot be split among "
                                         "ranks = 64"):
        parallel.tensor_parallel_comm_ratio(gpt3, 64, 989e12, 450e9)
    with pytest.raises(ValueError, match="heads = 32 cannot be split among "
                                         "ranks = 64"):
        parallel.tensor_parallel_bytes(llama, 2048, 64)
    deepseek = models.MODELS["deepseek-v3"].config
    with pytest.raises(ValueError, match="MLA"):
        parallel.ring_bytes(deepseek, 1024, 2)
    with pytest.raises(ValueError, match="dense models"):
        parallel.layer_weights(deepseek)


def test_cache_per_rank():
    llama = models.MODELS["llama3-8b"].config  # 32 heads, 8 K/V heads
    one = parallel.tensor_parallel_cache_bytes(llama, 1000, 1)
    assert one == 2 * 32 * 8 * 128 * 1000 * 2
    assert parallel.tensor_parallel_cache_bytes(llama, 1000, 8) == one / 8
    assert parallel.tensor_parallel_cache_bytes(llama, 1000, 16) == one / 8
    deepseek = models.MODELS["deepseek-v3"].config
    whole = parallel.tensor_parallel_cache_bytes(deepseek, 1000, 1)
    assert whole == 61 * (512 + 64) * 1000 * 2
    assert parallel.tensor_parallel_cache_bytes(deepseek, 1000, 8) == whole
