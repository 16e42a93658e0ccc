"""Bad inputs and faults in the collectives: right results or the same clear error on every rank.

``collective_hardening.py`` (any N >= 2): overlapping out=, read-only buffers on one rank,
settings that differ or are unusable on one rank, per-rank messages, unusable comm= on
every rank, one rank leaving the planned path (a call signature seen before) or a repeated
allreduce_many call while the others take it, the check off on one rank, and what a failed
in-place fusion says it applied. Every rank asserts. On one node without fault tolerance the
checks travel through the node's shared memory; with ``ft=True`` (or across nodes) as an
``MPI_Allreduce``: tests/test_collective_hardening.py runs both.
``collective_hardening.py one-bad-comm``: only rank 1 passes an unusable comm=; the job
must end at once with the error, not hang.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import hpcreduce
import hpcreduce.runtime.context
from hpcreduce.runtime import settings
from hpcreduce import ConfigurationError, InputMismatchError, UnsupportedInputError
from hpcreduce.collectives.buckets import GradientBuckets
from hpcreduce.collectives.fusion import _reduce_buckets
from hpcreduce.collectives.node_window import shared_exchange
from hpcreduce.collectives.ops import OPS
from mpi_checks import expect_raised

context = hpcreduce.init()
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
LAST = size - 1  # the rank with the odd input (rank 0 itself in a one-rank job)


def expect_everywhere(error, fragments, call):
    """``call`` raises ``error`` naming every fragment on this rank (so on all); the comm still works."""
    for fragment in [fragments] if isinstance(fragments, str) else fragments:
        expect_raised(error, fragment, call, rank)
    assert hpcreduce.allreduce(np.ones(3), "sum")[0] == size


def with_env(name, value, call):
    """``call()`` with ``name=value`` in this rank's environment only (None: unchanged);
    hpcreduce reads its settings once, so they are reloaded after each change."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
        settings.reload()
    try:
        return call()
    finally:
        os.environ.pop(name, None)
        if before is not None:
            os.environ[name] = before
        settings.reload()


def check_overlapping_out():
    values = np.arange(10, dtype=np.float64) + rank
    want = hpcreduce.allreduce(values)
    for x_at, out_at in ((slice(0, 10), slice(1, 11)), (slice(1, 11), slice(0, 10)), (slice(0, 10), slice(5, 15))):
        buffer = np.zeros(20)
        x, out = buffer[x_at], buffer[out_at]
        x[...] = values
        for algorithm in ("ring", "recursive_doubling", "native", "auto"):
            x[...] = values
            got = hpcreduce.allreduce(x, out=out, algorithm=algorithm)
            assert got is out and np.array_equal(out, want), (algorithm, x_at, out_at, out)
    same = values.copy()
    assert hpcreduce.allreduce(same, out=same) is same and np.array_equal(same, want)
    viewed = values.copy()
    hpcreduce.allreduce(viewed, out=viewed.view())
    assert np.array_equal(viewed, want), "out= a view of the same memory must reduce in place"
    shared = np.zeros(8)
    expect_everywhere(InputMismatchError, ["share memory with inplace=True", "array 0 and array 1"],
                      lambda: hpcreduce.allreduce_many([shared[:4], shared[2:6]], inplace=True))


def check_read_only_on_one_rank():
    out = np.zeros(4)
    out.flags.writeable = rank != LAST
    expect_everywhere(UnsupportedInputError, f"rank {LAST} passed a read-only array",
                      lambda: hpcreduce.allreduce(np.ones(4), out=out))
    arrays = [np.full(3, rank + 1.0), np.full(5000, rank + 1.0)]  # two buckets at 64 bytes
    arrays[1].flags.writeable = rank != LAST
    expect_everywhere(UnsupportedInputError, [f"rank {LAST} passed a read-only array", "array 1"],
                      lambda: hpcreduce.allreduce_many(arrays, inplace=True, threshold_bytes=64))
    assert all(np.all(a == rank + 1.0) for a in arrays), "an array was overwritten before the error"


