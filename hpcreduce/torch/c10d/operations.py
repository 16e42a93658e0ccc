"""The c10d operations over one group's ``Context``: checked, then moved through the collectives.

Each operation first agrees its signature across the group (``check``: each rank's local problem and
the fields every rank must share, e.g. dtype, shape, op, root; ``validate.PlannedCheck``, made once
per signature: one shared-memory exchange on one node, else one small allreduce), so a shape or
dtype that differs between ranks, or an op or dtype the backend does not do, raises the same error
on every rank before data moves. Then: reductions through ``allreduce`` (automatic choice) or the
16-bit sums of ``narrow`` (``tensors.reduction``); gathers and scatters as rows (``variable``) or one
``MPI_Bcast``/``MPI_Gather``/``MPI_Scatter`` of bytes.
"""
from __future__ import annotations

import time
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from ...collectives import agree, allreduce
from ...collectives.allreduce import PLAN_LIMIT
from ...collectives.broadcast import broadcast_tensor
from ...collectives.narrow import narrow_allreduce
from ...collectives.validate import Field, InputProblem, PlannedCheck, ProblemKind, agree as agree_fields, stable_hash
from ...collectives.variable import exchange_rows, gather_rows, scatter_reduced
from ...runtime.context import Context
from .tensors import Reduction, array, contiguous, describe, op_type, premul_factor, reduction, tensor_problem

Tensors = List[torch.Tensor]


def check(context: Context, what: str, fields: Sequence[Field], problem: Optional[str]) -> None:
    """Raise the same error on every rank of ``context`` if any rank has a ``problem`` or the
    ``fields`` differ; a signature seen before costs one planned check."""
    if problem is not None:
        agree_fields(context, what, fields, InputProblem(ProblemKind.NOT_SUPPORTED, problem))
        return
    checks = context.cache.setdefault("c10d.checks", {})
    key = (what, tuple(code for _, code, _ in fields))
    plan = checks.get(key)
    if plan is None:
        if len(checks) >= PLAN_LIMIT:
            checks.clear()
        shown = [(name, code, value() if callable(value) else value) for name, code, value in fields]
        plan = checks[key] = PlannedCheck(what, shown)  # kept: its fields hold text, never tensors
    plan.run(context)


def layout(tensors: Sequence, *extra: Field) -> List[Field]:
    """The number, dtypes and shapes of ``tensors``: what every rank's must match."""
    shapes = [(str(t.dtype), tuple(t.shape)) if isinstance(t, torch.Tensor) else None for t in tensors]
    return [("tensors", stable_hash(shapes), lambda: ", ".join(describe(t) for t in tensors) or "none"), *extra]


def op_field(op) -> Field:
    kind = op_type(op)
    if kind == dist.ReduceOp.RedOpType.PREMUL_SUM:
        factor = premul_factor(op)
        return ("reduce op", stable_hash(("PREMUL_SUM", factor)), f"PREMUL_SUM({factor!r})")
    return ("reduce op", int(kind.value), kind.name)


def first_problem(tensors: Sequence, more: Optional[str] = None) -> Optional[str]:
    return next((p for p in (tensor_problem(t) for t in tensors) if p is not None), more)


def allreduce_tensors(context: Context, what: str, tensors: Tensors, op) -> Tensors:
    """Every tensor reduced over the group in place (one check for all)."""
    problem = first_problem(tensors)
    plans = [reduction(t.dtype, op) for t in tensors] if problem is None else []
    problem = problem or next((p for p in plans if isinstance(p, str)), None)
    check(context, what, layout(tensors, op_field(op)), problem)
    with contiguous(tensors) as dense:
        for tensor, plan in zip(dense, plans):
            if tensor.numel():
                reduce_in_place(context, tensor, plan)
    return tensors


def reduce_in_place(context: Context, tensor: torch.Tensor, plan: Reduction) -> None:
    """One contiguous tensor reduced over the group, unchecked (``check`` ran)."""
    if plan.factor is not None:
        tensor.mul_(plan.factor)
    view = array(tensor).reshape(-1)
    if plan.path == "allreduce":
        allreduce(view, plan.op.name, comm=context, out=view, check=False)
    elif plan.path == "narrow":
        narrow_allreduce(context, view.view(np.uint16), plan.fmt, plan.op, check=False)
    elif plan.path == "wide":
        wide = tensor.float()
        allreduce(wide.numpy().reshape(-1), plan.op.name, comm=context, out=wide.numpy().reshape(-1), check=False)
        tensor.copy_(wide)
    else:
        context.comm.Allreduce(MPI.IN_PLACE, view, plan.op.mpi_op)
        if plan.op.divide_by_size:
            divide(view, context.size)


