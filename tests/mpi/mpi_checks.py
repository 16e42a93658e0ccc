"""Helpers shared by the MPI-side test programs in this folder."""
import numpy as np


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