def check_settings_that_differ():
    small = np.ones(256, np.float32)  # 1 KiB: one_shot by the default table
    ring_on_1 = "inf:ring" if rank == 1 else None
    expect_everywhere(InputMismatchError, ["algorithm", "passed one_shot (auto)", "rank 1 passed ring (auto)"],
                      lambda: with_env("HPCREDUCE_AUTO_TABLE", ring_on_1, lambda: hpcreduce.allreduce(small)))
    expect_everywhere(InputMismatchError, ["auto table", "rank 1 passed inf:ring", "131072:one_shot,inf:hierarchical"],
                      lambda: with_env("HPCREDUCE_AUTO_TABLE", ring_on_1,
                                       lambda: hpcreduce.allreduce_many([small, small])))
    expect_everywhere(InputMismatchError, ["fusion threshold", "rank 1 passed 64"],
                      lambda: with_env("HPCREDUCE_FUSION_BYTES", "64" if rank == 1 else None,
                                       lambda: hpcreduce.allreduce_many([small, small])))
    # The same tables everywhere: auto and an explicit choice of the same algorithm agree.
    got = hpcreduce.allreduce(small, algorithm="one_shot" if rank == 0 else "auto")
    assert got[0] == size


def check_unusable_setting_on_one_rank():
    small = np.ones(256, np.float32)
    for name, bad in (("HPCREDUCE_AUTO_TABLE", "lots:ring"), ("HPCREDUCE_CHECK", "maybe"),
                      ("HPCREDUCE_FUSION_BYTES", "-1")):
        expect_everywhere(ConfigurationError, [f"rank {LAST} has an unusable setting", name],
                          lambda name=name, bad=bad: with_env(name, bad if rank == LAST else None,
                                                              lambda: hpcreduce.allreduce_many([small, small])))


def check_messages_name_values():
    shaped = np.zeros((3, 4) if rank == 0 else (4, 3))
    expect_everywhere(InputMismatchError, ["shape", "rank 0 passed (3, 4)", "passed (4, 3)"],
                      lambda: hpcreduce.allreduce(shaped))
    expect_everywhere(InputMismatchError, ["algorithm", "rank 0 passed ring", "passed native"],
                      lambda: hpcreduce.allreduce(np.zeros(4), algorithm="ring" if rank == 0 else "native"))
    expect_everywhere(InputMismatchError, ["op", "rank 0 passed max", "passed sum"],
                      lambda: hpcreduce.allreduce(np.zeros(4), "max" if rank == 0 else "sum"))
    layout = [np.zeros(2), np.zeros((2, 2) if rank == 1 else (4,))]
    expect_everywhere(InputMismatchError, ["item 1", "rank 1 passed bias: float64 (2, 2)"],
                      lambda: hpcreduce.allreduce_many(layout, names=["weight", "bias"]))
    strided = np.zeros(8)[::2] if rank == 1 else np.zeros(4)
    expect_everywhere(UnsupportedInputError, ["rank 1 passed a non-contiguous array", "shape (4,) with strides (16,)"],
                      lambda: hpcreduce.allreduce(strided))


def check_planned_path_meets_full_path():
    """A signature seen before takes the planned path (one check allreduce made once per
    signature); a rank that changes its call, or passes what only the full path reports,
    meets the others in the same check: the same error everywhere, never a hang."""
    grid = np.arange(12.0).reshape(3, 4) + rank
    want = sum(np.arange(12.0).reshape(3, 4) + r for r in range(size))
    for algorithm in ("auto", "ring", "recursive_doubling", "native", "one_shot", "hierarchical"):
        for _ in range(2):  # the first call makes the plan, the second uses it
            assert np.array_equal(hpcreduce.allreduce(grid, algorithm=algorithm), want), algorithm
            into = np.empty_like(grid)
            assert hpcreduce.allreduce(grid, "mean", algorithm=algorithm, out=into) is into
            assert np.array_equal(into, want / size), algorithm
    odd = {"shape": np.zeros((4, 3)), "dtype": grid.astype(np.float32), "list": grid.tolist(),
           "strided": np.zeros((3, 8))[:, ::2]}
    for label, fragments, error, call in (
            ("shape", ["shape", f"rank {LAST} passed (4, 3)"], InputMismatchError, None),
            ("dtype", ["dtype", f"rank {LAST} passed float32"], InputMismatchError, None),
            ("list", [f"rank {LAST} passed something that is not a numpy or cupy array"], UnsupportedInputError,
             None),
            ("strided", [f"rank {LAST} passed a non-contiguous array"], UnsupportedInputError, None),
            ("op", ["op", f"rank {LAST} passed max"], InputMismatchError,
             lambda: hpcreduce.allreduce(grid, "max" if rank == LAST else "sum")),
            ("table", ["algorithm", f"rank {LAST} passed ring (auto)"], InputMismatchError,
             lambda: with_env("HPCREDUCE_AUTO_TABLE", "inf:ring" if rank == LAST else None,
                              lambda: hpcreduce.allreduce(grid)))):
        expect_everywhere(error, fragments, call or (lambda label=label: hpcreduce.allreduce(
            odd[label] if rank == LAST else grid)))
        assert np.array_equal(hpcreduce.allreduce(grid), want), f"after the {label} mismatch"


