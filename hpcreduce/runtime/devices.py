"""Which GPU this rank uses: its rank on the node, modulo the GPUs it can see.

CUDA-aware MPI and NCCL expect each rank to work on its own device (ranks on one node
otherwise all land on GPU 0). ``select_device()`` makes GPU ``local_rank % count`` cupy's
current device; call it once, right after start-up, before any cupy allocation. Where
the scheduler already gives each rank one GPU (``CUDA_VISIBLE_DEVICES`` per task, e.g.
Slurm's ``--gpus-per-task=1``), the rank sees one device and picks it.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from ..arrays import visible_gpus

# Set by the launchers for each rank: Open MPI, MPICH/Intel MPI (Hydra), Slurm's srun,
# MVAPICH, Cray PALS. The first one present wins.
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                        "MV2_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID")


def node_local_rank(env: Optional[Mapping[str, str]] = None, comm=None) -> int:
    """This process's rank among the ranks on its node.

    Read from the launcher's variables (no MPI call); without them, from ``comm``
    (default ``MPI.COMM_WORLD``) split by shared memory; 0 for a process on its own.
    """
    env = os.environ if env is None else env
    for name in LOCAL_RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    from mpi4py import MPI
    if not MPI.Is_initialized():
        return 0
    node = (MPI.COMM_WORLD if comm is None else comm).Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def select_device(local_rank: Optional[int] = None) -> int:
    """Make GPU ``local_rank % (visible GPUs)`` cupy's current device; return its index.

    ``local_rank`` defaults to ``node_local_rank()``. Raises ``GpuUnavailableError``
    when cupy does not import or sees no GPU.
    """
    count = visible_gpus()
    index = (node_local_rank() if local_rank is None else local_rank) % count
    import cupy
    cupy.cuda.Device(index).use()
    return index
