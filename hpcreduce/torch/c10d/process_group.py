"""``ProcessGroupHpcreduce``: the ``torch.distributed.ProcessGroup`` that c10d, DDP, FSDP2, DCP and
DeviceMesh call, each method queueing one operation (``operations``) on the group's ``Progress``.

Every group has its own MPI communicator in its own ``Context``: the world group a duplicate of
hpcreduce's communicator, a subgroup ``MPI_Comm_create_group`` over its members only (ranks outside
it take no part). ``replace_comm`` swaps a group's communicator (after a failure, the survivors'),
dropping what was cached for the old one.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from mpi4py import MPI

from ...collectives import agree
from ...errors import ConfigurationError
from ...runtime.context import Context, init
from ...runtime.failures import release
from . import operations as ops
from .tensors import array, contiguous, tensor_problem
from .work import PointWork, Progress, Work

NAME = "hpcreduce"
"""The backend's name: ``init_process_group("hpcreduce")``, ``new_group(backend="hpcreduce")``."""

class ProcessGroupHpcreduce(dist.ProcessGroup):
    """One group of ranks over its own MPI communicator (``self.context``)."""

    def __init__(self, context: Context, rank: int, size: int, name: str, threaded: Optional[bool] = None) -> None:
        super().__init__(rank, size)
        self.context, self._name = context, name
        self.progress = Progress(lambda: self.context.comm, threaded)

    def getBackendName(self) -> str:
        return NAME

    @property
    def group_name(self) -> str:
        """c10d's name of the group (how functional collectives find it)."""
        return self._name

    @classmethod
    def over(cls, comm: MPI.Intracomm, name: str, like: Optional[Context] = None) -> "ProcessGroupHpcreduce":
        """A group over ``comm`` (kept, not duplicated; e.g. the survivors' after a shrink), its rank and
        size ``comm``'s; fault tolerance and the GPU path as ``like``'s (else hpcreduce's context)."""
        like = like or init()
        if like.ft:
            comm.Set_errhandler(MPI.ERRORS_RETURN)
        context = Context(comm, ft=like.ft, cuda_aware=like.cuda_aware, launcher=like.launcher)
        return cls(context, comm.Get_rank(), comm.Get_size(), name)

    def replace_comm(self, comm: MPI.Intracomm) -> None:
        """Run the group over ``comm`` (of the same size: torch keeps a group's rank and size; after a
        shrink make a new group with ``over``) from now on, every queued operation finished first; a
        failure recorded for the old communicator is forgotten."""
        self.progress.drain()
        self.context.replace_comm(comm)
        self.progress.failed = None

    def shutdown(self) -> None:
        """``destroy_process_group``: queued operations finish; the communicator is released."""
        if not self.progress.closed:
            self.progress.drain()
            self.progress.closed = True
            release(self.context.comm)

    abort = shutdown

    def _submit(self, what: str, run: Callable[[], Any]) -> Work:
        if self.progress.closed:
            raise RuntimeError(f"hpcreduce: {what} on a process group that was destroyed")
        return self.progress.submit(what, run)

    # reductions
    def allreduce(self, tensors, opts=None) -> Work:
        tensors, op = _listed(tensors), _op(opts)
        return self._submit("allreduce", lambda: ops.allreduce_tensors(self.context, "allreduce", tensors, op))

    def allreduce_coalesced(self, tensors, opts=None) -> Work:
        tensors, op = list(tensors), _op(opts)
        return self._submit("allreduce_coalesced",
                            lambda: ops.allreduce_tensors(self.context, "allreduce_coalesced", tensors, op))

    def reduce(self, tensors, opts=None) -> Work:
        tensors, op, root = _listed(tensors), _op(opts), opts.rootRank
        return self._submit("reduce", lambda: ops.reduce_to_root(self.context, tensors, op, root))

    def reduce_scatter(self, outputs, input_lists, opts=None) -> Work:
        outputs, input_lists, op = _listed(outputs), _lists(input_lists), _op(opts)
        return self._submit("reduce_scatter",
                            lambda: ops.reduce_scatter_lists(self.context, outputs, input_lists, op))

    def reduce_scatter_single(self, output, x, opts=None) -> Work:
        op = _op(opts)
        return self._submit("reduce_scatter_tensor", lambda: ops.reduce_scatter_single(
            self.context, "reduce_scatter_tensor", [output], [x], op))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> Work:
        outputs, inputs, op = list(outputs), list(inputs), _op(opts)
        return self._submit("reduce_scatter_tensor_coalesced", lambda: ops.reduce_scatter_single(
            self.context, "reduce_scatter_tensor_coalesced", outputs, inputs, op))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # gathers, scatters, broadcast
    def broadcast(self, tensors, opts=None) -> Work:
        tensors, root = _listed(tensors), opts.rootRank
        return self._submit("broadcast", lambda: ops.broadcast_tensors(self.context, tensors, root))

    def allgather(self, output_lists, inputs, opts=None) -> Work:
        output_lists, inputs = _lists(output_lists), _listed(inputs)
        return self._submit("allgather", lambda: ops.all_gather_lists(self.context, output_lists, inputs))

    allgather_coalesced = allgather

    def all_gather_single(self, output, x, opts=None) -> Work:
        return self._submit("all_gather_into_tensor", lambda: ops.all_gather_single(
            self.context, "all_gather_into_tensor", [output], [x]))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> Work:
        outputs, inputs = list(outputs), list(inputs)
        return self._submit("all_gather_into_tensor_coalesced", lambda: ops.all_gather_single(
            self.context, "all_gather_into_tensor_coalesced", outputs, inputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, inputs, opts=None) -> Work:
        output_lists, inputs, root = _lists(output_lists), _listed(inputs), opts.rootRank
        return self._submit("gather", lambda: ops.gather_to_root(self.context, output_lists, inputs, root))

    def scatter(self, outputs, input_lists, opts=None) -> Work:
        outputs, input_lists, root = _listed(outputs), _lists(input_lists), opts.rootRank
        return self._submit("scatter", lambda: ops.scatter_from_root(self.context, outputs, input_lists, root))

    def alltoall(self, outputs, inputs, opts=None) -> Work:
        outputs, inputs = list(outputs), list(inputs)
        return self._submit("alltoall", lambda: ops.all_to_all_lists(self.context, outputs, inputs))

    def all_to_all_single(self, output, x, output_splits, input_splits, opts=None) -> Work:
        output_splits, input_splits = list(output_splits or []), list(input_splits or [])
        return self._submit("all_to_all_single", lambda: ops.all_to_all_single(
            self.context, output, x, output_splits, input_splits))

    alltoall_base = all_to_all_single

    def barrier(self, opts=None) -> Work:
        return self._submit("barrier", lambda: self.context.comm.Barrier())

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """gloo's: a barrier that names the ranks that did not reach it within ``timeout``
        (``dist.monitored_barrier`` itself refuses every backend but gloo; call this on the group)."""
        seconds = timeout.total_seconds() if timeout is not None else dist.default_pg_timeout.total_seconds()
        self._submit("monitored_barrier",
                     lambda: ops.monitored_barrier(self.context, seconds, wait_all_ranks)).wait()

    # point to point
    def send(self, tensors, dst: int, tag: int = 0) -> Work:
        tensor = _one(tensors, "send")
        dense = tensor.contiguous()
        request = self.context.comm.Isend(array(dense).reshape(-1), dest=dst, tag=tag)
        return PointWork("send", self.progress, request, [tensor])

    def recv(self, tensors, src: int, tag: int = 0) -> Work:
        return self._receive(_one(tensors, "recv"), src, tag)

    def recv_anysource(self, tensors, tag: int = 0) -> Work:
        return self._receive(_one(tensors, "recv"), MPI.ANY_SOURCE, tag)

    def _receive(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        with contiguous([tensor], written=False) as (dense,):
            request = self.context.comm.Irecv(array(dense).reshape(-1), source=src, tag=tag)
        finish = (lambda: None) if dense is tensor else (lambda: tensor.copy_(dense))
        return PointWork("recv", self.progress, request, [tensor], finish)

    def __repr__(self) -> str:
        return f"ProcessGroupHpcreduce(rank={self.rank()}, size={self.size()})"


def _op(opts) -> dist.ReduceOp:
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _listed(tensors) -> List[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _lists(lists) -> List[List[torch.Tensor]]:
    return [list(inner) for inner in lists]


def _one(tensors, what: str) -> torch.Tensor:
    tensors = _listed(tensors)
    problem = None if len(tensors) == 1 else f"{len(tensors)} tensors (one only)"
    problem = problem or tensor_problem(tensors[0])
    if problem is not None:
        raise ValueError(f"hpcreduce {what}: {problem}")
    return tensors[0]


def create(options, _backend_options=None) -> ProcessGroupHpcreduce:
    """The creator ``Backend.register_backend`` calls (``extended_api``): the world group over a
    duplicate of hpcreduce's communicator (its placement agreed with MPI's on every rank), or a
    subgroup over ``MPI_Comm_create_group`` of its members (called on members only)."""
    members = list(options.global_ranks_in_group)
    base = init()
    if not members or members == list(range(base.size)):
        problem = None if (options.group_rank, options.group_size) == (base.rank, base.size) else (
            f"torch's rank {options.group_rank} of {options.group_size} is not MPI's rank {base.rank} of {base.size}")
        agree(problem, comm=base, what="init_process_group(\"hpcreduce\")", error=ConfigurationError)
        comm = base.comm.Dup()
    else:
        group = base.comm.Get_group().Incl(members)
        comm = base.comm.Create_group(group, tag=abs(hash(tuple(members))) % 32768)
        group.Free()
    return ProcessGroupHpcreduce.over(comm, options.group_id, base)