def divide(view: np.ndarray, size: int) -> None:
    """A mean's division: exact for floats and complex numbers, floored for integers."""
    if view.dtype.kind in "fc":
        np.divide(view, size, out=view)
    else:
        np.floor_divide(view, size, out=view)


def premultiplied(x: torch.Tensor, plan: Reduction) -> torch.Tensor:
    """``x`` contiguous, times PREMUL_SUM's factor (a new tensor then: the caller's input stays)."""
    return x.contiguous() if plan.factor is None else x * plan.factor


def reduce_to_root(context: Context, tensors: Tensors, op, root: int) -> Tensors:
    """``reduce``: the root's tensors reduced in place; the others' left as they were."""
    problem = None if 0 <= root < context.size else f"root {root} outside the group of {context.size}"
    check(context, "reduce", [("root", root, root)], problem)
    targets = tensors if context.rank == root else [t.clone() for t in tensors]
    allreduce_tensors(context, "reduce", targets, op)
    return tensors


def broadcast_tensors(context: Context, tensors: Tensors, root: int) -> Tensors:
    problem = first_problem(tensors, None if 0 <= root < context.size else
                            f"root {root} outside the group of {context.size}")
    check(context, "broadcast", layout(tensors, ("root", root, root)), problem)
    for tensor in tensors:
        broadcast_tensor(context, tensor, root)
    return tensors


def all_gather_single(context: Context, what: str, outputs: Tensors, inputs: Tensors) -> Tensors:
    """Each input gathered from every rank into its output, rank after rank (one check for all)."""
    problem = first_problem([*outputs, *inputs]) or next(
        (f"output {describe(o)} is not {context.size} x input {describe(i)}" for o, i in zip(outputs, inputs)
         if o.dtype != i.dtype or o.numel() != context.size * i.numel()), None)
    check(context, what, layout(inputs), problem)
    with contiguous(outputs) as dense:
        for out, x in zip(dense, inputs):
            flat = array(x.contiguous()).reshape(-1)
            gather_rows(context, flat, [flat.size] * context.size, array(out).reshape(-1))
    return outputs


def all_gather_lists(context: Context, output_lists: List[Tensors], inputs: Tensors) -> List[Tensors]:
    """``allgather``: input i of every rank into ``output_lists[i]`` (rank j's into entry j)."""
    size, rank = context.size, context.rank
    problem = first_problem([*inputs, *(o for outs in output_lists for o in outs)]) or next(
        (f"{len(outs)} outputs for {size} ranks, or output {rank} unlike input {describe(x)}"
         for outs, x in zip(output_lists, inputs)
         if len(outs) != size or outs[rank].numel() != x.numel() or any(o.dtype != x.dtype for o in outs)), None)
    check(context, "allgather", layout([o for outs in output_lists for o in outs]), problem)
    for outs, x in zip(output_lists, inputs):
        flat = array(x.contiguous()).reshape(-1)
        counts = [o.numel() for o in outs]
        gathered = np.empty(sum(counts), flat.dtype)
        gather_rows(context, flat, counts, gathered)
        scatter_into(outs, gathered)
    return output_lists


def scatter_into(tensors: Tensors, flat: np.ndarray) -> None:
    """``flat``'s values, end to end, into ``tensors``."""
    start = 0
    with contiguous(tensors) as dense:
        for tensor in dense:
            array(tensor).reshape(-1)[...] = flat[start:start + tensor.numel()]
            start += tensor.numel()


def reduce_scatter_single(context: Context, what: str, outputs: Tensors, inputs: Tensors, op) -> Tensors:
    """Each input reduced over the group, this rank's slice into its output (one check for all)."""
    size = context.size
    plans = [reduction(x.dtype, op) if isinstance(x, torch.Tensor) else "not a tensor" for x in inputs]
    problem = first_problem([*outputs, *inputs]) or next((p for p in plans if isinstance(p, str)), None) or next(
        (f"input {describe(x)} is not {size} x output {describe(o)}" for o, x in zip(outputs, inputs)
         if o.dtype != x.dtype or x.numel() != size * o.numel()), None)
    check(context, what, layout(inputs, op_field(op)), problem)
    with contiguous(outputs) as dense:
        for out, x, plan in zip(dense, inputs, plans):
            flat = array(premultiplied(x, plan)).reshape(-1)
            scatter_reduced(context, flat, [out.numel()] * size, plan.op, array(out).reshape(-1), plan.fmt)
    return outputs


