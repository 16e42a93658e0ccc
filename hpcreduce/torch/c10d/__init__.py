"""hpcreduce as a ``torch.distributed`` backend: ``dist.init_process_group("hpcreduce")``.

Importing ``hpcreduce.torch`` registers the backend (``register``). Under ``mpirun``, ``srun`` or
``hpcreduce launch`` nothing else is needed: rank and world size come from MPI (a RANK/WORLD_SIZE
that is given must agree), and torch's store (a ``TCPStore`` that rank 0 serves, its address
broadcast over MPI) is made for it (``rendezvous``), so gloo groups beside it work too.

The public surface (stable):
- ``NAME`` = ``"hpcreduce"``, the registered backend name.
- ``ProcessGroupHpcreduce`` (``process_group``): the group c10d hands out (``dist.group.WORLD``,
  ``new_group``, DeviceMesh's). ``pg.context`` is its ``runtime.context.Context`` (its own MPI
  communicator); ``ProcessGroupHpcreduce.over(comm, name)`` makes a group over a given communicator
  (the survivors' after a failure); ``pg.replace_comm(comm)`` swaps a group's communicator for another
  of the same size, queued operations finished first; ``pg.progress`` runs its operations in order.
- ``Work`` (``work``): ``wait()``, ``is_completed()``, ``exception()``, ``get_future()``.
- ``LostRankError`` (``work``): what a group's pending and later operations raise once a rank died
  (under ``--with-ft ulfm``), naming the lost rank.
What it does not do: CUDA tensors (refused by name; the collectives' cupy path is not wired here yet);
``dist.monitored_barrier`` (torch refuses every backend but gloo before calling it: call
``group.monitored_barrier(timeout)`` on the group, or use a gloo group beside it).
Modules: ``tensors`` (tensor views, c10d ops to the collectives' ops), ``operations`` (each c10d
operation: checked across ranks, then moved), ``work`` (Work, ordered progress, failures),
``process_group`` (the group and its creator), ``rendezvous``. ``elastic`` (recovery) is built on these.
"""
from __future__ import annotations

import torch.distributed as dist

from .process_group import NAME, ProcessGroupHpcreduce, create
from .rendezvous import install
from .work import LostRankError, Work

__all__ = ["NAME", "LostRankError", "ProcessGroupHpcreduce", "Work", "register"]


def register() -> None:
    """Register the backend ``"hpcreduce"`` (CPU tensors) and the MPI rendezvous; idempotent."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu"])
    install()


register()
