"""Reduction operators and element types that the collectives support.

float16 travels as float16 (half the bytes of float32); in ``allreduce`` each pairwise
combine is computed in float32 and rounded back to float16 (numpy's and cupy's half
arithmetic), so a sum over N ranks is rounded N-1 times, as native MPI's float16 sum is;
``allreduce_many`` sums float16 in float32 and rounds once (``narrow``), as the torch DDP
wrapper does.
"mean" is a sum divided by the number of ranks; for integer types it is floored
(sum // N) so that the result keeps the input's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
from mpi4py import MPI

from ..arrays import array_module
from ..arrays.dtypes import REDUCED

DTYPES: Tuple[np.dtype, ...] = tuple(np.dtype(name) for name in REDUCED)


@dataclass(frozen=True)
class ReduceOp:
    """One operator: the ufunc that combines two buffers and MPI's built-in equivalent."""

    name: str
    ufunc_name: str
    mpi_op: MPI.Op
    divide_by_size: bool = False

    def combine(self, xp, a, b, out) -> None:
        """``out = a (op) b`` elementwise with ``xp`` (numpy or cupy); ``out`` may alias ``a``."""
        getattr(xp, self.ufunc_name)(a, b, out=out)

    def finish(self, out, size: int) -> None:
        """Turn the reduced buffer into the operator's result (divides for mean)."""
        if self.divide_by_size and size > 1:
            xp = array_module(out)
            if out.dtype.kind == "f":
                xp.divide(out, out.dtype.type(size), out=out)
            else:
                xp.floor_divide(out, size, out=out)

    def finish_into(self, reduced, out, size: int) -> None:
        """``out`` = the operator's result of ``reduced`` (the copy and, for mean, the division
        in one pass; bit for bit ``out[...] = reduced`` then ``finish``)."""
        if not (self.divide_by_size and size > 1):
            out[...] = reduced
        elif out.dtype.kind == "f":
            array_module(out).divide(reduced, out.dtype.type(size), out=out)
        else:
            array_module(out).floor_divide(reduced, size, out=out)


OPS = {op.name: op for op in (
    ReduceOp("sum", "add", MPI.SUM),
    ReduceOp("mean", "add", MPI.SUM, divide_by_size=True),
    ReduceOp("min", "minimum", MPI.MIN),
    ReduceOp("max", "maximum", MPI.MAX),
    ReduceOp("prod", "multiply", MPI.PROD),
)}
OP_NAMES = tuple(OPS)


_CODES = {dtype: code for code, dtype in enumerate(DTYPES)}


def dtype_code(dtype) -> int:
    """Position of ``dtype`` in ``DTYPES``, or -1 when unsupported."""
    try:
        return _CODES.get(np.dtype(dtype), -1)
    except TypeError:
        return -1
