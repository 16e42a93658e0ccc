"""Fusion, bad input, the staged (host-staging) path and the private communicator.

Run under mpirun at any N >= 2; every check is collective and every rank asserts.
"""
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce.collectives.allreduce import allreduce_pieces, reduce_flat
from hpcreduce.collectives.workspace import Workspace, host_allocator
from hpcreduce.collectives.native import native_allreduce
from hpcreduce.collectives.ops import OPS
from hpcreduce.collectives.recursive_doubling import recursive_doubling_allreduce
from hpcreduce.collectives.ring import ring_allreduce
from hpcreduce.collectives.transfer import StagedTransfer
from mpi_checks import expect_raised

context = hpcreduce.init()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()


def native_sum(x):
    reference = np.empty_like(x)
    world.Allreduce(x, reference, op=MPI.SUM)
    return reference


def check_fusion():
    rng = np.random.default_rng(rank)
    arrays = [rng.standard_normal((3, 5)).astype(np.float32), np.arange(7, dtype=np.int64) * rank,
              np.array(float(rank)), np.zeros(0, np.float32),
              rng.standard_normal(50_000).astype(np.float32),            # larger than the threshold
              rng.standard_normal((40, 40)).astype(np.float64)[:, ::2],  # not contiguous
              rng.standard_normal(11).astype(np.float16)]
    expected = [native_sum(np.ascontiguousarray(a)) for a in arrays]
    for threshold in (64, 1 << 20):
        results = hpcreduce.allreduce_many(arrays, "sum", threshold_bytes=threshold)
        for got, want, a in zip(results, expected, arrays):
            assert got.shape == a.shape and got.dtype == a.dtype, (got.shape, a.shape)
            # another summation order than native's (ring, hierarchical): rounding, also near 0
            tolerance = 1e-2 if a.dtype == np.float16 else 1e-5
            assert np.allclose(got, want, rtol=tolerance, atol=tolerance), (threshold, a.dtype)
    copies = [a.copy() for a in arrays]
    returned = hpcreduce.allreduce_many(copies, "mean", inplace=True, threshold_bytes=4096)
    assert all(r is c for r, c in zip(returned, copies))
    for got, want in zip(copies, expected):
        reference = want / size if want.dtype.kind == "f" else want // size
        assert np.allclose(got, reference.astype(want.dtype), rtol=1e-2), got.dtype


def expect_everywhere(error, fragment, call):
    """The call must raise ``error`` mentioning ``fragment`` on this rank (and so on all)."""
    expect_raised(error, fragment, call, rank)
    # Nothing was lost: the communicator still works for a valid call.
    assert hpcreduce.allreduce(np.ones(3), "sum")[0] == size


def check_bad_input():
    mine = np.zeros(4 + (rank == 0), np.float32)
    expect_everywhere(hpcreduce.InputMismatchError, "number of elements", lambda: hpcreduce.allreduce(mine))
    shaped = np.zeros((2, 3) if rank == 0 else (3, 2), np.float32)
    expect_everywhere(hpcreduce.InputMismatchError, "shape", lambda: hpcreduce.allreduce(shaped))
    typed = np.zeros(4, np.float64 if rank == size - 1 else np.float32)
    expect_everywhere(hpcreduce.InputMismatchError, f"rank {size - 1} passed float64",
                      lambda: hpcreduce.allreduce(typed))
    expect_everywhere(hpcreduce.InputMismatchError, "op",
                      lambda: hpcreduce.allreduce(np.zeros(4), "max" if rank == 1 else "sum"))
    strided = np.zeros(8, np.float32)[::2] if rank == 1 else np.zeros(4, np.float32)
    expect_everywhere(TypeError, "rank 1 passed a non-contiguous array", lambda: hpcreduce.allreduce(strided))
    expect_everywhere(TypeError, "unsupported dtype", lambda: hpcreduce.allreduce(np.zeros(4, np.complex64)))
    expect_everywhere(TypeError, "not a numpy or cupy array", lambda: hpcreduce.allreduce([1.0, 2.0]))
    expect_everywhere(ValueError, "unknown op", lambda: hpcreduce.allreduce(np.zeros(4), "median"))
    expect_everywhere(ValueError, "unknown algorithm", lambda: hpcreduce.allreduce(np.zeros(4), algorithm="tree"))
    expect_everywhere(ValueError, "out=", lambda: hpcreduce.allreduce(np.zeros(4), out=np.zeros(5)))
    many = [np.zeros(2)] * (2 if rank == 0 else 3)
    expect_everywhere(hpcreduce.InputMismatchError, "number of arrays", lambda: hpcreduce.allreduce_many(many))


