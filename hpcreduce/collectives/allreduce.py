"""``allreduce``: validate, pick an algorithm and a transfer, reduce.

The per-call Python cost matters for small messages (native MPI_Allreduce of 4 KiB
takes ~5 us here), so this path avoids repeated lookups: settings are read once.
"""
from __future__ import annotations

from typing import Optional

from ..runtime.context import Comm, Context, resolve
from ..runtime.settings import Setting, switch
from ..arrays import array_module
from .native import native_allreduce
from .ops import OP_NAMES, OPS, ReduceOp, dtype_code
from .recursive_doubling import recursive_doubling_allreduce
from .ring import ring_allreduce
from .selection import choose
from .transfer import transfer_for
from .validate import (ALGORITHMS, agree, array_problem, choice_problem, out_problem, raise_local,
                       stable_hash)

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
    result (``out=x`` reduces in place). ``comm``: a Context, an MPI intracommunicator
    (hpcreduce works on its own duplicate of it) or None for ``hpcreduce.init()``'s.
    With ``check`` (default on; ``HPCREDUCE_CHECK=0`` turns the default off) a mismatch
    of shape, dtype or op across ranks, or a bad input on any rank, raises the same
    error on every rank; it costs one small allreduce.
    """
    context = resolve(comm)
    local = array_problem(x) or choice_problem(op, algorithm) or out_problem(x, out)
    if CHECK.value() if check is None else check:
        agree(context.comm, "allreduce", signature(x, op, algorithm), local)
    elif local is not None:
        raise_local("allreduce", local, context.rank)
    if out is None:
        out = array_module(x).empty_like(x)
    reduce_flat(context, x.reshape(-1), out.reshape(-1), OPS[op], algorithm)
    return out


def signature(x, op: str, algorithm: str) -> list:
    """The fields every rank's call must agree on."""
    shape = tuple(getattr(x, "shape", ()))
    return [
        ("dtype", dtype_code(x.dtype) if hasattr(x, "dtype") else -1),
        ("op", OP_NAMES.index(op) if op in OP_NAMES else -1),
        ("algorithm", ALGORITHMS.index(algorithm) if algorithm in ALGORITHMS else -1),
        ("number of dimensions", len(shape)),
        ("number of elements", int(getattr(x, "size", 0))),
        ("shape (hashed)", stable_hash(shape)),
    ]


def reduce_flat(context: Context, x, out, op: ReduceOp, algorithm: str = "auto") -> None:
    """Reduce the flat contiguous ``x`` into ``out`` with no input checks (callers checked).

    In place when ``out`` is ``x``'s memory (the algorithms test ``out is x``)."""
    if out is not x and array_module(x).may_share_memory(x, out):
        out = x
    if algorithm == "auto":
        algorithm = choose(x.nbytes)
    sent, received = ALGORITHM_FUNCTIONS[algorithm](context.comm, x, out, op, transfer_for(context, x))
    context.traffic.add(sent, received)
    op.finish(out, context.size)
