"""Broadcast of whole arrays, host or device: ``broadcast`` (checked, public) and the state
sync's ``broadcast_arrays``.

Each array goes from ``root`` to every rank in place by ``MPI_Bcast``. A device (cupy)
array is handed to MPI itself where MPI is CUDA-aware (after a wait for the stream, so
MPI never reads memory a kernel is still writing), and otherwise staged: copied down to
a host array (``arrays.to_host``), broadcast, and copied back up (``arrays.copy_into``).
The path is the one ``allreduce`` takes (``transfer.transfer_kind``), so a device
array never reaches an MPI that cannot read device memory. A torch tensor (``broadcast_tensor``,
torch imported only then) goes as its bytes, by the same rule.

Cost of ``broadcast`` (N ranks, n bytes an array): the input check (``validate``: one exchange
of a 120-byte row through the node's shared memory on one node without fault tolerance, else
one allreduce of 2 x 4 int64, 64 bytes), then one ``MPI_Bcast`` per array. MPI picks its
algorithm; with a binomial tree (Open MPI's for small messages) that is ceil(log2 N) steps, each
rank but the root receives n bytes once and the root sends n bytes at each step; large messages
travel in segments down a pipeline or tree (about n bytes sent and received per rank). Staged
device arrays add n bytes device to host and n host to device on every rank.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, TypeVar

from ..arrays import copy_into, is_device_array, synchronize, to_host
from ..runtime.context import Comm, Context, resolve
from .allreduce import CHECK
from .transfer import transfer_kind
from .validate import (InputProblem, agree, array_labels, array_problem, first_problem, labelled, layout_fields,
                       raise_local, read_only_problem, root_check, setting_value)

__all__ = ["broadcast"]

Arrays = TypeVar("Arrays")


def broadcast(arrays: Arrays, root: int = 0, *, comm: Comm = None, check: Optional[bool] = None) -> Arrays:
    """Give every rank ``root``'s values of ``arrays``, in place; return ``arrays``.

    ``arrays``: one contiguous numpy or cupy array of float16/32/64 or int32/64, or a list
    or tuple of them (one check for all), with the same dtypes and shapes in the same order on
    every rank; on ranks other than ``root`` they must be writeable. ``comm`` as ``allreduce``
    takes it. With ``check`` (default on; ``HPCREDUCE_CHECK=0`` turns the default off) a root
    outside the communicator, arrays that differ across ranks in number, dtype or shape, or a
    bad array on any rank raises the same error on every rank before any data moves; off, a
    bad input on one rank can hang the others.
    """
    context = comm if type(comm) is Context else resolve(comm)
    listed = list(arrays) if isinstance(arrays, (list, tuple)) else [arrays]
    labels = array_labels(None, len(listed))
    checking, local = (check, None) if check is not None else setting_value(CHECK, True)
    root_field, wrong_root = root_check(root, context.size)
    local = first_problem(local, wrong_root, *(_array_problem(x, label, context.rank != root)
                                               for x, label in zip(listed, labels)))
    if checking:
        agree(context, "broadcast", [root_field, *layout_fields(listed, labels)], local)
    else:
        raise_local("broadcast", local, context.rank)
    broadcast_arrays(context, listed, root)
    return arrays


def _array_problem(x, label: str, receives: bool) -> Optional[InputProblem]:
    """What is wrong with ``x`` as a broadcast buffer (written into where this rank ``receives``)."""
    return labelled(array_problem(x), label) or (read_only_problem(x, label) if receives else None)


def broadcast_arrays(context, arrays: Iterable[object], root: int = 0) -> None:
    """Give every rank of ``context`` (a ``Context``: its ``comm`` and ``cuda_aware``)
    ``root``'s values of ``arrays`` (the same shapes and dtypes, in the same order, on every
    rank), in place."""
    comm = context.comm
    for array in arrays:
        if transfer_kind(is_device_array(array), context.cuda_aware) == "staged":
            host = to_host(array)
            comm.Bcast(host, root=root)
            copy_into(array, host)
        else:
            synchronize(array)
            comm.Bcast(array, root=root)


def broadcast_tensor(context, tensor: Any, root: int) -> None:
    """``MPI_Bcast`` of one torch tensor's bytes (any dtype) into itself: in its own memory
    when MPI can read it (CPU, or CUDA with a CUDA-aware MPI), else through a host copy."""
    import torch
    direct = tensor.is_contiguous() and (tensor.device.type == "cpu" or context.cuda_aware)
    buffer = tensor.detach() if direct else tensor.detach().contiguous().cpu()
    raw = buffer.reshape(-1).view(torch.uint8)
    if raw.device.type == "cuda":
        import cupy
        torch.cuda.synchronize(raw.device)
        context.comm.Bcast(cupy.from_dlpack(raw), root=root)
    else:
        context.comm.Bcast(raw.numpy(), root=root)
    if not direct:
        with torch.no_grad():
            tensor.copy_(buffer)
