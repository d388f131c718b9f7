"""Rank programs that misbehave on purpose, for tests/test_parallel.py.

Run on real ranks through ``mha_lit.ranks.launch("tests.rank_programs:NAME")``.
"""

import os
import time

import numpy as np

from mha_lit import parallel, ranks


def fail_on_rank_1(comm):
    """Rank 1 raises; the others wait at a barrier it never reaches."""
    if comm.Get_rank() == 1:
        raise KeyError("rank 1 gave up")
    comm.Barrier()
    return comm.Get_rank()


def hang_on_rank_1(comm):
    """Rank 1 sleeps far past any timeout; the others return."""
    if comm.Get_rank() == 1:
        time.sleep(600)
    return comm.Get_rank()


def exit_on_rank_0(comm):
    """Rank 0 leaves the process without a Python exception."""
    if comm.Get_rank() == 0:
        os._exit(3)
    comm.Barrier()
    return comm.Get_rank()


def rank_dependent_rows(comm, X, W):
    """Rank r hands tensor_parallel_attention r + 1 rows: shapes differ."""
    return parallel.tensor_parallel_attention(X[:comm.Get_rank() + 1], W, comm)


def ring_blocks(comm, X, W, sizes, layout="contiguous", causal=True):
    """ring_attention on blocks of the given sizes, in rank order."""
    ends = np.cumsum(sizes)
    r = comm.Get_rank()
    rows = np.arange(ends[r] - sizes[r], ends[r])
    return parallel.ring_attention(X[rows], W, comm, causal, layout=layout)


def decode_batch(comm, X, W, rope_base=None, window=None):
    """A TensorParallelKVCache of B sequences: prefill 2 rows, then steps."""
    cache = parallel.TensorParallelKVCache(W, comm, batch=X.shape[0],
                                           rope_base=rope_base, window=window)
    out = [cache.extend(X[:, :2])]
    out += [cache.step(X[:, t])[:, None] for t in range(2, X.shape[1])]
    return np.concatenate(out, axis=1)


def padded_prefill(comm, X, W, key_mask):
    """extend with a key_mask on a batched TensorParallelKVCache."""
    cache = parallel.TensorParallelKVCache(W, comm, batch=X.shape[0])
    return cache.extend(X, key_mask)


def ring_cases(comm, X, W):
    """ranks.ring for every (causal, layout), in one launch: (rows, Y) each."""
    return {(causal, layout): ranks.ring(comm, X, W, causal, layout)
            for causal in (True, False) for layout in parallel.LAYOUTS}


def tensor_parallel_cases(comm, X, W):
    """tensor_parallel_attention, causal and not, in one launch."""
    return {causal: parallel.tensor_parallel_attention(X, W, comm, causal)
            for causal in (True, False)}
