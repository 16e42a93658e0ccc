"""The row collectives and ``agree`` (``hpcreduce.collectives``) against local references (any N >= 2).

Every rank builds every rank's input from the rank number, so each result is checked against a
reference computed here. Then bad input on one rank: the same error on every rank, and the
communicator still works after it. ``collective_primitives.py kill``: (under --with-ft ulfm) the last
rank SIGKILLs itself before a call; every survivor's call raises MPI's process-failure error.
"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce import InputMismatchError, UnsupportedInputError
from hpcreduce.collectives import agree, allgatherv, alltoallv, reduce_scatter
from hpcreduce.runtime.failures import is_process_failure
from mpi_checks import expect_raised, run_checks

context = hpcreduce.init()
rank, size = context.rank, context.size
LAST = size - 1
DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool", "complex64")


def rows_of(r: int, count: int, dtype: str, seed: int) -> np.ndarray:
    values = np.random.default_rng(seed * 100 + r).integers(-9, 9, (count, 3, 2))
    return values.astype(dtype)


def expect_everywhere(error, fragments, call):
    for fragment in fragments:
        expect_raised(error, fragment, call, rank)
    assert allgatherv(np.full(1, rank)).tolist() == list(range(size)), "the communicator still works"


def check_allgatherv():
    for seed, dtype in enumerate(DTYPES):
        counts = [(r * 3 + seed) % 4 for r in range(size)]  # some ranks pass no rows
        got = allgatherv(rows_of(rank, counts[rank], dtype, seed))
        want = np.concatenate([rows_of(r, counts[r], dtype, seed) for r in range(size)])
        assert got.dtype == want.dtype and np.array_equal(got, want), (dtype, got, want)


def check_alltoallv():
    def chunk(src, dst, dtype):  # what rank src sends rank dst
        return rows_of(src * size + dst, (src + 2 * dst) % 3, dtype, 7)
    for dtype in ("float32", "int8", "bool", "complex128"):
        got = alltoallv([chunk(rank, dst, dtype) for dst in range(size)])
        assert len(got) == size
        for src in range(size):
            assert got[src].dtype == np.dtype(dtype) and np.array_equal(got[src], chunk(src, rank, dtype)), src


def check_reduce_scatter():
    counts = [r % 3 + 1 for r in range(size)]
    start = sum(counts[:rank])
    for dtype in ("float32", "float64", "int32", "int64"):
        for op, fold in (("sum", np.sum), ("min", np.min), ("max", np.max), ("prod", np.prod)):
            inputs = [rows_of(r, sum(counts), dtype, 3) for r in range(size)]
            got = reduce_scatter(inputs[rank], counts, op)
            want = fold(np.stack(inputs), axis=0)[start:start + counts[rank]].astype(dtype)
            assert got.dtype == np.dtype(dtype) and np.allclose(got, want, rtol=1e-6), (dtype, op, got, want)
    inputs = [rows_of(r, sum(counts), "float64", 4) for r in range(size)]
    got = reduce_scatter(inputs[rank], counts, "mean")
    assert np.allclose(got, np.mean(inputs, axis=0)[start:start + counts[rank]])


def check_float16_is_rounded_once():
    """2049 + 1 + 1 ...: a float16 sum rounded at every step stays at 2048; in float32 it is exact."""
    x = np.full((size, 4), 1.0, np.float16)
    if rank == 0:
        x[...] = 2048
    got = reduce_scatter(x, [1] * size, "sum")
    want = np.float16(np.float32(2048) + (size - 1))
    assert got.dtype == np.float16 and np.array_equal(got, np.full((1, 4), want, np.float16)), got


def check_agree():
    agree(None, what="nothing wrong")
    problem = "out of cheese" if rank == LAST else None
    expect_everywhere(InputMismatchError, [f"my step: rank {LAST}: out of cheese"],
                      lambda: agree(problem, what="my step"))
    expect_everywhere(KeyError, [f"rank {LAST}: out of cheese"],
                      lambda: agree(problem, what="x", error=KeyError))


def check_bad_input_on_one_rank():
    odd = rank == LAST
    expect_everywhere(InputMismatchError, ["allgatherv", "dtype", f"rank {LAST} passed float64"],
                      lambda: allgatherv(np.zeros(2, np.float64 if odd else np.float32)))
    expect_everywhere(InputMismatchError, ["shape after axis 0"],
                      lambda: allgatherv(np.zeros((2, 3 if odd else 2))))
    strided = np.zeros((4, 2))[:, :1] if odd else np.zeros((4, 1))
    expect_everywhere(UnsupportedInputError, [f"rank {LAST} passed a non-contiguous array"],
                      lambda: allgatherv(strided))
    expect_everywhere(InputMismatchError, [f"rank {LAST}", "chunks for"],
                      lambda: alltoallv([np.zeros(1)] * (size + 1 if odd else size)))
    counts = [2] * size if odd else [1] * size
    expect_everywhere(InputMismatchError, ["reduce_scatter", "counts"],
                      lambda: reduce_scatter(np.zeros((sum(counts), 2)), counts))
    expect_everywhere(InputMismatchError, ["unknown op"],
                      lambda: reduce_scatter(np.zeros((size, 2)), [1] * size, "median" if odd else "sum"))


def kill_last_rank():
    if rank == LAST:
        os.kill(os.getpid(), signal.SIGKILL)
    began = time.monotonic()
    for call in (lambda: allgatherv(np.zeros(3)), lambda: reduce_scatter(np.zeros((size, 2)), [1] * size),
                 lambda: alltoallv([np.zeros(1)] * size), lambda: agree(None, what="after")):
        try:
            call()
        except MPI.Exception as error:
            assert is_process_failure(error, context.comm), error
            break
    else:
        raise AssertionError("no call reported the dead rank")
    print(f"rank {rank}: dead rank reported after {time.monotonic() - began:.2f} s", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["kill"]:
        allgatherv(np.zeros(1))  # every rank is up
        kill_last_rank()
    else:
        run_checks(check_allgatherv, check_alltoallv, check_reduce_scatter, check_float16_is_rounded_once,
                   check_agree, check_bad_input_on_one_rank)
