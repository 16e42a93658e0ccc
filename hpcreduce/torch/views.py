"""Torch tensors as the arrays hpcreduce reduces: numpy views of CPU tensors, cupy views (DLPack)
of CUDA tensors, without copies; and the (name, parameter) pairs of a module."""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple, Union

import torch

from .dtypes import NUMPY as DTYPES

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


def write_elements(tensor: torch.Tensor, a: int, b: int, values: torch.Tensor) -> None:
    """``values`` into elements ``[a, b)`` of ``tensor`` in its logical (row-major) order, in place,
    whatever its strides (a channels_last or transposed parameter: through one copy of it)."""
    target = tensor.detach()
    if target.is_contiguous():
        target.view(-1)[a:b].copy_(values)
        return
    whole = target.reshape(-1).clone()
    whole[a:b] = values
    target.copy_(whole.view(target.shape))