def reduce_scatter_lists(context: Context, outputs: Tensors, input_lists: List[Tensors], op) -> Tensors:
    """``reduce_scatter``: ``input_lists[i][j]`` of every rank reduced into rank j's ``outputs[i]``."""
    size, rank = context.size, context.rank
    plans = [reduction(o.dtype, op) if isinstance(o, torch.Tensor) else "not a tensor" for o in outputs]
    problem = first_problem([*outputs, *(x for xs in input_lists for x in xs)]) or next(
        (p for p in plans if isinstance(p, str)), None) or next(
        (f"{len(xs)} inputs for {size} ranks, or input {rank} unlike output {describe(o)}"
         for o, xs in zip(outputs, input_lists)
         if len(xs) != size or xs[rank].numel() != o.numel() or any(x.dtype != o.dtype for x in xs)), None)
    check(context, "reduce_scatter", layout([x for xs in input_lists for x in xs], op_field(op)), problem)
    with contiguous(outputs) as dense:
        for out, xs, plan in zip(dense, input_lists, plans):
            flat = np.concatenate([array(premultiplied(x, plan)).reshape(-1) for x in xs])
            scatter_reduced(context, flat, [x.numel() for x in xs], plan.op, array(out).reshape(-1), plan.fmt)
    return outputs


