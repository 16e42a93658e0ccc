"""Which GPU this rank uses: its rank on the node, modulo the GPUs it can see.

CUDA-aware MPI and NCCL expect each rank to work on its own device (ranks on one node
otherwise all land on GPU 0). ``select_device()`` makes GPU ``local_rank % count`` cupy's
current device; call it once, right after start-up, before any cupy allocation. Where
the scheduler already gives each rank one GPU (``CUDA_VISIBLE_DEVICES`` per task, e.g.
Slurm's ``--gpus-per-task=1``), the rank sees one device and picks it.
``open_device(kind, comm)`` is what a run calls first: on ``gpu`` every rank checks it
has cupy and a GPU, they agree (one small allgather), and each selects its device; a
rank without one makes every rank raise ``GpuUnavailableError`` naming what is missing.
"""
from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Sequence

from ..arrays import Device, visible_gpus
from ..errors import GpuUnavailableError, SettingProblem, setting_problem

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


def gpu_problem(comm=None) -> Optional[SettingProblem]:
    """Why ``--device gpu`` cannot run here: every rank's own check (``local_gpu_problem``),
    agreed over ``comm`` (one allgather: the same answer on every rank, naming the first rank
    without a GPU and what it lacks); with ``comm`` None this process's alone."""
    mine = local_gpu_problem()
    return gpu_verdict([mine] if comm is None else comm.allgather(mine), agreed=comm is not None)


def local_gpu_problem() -> Optional[str]:
    """What this process lacks for GPU work (cupy, a visible GPU), or None."""
    try:
        visible_gpus()
    except GpuUnavailableError as err:
        return str(err)
    return None


def gpu_verdict(found: Sequence[Optional[str]], agreed: bool) -> Optional[SettingProblem]:
    """The problem of the ranks' ``local_gpu_problem`` answers (by rank), or None; ``agreed``:
    they were gathered from every rank (else ``found`` is this process's alone)."""
    missing = [(rank, problem) for rank, problem in enumerate(found) if problem is not None]
    if not missing:
        return None
    rank, problem = missing[0]
    where = f"{len(missing)} of {len(found)} rank(s) have none (rank {rank}" if agreed else "this process"
    return setting_problem("{device} gpu needs cupy and a GPU on every rank; %s: {problem}%s; see docs/gpu.md"
                           % (where, ")" if agreed else ""), problem=problem)


def open_device(kind: str, comm=None) -> Device:
    """The ``Device`` a run computes on. ``gpu``: ``gpu_problem(comm)`` (collective over
    ``comm``; None for a process checking alone, such as a rank that joins a running job)
    raises ``GpuUnavailableError`` on every rank, else this rank's GPU is selected
    (``select_device``). ``cpu``: nothing to check, no communication."""
    if kind == "gpu":
        problem = gpu_problem(comm)
        if problem is not None:
            raise GpuUnavailableError(problem)
        select_device()
    return Device(kind)


def gpu_summary() -> Dict[str, object]:
    """What this process sees of GPUs, for ``hpcreduce info``: ``gpus`` (count), ``names``,
    ``cupy`` (version), ``cuda_driver`` ("major.minor"), or ``problem`` (what is missing)."""
    try:
        count = visible_gpus()
    except GpuUnavailableError as err:
        return {"gpus": 0, "problem": str(err)}
    import cupy
    names = []
    for index in range(count):
        name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    driver = cupy.cuda.runtime.driverGetVersion()
    return {"gpus": count, "names": names, "cupy": cupy.__version__,
            "cuda_driver": f"{driver // 1000}.{driver % 1000 // 10}", "problem": None}
