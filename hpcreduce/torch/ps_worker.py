"""A torch module trained through parameter servers: ``start_parameter_server`` and its worker side."""
from __future__ import annotations

from typing import Optional

import torch

from ..collectives.validate import InputProblem, ProblemKind, agree, stable_hash
from ..runtime.context import resolve
from .views import DTYPES, named

class TorchPSWorker:
    """A torch module's parameters through a parameter-server worker (``hpcreduce.ps.Worker``):
    ``pull`` reads them from the servers into the module, ``push`` sends its gradients."""

    def __init__(self, module: torch.nn.Module, worker):
        self.module, self.worker = module, worker
        self.params = named(module)

    def pull(self) -> None:
        """Every parameter from the servers, into the module's tensors (CPU: no copy)."""
        handles = []
        for name, param in self.params:
            direct = param.device.type == "cpu" and param.is_contiguous()
            out = param.detach().numpy() if direct else None
            handles.append((param, self.worker.pull_async(name, out=out), direct))
        for param, handle, direct in handles:
            values = handle.wait()
            if not direct:
                with torch.no_grad():
                    param.copy_(torch.from_numpy(values))

    def push(self, scale: Optional[float] = None) -> list:
        """Every parameter's gradient times ``scale`` (default 1/workers, so that under BSP
        the servers' sum is the workers' mean gradient) to the servers; returns their
        ``PushResult``s. A missing gradient is pushed as zeros."""
        scale = 1.0 / self.worker.layout.worker_count if scale is None else scale
        handles = []
        for name, param in self.params:
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            values = (grad.detach() * scale).cpu().numpy()
            handles.append(self.worker.push_async(name, values))
        return [handle.wait() for handle in handles]

    def clock(self) -> int:
        return self.worker.clock()

    def release(self) -> None:
        self.worker.release()


def start_parameter_server(module: torch.nn.Module, *, servers: int = 1, consistency: str = "bsp",
                           staleness: int = 0, optimizer: str = "sgd", lr: float = 0.01, comm=None):
    """Start a PS job for ``module`` (collective): ranks 0..servers-1 get a ``Server``
    (call ``serve()``) holding shards initialised from their own copy of the module (build
    it identically everywhere, or ``broadcast_parameters`` first); the others get a
    ``TorchPSWorker``. Only dense float parameters (PS tables)."""
    from ..ps import Consistency, ParamSpec, Server, start
    context = resolve(comm)
    params = named(module)
    unusable = [f"{name} has dtype {param.dtype}" for name, param in params
                if param.dtype not in DTYPES or not param.is_floating_point()]
    layout = [(name, tuple(param.shape), str(param.dtype)) for name, param in params]
    agree(context, "start_parameter_server", [("parameters", stable_hash(layout), lambda: layout)],
          InputProblem(ProblemKind.UNUSABLE_ARRAY,
                       "; ".join(unusable) + " (parameter-server tables are float16, float32 or float64)")
          if unusable else None)
    specs = [ParamSpec(name, tuple(param.shape), DTYPES[param.dtype]) for name, param in params]
    role = start(specs, lambda: {name: param.detach().cpu().numpy() for name, param in params},
                 servers=servers, consistency=Consistency(consistency, staleness), optimizer=optimizer, lr=lr,
                 comm=context)
    return role if isinstance(role, Server) else TorchPSWorker(module, role)
