"""One-shot allreduce: every rank reads every rank's input from the node's shared memory.

Steps (N ranks on one node, n bytes): each rank copies its n bytes beside its header row in
the node's ``SharedExchange``; once every row carries the call's number, each rank combines
the N inputs in rank order into its result. One synchronisation and no message: per rank n
bytes written, N x n read and N - 1 combines of n bytes (every rank does them all, in the
same order, so every rank ends with the same bits). It beats a message-based allreduce for
small messages, where that pays log2(N) or 2(N - 1) latencies; its reads grow with N x n,
so ``auto`` gives it small messages only (``selection``).
With the input check on, the check's row travels in the same exchange (``checked_one_shot``):
the whole checked call is one synchronisation. Only where every rank shares one node and
fault tolerance is off, and for at most the exchange's ``capacity`` (256 KiB, less from 5
ranks on: at most 1 MiB read per rank); elsewhere native
``MPI_Allreduce`` runs in its place (``stepped_aside`` and ``one_shot_allreduce``).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ..arrays import copy_into, host_pair
from ..runtime.context import Context
from .exchange import SharedExchange, header_row
from .native import native_allreduce, native_moved
from .node_window import node_window, shared_exchange
from .ops import ReduceOp
from .transfer import DirectTransfer
from .validate import PlannedCheck, raise_for_rows

FEW_INPUTS = 8
"""Up to this many ranks the inputs are combined one ufunc call each, above by one ``ufunc.reduce``."""
UNCHECKED_ROW = header_row([])
"""The row of a call without the check (a checked call's row differs: it counts its fields)."""


def one_shot_allreduce(comm: MPI.Intracomm, x, out, op: ReduceOp, transfer: DirectTransfer) -> Tuple[int, int]:
    """Reduce the flat array ``x`` into ``out`` (may alias ``x``) without the check; native
    ``MPI_Allreduce`` where the ranks span nodes or ``x`` exceeds the exchange's payload."""
    if comm.Get_size() == 1:
        if out is not x:
            out[...] = x
        return 0, 0
    shared = node_window(comm)
    if shared.nodes > 1 or x.nbytes > shared.exchange().capacity:
        return native_allreduce(comm, x, out, op, transfer)
    host_x, host_out = host_pair(x, out)
    plan = ShotPlan(shared.exchange(), host_x.dtype, host_x.shape, op)
    plan.reduce(comm, host_x, host_out, None)
    if host_out is not out:
        copy_into(out, host_out)
    return plan.moved, plan.moved


class ShotPlan:
    """One-shot calls of one signature (dtype, shape, op) through ``exchange``, with the views
    made once: a checked call's row travels with its payload in one exchange."""

    __slots__ = ("exchange", "areas", "stacks", "inputs", "ufunc", "moved")

    def __init__(self, exchange: SharedExchange, dtype: np.dtype, shape: Tuple[int, ...], op: ReduceOp) -> None:
        count = int(np.prod(shape))
        self.exchange = exchange
        self.stacks = [stack.reshape((exchange.size, *shape)) for stack in exchange.payloads(dtype, count)]
        self.inputs = [list(stack) for stack in self.stacks]
        self.areas = [inputs[exchange.rank] for inputs in self.inputs]
        self.ufunc = getattr(np, op.ufunc_name)
        self.moved = native_moved(count * dtype.itemsize, exchange.size)

    def reduce(self, comm: MPI.Intracomm, x: np.ndarray, out: np.ndarray, check: Optional[PlannedCheck]) -> None:
        """Raise ``check``'s error on every rank (or, without one, the error of a check that is on
        somewhere else), or reduce the host array ``x`` into ``out``."""
        exchange = self.exchange
        row = UNCHECKED_ROW if check is None else check.row
        parity = exchange.publish(row, x, self.areas)
        if not exchange.same(parity, row):
            what, fields = ("allreduce", []) if check is None else (check.what, check.fields)
            raise_for_rows(comm, what, fields, None, exchange.rows(parity))
        combine(self.ufunc, self.stacks[parity], self.inputs[parity], out)

    def run(self, context: Context, x: np.ndarray, out: np.ndarray, check: Optional[PlannedCheck]) -> None:
        """``reduce`` on ``context``, counting the traffic as native's."""
        self.reduce(context.comm, x, out, check)
        traffic = context.traffic
        traffic.sent += self.moved
        traffic.received += self.moved


def shot_plan(context: Context, x, op: ReduceOp) -> Optional[ShotPlan]:
    """The ``ShotPlan`` of a one-shot call of ``x``, or None where it steps aside (ranks on several
    nodes, fault tolerance, more than the exchange's payload): a check then runs on its own and
    native ``MPI_Allreduce`` in its place."""
    exchange = None if context.ft else shared_exchange(context)
    if exchange is None or x.nbytes > exchange.capacity:
        return None
    return ShotPlan(exchange, x.dtype, tuple(x.shape), op)


def checked_one_shot(plan: ShotPlan, context: Context, x, out, check: PlannedCheck) -> None:
    """``plan.run`` for any array: a device array's values are staged through host memory."""
    host_x, host_out = host_pair(x, out)
    plan.run(context, host_x, host_out, check)
    if host_out is not out:
        copy_into(out, host_out)


def combine(ufunc, stack: np.ndarray, inputs: List[np.ndarray], out: np.ndarray) -> None:
    """``out = inputs[0] (op) inputs[1] (op) ...`` with the op's ``ufunc``, in rank order:
    ``inputs`` are the rows of ``stack``. One ufunc call per rank up to FEW_INPUTS ranks, one
    ``ufunc.reduce`` over the stack above (numpy combines its rows in the same order, so the
    bits are the same either way; measured: the calls win at 2-4 ranks, the reduce from 16)."""
    if len(inputs) == 1:
        out[...] = inputs[0]
    elif len(inputs) > FEW_INPUTS:
        ufunc.reduce(stack, axis=0, out=out)
    else:
        ufunc(inputs[0], inputs[1], out)
        for more in inputs[2:]:
            ufunc(out, more, out)

