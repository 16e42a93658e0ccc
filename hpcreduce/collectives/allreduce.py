"""``allreduce``: validate, pick an algorithm and a transfer, reduce.

The per-call Python cost matters for small messages (native MPI_Allreduce of 4 KiB
takes ~5 us here), so this path avoids repeated lookups: settings are read once.
"""
from __future__ import annotations

from typing import Optional, Tuple

from ..runtime.context import Comm, Context, resolve
from ..runtime.settings import Setting, switch
from ..arrays import array_module
from .memory import start_address
from .native import native_allreduce
from .ops import OP_NAMES, OPS, ReduceOp, dtype_code
from .recursive_doubling import recursive_doubling_allreduce
from .ring import ring_allreduce
from .selection import TABLE, choose
from .transfer import transfer_for
from .validate import (ALGORITHMS, Problem, agree, array_problem, choice_problem, out_problem, problem,
                       raise_local, setting_value, stable_hash)

ALGORITHM_FUNCTIONS = {
    "ring": ring_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "native": native_allreduce,
}

CHECK = Setting("HPCREDUCE_CHECK", switch, True, "on or off")


def allreduce(x, op: str = "sum", *, algorithm: str = "auto", comm: Comm = None,
              out=None, check: Optional[bool] = None):
    """Reduce ``x`` elementwise over all ranks; return the result, of x's shape and dtype.

    ``op``: sum, mean, min, max or prod. ``algorithm``: auto (by message size, see
    ``selection``), ring, recursive_doubling or native (``MPI_Allreduce``). ``x`` is a
    contiguous numpy or cupy array of float16/32/64 or int32/64. ``out`` receives the
    result (``out=x`` reduces in place; an ``out`` that partly overlaps ``x`` gets the
    right result through a temporary). ``comm``: a Context, an MPI intracommunicator
    (hpcreduce works on its own duplicate of it) or None for ``hpcreduce.init()``'s.
    With ``check`` (default on; ``HPCREDUCE_CHECK=0`` turns the default off) a mismatch
    of shape, dtype, op or the algorithm that would run across ranks, or a bad input on
    any rank, raises the same error on every rank; it costs one small allreduce.
    """
    context = resolve(comm)
    checking, local = (check, None) if check is not None else setting_value(CHECK, True)
    local = local or array_problem(x) or choice_problem(op, algorithm) or out_problem(x, out)
    chosen, local = resolved_algorithm(x, algorithm, local)
    if local is None and out is None:
        out, local = allocated_like(x)
    if checking:
        agree(context.comm, "allreduce", signature(x, op, algorithm, chosen), local)
    else:
        raise_local("allreduce", local, context.rank)
    reduce_flat(context, x.reshape(-1), out.reshape(-1), OPS[op], chosen)
    return out


def resolved_algorithm(x, algorithm: str, local: Optional[Problem]) -> Tuple[str, Optional[Problem]]:
    """The algorithm this rank would run on ``x`` ("auto" by ``HPCREDUCE_AUTO_TABLE``), and the
    local problem so far (an unusable table is one)."""
    if local is not None or algorithm != "auto":
        return algorithm, local
    table, unusable = setting_value(TABLE, None)
    return ("auto", unusable) if unusable else (choose(x.nbytes, table), None)


def allocated_like(x) -> Tuple[object, Optional[Problem]]:
    """A new array like ``x``, allocated before any communication (so that running out of
    memory on one rank is reported on every rank)."""
    try:
        return array_module(x).empty_like(x), None
    except MemoryError as err:
        return None, problem(11, f"{x.nbytes} bytes: {err}")


def signature(x, op: str, requested: str, chosen: str) -> list:
    """The fields every rank's call must agree on: (name, compared code, value shown)."""
    shape = tuple(getattr(x, "shape", ()))
    dtype = getattr(x, "dtype", None)
    shown = chosen if requested == chosen else f"{chosen} ({requested})"
    return [
        ("dtype", dtype_code(dtype) if dtype is not None else -1, dtype if dtype is not None else type(x).__name__),
        ("op", OP_NAMES.index(op) if op in OP_NAMES else -1, op),
        ("algorithm", ALGORITHMS.index(chosen) if chosen in ALGORITHMS else -1, shown),
        ("number of dimensions", len(shape), len(shape)),
        ("number of elements", int(getattr(x, "size", 0)), int(getattr(x, "size", 0))),
        ("shape", stable_hash(shape), shape),
    ]


def reduce_flat(context: Context, x, out, op: ReduceOp, algorithm: str = "auto") -> None:
    """Reduce the flat contiguous ``x`` into ``out`` with no input checks (callers checked).

    In place when ``out`` is ``x``'s memory (the algorithms test ``out is x``); an ``out``
    that partly overlaps ``x`` receives the result through a temporary."""
    if out is not x and array_module(x).may_share_memory(x, out):
        if start_address(out) != start_address(x):
            temporary = array_module(x).empty_like(x)
            reduce_flat(context, x, temporary, op, algorithm)
            out[...] = temporary
            return
        out = x
    if algorithm == "auto":
        algorithm = choose(x.nbytes)
    sent, received = ALGORITHM_FUNCTIONS[algorithm](context.comm, x, out, op, transfer_for(context, x))
    context.traffic.add(sent, received)
    op.finish(out, context.size)
