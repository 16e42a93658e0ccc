"""Gradients reduced after backward (``allreduce_gradients``), optionally living in persistent
fusion buffers (``bucket_gradients``, DDP's ``gradient_as_bucket_view``)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..collectives import allreduce, allreduce_many
from ..collectives.buckets import fusion_threshold, plan_buckets, register
from ..collectives.validate import Unusable, stable_hash
from ..errors import InputMismatchError, UnsupportedInputError
from .buckets import gradients_into
from .finite import all_finite
from .views import Parameters, array_view, named

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
        flat, views = gradients_into([params[i] for i in bucket])
        storage = array_view(flat)[0]
        register(storage)
        for i, view in zip(bucket, views):
            setattr(params[i], BUCKET_ATTRIBUTE, (view, storage))


def allreduce_gradients(parameters: Parameters, op: str = "mean", *, comm=None, check_finite: bool = True) -> None:
    """Reduce every parameter's ``.grad`` over all ranks, in place (``op`` "mean" by default,
    or "sum"). A parameter whose ``.grad`` is None on every rank keeps it None (as torch DDP
    leaves a parameter no rank used); one that is None on some ranks only is reduced with zeros
    there. Collective (one small allreduce says which gradients some rank has); on bad input (a
    dtype or layout hpcreduce does not reduce, a NaN or Inf with ``check_finite``: pass
    False under loss scaling, which expects them) every rank raises
    ``InputMismatchError``/``UnsupportedInputError`` naming the parameters and ranks,
    before any gradient changes. float16 gradients are summed in float32 and rounded once, as
    ``DistributedDataParallel`` reduces them."""
    pairs = named(parameters)
    code = stable_hash([(name, tuple(param.shape), str(param.dtype)) for name, param in pairs])
    present = np.array([param.grad is not None for _, param in pairs] + [code, -code], dtype=np.int64)
    try:
        allreduce(present, "max", comm=comm, out=present)
    except InputMismatchError as error:
        raise InputMismatchError(f"allreduce_gradients: the ranks pass different numbers of parameters "
                                 f"({error})") from None
    if present[-2] != code or present[-1] != -code:  # other models: allreduce_many names the difference
        present[:] = 1
    names, grads = [], []
    for (name, param), somewhere in zip(pairs, present[:-2]):
        if not somewhere:
            continue
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

