"""The gradient buckets of a wrapped module: persistent flat buffers, gradients as views of them.

Parameters that take a gradient are bucketed in reverse registration order (the order
backward tends to produce their gradients, as DDP does), a new bucket starting at a change of
dtype or device or when the next parameter would take the bucket past ``cap_bytes`` (the first
bucket past 1 MiB, as DDP's first bucket). Every
rank builds the same plan from the same module; ``layout`` is what the ranks compare.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from ..collectives.buckets import plan as plan_buckets

FIRST_BUCKET_BYTES = 1 << 20
"""The first bucket (the last layers, whose gradients come first) holds at most this, as in
DDP: its reduction starts early in backward."""


@dataclass
class Bucket:
    """One flat buffer and the parameters whose gradients live in it (``views``, in order)."""

    index: int
    flat: torch.Tensor
    names: List[str]
    params: List[torch.nn.Parameter]
    views: List[torch.Tensor]
    waiting: int = field(default=0, init=False)  # gradients not yet ready in this backward
    sources: List[Optional[torch.Tensor]] = field(default_factory=list, init=False)
    """Per parameter, autograd's own gradient to reduce in place of its view (None: the view)."""

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


def plan(named: Sequence[Tuple[str, torch.nn.Parameter]], cap_bytes: int) -> List[List[int]]:
    """Indices into ``named`` grouped into buckets by the one planner (``collectives.buckets.plan``):
    reverse order, one dtype and device per bucket, the first of at most ``FIRST_BUCKET_BYTES``."""
    params = [param for _, param in named]
    return plan_buckets([param.numel() * param.element_size() for param in params],
                        [(param.dtype, param.device) for param in params], cap_bytes,
                        first_cap=min(cap_bytes, FIRST_BUCKET_BYTES))


def gradients_into(params: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """A flat buffer for ``params`` (one dtype and device) and each one's gradient as a view of
    it, end to end, in order (current gradients kept; none: zeros)."""
    first = params[0]
    flat = torch.zeros(sum(param.numel() for param in params), dtype=first.dtype, device=first.device)
    views, offset = [], 0
    for param in params:
        view = flat[offset:offset + param.numel()].view_as(param)
        offset += param.numel()
        if param.grad is not None:
            view.copy_(param.grad)
        param.grad = view
        views.append(view)
    return flat, views


def build(named: Sequence[Tuple[str, torch.nn.Parameter]], cap_bytes: int) -> List[Bucket]:
    """The buckets of ``named``, each parameter's gradient becoming a view of its bucket."""
    buckets = []
    for number, members in enumerate(plan(named, cap_bytes)):
        params = [named[i][1] for i in members]
        flat, views = gradients_into(params)
        buckets.append(Bucket(number, flat, [named[i][0] for i in members], params, views))
    return buckets


def layout(named: Sequence[Tuple[str, torch.nn.Parameter]],
           cap_bytes: int) -> List[Tuple[int, str, Tuple[int, ...], str]]:
    """What must be the same on every rank: each bucket's parameters, shapes and dtypes, in order."""
    return [(number, named[i][0], tuple(named[i][1].shape), str(named[i][1].dtype))
            for number, members in enumerate(plan(named, cap_bytes)) for i in members]


def unfit(grad: torch.Tensor, view: torch.Tensor) -> Optional[str]:
    """Why ``grad`` cannot be reduced as its bucket ``view`` (None: it can)."""
    if grad.is_sparse:
        return "its gradient is sparse (use a dense layer, or the parameter server's rows)"
    if grad.shape != view.shape:
        return f"its gradient has shape {tuple(grad.shape)}, its bucket {tuple(view.shape)} (it changed after wrapping)"
    if grad.dtype != view.dtype or grad.device != view.device:
        return f"its gradient is {grad.dtype} on {grad.device}, its bucket {view.dtype} on {view.device}"
    return None