def check_input_check_off_on_one_rank():
    """Where the check travels in the node's shared memory, a one-shot call with the check off on
    one rank meets the checked calls of the others in the same exchange: the same error
    everywhere, never a hang (across nodes and under fault tolerance a check is a collective of
    its own, which a rank without it never joins: keep the check on, or off, everywhere)."""
    if shared_exchange(context) is None:
        return
    small = np.ones(16)
    expect_everywhere(InputMismatchError, "whether the input check is on",
                      lambda: hpcreduce.allreduce(small, algorithm="one_shot", check=rank != LAST))
    expect_everywhere(InputMismatchError, "whether the input check is on",
                      lambda: hpcreduce.allreduce(small, check=rank != LAST))


def check_repeated_fusion_meets_full_path():
    """A repeated allreduce_many call (the same arrays, unchanged: the kept ``ManyPlan``) meets a
    rank whose call changed (an array reshaped or made read-only in place, another list) in the
    same check: the same error everywhere, never a hang; the kept call still works after."""
    inputs = [np.zeros(3), np.zeros((2, 2))]
    views = GradientBuckets(inputs).load(inputs)

    def reduce_views():
        for view in views:
            view[...] = rank + 1.0
        assert hpcreduce.allreduce_many(views, inplace=True)[1] is views[1]
        assert all(np.all(view == size * (size + 1) / 2) for view in views), views

    def reshape(flat):
        views[1].shape = (4,) if flat else (2, 2)

    def read_only(locked):
        views[0].flags.writeable = not locked

    for _ in range(2):
        reduce_views()
    for change, error, fragments, call in (
            (reshape, InputMismatchError, ["dtypes and shapes", f"rank {LAST} passed array 1: float64 (4,)"], None),
            (read_only, UnsupportedInputError, [f"rank {LAST} passed a read-only array", "array 0"], None),
            (None, InputMismatchError, ["dtypes and shapes", f"rank {LAST} passed array 0: float64 (2, 2)"],
             lambda: hpcreduce.allreduce_many(views[::-1] if rank == LAST else views, inplace=True))):
        if change is not None and rank == LAST:
            change(True)
        try:
            expect_everywhere(error, fragments, call or (lambda: hpcreduce.allreduce_many(views, inplace=True)))
        finally:
            if change is not None and rank == LAST:
                change(False)
        reduce_views()


def check_failed_fusion_says_what_was_applied():
    alone = hpcreduce.runtime.context.resolve(MPI.COMM_SELF)
    arrays = [np.ones(3), np.ones(4), np.ones(5)]
    arrays[1].flags.writeable = False  # past the checks: fails while unpacking the second bucket
    try:
        _reduce_buckets(alone, arrays, [[0], [1, 2]], [None, None], arrays, OPS["sum"], "auto", True)
    except ValueError as err:
        assert "on this rank arrays [0] already hold the reduced result" in "".join(err.__notes__), err.__notes__
    else:
        raise AssertionError("writing into a read-only array did not fail")


if sys.argv[1:] == ["one-bad-comm"]:
    hpcreduce.allreduce(np.ones(2), comm="world" if rank == 1 else None)
    raise AssertionError(f"rank {rank}: an unusable comm= on rank 1 did not end the job")

ACROSS_RANKS = (check_settings_that_differ, check_messages_name_values,  # need two ranks to differ
                check_planned_path_meets_full_path, check_repeated_fusion_meets_full_path,
                check_input_check_off_on_one_rank)
for check in (check_overlapping_out, check_read_only_on_one_rank, check_unusable_setting_on_one_rank,
              *(ACROSS_RANKS if size > 1 else ()), check_failed_fusion_says_what_was_applied):
    check()
    world.Barrier()
    if rank == 0:
        print(f"ok {check.__name__}", flush=True)
sys.exit(0)
