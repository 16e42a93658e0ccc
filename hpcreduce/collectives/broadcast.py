"""Broadcast of whole arrays, host or device, as a state sync needs it.

Each array goes from ``root`` to every rank in place by ``MPI_Bcast``. A device (cupy)
array is handed to MPI itself where MPI is CUDA-aware (after a wait for the stream, so
MPI never reads memory a kernel is still writing), and otherwise staged: copied down to
a host array (``arrays.to_host``), broadcast, and copied back up (``arrays.copy_into``).
The path is the one ``allreduce`` takes (``transfer.transfer_kind``), so a device
array never reaches an MPI that cannot read device memory. A torch tensor (``broadcast_tensor``,
torch imported only then) goes as its bytes, by the same rule.
"""
from __future__ import annotations

from typing import Any, Iterable

from ..arrays import copy_into, is_device_array, synchronize, to_host
from .transfer import transfer_kind


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
