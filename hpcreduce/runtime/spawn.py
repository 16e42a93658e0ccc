"""Spawn new ranks into a running job and merge them in after the current ones; let ranks leave it.

Parents call ``spawn_and_merge`` collectively; each child's ``hpcreduce.init()`` sees
its parent and calls ``merge_with_parent``. The intercommunicator is disconnected on
both sides at once (one left connected crashes Open MPI 5.0's MPI_Finalize), and no
``Dup`` is taken. Newcomers rank after every current rank, so the ranks a job gave roles
(PS servers first) keep their numbers.
Cost: one MPI_Comm_spawn (process start-up, ~0.2 s here) and one merge.
``split_off`` is the way out: ranks that leave get no new communicator and end their
process (``leave_job``) while the others go on over the split.
"""
from __future__ import annotations

import os
import re
import sys
from typing import NoReturn, Optional, Sequence, Tuple

from mpi4py import MPI

from ..errors import LaunchError
from .failures import is_process_failure, release
from .hosts import hostfile_slots
from .settings import Setting


def info_items(text: str) -> Tuple[Tuple[str, str], ...]:
    """``key=value;key=value`` as (key, value) pairs; ValueError naming an item without a key
    or a value (MPI refuses it only at the first spawn, after training began)."""
    items = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, _, value = (part.strip() for part in item.partition("="))
        if not key or not value:
            raise ValueError(f"{item!r} needs a key and a value, as key=value")
        items.append((key, value))
    return tuple(items)


SPAWN_INFO = Setting("HPCREDUCE_SPAWN_INFO", info_items, info_items("map_by=slot:oversubscribe"),
                     "spawn info as key=value;key=value")


def spawn_slots(hostfile: Optional[str]) -> Optional[int]:
    """The most ranks spawning may take a job to: ``hostfile``'s slots (spawned ranks need free
    slots there) unless ``HPCREDUCE_SPAWN_INFO`` is set to allow ``oversubscribe``; None (no bound)
    without a hostfile (the default spawn info oversubscribes), or for one that declares no slots
    or cannot be read."""
    if not hostfile or (SPAWN_INFO.is_set() and SPAWN_INFO.problem() is None
                        and any("oversubscribe" in value for _, value in SPAWN_INFO.value())):
        return None
    try:
        return hostfile_slots(hostfile)
    except LaunchError:
        return None


PER_CPU = 4
"""Ranks a CPU of this node may take when nothing else bounds growth (the default spawn
oversubscribes this node only)."""


def slurm_ranks() -> Optional[int]:
    """The ranks Slurm allocated this job: ``SLURM_NTASKS``, else the CPUs of
    ``SLURM_JOB_CPUS_PER_NODE`` (``4(x2),2``: 10); None outside a Slurm job or when unreadable."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    tasks = os.environ.get("SLURM_NTASKS", "")
    if tasks.isdecimal() and int(tasks) > 0:
        return int(tasks)
    total = 0
    for part in filter(None, os.environ.get("SLURM_JOB_CPUS_PER_NODE", "").split(",")):
        match = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", part)
        if not match:
            return None
        total += int(match[1]) * int(match[2] or 1)
    return total or None


def growth_limit(max_ranks: Optional[int], hostfile: Optional[str]) -> Tuple[int, str]:
    """The most ranks a job may grow to, and what says so (as words): the smallest of
    ``max_ranks`` (``--max-ranks``), ``hostfile``'s slots (``spawn_slots``) and Slurm's
    allocation (``slurm_ranks``); with none of them, ``PER_CPU`` ranks a CPU of this node."""
    found = [(limit, why) for limit, why in (
        (max_ranks, "--max-ranks"), (spawn_slots(hostfile), "the slots of the job's hosts"),
        (slurm_ranks(), "Slurm's allocation of the job")) if limit]
    cpus = os.cpu_count() or 1
    return min(found) if found else (PER_CPU * cpus, f"{PER_CPU} ranks for each of this node's {cpus} CPUs "
                                                     "(--max-ranks or a hostfile sets another bound)")


def spawn_info() -> MPI.Info:
    """``MPI_Info`` for the spawn, from ``HPCREDUCE_SPAWN_INFO`` ("key=value;key=value").

    The default lets a node take more ranks than cores (a single-node job); on a
    cluster name the hosts instead, e.g. ``host=node7`` or ``hostfile=/path``.
    """
    info = MPI.Info.Create()
    for key, value in SPAWN_INFO.value():
        info.Set(key, value)
    return info


def spawn_and_merge(comm: MPI.Intracomm, count: int, command: Sequence[str]) -> MPI.Intracomm:
    """Start ``count`` processes running ``command``; return the merged communicator
    (current ranks first, newcomers after, errors returned).

    The newcomers form one spawned job. Open MPI 5.0.11 ends the whole spawned job when
    one of its processes dies, so its siblings are then lost too (and recovered from
    like any failure), and mpirun's exit code reports that job's failure even when the
    run recovered. Spawning them one by one avoided the first but hung MPI_Finalize's
    disconnect under load, which is worse.
    """
    info = spawn_info()
    try:
        inter = comm.Spawn(command[0], list(command[1:]), maxprocs=count, info=info, root=0)
    except MPI.Exception as err:  # every rank of ``comm`` gets the spawn's error
        if is_process_failure(err, comm):  # a parent died meanwhile: the caller's to recover from
            raise
        now = ";".join("=".join(item) for item in SPAWN_INFO.value())
        raise LaunchError(f"cannot start {count} more rank(s): MPI_Comm_spawn failed ({err.Get_error_string()}); "
                          f"most often the hosts have no free slot left: give more slots (--hostfile) "
                          f"or hosts ({SPAWN_INFO.name}, now {now!r})") from None
    finally:
        info.Free()
    merged = inter.Merge(high=False)
    inter.Disconnect()
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    return merged


def merge_with_parent() -> Optional[MPI.Intracomm]:
    """In a spawned process: the communicator shared with the job that spawned it, else None."""
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        return None
    merged = parent.Merge(high=True)
    parent.Disconnect()
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    return merged


def split_off(comm: MPI.Intracomm, leaving: bool) -> Optional[MPI.Intracomm]:
    """Collective over ``comm``: the communicator of the ranks that stay (in their order,
    errors returned), or None on a rank that is ``leaving``."""
    staying = comm.Split(MPI.UNDEFINED if leaving else 0, comm.Get_rank())
    if staying == MPI.COMM_NULL:
        return None
    staying.Set_errhandler(MPI.ERRORS_RETURN)
    return staying


def leave_job(comm: MPI.Intracomm, finalize: bool = False) -> NoReturn:
    """End this process with exit status 0 once it has left the job (``split_off``): output
    flushed, ``comm`` freed. Without ``finalize`` it is gone at once: no communicator of the
    survivors holds it, so none of them sees its end (Open MPI 5.0.11's MPI_Finalize would
    wait for the whole job to end). ``finalize``: call MPI_Finalize first, for a spawned
    process (PRRTE ends a whole spawned job when one of its processes ends without it, and
    mpirun then fails); it then stays, idle, until the job ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    release(comm)
    if finalize:
        MPI.Finalize()
    os._exit(0)
