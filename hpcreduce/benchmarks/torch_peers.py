"""The models and the per-step candidates of ``hpcreduce bench torch``, each on its own copy of the model.

A candidate is one training step (zero_grad, forward, backward, the gradient mean, SGD step)
on the same batch every call: ``compute`` (no communication), ``torch_ddp`` (torch's
DistributedDataParallel over gloo, the peer), ``hpcreduce_ddp`` (the wrapper as it comes: its
reductions on a thread where the rank has a spare core, else at the end of backward),
``hpcreduce_ddp_thread`` (always on the reduction thread, overlapping backward),
``hpcreduce_ddp_no_check`` (no NaN/Inf check), ``hpcreduce_ddp_bf16`` (16-bit wire),
``hpcreduce_ddp_powersgd`` (``powerSGD_hook`` at rank 4, compressing from the second step),
``hpcreduce_ddp_adam`` and ``hpcreduce_zero_adam`` (Adam, unsharded and as a
``ZeroRedundancyOptimizer``), ``allreduce_gradients`` (after backward; ``_no_check`` without its NaN/Inf check),
``mpi4py_loop`` (one ``MPI_Allreduce`` per gradient, in place, after backward: the plain loop)
and ``mpi4py_flat_loop`` (the gradients flattened into one tensor, one ``MPI_Allreduce``,
copied back: the loop many users write, and the one issue 35 names).
"""
from __future__ import annotations

import socket
from typing import Callable, Dict, Tuple

import torch
from mpi4py import MPI

from .. import torch as hpt
from ..torch import hooks
from ..runtime.nodes import rank_nodes

Step = Callable[[], None]


def mlp() -> torch.nn.Module:
    """Six 512-wide linear layers (6.3 MB of float32 gradients)."""
    layers = []
    for index in range(6):
        layers += [torch.nn.Linear(512, 512)] + ([torch.nn.ReLU()] if index < 5 else [])
    return torch.nn.Sequential(*layers)


def cnn() -> torch.nn.Module:
    """Four 3x3 convolutions and two linear layers on 32x32 images (backward longer than its reduction)."""
    def conv(inputs: int, outputs: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(inputs, outputs, 3, padding=1), torch.nn.ReLU())
    return torch.nn.Sequential(conv(3, 16), conv(16, 32), torch.nn.MaxPool2d(2), conv(32, 64), torch.nn.MaxPool2d(2),
                               conv(64, 64), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                               torch.nn.Linear(64 * 4 * 4, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))

MODELS = {"mlp": (mlp, lambda g, batch: torch.randn(batch, 512, generator=g), 512),
          "cnn": (cnn, lambda g, batch: torch.randn(batch, 3, 32, 32, generator=g), 10)}


def batch_of(model: str, batch: int, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """This rank's fixed batch for ``model``."""
    _, inputs, classes = MODELS[model]
    g = torch.Generator().manual_seed(rank + 1)
    return inputs(g, batch), torch.randint(0, classes, (batch,), generator=g)


def start_gloo(comm: MPI.Intracomm) -> None:
    """torch.distributed over gloo on the same ranks (rank 0's address and a free port, sent by MPI)."""
    if torch.distributed.is_initialized():
        return
    address = None
    one_node = len(set(rank_nodes(comm))) == 1
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        address = ("127.0.0.1" if one_node else socket.gethostbyname(socket.gethostname()), port)
    host, port = comm.bcast(address, root=0)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=comm.Get_rank(),
                                         world_size=comm.Get_size())


def candidates(model: str, comm: MPI.Intracomm, batch: int, initial: Dict[str, torch.Tensor],
               cap_mb: float) -> Tuple[Dict[str, Step], Dict[str, torch.nn.Module], Dict[str, object]]:
    """Every candidate's step, the module each trains (all start from ``initial``) and each
    wrapper and sharded optimizer by candidate (``wire_bytes()``, ``state_bytes()`` after steps)."""
    x, y = batch_of(model, batch, comm.Get_rank())
    size = comm.Get_size()
    steps: Dict[str, Step] = {}
    modules: Dict[str, torch.nn.Module] = {}
    kept: Dict[str, object] = {}

    def fresh() -> torch.nn.Module:
        module = MODELS[model][0]()
        module.load_state_dict(initial)
        return module

    def add(name: str, wrapped: torch.nn.Module, params: torch.nn.Module, after: Callable[[], None] = lambda: None,
            make: Callable[[torch.nn.Module], torch.optim.Optimizer] = lambda m: torch.optim.SGD(m.parameters(),
                                                                                                 lr=0.01)):
        optimizer = make(params)
        kept[f"{name}.optimizer"] = optimizer

        def step() -> None:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(wrapped(x), y).backward()
            after()
            optimizer.step()
        steps[name], modules[name] = step, params

    add("compute", plain := fresh(), plain)
    module = fresh()
    add("torch_ddp", torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=cap_mb), module)
    for name, options in (("hpcreduce_ddp", {}), ("hpcreduce_ddp_thread", {"overlap": True}),
                          ("hpcreduce_ddp_no_check", {"check_finite": False}),
                          ("hpcreduce_ddp_bf16", {"compression": "bf16"}), ("hpcreduce_ddp_powersgd", {})):
        module = fresh()
        wrapped = hpt.DistributedDataParallel(module, bucket_cap_mb=cap_mb, **options)
        if name == "hpcreduce_ddp_powersgd":
            wrapped.register_comm_hook(hooks.PowerSGDState(None, matrix_approximation_rank=4, start_powerSGD_iter=1),
                                       hooks.powerSGD_hook)
        add(name, wrapped, module)
        kept[name] = wrapped
    for name, make in (("hpcreduce_ddp_adam", lambda m: torch.optim.Adam(m.parameters(), lr=1e-4)),
                       ("hpcreduce_zero_adam", lambda m: hpt.ZeroRedundancyOptimizer(m.parameters(), torch.optim.Adam,
                                                                                     lr=1e-4))):
        module = fresh()
        add(name, hpt.DistributedDataParallel(module, bucket_cap_mb=cap_mb), module, make=make)
    module = fresh()
    add("allreduce_gradients", module, module, lambda m=module: hpt.allreduce_gradients(m))
    module = fresh()
    add("allreduce_gradients_no_check", module, module,
        lambda m=module: hpt.allreduce_gradients(m, check_finite=False))
    module = fresh()

    def loop(m: torch.nn.Module = module) -> None:
        for param in m.parameters():
            comm.Allreduce(MPI.IN_PLACE, param.grad.numpy(), op=MPI.SUM)
            param.grad.div_(size)
    add("mpi4py_loop", module, module, loop)
    module = fresh()

    def flat_loop(m: torch.nn.Module = module) -> None:
        grads = [param.grad for param in m.parameters()]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
        flat.div_(size)
        start = 0
        for grad in grads:
            grad.copy_(flat[start:start + grad.numel()].view_as(grad))
            start += grad.numel()
    add("mpi4py_flat_loop", module, module, flat_loop)
    return steps, modules, kept
