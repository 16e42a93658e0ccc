"""hpcreduce: data-parallel training over MPI ranks, by ring AllReduce or parameter server.

    import hpcreduce
    ctx = hpcreduce.init()                      # private duplicate of MPI.COMM_WORLD
    total = hpcreduce.allreduce(grad, "sum")    # ring / recursive doubling / native, by size
    grads = hpcreduce.allreduce_many(grads, "mean")   # tensor fusion
"""
from .collectives import allreduce, allreduce_many
from .errors import (FaultToleranceUnavailableError, HpcreduceError, InputMismatchError,
                     LaunchError, UnsupportedInputError)
from .runtime.context import Context, init

__version__ = "0.1.0"

__all__ = [
    "init", "Context", "allreduce", "allreduce_many",
    "HpcreduceError", "InputMismatchError", "UnsupportedInputError",
    "FaultToleranceUnavailableError", "LaunchError", "__version__",
]