def check_staged_path():
    """Staging through host buffers, with numpy standing in for device memory."""
    def copy(source, target):
        np.copyto(target, source)

    staged = StagedTransfer(Workspace(host_allocator), Workspace(host_allocator), copy, copy)
    for n in (0, 1, size + 1, 300_001):
        x = np.random.default_rng(rank).uniform(-1, 1, n).astype(np.float32)
        want = native_sum(x)
        for algorithm in (ring_allreduce, recursive_doubling_allreduce, native_allreduce):
            out = np.full_like(x, np.nan)
            algorithm(context.comm, x, out, OPS["sum"], staged)
            assert np.allclose(out, want, rtol=1e-5, atol=1e-5), (algorithm.__name__, n)
        in_place = x.copy()
        ring_allreduce(context.comm, in_place, in_place, OPS["sum"], staged, segment_bytes=4096)
        assert np.allclose(in_place, want, rtol=1e-5, atol=1e-5), n


def check_private_communicator():
    assert MPI.Comm.Compare(context.comm, world) == MPI.CONGRUENT  # a duplicate, never the same
    user = world.Split(rank % 2, rank)
    half = hpcreduce.allreduce(np.ones(2), comm=user)
    assert half[0] == user.Get_size()
    private = hpcreduce.runtime.context.resolve(user)
    assert private is hpcreduce.runtime.context.resolve(user)  # duplicated once, then cached
    assert MPI.Comm.Compare(private.comm, user) == MPI.CONGRUENT
    user.Free()  # frees the private duplicate too (attribute delete callback)
    assert private.comm == MPI.COMM_NULL, "the private duplicate outlived the user's communicator"


def check_traffic_counter():
    before = context.traffic.sent
    x = np.ones(1000 * size, np.float64)
    reduce_flat(context, x, np.empty_like(x), OPS["sum"], "ring")
    chunk_bytes = 1000 * 8
    assert context.traffic.sent - before == 2 * (size - 1) * chunk_bytes, context.traffic


def check_pieces():
    """allreduce_pieces equals allreduce of the pieces end to end, bit for bit (hierarchical above
    128 KiB, the copying fallback below), pieces that are views of out read in place, and with
    in_place=True written back into the pieces (one piece or several, some of them views of the
    scratch; small pieces packed into one message at two ranks of one node); the finite verdict is the
    same on every rank and False when one rank holds a NaN or an Inf."""
    for count, dtype in ((300_000, np.float32), (70_000, np.float64), (1000, np.float32)):
        rng = np.random.default_rng(rank)
        whole = rng.standard_normal(count).astype(dtype)
        for op in ("sum", "mean"):
            expected = hpcreduce.allreduce(whole.copy(), op)
            out = np.full(count, 7, dtype)
            cut = [0, 5, count // 3, count // 2 + 1, count]
            pieces = [whole[a:b].copy() if i % 2 else out[a:b] for i, (a, b) in enumerate(zip(cut, cut[1:]))]
            for piece, a, b in zip(pieces, cut, cut[1:]):
                piece[...] = whole[a:b]
            assert allreduce_pieces(pieces, out, op, comm=context, check_finite=True)
            assert out.tobytes() == expected.tobytes(), (count, dtype, op)
            for cuts, views in (([0, count], False), (cut, False), (cut, True)):
                scratch = np.full(count, 7, dtype)  # views: every other piece lies in it, at its own place
                pieces = [scratch[a:b] if views and i % 2 == 0 else whole[a:b].copy()
                          for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]
                for piece, a, b in zip(pieces, cuts, cuts[1:]):
                    piece[...] = whole[a:b]
                assert allreduce_pieces(pieces, scratch, op, comm=context, check_finite=True, in_place=True)
                assert np.concatenate(pieces).tobytes() == expected.tobytes(), (count, dtype, op, len(pieces), views)
        for bad in (np.nan, np.inf):
            if rank == size - 1:
                whole[count // 2] = bad
            for in_place in (False, True):
                verdicts = world.allgather(allreduce_pieces([whole[:9].copy(), whole[9:].copy()], np.empty_like(whole),
                                                            "mean", comm=context, check_finite=True, in_place=in_place))
                assert verdicts == [False] * size, (verdicts, in_place)
            whole[count // 2] = 0


CHECKS = (check_fusion, check_bad_input, check_staged_path, check_private_communicator, check_traffic_counter,
          check_pieces)
for check in [c for c in CHECKS if c.__name__ in sys.argv[1:]] or CHECKS:  # names given: only those
    check()
    world.Barrier()
    if rank == 0:
        print(f"ok {check.__name__}", flush=True)
sys.exit(0)
