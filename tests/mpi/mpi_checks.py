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


def full_batch_descent(start, x, y, lr: float, steps: int):
    """A copy of the torch module ``start`` after ``steps`` of full-batch gradient descent on
    the mean squared error of (``x``, ``y``): what BSP servers running SGD should compute."""
    import copy

    import torch
    expected = copy.deepcopy(start)
    for _ in range(steps):
        expected.zero_grad()
        ((expected(x) - y) ** 2).mean().backward()
        with torch.no_grad():
            for param in expected.parameters():
                param -= lr * param.grad
    return expected
