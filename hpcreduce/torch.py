"""PyTorch interop (``pip install 'hpcreduce[torch]'``): data-parallel torch models over MPI ranks.

    import hpcreduce.torch as hpt
    hpt.broadcast_parameters(model)          # every rank starts from rank 0's weights
    for x, y in my_shard:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        hpt.allreduce_gradients(model)       # mean gradient over all ranks, in place
        optimizer.step()

or with parameter servers (the servers run hpcreduce's optimizer, see docs/parameter-server.md):

    role = hpt.start_parameter_server(model, servers=1, optimizer="sgd", lr=0.1)
    if isinstance(role, hpcreduce.ps.Server):
        role.serve()
    else:
        for x, y in my_shard:
            role.pull()                      # the servers' parameters into the model
            model.zero_grad(); loss_fn(model(x), y).backward()
            role.push()                      # gradients to the servers
            role.clock()
        role.release()

Tensors are not copied where it can be helped: a CPU tensor is reduced through its numpy
view (``tensor.numpy()`` shares its memory), a CUDA tensor through a cupy view
(DLPack, zero-copy; needs cupy). Every rank must pass the same parameters in the same
order; a parameter without a gradient counts as zeros (as Horovod does). Bad input
(different models on different ranks, a dtype hpcreduce does not reduce, sparse or
non-finite gradients, a root outside the communicator) raises on every rank, naming the
parameters and ranks, before any data moves.
Cost: ``allreduce_gradients`` is one ``allreduce_many`` of all gradients (see
docs/algorithms.md) after one ``isfinite`` pass over them (``check_finite``); after
``bucket_gradients(model)`` the gradients live in persistent fusion buffers and are reduced
there, with no copy in or out;
``broadcast_parameters`` one small allreduce (the root), one small pickled signature
broadcast and an allgather of verdicts, then one ``MPI_Bcast`` per tensor (any dtype, as bytes);
``pull``/``push``: one PS pull or push per parameter, all in flight together.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from .collectives import allreduce_many
from .collectives.broadcast import broadcast_tensor
from .collectives.buckets import fusion_threshold, plan_buckets, register
from .collectives.validate import InputProblem, ProblemKind, Unusable, agree, root_check, stable_hash
from .errors import InputMismatchError, UnsupportedInputError
from .runtime.context import resolve

__all__ = ["allreduce_gradients", "bucket_gradients", "broadcast_parameters", "start_parameter_server",
           "TorchPSWorker"]

DTYPES = {torch.float16: "float16", torch.float32: "float32", torch.float64: "float64",
          torch.int32: "int32", torch.int64: "int64"}

Parameters = Union[torch.nn.Module, Iterable[Tuple[str, torch.Tensor]]]


def named(parameters: Parameters) -> List[Tuple[str, torch.Tensor]]:
    """(name, parameter) pairs of a module, or the pairs given."""
    if isinstance(parameters, torch.nn.Module):
        return list(parameters.named_parameters())
    return list(parameters)


def array_view(tensor: torch.Tensor) -> Tuple[Any, Optional[str]]:
    """A numpy (CPU) or cupy (CUDA) array sharing ``tensor``'s memory, or a reason it cannot be."""
    if tensor.is_sparse:
        return None, "sparse gradients are not supported (use a dense layer, or the parameter server's rows)"
    if tensor.dtype not in DTYPES:
        return None, f"dtype {tensor.dtype} is not supported (supported: {', '.join(DTYPES.values())})"
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        return tensor.numpy(), None
    if tensor.device.type == "cuda":
        try:
            import cupy
        except ImportError:
            return None, "CUDA tensors need cupy (pip install 'hpcreduce[gpu]')"
        return cupy.from_dlpack(tensor), None
    return None, f"tensors on {tensor.device.type} are not supported (CPU or CUDA only)"


BUCKET_ATTRIBUTE = "_hpcreduce_gradient_view"
"""Set on a bucketed parameter: its gradient view, and the registered array over its bucket
(kept alive with the parameter)."""


