"""Collectives over rows of any count per rank: ``allgatherv``, ``alltoallv`` and ``reduce_scatter``.

An array's rows are its slices along axis 0; every rank passes the same dtype and the same shape
after axis 0 (any dtype numpy can send: bool, complex, 8-bit ints included, except for
``reduce_scatter``, which reduces the collectives' dtypes). The local checks and those fields are
agreed first (``validate.agree``: one shared-memory exchange on one node without fault tolerance,
else one small allreduce), then the row counts travel (one ``MPI_Allgather``/``MPI_Alltoall`` of
int64, skipped where they are known), then the data as bytes in one ``MPI_Allgather(v)`` or
``MPI_Alltoall(v)``: each rank sends and receives only the rows it must, never a pickle.
``reduce_scatter`` is an alltoall of the chunks (rank r receives every rank's chunk r, (N-1)/N
of the input, as a ring's reduce-scatter moves) and a local reduction in rank order; 16-bit
floats are accumulated in float32 and rounded once (``narrow``). A device (cupy) array goes to
MPI directly where MPI is CUDA-aware, else through a host copy (``transfer.transfer_kind``).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..arrays import array_module, is_device_array, synchronize, to_device, to_host
from ..runtime.context import Comm, Context, resolve
from .narrow import narrowed, widen
from .ops import OPS, ReduceOp
from .transfer import transfer_kind
from .validate import (Field, InputProblem, ProblemKind, agree, array_problem, first_problem, labelled,
                       stable_hash)

__all__ = ["allgatherv", "alltoallv", "reduce_scatter", "gather_rows", "exchange_rows", "scatter_reduced"]


def allgatherv(x, *, comm: Comm = None):
    """Every rank's ``x`` concatenated along axis 0 in rank order (any row count per rank)."""
    context = comm if type(comm) is Context else resolve(comm)
    local = movable_problem(x)
    agree(context, "allgatherv", row_fields(x), local)
    host, staged = _on_host(context, x)
    counts = np.empty(context.size, np.int64)
    context.comm.Allgather([np.array([len(host)], np.int64), MPI.INT64_T], [counts, MPI.INT64_T])
    out = array_module(host).empty((int(counts.sum()), *host.shape[1:]), host.dtype)
    gather_rows(context, host, counts, out)
    return to_device(out) if staged else out


def alltoallv(chunks: Sequence, *, comm: Comm = None) -> list:
    """Chunk j of this rank to rank j; returns what each rank sent to this one, in rank order."""
    context = comm if type(comm) is Context else resolve(comm)
    chunks = list(chunks) if isinstance(chunks, (list, tuple)) else [chunks]
    size = context.size
    local = None if len(chunks) == size else InputProblem(
        ProblemKind.BAD_COUNTS, f"{len(chunks)} chunks for {size} ranks (one per rank)")
    local = first_problem(local, *(labelled(movable_problem(chunk), f"chunk {j}") for j, chunk in enumerate(chunks)))
    first = chunks[0] if chunks else None
    if local is None and any(c.dtype != first.dtype or c.shape[1:] != first.shape[1:] for c in chunks):
        local = InputProblem(ProblemKind.BAD_COUNTS, "chunks of different dtypes or shapes after axis 0: "
                             + ", ".join(f"{c.dtype}{tuple(c.shape)}" for c in chunks))
    agree(context, "alltoallv", row_fields(first), local)
    staged = transfer_kind(is_device_array(first), context.cuda_aware) == "staged"
    pieces = [to_host(chunk) for chunk in chunks] if staged else chunks
    xp = array_module(pieces[0])
    send = xp.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    sent_counts = np.array([len(chunk) for chunk in pieces], np.int64)
    counts = np.empty(size, np.int64)
    context.comm.Alltoall([sent_counts, MPI.INT64_T], [counts, MPI.INT64_T])
    received = xp.empty((int(counts.sum()), *send.shape[1:]), send.dtype)
    exchange_rows(context, send, sent_counts, received, counts)
    parts = xp.split(received, np.cumsum(counts)[:-1].tolist())
    return [to_device(part) for part in parts] if staged else parts


def reduce_scatter(x, counts: Sequence[int], op: str = "sum", *, comm: Comm = None):
    """This rank's ``counts[rank]`` rows of ``x`` (``sum(counts)`` rows, ``counts`` alike on every
    rank) reduced over all ranks with ``op`` (allreduce's: sum, mean, min, max, prod)."""
    context = comm if type(comm) is Context else resolve(comm)
    counts = list(counts) if isinstance(counts, (list, tuple, np.ndarray)) else counts
    local = first_problem(array_problem(x), counts_problem(x, counts, context.size),
                          None if op in OPS else InputProblem(ProblemKind.UNKNOWN_OP, f"got op={op!r}"))
    fields = [*row_fields(x), ("op", stable_hash(op), op),
              ("counts", stable_hash([int(c) for c in counts] if local is None else None), counts)]
    agree(context, "reduce_scatter", fields, local)
    host, staged = _on_host(context, x)
    out = array_module(host).empty((int(counts[context.rank]), *host.shape[1:]), host.dtype)
    scatter_reduced(context, host, [int(c) for c in counts], OPS[op], out)
    return to_device(out) if staged else out


