"""hpcreduce: data-parallel training over MPI ranks, by ring AllReduce or parameter server.

    import hpcreduce
    ctx = hpcreduce.init()                      # private duplicate of MPI.COMM_WORLD
    total = hpcreduce.allreduce(grad, "sum")    # ring / recursive doubling / native, by size
    grads = hpcreduce.allreduce_many(grads, "mean")   # tensor fusion
    hpcreduce.broadcast([w, b], root=0)         # rank 0's values everywhere, in place

Every error hpcreduce raises on purpose (``hpcreduce.errors``) is exported here too:
``except hpcreduce.TrainingError``. Importing the package does not start MPI: the names
below load on first use, so the ``hpcreduce`` command can relaunch itself under mpirun
before MPI is initialised. In a rank of a launcher other than ``hpcreduce launch`` (whose
mpirun line carries them), it sets what this environment's own Open MPI (PyPI's) needs before
MPI starts (``OMPI_MCA_osc``, ``OMPI_MCA_btl``: ``runtime.environment.bundled_mpi_defaults``):
import hpcreduce before ``mpi4py.MPI``. Any other process's environment is left as it is.
"""
import sys
from importlib import import_module
from typing import Any, Callable, Mapping

from .runtime.environment import bundled_mpi_defaults

bundled_mpi_defaults()  # the one place: every hpcreduce module that starts MPI is imported after this

__version__ = "0.1.0"

_EXPORTS = {
    "init": "hpcreduce.runtime.context",
    "Context": "hpcreduce.runtime.context",
    "allreduce": "hpcreduce.collectives.allreduce",
    "allreduce_many": "hpcreduce.collectives.fusion",
    "broadcast": "hpcreduce.collectives.broadcast",
    "select_device": "hpcreduce.runtime.devices",
    **{name: "hpcreduce.errors" for name in (  # every error hpcreduce raises on purpose
        "HpcreduceError", "InputMismatchError", "UnsupportedInputError", "ConfigurationError",
        "CheckpointMismatchError", "FaultToleranceUnavailableError", "LaunchError",
        "DeadlineExceededError", "ProcessLostError", "GpuUnavailableError", "ModelError", "TrainingError",
        "OutputFileError", "InputFileError", "PSConfigError", "PSInputError", "PSRefusedError", "PSTrainingError",
        "PlottingUnavailableError", "UnknownResultError")},
}

__all__ = [*_EXPORTS, "__version__"]


def _lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` (PEP 562) of ``package``, whose name ``name`` loads on first
    use from module ``names[name]`` and is then kept on the package (``hpcreduce.train`` too)."""
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(names[name]), name)
        setattr(sys.modules[package], name, value)
        return value
    return __getattr__


__getattr__ = _lazy_exports(__name__, _EXPORTS)