def bucket_gradients(parameters: Parameters, *, threshold_bytes: Optional[int] = None) -> None:
    """Give every parameter a gradient that is a view into persistent fusion buffers (PyTorch
    DDP's ``gradient_as_bucket_view``), keeping its current values: ``allreduce_gradients``
    then reduces each bucket where it lies, with no copy in or out. Buckets follow
    ``allreduce_many``'s grouping (``threshold_bytes``: its fusion threshold, default
    ``HPCREDUCE_FUSION_BYTES``). Local (no communication). A gradient that autograd or
    ``zero_grad(set_to_none=True)`` replaces later is copied back into its view by
    ``allreduce_gradients``. Raises ``UnsupportedInputError`` for a parameter hpcreduce
    cannot reduce."""
    pairs = named(parameters)
    params = [param for _, param in pairs]
    like = []
    for name, param in pairs:
        view, reason = array_view(param)
        if reason is not None:
            raise UnsupportedInputError(f"bucket_gradients: parameter {name!r}: {reason}")
        like.append(view)
    for bucket in plan_buckets(like, fusion_threshold(threshold_bytes)):
        first = params[bucket[0]]
        flat = torch.zeros(sum(params[i].numel() for i in bucket), dtype=first.dtype, device=first.device)
        storage = array_view(flat)[0]
        register(storage)
        offset = 0
        for i in bucket:
            view = flat[offset:offset + params[i].numel()].view_as(params[i])
            offset += params[i].numel()
            if params[i].grad is not None:
                view.copy_(params[i].grad)
            params[i].grad = view
            setattr(params[i], BUCKET_ATTRIBUTE, (view, storage))


def allreduce_gradients(parameters: Parameters, op: str = "mean", *, comm=None, check_finite: bool = True) -> None:
    """Reduce every parameter's ``.grad`` over all ranks, in place (``op`` "mean" by default,
    or "sum"); a missing gradient is created as zeros first. Collective; on bad input (a
    dtype or layout hpcreduce does not reduce, a NaN or Inf with ``check_finite``: pass
    False under loss scaling, which expects them) every rank raises
    ``InputMismatchError``/``UnsupportedInputError`` naming the parameters and ranks,
    before any gradient changes."""
    names, grads = [], []
    for name, param in named(parameters):
        bucketed = getattr(param, BUCKET_ATTRIBUTE, None)
        if bucketed is not None and param.grad is not bucketed[0]:
            restore_view(param, bucketed[0])
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        names.append(name)
        grads.append(param.grad)
    finite = all_finite(grads) if check_finite else [True] * len(grads)
    views = []
    for grad, ok in zip(grads, finite):
        view, reason = array_view(grad)
        if reason is None and not ok:
            reason = "has NaN or Inf values"
        views.append(Unusable(reason) if reason else view)
    allreduce_many(views, op, comm=comm, inplace=True, names=names)


def restore_view(param: torch.Tensor, view: torch.Tensor) -> None:
    """Put a replaced gradient back into its bucket view (zeros for none); one that no longer
    fits the view (another shape, dtype or device) stays as it is, reduced by copying."""
    grad = param.grad
    if grad is None:
        view.zero_()
    elif grad.shape != view.shape or grad.dtype != view.dtype or grad.device != view.device or grad.is_sparse:
        return
    else:
        view.copy_(grad)
    param.grad = view


def all_finite(tensors: Sequence[torch.Tensor]) -> List[bool]:
    """Whether each tensor is free of NaN and Inf, read back once per device (not once per
    tensor: each read of a CUDA result waits for the GPU)."""
    finite = [True] * len(tensors)
    by_device: Dict[torch.device, List[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    for indices in by_device.values():
        flags = torch.stack([torch.isfinite(tensors[i]).all() for i in indices]).tolist()
        for index, flag in zip(indices, flags):
            finite[index] = bool(flag)
    return finite


def state_tensors(module: Union[torch.nn.Module, Dict[str, torch.Tensor]]) -> List[Tuple[str, torch.Tensor]]:
    """Parameters and buffers (a module's ``state_dict``, sharing its storage), by name."""
    state = module.state_dict() if isinstance(module, torch.nn.Module) else module
    return sorted(state.items())


def broadcast_parameters(module: Union[torch.nn.Module, Dict[str, torch.Tensor]], root: int = 0, *,
                         comm=None) -> None:
    """Give every rank ``root``'s parameters and buffers (a module or a state dict), in place.
    Collective; ranks whose tensors differ in names, shapes or dtypes get
    ``InputMismatchError`` on every rank before anything is overwritten."""
    context = resolve(comm)
    root_field, wrong_root = root_check(root, context.size)
    agree(context, "broadcast_parameters", [root_field], wrong_root)
    tensors = state_tensors(module)
    signature = [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors]
    theirs = context.comm.bcast(signature if context.rank == root else None, root=root)
    verdict = None
    if theirs != signature:
        different = next((f"{mine} here, {other} on rank {root}"
                          for mine, other in zip(signature, theirs) if mine != other),
                         f"{len(signature)} tensors here, {len(theirs)} on rank {root}")
        verdict = f"rank {context.rank}: {different}"
    verdicts = [v for v in context.comm.allgather(verdict) if v]
    if verdicts:
        raise InputMismatchError("broadcast_parameters: the ranks' modules differ: " + "; ".join(verdicts))
    for _name, tensor in tensors:
        with torch.no_grad():
            broadcast_tensor(context, tensor, root)


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
    from .ps import Consistency, ParamSpec, Server, start
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