def all_to_all_single(context: Context, out: torch.Tensor, x: torch.Tensor, out_splits: Sequence[int],
                      in_splits: Sequence[int]) -> Tensors:
    """``all_to_all_single``: rows of ``x`` (``in_splits[j]`` to rank j; equal without splits) into
    ``out`` (``out_splits[j]`` from rank j). The counts are exchanged and compared before data moves."""
    size = context.size
    problem = first_problem([out, x])
    if problem is None:
        problem = (_splits_problem("input", x, in_splits, size) or _splits_problem("output", out, out_splits, size)
                   or (None if out.dtype == x.dtype else f"output {out.dtype}, input {x.dtype}"))
    given = bool(in_splits) or bool(out_splits)
    if problem is None and not given and out.shape != x.shape:
        problem = f"output {describe(out)} unlike input {describe(x)} without split sizes"
    fields = [("dtype", stable_hash(str(x.dtype)), x.dtype),
              ("shape after dim 0", stable_hash(tuple(x.shape[1:])), tuple(x.shape[1:])),
              ("split sizes", 0 if given else stable_hash(tuple(x.shape)), "given" if given else tuple(x.shape))]
    check(context, "all_to_all_single", fields, problem)
    sent = list(in_splits) or [x.shape[0] // size] * size
    expected = list(out_splits) or [out.shape[0] // size] * size
    if given:  # without split sizes every rank's shape was compared: the counts are known
        counts = np.empty(size, np.int64)
        context.comm.Alltoall([np.array(sent, np.int64), MPI.INT64_T], [counts, MPI.INT64_T])
        wrong = counts.tolist() != expected
        agree(f"expects {expected} rows from the ranks, which send it {counts.tolist()}" if wrong else None,
              comm=context, what="all_to_all_single")
    with contiguous([out]) as (dense,):
        exchange_rows(context, array(x.contiguous()), sent, array(dense), expected)
    return [out]


def _splits_problem(name: str, tensor: torch.Tensor, splits: Sequence[int], size: int) -> Optional[str]:
    rows = tensor.shape[0] if tensor.dim() else 0
    if splits:
        return None if len(splits) == size and sum(splits) == rows and min(splits) >= 0 else \
            f"{name} split sizes {list(splits)} do not cut {rows} rows for {size} ranks"
    return None if rows % size == 0 else f"{name} of {rows} rows does not split evenly over {size} ranks"


def all_to_all_lists(context: Context, outputs: Tensors, inputs: Tensors) -> Tensors:
    """``alltoall``: ``inputs[j]`` to rank j, rank j's into ``outputs[j]`` (any sizes)."""
    from ...collectives import alltoallv
    size = context.size
    problem = first_problem([*outputs, *inputs]) or (
        None if len(inputs) == size == len(outputs) else f"{len(inputs)} inputs and {len(outputs)} outputs for "
                                                         f"{size} ranks")
    dtypes = {t.dtype for t in [*inputs, *outputs] if isinstance(t, torch.Tensor)}
    problem = problem or (None if len(dtypes) <= 1 else f"tensors of dtypes {sorted(map(str, dtypes))}")
    check(context, "alltoall", [("dtype", stable_hash(sorted(map(str, dtypes))), sorted(map(str, dtypes)))], problem)
    got = alltoallv([array(x.contiguous()).reshape(-1) for x in inputs], comm=context)
    wrong = [j for j in range(size) if got[j].size != outputs[j].numel()]
    agree(f"expects {[o.numel() for o in outputs]} values from the ranks, which send it "
          f"{[g.size for g in got]}" if wrong else None, comm=context, what="alltoall")
    with contiguous(outputs) as dense:
        for out, part in zip(dense, got):
            array(out).reshape(-1)[...] = part
    return outputs


def gather_to_root(context: Context, output_lists: List[Tensors], inputs: Tensors, root: int) -> List[Tensors]:
    """``gather``: every rank's input into the root's ``output_lists[0]``, in rank order."""
    x = _rooted("gather", context, inputs, output_lists, root)
    flat = array(x.contiguous()).reshape(-1)
    gathered = np.empty(flat.size * context.size, flat.dtype) if context.rank == root else None
    context.comm.Gather(flat, gathered, root=root)
    if gathered is not None:
        scatter_into(output_lists[0], gathered)
    return output_lists


def scatter_from_root(context: Context, outputs: Tensors, input_lists: List[Tensors], root: int) -> Tensors:
    """``scatter``: entry j of the root's ``input_lists[0]`` into rank j's output."""
    _rooted("scatter", context, outputs, input_lists, root)
    sent = np.concatenate([array(x.contiguous()).reshape(-1) for x in input_lists[0]]) \
        if context.rank == root else None
    with contiguous(outputs) as (dense,):
        context.comm.Scatter(sent, array(dense).reshape(-1), root=root)
    return outputs


def _rooted(what: str, context: Context, tensors: Tensors, root_lists: List[Tensors], root: int) -> torch.Tensor:
    """The checks of ``gather``/``scatter``: one tensor on each rank, a root in the group, and on the
    root a list of one tensor like it per rank (``root_lists[0]``). Returns the tensor."""
    size, mine = context.size, tensors[0] if len(tensors) == 1 else None
    problem = first_problem(tensors, None if mine is not None and 0 <= root < size else
                            f"one tensor and a root in the group (got {len(tensors)} tensors, root {root})")
    if problem is None and context.rank == root:
        listed = root_lists[0] if len(root_lists) == 1 else []
        if len(listed) != size or any(t.numel() != mine.numel() or t.dtype != mine.dtype for t in listed):
            problem = f"the root needs a list of {size} tensors like {describe(mine)}"
    check(context, what, layout(tensors, ("root", root, root)), problem)
    return mine


def monitored_barrier(context: Context, timeout_s: float, wait_all_ranks: bool) -> None:
    """gloo's ``monitored_barrier``: rank 0 waits up to ``timeout_s`` for every rank's token (naming
    the first rank, or with ``wait_all_ranks`` every rank, that did not come), then releases them."""
    comm, rank, size = context.comm, context.rank, context.size
    token = np.zeros(1, np.int8)
    if rank != 0:
        comm.Send(token, dest=0, tag=MONITORED)
        comm.Recv(token, source=0, tag=MONITORED)
        if token[0]:
            raise RuntimeError("hpcreduce monitored_barrier: rank 0 timed out waiting for other ranks")
        return
    tokens = [np.zeros(1, np.int8) for _ in range(size)]
    requests = [comm.Irecv(tokens[peer], source=peer, tag=MONITORED) for peer in range(1, size)]
    deadline = time.monotonic() + timeout_s
    while not MPI.Request.Testall(requests) and time.monotonic() < deadline:
        time.sleep(0.001)
    missing = [peer for peer, request in zip(range(1, size), requests) if not request.Test()]
    for peer in range(1, size):
        if peer not in missing:
            comm.Send(np.ones(1, np.int8) if missing else token, dest=peer, tag=MONITORED)
    if missing:
        for request in requests:
            if request:
                request.Cancel()
                request.Wait()
        named = missing if wait_all_ranks else missing[:1]
        raise RuntimeError(f"hpcreduce monitored_barrier: rank{'s' if len(named) > 1 else ''} "
                           f"{', '.join(map(str, named))} did not reach the barrier within {timeout_s:g} s")


MONITORED = 0x4D42  # "MB": the tag of monitored_barrier's tokens
