"""16-bit sums with float32 accumulation and one rounding (float16 and bfloat16).

A ring passes partial sums along in the wire's dtype, so a 16-bit sum over N ranks would
be rounded N-1 times. Here the flat array, padded to N equal chunks, goes through
``MPI_Alltoall`` (rank r receives every rank's chunk r), rank r sums its chunk in float32
(and divides, for mean), rounds it once to 16 bits, and ``MPI_Allgather`` gives every rank
every chunk: all ranks hold the same values, and the bytes each sends, 2 (N-1)/N n x 2, are
the ring's. Arrays are the 16-bit patterns (uint16), so bfloat16, which numpy lacks, goes too;
``widen``/``narrowed`` convert (bfloat16 rounds to nearest even). Host (numpy) and device
(cupy) arrays.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..arrays import array_module
from ..arrays.dtypes import NARROW
from ..runtime.context import Context
from .ops import ReduceOp
from .validate import InputProblem, agree, raise_local, stable_hash

FORMATS = NARROW
"""The 16-bit formats summed here, by name (``arrays.dtypes.NARROW``)."""
SUMMED = ("sum", "mean")
"""The ops that accumulate (the others are exact in any width and stay with the ring)."""


def widen(bits, fmt: str):
    """The float32 values of 16-bit patterns ``bits`` (uint16) in ``fmt``."""
    xp = array_module(bits)
    if fmt == "float16":
        return bits.view(xp.float16).astype(xp.float32)
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def narrowed(values, fmt: str, out) -> None:
    """Round float32 ``values`` once to ``fmt``, into the uint16 array ``out``."""
    xp = array_module(values)
    if fmt == "float16":
        with np.errstate(over="ignore"):  # past 65504 is inf, as a float16 sum is
            out[...] = values.astype(xp.float16).view(xp.uint16)
        return
    raw = values.view(xp.uint32)
    rounded = (raw + xp.uint32(0x7FFF) + ((raw >> 16) & xp.uint32(1))) >> 16
    nan = xp.isnan(values)
    out[...] = xp.where(nan, (raw >> 16) | xp.uint32(0x40), rounded).astype(xp.uint16)


class Codec:
    """The conversions ``narrow_allreduce`` makes: every rank's chunk summed in float32
    (``chunk_sum``) and a float32 chunk rounded to 16 bits (``narrowed``). These are numpy's
    (any array module); a caller with faster ones (torch's casts) passes its own."""

    @staticmethod
    def chunk_sum(received, fmt: str, size: int):
        """The float32 sum over ``size`` equal chunks of the uint16 array ``received``."""
        return widen(received, fmt).reshape(size, -1).sum(0, dtype=array_module(received).float32)

    narrowed = staticmethod(narrowed)


def narrow_allreduce(context: Context, bits, fmt: str, op: ReduceOp, *, check: bool = True,
                     local: Optional[InputProblem] = None, codec: Codec = Codec()) -> None:
    """Replace the flat uint16 array ``bits`` (``fmt`` patterns) by its sum or mean over the
    ranks, accumulated in float32 and rounded once (collective). With ``check``, the ranks first
    agree on the count, the format and the op (the same six fields as ``allreduce``'s check)."""
    fields = [("number of elements", int(bits.size), int(bits.size)),
              ("16-bit format", FORMATS.index(fmt), fmt),
              ("op", stable_hash(op.name), op.name),
              ("algorithm", 0, "float32 accumulation"),
              ("dtype", 0, "uint16 patterns"),
              ("number of dimensions", 1, 1)]
    if check:
        agree(context, "allreduce (16-bit)", fields, local)
    else:
        raise_local("allreduce (16-bit)", local, context.rank)
    comm, size = context.comm, context.size
    if size == 1:
        return
    xp = array_module(bits)
    count = bits.size
    chunk = -(-count // size)
    send = xp.zeros(chunk * size, xp.uint16)
    send[:count] = bits
    received = xp.empty_like(send)
    comm.Alltoall(send, received)
    mine = codec.chunk_sum(received, fmt, size)
    if op.divide_by_size:
        mine /= xp.float32(size)
    rounded = xp.empty(chunk, xp.uint16)
    codec.narrowed(mine, fmt, rounded)
    comm.Allgather(rounded, send)
    bits[...] = send[:count]
    moved = 2 * (size - 1) * chunk * 2
    context.traffic.add(moved, moved)


def is_narrow_sum(dtype, op: str) -> bool:
    """Whether an array of ``dtype`` under ``op`` is summed here (float16 sum and mean)."""
    return np.dtype(dtype) == np.float16 and op in SUMMED
