"""What ``hpcreduce bench c10d`` and the c10d tests share: the default process group started
over a named backend under mpirun, a gloo group beside it on the same ranks, and the training
steps of torch's own DDP and FSDP2 (``fully_shard``) on ``torch_peers``' models, unchanged but
for the group they run on.
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from mpi4py import MPI

from .torch_peers import MODELS, batch_of, start_gloo

Step = Callable[[], None]


def start(backend: str, comm: MPI.Intracomm = MPI.COMM_WORLD) -> Optional[dist.ProcessGroup]:
    """The default process group over ``backend`` ("hpcreduce": nothing but its name, rank and
    size from MPI; "gloo": rank 0's address sent by MPI) and, unless it is gloo already, a gloo
    group of every rank beside it (returned; None: the default group is gloo's)."""
    if backend == "gloo":
        start_gloo(comm)
        return None
    from .. import torch as _registers  # noqa: F401  (``import hpcreduce.torch`` registers "hpcreduce")
    dist.init_process_group(backend)
    return dist.new_group(backend="gloo")


def fresh(model: str, initial: Dict[str, torch.Tensor], device: str = "cpu") -> torch.nn.Module:
    """A new ``model`` holding ``initial``, on ``device``."""
    module = MODELS[model][0]()
    module.load_state_dict(initial)
    return module.to(device)


def batch_on(model: str, batch_size: int, device: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """This rank's fixed batch (``torch_peers.batch_of``) on ``device``."""
    return tuple(part.to(device) for part in batch_of(model, batch_size, dist.get_rank()))


def shard(module: torch.nn.Module, **options) -> torch.nn.Module:
    """FSDP2 as its docs apply it: each layer with parameters, then the root."""
    from torch.distributed.fsdp import fully_shard
    for layer in module:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, **options)
    return fully_shard(module, **options)


def training_step(wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  batch: Tuple[torch.Tensor, torch.Tensor]) -> Step:
    """One step of ``wrapped`` on ``batch``: zero_grad, cross-entropy, backward, step; the step's
    ``last_loss()`` is its last loss."""
    x, y = batch
    last = [float("nan")]

    def step() -> None:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(wrapped(x), y)
        loss.backward()
        optimizer.step()
        last[0] = float(loss.detach())
    step.last_loss = lambda: last[0]
    return step


def ddp_step(model: str, initial: Dict[str, torch.Tensor], batch_size: int,
             group: Optional[dist.ProcessGroup] = None, device: str = "cpu") -> Tuple[Step, torch.nn.Module]:
    """torch's DistributedDataParallel on ``group`` (None: the default group): its step and module."""
    module = fresh(model, initial, device)
    wrapped = torch.nn.parallel.DistributedDataParallel(module, process_group=group)
    return training_step(wrapped, torch.optim.SGD(module.parameters(), lr=0.05),
                         batch_on(model, batch_size, device)), module


def fsdp_step(model: str, initial: Dict[str, torch.Tensor], batch_size: int, mesh=None,
              device: str = "cpu") -> Tuple[Step, torch.nn.Module]:
    """FSDP2 over ``mesh`` (None: the default group's 1-D mesh): its step and module."""
    module = shard(fresh(model, initial, device), **({} if mesh is None else {"mesh": mesh}))
    return training_step(module, torch.optim.SGD(module.parameters(), lr=0.05),
                         batch_on(model, batch_size, device)), module


def step_pair(case: str, gloo: Optional[dist.ProcessGroup], batches: Dict[str, int]
              ) -> Tuple[Dict[str, Step], int, Dict[str, Callable[[], float]]]:
    """``case`` (``ddp_mlp``, ``ddp_cnn``, ``fsdp2_mlp``, ``torchrec_dlrm``) on the default group
    ("ours") and on ``gloo`` (None: the default group is gloo's), from the same parameters on the
    same batch: the two steps, the batch per rank and each side's last loss; no steps and why
    where TorchRec does not import."""
    kind, model = case.split("_")
    batch = batches[model]
    torch.manual_seed(0)
    if kind == "torchrec":
        from .dlrm import Shape, batch_of as dlrm_batch
        from .torchrec_peer import build, import_problem
        problem = import_problem()
        if problem:
            return {}, batch, problem
        shape, pair, losses = Shape(fields=8, rows=100_000, dim=16, bag=4, batch=batch), {}, {}
        for name, group in (("ours", None), ("gloo", gloo)):
            torch.manual_seed(0)
            steps, _, losses[name] = build(shape, dlrm_batch(shape, dist.get_rank()), 0.01, group)
            pair[name] = functools.partial(steps, 1)
        return pair, batch, losses
    initial = MODELS[model][0]().state_dict()
    if kind == "ddp":
        made = {"ours": ddp_step(model, initial, batch), "gloo": ddp_step(model, initial, batch, gloo)}
    else:
        from torch.distributed.device_mesh import DeviceMesh
        mesh = None if gloo is None else DeviceMesh.from_group(gloo, "cpu")
        made = {"ours": fsdp_step(model, initial, batch), "gloo": fsdp_step(model, initial, batch, mesh)}
    return {name: step for name, (step, _) in made.items()}, batch, \
        {name: step.last_loss for name, (step, _) in made.items()}


def full_parameters(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Every parameter whole (a DTensor gathered), by name."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in module.named_parameters()}


def largest_difference(one: Dict[str, torch.Tensor], other: Dict[str, torch.Tensor]) -> float:
    return max(float((one[name] - other[name]).abs().max()) for name in one)