def movable_problem(x) -> Optional[InputProblem]:
    """What keeps ``x`` from travelling as rows, if anything."""
    if type(x) is not np.ndarray and not is_device_array(x):
        return InputProblem(ProblemKind.NOT_AN_ARRAY, f"got {type(x).__name__}")
    if x.dtype.hasobject or x.ndim == 0:
        return InputProblem(ProblemKind.UNMOVABLE, f"{x.dtype} of shape {tuple(x.shape)} (rows of fixed-size "
                                                   "values along axis 0 are needed)")
    if not x.flags.c_contiguous:
        return InputProblem(ProblemKind.NOT_CONTIGUOUS, f"array of shape {tuple(x.shape)} with strides "
                                                        f"{tuple(x.strides)}")
    return None


def counts_problem(x, counts, size: int) -> Optional[InputProblem]:
    """``BAD_COUNTS`` unless ``counts`` is ``size`` non-negative integers summing to ``x``'s rows."""
    try:
        usable = len(counts) == size and all(int(c) == c and c >= 0 for c in counts)
    except TypeError:
        usable = False
    if usable and int(sum(counts)) == (x.shape[0] if getattr(x, "ndim", 0) else -1):
        return None
    return InputProblem(ProblemKind.BAD_COUNTS, f"counts={counts!r} for {size} ranks and an input of shape "
                                                f"{tuple(getattr(x, 'shape', ()))}")


def row_fields(x) -> List[Field]:
    """The dtype and the shape after axis 0: what every rank's rows must share."""
    dtype, trailing = getattr(x, "dtype", None), tuple(getattr(x, "shape", ())[1:])
    return [("dtype", stable_hash(getattr(dtype, "str", None)), dtype),
            ("shape after axis 0", stable_hash(trailing), trailing)]


def gather_rows(context: Context, x, counts: Sequence[int], out) -> None:
    """Every rank's rows of ``x`` (``counts[r]`` from rank r) into ``out``, in rank order; no checks."""
    row = _row_bytes(x)
    synchronize(x)
    comm = context.comm
    if len(set(counts)) == 1:
        comm.Allgather([_bytes(x), MPI.BYTE], [_bytes(out), MPI.BYTE])
    else:
        sizes = [int(c) * row for c in counts]
        comm.Allgatherv([_bytes(x), MPI.BYTE], [_bytes(out), sizes, _starts(sizes), MPI.BYTE])
    context.traffic.add(x.nbytes * (context.size - 1), out.nbytes - x.nbytes)


def exchange_rows(context: Context, send, sent_counts: Sequence[int], received, counts: Sequence[int]) -> None:
    """Rows ``send`` (``sent_counts[j]`` to rank j, in order) to every rank, and ``counts[j]``
    rows from rank j into ``received``, in rank order; no checks."""
    row = _row_bytes(send)
    synchronize(send)
    comm, rank = context.comm, context.rank
    if len(set(sent_counts)) == 1 and len(set(counts)) == 1:
        comm.Alltoall([_bytes(send), MPI.BYTE], [_bytes(received), MPI.BYTE])
    else:
        out_sizes, in_sizes = [int(c) * row for c in sent_counts], [int(c) * row for c in counts]
        comm.Alltoallv([_bytes(send), out_sizes, _starts(out_sizes), MPI.BYTE],
                       [_bytes(received), in_sizes, _starts(in_sizes), MPI.BYTE])
    context.traffic.add(row * (int(sum(sent_counts)) - int(sent_counts[rank])),
                        row * (int(sum(counts)) - int(counts[rank])))


def scatter_reduced(context: Context, x, counts: Sequence[int], op: ReduceOp, out,
                    fmt: Optional[str] = None) -> None:
    """``out`` = this rank's ``counts[rank]`` rows of ``x`` reduced over the ranks, in rank order;
    no checks. 16-bit floats (float16, or ``fmt``'s uint16 patterns) are combined in float32 and
    rounded once."""
    size, mine = context.size, counts[context.rank]
    xp = array_module(x)
    received = xp.empty((size * mine, *x.shape[1:]), x.dtype)
    exchange_rows(context, x, counts, received, [mine] * size)
    stacked = received.reshape(size, mine, *x.shape[1:])
    fmt = fmt or ("float16" if x.dtype == np.float16 else None)
    if fmt is None:
        getattr(xp, op.ufunc_name).reduce(stacked, axis=0, out=out)
        op.finish(out, size)
        return
    wide = getattr(xp, op.ufunc_name).reduce(widen(stacked.view(xp.uint16), fmt), axis=0)
    op.finish(wide, size)
    narrowed(wide, fmt, out.view(xp.uint16))


def _on_host(context: Context, x) -> Tuple[object, bool]:
    """``x`` as MPI may read it: itself, or (a device array where MPI is not CUDA-aware) a host copy."""
    if transfer_kind(is_device_array(x), context.cuda_aware) == "staged":
        return to_host(x), True
    return x, False


def _row_bytes(x) -> int:
    return x.itemsize * int(np.prod(x.shape[1:], dtype=np.int64))


def _bytes(x):
    return x.reshape(-1).view(array_module(x).uint8)


def _starts(sizes: Sequence[int]) -> List[int]:
    return [0, *np.cumsum(sizes[:-1]).tolist()] if len(sizes) > 1 else [0]
