"""What a comm hook sees and calls: torch's ``GradBucket``, and ``all_reduce`` over hpcreduce.

A hook runs where the reducer reduces (its thread, or the end of backward), with the
reducer's own communicator current (``running_on``): ``all_reduce(tensor, group=None)`` and
``get_world_size(group=None)`` use it, as torch's hooks use ``dist.all_reduce(...,
group=process_group)`` (``group`` may also be a Context or an MPI intracommunicator).
``all_reduce`` goes through ``hpcreduce.collectives``: the automatic, node-aware algorithm,
the traffic count, the fault-tolerance path and the cross-rank check (a rank whose call
differs, or whose hook failed, makes every rank raise); 16-bit tensors are summed in float32
and rounded once (``collectives.narrow``; a device tensor through a host copy). It runs at
once and returns a completed Future.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator, List, Optional

import numpy as np
import torch

from ...collectives.allreduce import allreduce
from ...collectives.narrow import Codec, narrow_allreduce
from ...collectives.ops import OPS
from ...collectives.validate import InputProblem, ProblemKind, agree
from ...runtime.context import Comm, Context, resolve
from ..dtypes import FORMAT_DTYPES as FORMATS, NARROW
from ..views import array_view


class TorchCodec(Codec):
    """``narrow``'s conversions as torch's casts (one pass each, on the numpy arrays' memory)."""

    @staticmethod
    def chunk_sum(received, fmt: str, size: int):
        values = torch.from_numpy(received.view(np.int16)).view(FORMATS[fmt])
        return values.view(size, -1).sum(0, dtype=torch.float32).numpy()

    @staticmethod
    def narrowed(values, fmt: str, out) -> None:
        torch.from_numpy(out.view(np.int16)).view(FORMATS[fmt]).copy_(torch.from_numpy(values))


TORCH_CODEC = TorchCodec()
REPORT_FIELDS = [("comm hook", 0, "")] * 6
"""A rank's report of a failure where its peers run ``allreduce``: as many fields as that
call's check, so it meets one (every rank then raises it)."""
_current = threading.local()


class GradBucket:
    """One bucket as torch's ``dist.GradBucket`` shows it: a flat buffer of this rank's
    gradients (summed locally, not yet divided by the number of ranks) and its parameters."""

    def __init__(self, index: int, buffer: torch.Tensor, gradients: List[torch.Tensor],
                 parameters: List[torch.nn.Parameter], last: bool):
        self._index, self._buffer, self._gradients = index, buffer, gradients
        self._parameters, self._last = parameters, last

    def index(self) -> int:
        """The bucket's number (0 first, the last layers)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat gradient buffer (1-D; the hook may work in it)."""
        return self._buffer

    def gradients(self) -> List[torch.Tensor]:
        """Each parameter's gradient, a view of ``buffer()``."""
        return self._gradients

    def parameters(self) -> List[torch.nn.Parameter]:
        """The bucket's parameters, in buffer order."""
        return self._parameters

    def is_last(self) -> bool:
        """Whether this is the step's last bucket."""
        return self._last

    def set_buffer(self, tensor: torch.Tensor) -> None:
        """Replace the buffer's values by ``tensor``'s."""
        self._buffer.copy_(tensor)


@contextmanager
def running_on(context: Context) -> Iterator[None]:
    """Make ``context`` the one hooks' ``group=None`` means, for this thread."""
    before, _current.context = getattr(_current, "context", None), context
    try:
        yield
    finally:
        _current.context = before


def group_context(group: Comm) -> Context:
    """The context of ``group``: the running reducer's for None (else the default one)."""
    if group is None:
        found: Optional[Context] = getattr(_current, "context", None)
        return found if found is not None else resolve(None)
    return resolve(group)


def get_world_size(group: Comm = None) -> int:
    """The number of ranks of ``group`` (torch.distributed's name)."""
    return group_context(group).size


def all_reduce(tensor: torch.Tensor, op: str = "sum", group: Comm = None) -> "torch.futures.Future[torch.Tensor]":
    """Reduce ``tensor`` over ``group``'s ranks in place (``op``: sum, mean, min, max, prod);
    a completed Future of it. Collective, checked across ranks."""
    context = group_context(group)
    if tensor.dtype in NARROW and op in ("sum", "mean"):
        problem = None if tensor.is_contiguous() else InputProblem(ProblemKind.NOT_CONTIGUOUS, "a 16-bit tensor")
        host = tensor.detach() if tensor.device.type == "cpu" else tensor.detach().cpu()  # device: staged
        bits = host.view(torch.int16) if problem is None else torch.zeros(tensor.numel(), dtype=torch.int16)
        narrow_allreduce(context, bits.numpy().view(np.uint16).reshape(-1), NARROW[tensor.dtype], OPS[op],
                         local=problem, codec=TORCH_CODEC)
        if tensor.device.type != "cpu" and problem is None:
            tensor.copy_(host)
    else:
        view, reason = array_view(tensor)
        if reason is not None:  # agreed: the peers' allreduce meets this report, none waits
            agree(context, "all_reduce", REPORT_FIELDS, InputProblem(ProblemKind.UNUSABLE_ARRAY,
                                                                     f"all_reduce: {reason}"))
        allreduce(view, op, comm=context, out=view)
    future: "torch.futures.Future[torch.Tensor]" = torch.futures.Future()
    future.set_result(tensor)
    return future


def hook_result(future: object, flat: torch.Tensor) -> torch.Tensor:
    """The reduced tensor a hook's Future holds, or a ValueError saying how it does not fit."""
    if not isinstance(future, torch.futures.Future):
        raise ValueError(f"returned a {type(future).__name__}, not a torch.futures.Future")
    value = future.wait()
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"returned a Future of a {type(value).__name__}, not of a tensor")
    if value.numel() != flat.numel() or value.dtype != flat.dtype or value.device != flat.device:
        raise ValueError(f"returned a Future of a {value.dtype} tensor of {value.numel()} values on {value.device}; "
                         f"the bucket is {flat.dtype}, {flat.numel()} values on {flat.device}")
    return value.reshape(-1)
