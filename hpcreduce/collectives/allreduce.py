"""``allreduce``: validate, pick an algorithm and a transfer, reduce.

The per-call Python cost matters for small messages (native MPI_Allreduce of 4 KiB
takes ~3-5 us here), so a call whose signature was seen before takes the planned path
(``planned``: one dictionary lookup, a few attribute tests, the same check as ``agree``, the
algorithm; about 1 us of Python on top of them); anything unusual takes the full path, which
names every problem on every rank.
Cost of the check (``validate``): one exchange of a 120-byte row through the node's shared
memory, inside the same exchange as the data for a one-shot call; across nodes and under fault
tolerance one allreduce of 14 int64, a collective of its own.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..errors import ConfigurationError
from ..runtime.context import Comm, Context, resolve
from ..runtime.settings import Setting, generation, switch
from ..arrays import array_module, is_device_array
from .finite_copy import finish_sum_in_place
from .hierarchical import hierarchical_allreduce, hierarchical_pieces, stepped_aside
from .memory import start_address
from .native import native_allreduce, native_moved
from .node_window import node_window
from .one_shot import checked_one_shot, one_shot_allreduce, shot_plan
from .ops import OP_NAMES, OPS, ReduceOp, dtype_code
from .recursive_doubling import recursive_doubling_allreduce
from .ring import ring_allreduce
from .selection import TABLE, choose
from .transfer import transfer_for
from .validate import (ALGORITHMS, InputProblem, PlannedCheck, ProblemKind, agree, array_problem, choice_problem,
                       out_problem, raise_local, setting_value, stable_hash)

__all__ = ["allreduce", "allreduce_pieces"]

ALGORITHM_FUNCTIONS = {
    "ring": ring_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "native": native_allreduce,
    "hierarchical": hierarchical_allreduce,
    "one_shot": one_shot_allreduce,
}

CHECK = Setting("HPCREDUCE_CHECK", switch, True, "on or off")


def allreduce(x, op: str = "sum", *, algorithm: str = "auto", comm: Comm = None,
              out=None, check: Optional[bool] = None):
    """Reduce ``x`` elementwise over all ranks; return the result, of x's shape and dtype.

    ``op``: sum, mean, min, max or prod. ``algorithm``: auto (by message size, see
    ``selection``), ring, recursive_doubling, native (``MPI_Allreduce``), hierarchical
    (node-local shared memory, leaders across nodes; native under fault tolerance) or one_shot
    (small messages on one node: every rank reads every input from shared memory; native
    across nodes and under fault tolerance). ``x`` is a
    contiguous numpy or cupy array of float16/32/64 or int32/64. ``out`` receives the
    result (``out=x`` reduces in place; an ``out`` that partly overlaps ``x`` gets the
    right result through a temporary). ``comm``: a Context, an MPI intracommunicator
    (hpcreduce works on its own duplicate of it) or None for ``hpcreduce.init()``'s.
    With ``check`` (default on; ``HPCREDUCE_CHECK=0`` turns the default off) a mismatch
    of shape, dtype, op or the algorithm that would run across ranks, or a bad input on
    any rank, raises the same error on every rank; it costs one shared-memory exchange on one
    node (none of its own for a one-shot call), one small allreduce elsewhere.
    A host array of a signature seen before takes the planned path (``planned``).
    """
    context = comm if type(comm) is Context else resolve(comm)
    result = planned(context, x, op, algorithm, out, check)
    if result is not None:
        return result
    checking, local = (check, None) if check is not None else setting_value(CHECK, True)
    local = local or array_problem(x) or choice_problem(op, algorithm) or out_problem(x, out)
    chosen, local = resolved_algorithm(x, algorithm, local)
    if local is None and out is None:
        out, local = allocated_like(x)
    fields = signature(x, op, algorithm, chosen)
    shot = shot_plan(context, x, OPS[op]) if checking and local is None and chosen == "one_shot" else None
    if shot is not None:
        checked_one_shot(shot, context, x, out, PlannedCheck("allreduce", fields))
        OPS[op].finish(out, context.size)
        return out
    if checking:
        agree(context, "allreduce", fields, local)
    else:
        raise_local("allreduce", local, context.rank)
    reduce_flat(context, x.reshape(-1), out.reshape(-1), OPS[op], chosen)
    return out


class CallPlan:
    """What every call of one signature (dtype, shape, op, algorithm) needs, worked out once
    per context (so per communicator: ``Context.replace_comm`` drops them) and settings
    ``generation``: whether to check by default, the algorithm ``auto`` picks by the table,
    the check (``PlannedCheck``), a one-shot call's views of the exchange (``shot``),
    the bytes counted as moved (native's) and whether to divide."""

    __slots__ = ("generation", "checking", "algorithm", "function", "op", "check", "native", "flatten",
                 "shot", "moved", "divide", "size")

    def __init__(self, context: Context, x: np.ndarray, op: str, algorithm: str, checking: bool, table,
                 generation: int) -> None:
        size = context.size
        self.generation, self.checking = generation, checking
        self.algorithm = choose(x.nbytes, table) if algorithm == "auto" else algorithm
        self.function = ALGORITHM_FUNCTIONS[stepped_aside(self.algorithm, context.ft, x.nbytes)]
        self.op = OPS[op]
        self.check = PlannedCheck("allreduce", signature(x, op, algorithm, self.algorithm))
        self.native = self.function is native_allreduce
        self.shot = shot_plan(context, x, self.op) if self.algorithm == "one_shot" else None
        self.flatten = x.ndim != 1
        self.moved = native_moved(x.nbytes, size)
        self.divide = self.op.divide_by_size and (self.shot is not None or not finishes(self.function))
        self.size = size


PLAN_LIMIT = 256
"""Most plans a context keeps (all are dropped when one more is needed)."""


def planned(context: Context, x, op: str, algorithm: str, out, check: Optional[bool]):
    """The hot path: a contiguous host array of a supported dtype with a known op and
    algorithm and a usable ``out``; returns the result, or None to leave the call (and
    every problem's report) to the full path. Per call it costs a dictionary lookup, a few
    attribute tests, the same check as ``agree`` (ranks on either path meet in it) and the
    algorithm: about 1 us of Python on top of them."""
    if type(x) is not np.ndarray:
        return None
    plan = _plan_of(context, x, op, algorithm)
    if plan is None or not x.flags.c_contiguous:
        return None
    if out is None:
        try:
            out = np.empty_like(x)
        except MemoryError:
            return None
    elif out is not x and (type(out) is not np.ndarray or out.shape != x.shape or out.dtype != x.dtype
                           or not _usable_out(x, out.flags, out)):
        return None
    checking = plan.checking if check is None else check
    if plan.shot is not None:
        plan.shot.run(context, x, out, plan.check if checking else None)
    else:
        _planned_reduce(context, plan, x, out, checking)
    if plan.divide:
        plan.op.finish(out, plan.size)
    return out


def allreduce_pieces(pieces: Sequence[np.ndarray], out: np.ndarray, op: str = "sum", *, comm: Comm = None,
                     check_finite: bool = False, in_place: bool = False) -> bool:
    """``allreduce(x, op, out=out)`` of the ``x`` that the flat host arrays ``pieces`` (``out``'s
    dtype, ``out.size`` values in all; any may be a view of ``out`` at its own place) make end
    to end, written into the contiguous 1-D ``out`` or, with ``in_place``, back into the pieces
    (``out`` is then scratch). Where the hierarchical allreduce runs it reads each piece where it
    lies and copies the result straight to where it goes (``hierarchical_pieces``); ``in_place``
    with two ranks on one node (for a bucket of any size), each piece is reduced where it lies by
    native ``MPI_Allreduce`` instead (``_native_pieces``: a sum of two has one order, so the same
    bits); elsewhere the pieces are copied into ``out`` first (and, ``in_place``, back after; a
    single piece is reduced where it lies). The same check as ``allreduce``'s, so either meets the other's.
    Returns whether the result may hold only finite values (its sum is finite: the same verdict
    on every rank; with ``check_finite``, else True), the sum taken in the hierarchical
    allreduce's copy out (``finite_copy``) or, elsewhere, in a pass of its own."""
    context = comm if type(comm) is Context else resolve(comm)
    plan = _plan_of(context, out, op, "auto")
    if plan is not None and in_place and _two_ranks_of_one_node(context, plan):
        if plan.checking:
            plan.check.run(context)
        return _native_pieces(context, pieces, plan.op, check_finite)
    if plan is None or plan.function is not hierarchical_allreduce or plan.shot is not None:
        return _gathered_pieces(context, pieces, out, op, check_finite, in_place)
    if plan.checking:
        plan.check.run(context)
    sent, received, total = hierarchical_pieces(context.comm, pieces, out, plan.op, summed=check_finite,
                                                in_place=in_place)
    context.traffic.add(sent, received)
    return math.isfinite(total)


def _two_ranks_of_one_node(context: Context, plan: CallPlan) -> bool:
    """Whether ``plan``'s call runs on two ranks of one node with the automatic choice
    node-aware (hierarchical, or one-shot for a small bucket; no fault tolerance, where shared
    windows are not used): there ``_native_pieces`` reduces each piece where it lies."""
    return context.size == 2 and not context.ft and plan.algorithm in ("hierarchical", "one_shot") \
        and node_window(context.comm).nodes == 1


PACKED_BELOW = 64 << 10
"""``_native_pieces`` packs the pieces smaller than this (biases, the used-parameter flags) into
one message: one ``MPI_Allreduce`` and one pass for all of them instead of a call each."""


def _native_pieces(context: Context, pieces: Sequence[np.ndarray], op: ReduceOp, check_finite: bool) -> bool:
    """Each piece reduced where it lies by ``MPI_Allreduce`` in place (the small ones packed into
    one array and back, ``PACKED_BELOW``), then divided (a mean) with its sum taken in the same
    pass (``finish_sum_in_place``). For two ranks of one node: Open MPI's shared-memory path reads
    the peer's buffer itself, where the hierarchical allreduce copies every piece into the node's
    window and the result out of it; measured inside a torch step (the gradients just written by
    backward) this is the faster of the two (docs/algorithms.md), and a sum of two values has one
    result, so the bits are the hierarchical allreduce's."""
    small = [piece for piece in pieces if piece.nbytes < PACKED_BELOW]
    whole = [piece for piece in pieces if piece.nbytes >= PACKED_BELOW]
    packed = np.empty(sum(piece.size for piece in small), small[0].dtype) if small else None
    if small:
        _copy_in(small, packed)
    comm, size, total = context.comm, context.size, 0.0
    for piece in whole + ([packed] if small else []):
        comm.Allreduce(MPI.IN_PLACE, piece, op.mpi_op)
        if check_finite:
            total += finish_sum_in_place(op, piece, size)
        else:
            op.finish(piece, size)
        moved = native_moved(piece.nbytes, size)
        context.traffic.add(moved, moved)
    if small:
        _copy_back(small, packed)
    return math.isfinite(total)


def _gathered_pieces(context: Context, pieces: Sequence[np.ndarray], out: np.ndarray, op: str,
                     check_finite: bool, in_place: bool) -> bool:
    """``allreduce_pieces`` where it is not hierarchical: the pieces gathered into ``out`` and
    reduced there (one piece ``in_place``: reduced where it lies), the result copied back
    ``in_place``; the NaN/Inf verdict from the result's sum."""
    if in_place and len(pieces) == 1:
        out = pieces[0]
    else:
        _copy_in(pieces, out)
    allreduce(out, op, comm=context, out=out)
    if in_place and len(pieces) > 1:
        _copy_back(pieces, out)
    return not check_finite or out.dtype.kind != "f" or math.isfinite(float(np.sum(out)))


def _copy_in(pieces: Sequence[np.ndarray], flat: np.ndarray) -> None:
    """The pieces end to end into ``flat`` (a piece already at its own place in it stays)."""
    start = 0
    for piece in pieces:
        if start_address(piece) != start_address(flat[start:]):
            flat[start:start + piece.size] = piece
        start += piece.size


def _copy_back(pieces: Sequence[np.ndarray], flat: np.ndarray) -> None:
    """``_copy_in`` undone: each piece takes its part of ``flat`` back."""
    start = 0
    for piece in pieces:
        if start_address(piece) != start_address(flat[start:]):
            piece[...] = flat[start:start + piece.size]
        start += piece.size


def _plan_of(context: Context, x: np.ndarray, op: str, algorithm: str) -> Optional[CallPlan]:
    """The kept plan of ``x``'s signature (made if new or stale), or None (the full path's)."""
    plans = context.cache.get("allreduce.plans")
    plan = plans.get((x.dtype, x.shape, op, algorithm)) if plans is not None else None
    if plan is None or plan.generation != generation():
        plan = _new_plan(context, x, op, algorithm)
    return plan


def _planned_reduce(context: Context, plan: CallPlan, x: np.ndarray, out: np.ndarray, checking: bool) -> None:
    """The planned path's check (when ``checking``) and reduction, apart from a one-shot call."""
    comm = context.comm
    if checking:
        plan.check.run(context)
    if plan.native:
        comm.Allreduce(MPI.IN_PLACE if out is x else x, out, plan.op.mpi_op)
        sent = received = plan.moved
    else:
        flat_x, flat_out = (x.reshape(-1), out.reshape(-1)) if plan.flatten else (x, out)
        transfer = context.cache.get("transfer.host") or transfer_for(context, x)
        sent, received = plan.function(comm, flat_x, flat_out, plan.op, transfer)
    traffic = context.traffic
    traffic.sent += sent
    traffic.received += received


def _new_plan(context: Context, x: np.ndarray, op: str, algorithm: str) -> Optional[CallPlan]:
    """The plan of ``x``'s signature (kept in the context's cache), or None where the full path must
    report something: an unsupported dtype, op or algorithm, or an unusable setting."""
    if dtype_code(x.dtype) < 0 or choice_problem(op, algorithm) is not None:
        return None
    try:
        made = generation()
        checking, table = CHECK.value(), (TABLE.value() if algorithm == "auto" else None)
    except ConfigurationError:
        return None
    plans = context.cache.setdefault("allreduce.plans", {})
    if len(plans) >= PLAN_LIMIT:
        plans.clear()
    plan = plans[(x.dtype, x.shape, op, algorithm)] = CallPlan(context, x, op, algorithm, checking, table, made)
    return plan


def _usable_out(x: np.ndarray, flags, out: np.ndarray) -> bool:
    """An ``out`` of ``x``'s type, shape and dtype (with ``flags``) can take the result on the
    planned path: contiguous, writeable and apart from ``x`` (two arrays that own their memory
    are apart without asking numpy)."""
    return flags.c_contiguous and flags.writeable and (
        x.base is None and out.base is None or not np.may_share_memory(x, out))


def resolved_algorithm(x, algorithm: str,
                       local: Optional[InputProblem]) -> Tuple[str, Optional[InputProblem]]:
    """The algorithm this rank would run on ``x`` ("auto" by ``HPCREDUCE_AUTO_TABLE``), and the
    local problem so far (an unusable table is one)."""
    if local is not None or algorithm != "auto":
        return algorithm, local
    table, unusable = setting_value(TABLE, None)
    return ("auto", unusable) if unusable else (auto_choice(x, table), None)


def auto_choice(x, table=None) -> str:
    """``auto``'s algorithm for ``x`` by ``table`` (else the active one); for a device array the
    ring where the table says hierarchical and native where it says one_shot (their shared
    memory is host memory)."""
    chosen = choose(x.nbytes, table)
    if is_device_array(x):
        return {"hierarchical": "ring", "one_shot": "native"}.get(chosen, chosen)
    return chosen


def allocated_like(x) -> Tuple[object, Optional[InputProblem]]:
    """A new array like ``x``, allocated before any communication (so that running out of
    memory on one rank is reported on every rank)."""
    try:
        return array_module(x).empty_like(x), None
    except MemoryError as err:
        return None, InputProblem(ProblemKind.OUT_OF_MEMORY, f"{x.nbytes} bytes: {err}")


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
        algorithm = auto_choice(x)
    function = ALGORITHM_FUNCTIONS[stepped_aside(algorithm, context.ft, x.nbytes)]
    sent, received = function(context.comm, x, out, op, transfer_for(context, x))
    context.traffic.add(sent, received)
    if not finishes(function):
        op.finish(out, context.size)


def finishes(function) -> bool:
    """Whether the algorithm ``function`` applies the operator's ``finish`` itself (the
    hierarchical allreduce divides a mean in its copy out)."""
    return function is hierarchical_allreduce
