"""torch.distributed code (torch's own ``DistributedDataParallel``) under ``hpcreduce.elastic``.

    import torch.distributed as dist, hpcreduce, hpcreduce.torch
    from hpcreduce import elastic
    from hpcreduce.torch.c10d.elastic import run

    hpcreduce.init(ft=True)
    dist.init_process_group("hpcreduce")
    state = elastic.State(model=model, optimizer=opt, step=0)

    @run
    def train(state):
        ddp = torch.nn.parallel.DistributedDataParallel(model)  # on the group of this attempt
        while state.step < steps:
            ...                                                  # forward, backward, opt.step()
            state.step += 1
            state.commit()

``run`` is ``elastic.run`` with two additions. A lost rank's error from the process group (the
backend's ``LostRankError``, however torch passed it on: DDP's reducer rethrows it from C++ as a
``RuntimeError`` carrying its name) is the MPI process failure ``elastic.run`` recovers from: the
survivors shrink, restore their last commit and take rank 0's. Then, before ``train`` is called
again, the default process group is destroyed and made again over the survivors (the backend takes
the shrunk communicator of hpcreduce's context), so ``train`` wraps the model anew at its start.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Optional, TypeVar

import torch.distributed as dist
from mpi4py import MPI

from ... import elastic
from ...runtime.failures import is_process_failure
from .work import LostRankError

T = TypeVar("T")
_rebuilding: "weakref.WeakSet[elastic.State]" = weakref.WeakSet()


def run(func: Optional[Callable[..., T]] = None, *, backend: str = "hpcreduce",
        on_stop: Optional[Callable[[elastic.State], Optional[str]]] = None) -> Any:
    """``elastic.run`` for a loop over torch.distributed on ``backend``: lost ranks' errors from
    torch recovered from, the default process group rebuilt over the ranks after every change."""
    if func is None:
        return functools.partial(run, backend=backend, on_stop=on_stop)

    @functools.wraps(func)
    def translated(state: elastic.State, *args: Any, **kwargs: Any) -> T:
        try:
            return func(state, *args, **kwargs)
        except Exception as error:
            failure = process_failure(error)
            if failure is None:
                raise
            raise failure from error

    looped = elastic.run(translated, on_stop=on_stop)

    @functools.wraps(func)
    def wrapper(state: elastic.State, *args: Any, **kwargs: Any) -> T:
        if state not in _rebuilding:
            _rebuilding.add(state)
            state.register_reset_callbacks([lambda: rebuild(backend)])
        return looped(state, *args, **kwargs)
    return wrapper


def process_failure(error: BaseException) -> Optional[MPI.Exception]:
    """The MPI process failure behind ``error`` (an MPI error or the backend's ``LostRankError``
    in its chain, or that name in its text where torch's C++ rethrew it), else None."""
    seen = error
    while seen is not None:
        if isinstance(seen, MPI.Exception) and is_process_failure(seen):
            return seen
        if isinstance(seen, LostRankError) or LostRankError.__name__ in str(seen):
            return MPI.Exception(MPI.ERR_PROC_FAILED)
        seen = seen.__cause__ or seen.__context__
    return None


def rebuild(backend: str) -> None:
    """The default process group made again over hpcreduce's context (after it changed)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(backend)
