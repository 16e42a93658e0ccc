"""Every rank takes one rank's parameters and buffers: ``broadcast_parameters``."""
from __future__ import annotations

from typing import Dict, List, Tuple, Union

import torch

from ..collectives import agree as agree_on
from ..collectives.broadcast import broadcast_tensor
from ..collectives.validate import agree, root_check
from ..runtime.context import resolve


def state_tensors(module: Union[torch.nn.Module, Dict[str, torch.Tensor]]) -> List[Tuple[str, torch.Tensor]]:
    """Parameters and buffers (a module's ``state_dict``, sharing its storage), by name."""
    state = module.state_dict() if isinstance(module, torch.nn.Module) else module
    return sorted(state.items())


def broadcast_parameters(module: Union[torch.nn.Module, Dict[str, torch.Tensor]], root: int = 0, *,
                         comm=None) -> None:
    """Give every rank ``root``'s parameters and buffers (a module or a state dict), in place.
    Collective; ranks whose tensors differ in names, shapes or dtypes get
    ``InputMismatchError`` on every rank before anything is overwritten. On a rank spawned
    into a running elastic job (``context.joined``) it does nothing: the job's ranks are not
    in this call, and ``elastic.run``'s join gives the newcomer rank 0's tracked values."""
    context = resolve(comm)
    if context.joined:
        return
    root_field, wrong_root = root_check(root, context.size)
    agree(context, "broadcast_parameters", [root_field], wrong_root)
    tensors = state_tensors(module)
    signature = [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors]
    theirs = context.comm.bcast(signature if context.rank == root else None, root=root)
    different = None if theirs == signature else next(
        (f"{mine} here, {other} on rank {root}" for mine, other in zip(signature, theirs) if mine != other),
        f"{len(signature)} tensors here, {len(theirs)} on rank {root}")
    agree_on(different, comm=context, what="broadcast_parameters: the ranks' modules differ")
    for _name, tensor in tensors:
        with torch.no_grad():
            broadcast_tensor(context, tensor, root)
