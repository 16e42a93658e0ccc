"""Helpers shared by the MPI-side test programs in this folder."""
import sys
import traceback

import numpy as np
from mpi4py import MPI


def sample(dtype: np.dtype, op: str, n: int, seed: int) -> np.ndarray:
    """Values for reducing with ``op`` in ``dtype``: small factors for prod (no overflow),
    +-50 otherwise."""
    rng = np.random.default_rng(seed)
    if op == "prod":
        values = rng.uniform(0.5, 2.0, n) if dtype.kind == "f" else rng.integers(-3, 4, n)
    else:
        values = rng.uniform(-50, 50, n) if dtype.kind == "f" else rng.integers(-50, 50, n)
    return values.astype(dtype)


def expect_raised(error, fragment: str, call, rank: int) -> None:
    """``call()`` must raise ``error`` with ``fragment`` in its message on this rank."""
    try:
        call()
    except error as err:
        assert fragment in str(err), f"{fragment!r} not in {err}"
    else:
        raise AssertionError(f"rank {rank}: no {error.__name__} for {fragment!r}")


def run_checks(*checks) -> None:
    """Run each check on every rank; rank 0 prints "ok NAME" once all passed it. A check that
    fails on one rank ends the job (MPI_Abort) instead of leaving the others waiting."""
    world = MPI.COMM_WORLD
    for check in checks:
        try:
            check()
        except BaseException:
            traceback.print_exc()
            sys.stdout.flush()
            world.Abort(1)
        world.Barrier()
        if world.Get_rank() == 0:
            print(f"ok {check.__name__}", flush=True)
