"""PagedKVCache: equal to KVCache under any interleaving; its blocks counted exactly."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mha_lit import Dims, KVCache, init_weights, plots  # noqa: E402
from mha_lit.paged import OutOfBlocksError, PagedKVCache, blocks_needed  # noqa: E402
from tests.shapes_for_tests import PRIME_DIMS  # noqa: E402

TOL = 1e-12  # float64: the same products, summed in other orders

# (dims, rope_base): the book's heads, grouped heads with rotary keys, one head
CONFIGS = [
    (Dims(), None),
    (Dims(d_model=11, d_k=6, d_v=5, heads=6, kv_heads=2), 10000.0),
    (Dims(d_model=3, d_k=5, d_v=7, heads=1), None),
]


def _accounting(cache):
    """Every count the cache reports, recomputed from its block tables."""
    tables = {s: cache.block_table(s) for s in cache.sequences}
    refs = np.zeros(cache.num_blocks, dtype=int)
    for s, table in tables.items():
        assert len(table) == blocks_needed(cache.length(s), cache.block_size)
        assert len(set(table)) == len(table)
        refs[list(table)] += 1
    assert np.array_equal(cache.ref_counts, refs)
    assert cache.blocks_in_use == np.count_nonzero(refs)
    assert cache.blocks_in_use + cache.free_blocks == cache.num_blocks


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-rope{c[1]}")
@given(data=st.data(), block_size=st.integers(1, 5))
def test_any_interleaving_equals_one_kv_cache_per_sequence(config, data, block_size):
    """add / extend / step / fork / free in any order: each sequence's outputs and keys
    equal those of a KVCache given the same rows (a fork: its parent's rows so far)."""
    dims, rope_base = config
    W = init_weights(dims, seed=3)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    cache = PagedKVCache(W, block_size=block_size, num_blocks=400, rope_base=rope_base)
    refs, rows = {}, {}  # id -> its KVCache, and every row given to it
    for _ in range(data.draw(st.integers(1, 14), label="operations")):
        live = cache.sequences
        op = data.draw(st.sampled_from(["add", "extend", "step", "fork", "free"]
                                       if live else ["add"]), label="op")
        if op == "add":
            s = cache.add_sequence()
            refs[s], rows[s] = KVCache(W, capacity=1, rope_base=rope_base), []
            continue
        s = data.draw(st.sampled_from(live), label="sequence")
        if op in ("extend", "step"):
            m = 1 if op == "step" else data.draw(st.integers(0, 7), label="m")
            X = rng.standard_normal((m, dims.d_model))
            Y = cache.step(s, X[0])[None] if op == "step" else cache.extend(s, X)
            assert np.allclose(Y, refs[s].extend(X), rtol=0, atol=TOL)
            rows[s].append(X)
        elif op == "fork":
            new = cache.fork(s)
            refs[new], rows[new] = KVCache(W, rope_base=rope_base), list(rows[s])
            if rows[s]:
                refs[new].extend(np.concatenate(rows[s]))
        else:
            cache.free(s)
            del refs[s], rows[s]
        _accounting(cache)
    for s in cache.sequences:
        assert cache.length(s) == len(refs[s])
        assert np.allclose(cache.keys(s), refs[s].keys, rtol=0, atol=TOL)
        assert np.allclose(cache.values(s), refs[s].values, rtol=0, atol=TOL)


@pytest.mark.parametrize("dims", PRIME_DIMS, ids=str)
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_steps_and_prefill_equal_kv_cache(dims, block_size):
    W = init_weights(dims, seed=5)
    X = np.random.default_rng(5).standard_normal((dims.tokens + 19, dims.d_model))
    cache, ref = PagedKVCache(W, block_size, num_blocks=64), KVCache(W)
    s = cache.add_sequence()
    assert np.allclose(cache.extend(s, X[:9]), ref.extend(X[:9]), rtol=0, atol=TOL)
    for x in X[9:]:
        assert np.allclose(cache.step(s, x), ref.step(x), rtol=0, atol=TOL)
    assert cache.blocks_in_use == blocks_needed(len(X), block_size)


def test_float32_cache_keeps_float32():
    W = init_weights(seed=2, dtype=np.float32)
    X = np.random.default_rng(2).standard_normal((6, 5)).astype(np.float32)
    cache = PagedKVCache(W, block_size=4, num_blocks=4)
    Y = cache.extend(cache.add_sequence(), X)
    assert Y.dtype == np.float32 and cache.keys(0).dtype == np.float32
    assert np.allclose(Y, KVCache(W).extend(X), rtol=0, atol=1e-6)


def test_a_long_prefill_takes_the_tiled_path(monkeypatch):
    from mha_lit import fast

    monkeypatch.setattr(fast, "SCORES_LIMIT_BYTES", 64)  # every block "too large"
    W = init_weights(seed=4)
    X = np.random.default_rng(4).standard_normal((40, 5))
    called = []
    real = fast.attend_tiled
    monkeypatch.setattr(fast, "attend_tiled", lambda *a: called.append(1) or real(*a))
    cache = PagedKVCache(W, block_size=8, num_blocks=8)
    Y = cache.extend(cache.add_sequence(), X)
    assert called
    monkeypatch.undo()
    assert np.allclose(Y, KVCache(W).extend(X), rtol=0, atol=TOL)


# --- the block accounting -----------------------------------------------------------------


def _cache_with(rows, block_size=4, num_blocks=16, seed=0):
    W = init_weights(seed=seed)
    cache = PagedKVCache(W, block_size=block_size, num_blocks=num_blocks)
    s = cache.add_sequence()
    cache.extend(s, np.random.default_rng(seed).standard_normal((rows, 5)))
    return cache, s


def test_a_fork_takes_no_block_and_shares_every_one():
    cache, s = _cache_with(10)  # blocks of 4: 3 blocks, the last holding 2 rows
    before = cache.blocks_in_use
    f = cache.fork(s)
    assert cache.blocks_in_use == before == 3
    assert cache.block_table(f) == cache.block_table(s) and cache.length(f) == 10
    assert list(cache.ref_counts[list(cache.block_table(s))]) == [2, 2, 2]


def test_appending_to_a_shared_partly_filled_block_copies_exactly_one():
    cache, s = _cache_with(10)
    f = cache.fork(s)
    old = cache.block_table(s)
    keys = cache.keys(s).copy()
    cache.step(f, np.ones(5))  # slot 3 of the shared last block: copy it first
    assert cache.blocks_in_use == 4  # one more: the copy
    assert cache.block_table(s) == old  # the parent keeps its blocks
    assert cache.block_table(f)[:2] == old[:2] and cache.block_table(f)[2] != old[2]
    assert list(cache.ref_counts[list(old)]) == [2, 2, 1]
    assert np.array_equal(cache.keys(f)[:, :10], keys)  # copied, not recomputed
    cache.step(s, np.ones(5))  # the parent is now alone in its last block: no copy
    assert cache.blocks_in_use == 4 and cache.block_table(s) == old


def test_a_full_last_block_shared_by_a_fork_is_not_copied():
    cache, s = _cache_with(8)  # two full blocks of 4
    f = cache.fork(s)
    cache.step(f, np.ones(5))  # a new block for row 9; nothing is copied
    assert cache.blocks_in_use == 3
    assert cache.block_table(f)[:2] == cache.block_table(s)
    assert list(cache.ref_counts[list(cache.block_table(s))]) == [2, 2]


def test_a_block_is_taken_only_when_the_last_is_full():
    cache, s = _cache_with(1)
    counts = []
    for _ in range(8):
        cache.step(s, np.ones(5))
        counts.append(cache.blocks_in_use)
    assert counts == [1, 1, 1, 2, 2, 2, 2, 3]  # rows 2..9 in blocks of 4


def test_free_returns_the_blocks_no_other_sequence_holds():
    cache, s = _cache_with(10)
    f = cache.fork(s)
    cache.extend(f, np.ones((6, 5)))  # a copy of block 3, then one new block
    assert cache.blocks_in_use == 5
    cache.free(s)  # blocks 1, 2 stay with the fork; s's own last block returns
    assert cache.blocks_in_use == 4 and cache.free_blocks == 12
    assert list(cache.ref_counts[list(cache.block_table(f))]) == [1, 1, 1, 1]
    cache.free(f)
    assert cache.blocks_in_use == 0 and cache.free_blocks == 16
    assert cache.sequences == []
    t = cache.add_sequence()  # freed blocks are taken again, lowest id first
    cache.extend(t, np.ones((5, 5)))
    assert cache.block_table(t) == (0, 1)


def test_running_out_of_blocks_names_the_pool_and_changes_nothing():
    cache, s = _cache_with(10, num_blocks=4)
    f = cache.fork(s)
    state = (cache.block_table(s), cache.block_table(f), cache.ref_counts,
             cache.lengths, cache.free_blocks, cache.keys(f).copy())
    with pytest.raises(OutOfBlocksError, match=r"needs 3 free blocks of 4 rows, but the "
                                            r"pool of 4 blocks has 1 free"):
        cache.extend(f, np.ones((8, 5)))  # a copy and 2 new blocks; 1 is free
    after = (cache.block_table(s), cache.block_table(f), cache.ref_counts,
             cache.lengths, cache.free_blocks, cache.keys(f))
    assert after[:2] == state[:2] and np.array_equal(after[2], state[2])
    assert after[3:5] == state[3:5] and np.array_equal(after[5], state[5])
    cache.extend(f, np.ones((2, 5)))  # what fits still goes in: the copy only
    assert cache.free_blocks == 0


def test_a_failed_append_after_the_copy_leaves_the_cache_as_it_was(monkeypatch):
    from mha_lit import paged

    cache, s = _cache_with(10)
    f = cache.fork(s)
    state = (cache.block_table(f), cache.ref_counts, cache.free_blocks, cache.lengths)

    def broken(*args, **kwargs):
        raise FloatingPointError("in the kernel")

    monkeypatch.setattr(paged, "attention", broken)
    with pytest.raises(FloatingPointError):
        cache.step(f, np.ones(5))  # took the copy, then failed
    assert cache.block_table(f) == state[0] and np.array_equal(cache.ref_counts, state[1])
    assert cache.free_blocks == state[2] and cache.lengths == state[3]
    monkeypatch.undo()
    ref = KVCache(cache.W)
    ref.extend(np.random.default_rng(0).standard_normal((10, 5)))
    assert np.allclose(cache.step(f, np.ones(5)), ref.step(np.ones(5)), rtol=0, atol=TOL)


def test_an_empty_extend_takes_no_block():
    cache, s = _cache_with(8)
    f = cache.fork(s)
    assert cache.extend(f, np.empty((0, 5))).shape == (0, 5)
    assert cache.blocks_in_use == 2 and cache.length(f) == 8


@pytest.mark.parametrize("call, error, message", [
    (lambda c, s: c.extend(s, np.ones((3, 4))),
     ValueError, r"extend takes a block X \(m, d_model\), with d_model = 5, got shape \(3, 4\)"),
    (lambda c, s: c.extend(s, np.ones(5)), ValueError, r"got shape \(5,\)"),
    (lambda c, s: c.step(s, np.ones((2, 5))),
     ValueError, r"step takes one row x \(d_model,\), with d_model = 5, got shape \(2, 5\)"),
    (lambda c, s: c.step(s, np.array([1.0, np.nan, 0, 0, 0])), ValueError, "1 NaN"),
    (lambda c, s: c.step(99, np.ones(5)), ValueError, r"no sequence 99 in this cache: its "
                                                      r"sequences are \[0\]"),
    (lambda c, s: c.fork(True), ValueError, "no sequence True"),
    (lambda c, s: c.free("0"), ValueError, "no sequence '0'"),
])
def test_bad_rows_and_ids_are_refused_by_name(call, error, message):
    cache, s = _cache_with(5)
    with pytest.raises(error, match=message):
        call(cache, s)
    assert cache.lengths == {0: 5} and cache.blocks_in_use == 2


def test_a_freed_sequence_is_gone():
    cache, s = _cache_with(5)
    cache.free(s)
    with pytest.raises(ValueError, match=r"no sequence 0 in this cache: its sequences are \[\]"):
        cache.step(s, np.ones(5))


def test_bad_construction_is_refused():
    W = init_weights(seed=0)
    with pytest.raises(TypeError, match="PagedKVCache needs mha_lit.Weights"):
        PagedKVCache("W")
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        PagedKVCache(W, block_size=0)
    with pytest.raises(TypeError, match="num_blocks must be a positive integer"):
        PagedKVCache(W, num_blocks=2.0)
    with pytest.raises(ValueError, match="d_k must be even"):
        PagedKVCache(W, rope_base=10000.0)  # d_k = 7
    with pytest.raises(ValueError, match="rows must be a whole number"):
        blocks_needed(-1, 4)


def test_blocks_needed_is_the_ceiling():
    assert [blocks_needed(n, 4) for n in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


def test_repr_names_the_sequences_and_the_pool():
    cache, _ = _cache_with(5)
    assert repr(cache) == ("PagedKVCache(sequences={0: 5}, block_size=4, "
                           "blocks_in_use=2/16, heads=2, kv_heads=2, d_k=7, d_v=11)")


def test_keys_are_read_only():
    cache, s = _cache_with(5)
    with pytest.raises(ValueError):
        cache.keys(s)[0, 0, 0] = 1.0


# --- the figure ---------------------------------------------------------------------------


def test_paged_blocks_draws_every_table_entry_and_pool_block():
    cache, s = _cache_with(10, num_blocks=8)
    f = cache.fork(s)
    cache.step(f, np.ones(5))
    labels = {s: "A", f: "fork of A"}
    fig = plots.paged_blocks({labels[q]: cache.block_table(q) for q in cache.sequences},
                             {labels[q]: cache.length(q) for q in cache.sequences}, 4, 8)
    top, pool = fig.axes
    gids = [p.get_gid() for p in top.patches if p.get_gid()]
    assert gids == ["table:A:0", "table:A:1", "table:A:2",
                    "table:fork of A:0", "table:fork of A:1", "table:fork of A:2"]
    kinds = [p.get_gid() for p in pool.patches]
    assert kinds == ["block:0:shared", "block:1:shared", "block:2:own", "block:3:own",
                     "block:4:free", "block:5:free", "block:6:free", "block:7:free"]
    assert "the pool: 8 blocks, 4 in use" == pool.get_title()
    assert [t.get_text() for t in pool.texts].count("×2") == 2
    fig.canvas.draw()
    small = [t.get_text() for t in fig.findobj(matplotlib.text.Text)
             if t.get_visible() and t.get_text().strip() and t.get_fontsize() < 7]
    assert not small
    plt.close(fig)


def test_paged_blocks_refuses_tables_that_do_not_fit():
    with pytest.raises(ValueError, match="'A' has 5 rows, which take 2 blocks of 4, but its "
                                         "table lists 1"):
        plots.paged_blocks({"A": [0]}, {"A": 5}, 4, 8)
    with pytest.raises(ValueError, match="outside the pool's 0 .. 7"):
        plots.paged_blocks({"A": [0, 8]}, {"A": 5}, 4, 8)
    with pytest.raises(ValueError, match="lengths name"):
        plots.paged_blocks({"A": [0]}, {"B": 1}, 4, 8)
    plt.close("all")
