"""``hpcreduce.broadcast`` under real mpirun (any N >= 1): root's values on every rank, in place,
for every dtype and root; bad input on one rank (or a root outside the communicator, arrays
that differ across ranks) is the same error on every rank, and the communicator still works
after it; ``comm=`` a sub-communicator; the check off. Every rank asserts.
"""
import numpy as np
from mpi4py import MPI

import hpcreduce
from hpcreduce import InputMismatchError, UnsupportedInputError
from mpi_checks import expect_raised, run_checks

hpcreduce.init()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
LAST = size - 1  # the rank with the odd input (rank 0 itself in a one-rank job)
DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
SHAPES = [(0,), (1,), (7,), (3, 5), (1000, 3)]


def expect_everywhere(error, fragments, call):
    """``call`` raises ``error`` naming every fragment on this rank (so on all); the comm still works."""
    for fragment in fragments:
        expect_raised(error, fragment, call, rank)
    assert hpcreduce.allreduce(np.ones(3), "sum")[0] == size


def own(dtype, shape, owner):
    return (np.arange(int(np.prod(shape))).reshape(shape) % 50 + owner).astype(dtype)


def check_root_values_in_place():
    for root in range(size):
        arrays = [own(dtype, shape, rank) for dtype in DTYPES for shape in SHAPES]
        assert hpcreduce.broadcast(arrays, root=root) is arrays
        for got, (dtype, shape) in zip(arrays, [(d, s) for d in DTYPES for s in SHAPES]):
            assert got.dtype == dtype and np.array_equal(got, own(dtype, shape, root)), (root, dtype, shape)
        single = own(np.float32, (4, 4), rank)
        assert hpcreduce.broadcast(single, root=root) is single
        assert np.array_equal(single, own(np.float32, (4, 4), root))
        pair = (own(np.int64, (3,), rank), own(np.float64, (2,), rank))
        assert hpcreduce.broadcast(pair, root=root, check=False) is pair
        assert all(np.array_equal(got, own(got.dtype, got.shape, root)) for got in pair)


def check_read_only_root_is_read_only_receivers_are_refused():
    values = own(np.float64, (5,), rank)
    values.flags.writeable = rank != 0
    hpcreduce.broadcast(values, root=0)
    assert np.array_equal(values, own(np.float64, (5,), 0))
    if size > 1:
        values.flags.writeable = rank != LAST
        expect_everywhere(UnsupportedInputError, [f"rank {LAST} passed a read-only array", "array 0"],
                          lambda: hpcreduce.broadcast(values, root=0))


def check_bad_input_on_one_rank_raises_everywhere():
    good = [np.zeros(4), np.zeros(3, np.int32)]
    odd = [np.zeros(4), "three"] if rank == LAST else good
    expect_everywhere(UnsupportedInputError, [f"rank {LAST} passed something that is not a numpy or cupy array",
                                              "array 1: got str"], lambda: hpcreduce.broadcast(odd))
    strided = np.zeros((4, 4))[:, ::2] if rank == LAST else np.zeros((4, 2))
    expect_everywhere(UnsupportedInputError, [f"rank {LAST} passed a non-contiguous array"],
                      lambda: hpcreduce.broadcast(strided))
    narrow = np.zeros(4, np.int8)
    expect_everywhere(UnsupportedInputError, ["passed an array of an unsupported dtype", "got int8"],
                      lambda: hpcreduce.broadcast(narrow))
    expect_everywhere(InputMismatchError, ["asked for a root outside the communicator",
                                           f"root={size}, but the communicator has {size} ranks"],
                      lambda: hpcreduce.broadcast(np.zeros(3), root=size))


def check_arrays_that_differ_across_ranks():
    if size == 1:
        return
    shaped = np.zeros((2, 3) if rank == LAST else (3, 2))
    expect_everywhere(InputMismatchError, ["ranks disagree on the dtypes and shapes", "item 0"],
                      lambda: hpcreduce.broadcast(shaped))
    counted = [np.zeros(2)] * (2 if rank == LAST else 1)
    expect_everywhere(InputMismatchError, ["ranks disagree on the number of arrays"],
                      lambda: hpcreduce.broadcast(counted))
    expect_everywhere(InputMismatchError, ["ranks disagree on the root"],
                      lambda: hpcreduce.broadcast(np.zeros(2), root=LAST if rank == LAST else 0))


def check_on_a_sub_communicator():
    half = world.Split(rank % 2, rank)
    values = own(np.float32, (6,), rank)
    hpcreduce.broadcast(values, root=half.Get_size() - 1, comm=half)
    owner = rank % 2 + 2 * (half.Get_size() - 1)
    assert np.array_equal(values, own(np.float32, (6,), owner)), (values, owner)
    half.Free()


run_checks(check_root_values_in_place, check_read_only_root_is_read_only_receivers_are_refused,
           check_bad_input_on_one_rank_raises_everywhere, check_arrays_that_differ_across_ranks,
           check_on_a_sub_communicator)
