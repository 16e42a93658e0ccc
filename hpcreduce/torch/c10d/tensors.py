"""Torch tensors as the arrays the collectives move, and c10d's reduce ops as the collectives' ops.

A CPU tensor is moved through a numpy view of its memory (no copy); bfloat16, which numpy lacks, as
its uint16 bit patterns. A non-contiguous tensor goes through a contiguous copy that is copied back
(``contiguous``). ``reduction(dtype, op)`` says how a reduction runs: ``allreduce`` (hpcreduce's
automatic choice) for the collectives' dtypes and ops, ``narrow`` (16-bit sums: float32 accumulation,
rounded once), ``wide`` (other 16-bit ops, exact or rounded once in float32) or ``native`` (MPI's
own op on small ints, bool, complex and the bitwise ops); or why it cannot.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, NamedTuple, Optional

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from ...collectives.ops import OPS, ReduceOp
from ..dtypes import NARROW, NUMPY

RedOpType = dist.ReduceOp.RedOpType
NAMES = {RedOpType.SUM: "sum", RedOpType.AVG: "mean", RedOpType.MIN: "min", RedOpType.MAX: "max",
         RedOpType.PRODUCT: "prod"}
BITWISE = {RedOpType.BAND: ReduceOp("band", "bitwise_and", MPI.BAND),
           RedOpType.BOR: ReduceOp("bor", "bitwise_or", MPI.BOR),
           RedOpType.BXOR: ReduceOp("bxor", "bitwise_xor", MPI.BXOR)}
LOGICAL = {"sum": ReduceOp("lor", "logical_or", MPI.LOR), "max": ReduceOp("lor", "logical_or", MPI.LOR),
           "min": ReduceOp("land", "logical_and", MPI.LAND), "prod": ReduceOp("land", "logical_and", MPI.LAND)}
LOGICAL_BITWISE = {RedOpType.BAND: LOGICAL["min"], RedOpType.BOR: LOGICAL["sum"],
                   RedOpType.BXOR: ReduceOp("lxor", "logical_xor", MPI.LXOR)}
NATIVE_INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.uint32, torch.uint64)
"""Bool tensors: a sum or max is "any", a min or product "all" (as torch's own reductions of bools)."""


class Reduction(NamedTuple):
    """How one (dtype, op) reduces: ``path`` (allreduce, narrow, wide, native), the collectives'
    op and, for ``narrow``/``wide``, the 16-bit format."""

    path: str
    op: ReduceOp
    fmt: Optional[str] = None
    factor: Optional[float] = None
    """PREMUL_SUM's: each input multiplied by it before the sum (FSDP2's gradient division)."""


def op_type(op) -> RedOpType:
    """The ``RedOpType`` of an ``opts.reduceOp`` (a ``ReduceOp`` or already a type)."""
    return op if isinstance(op, RedOpType) else op.op


def reduction(dtype: torch.dtype, op) -> "Reduction | str":
    """How ``dtype`` reduces under c10d's ``op``, or the reason it cannot (text)."""
    kind = op_type(op)
    if kind == RedOpType.PREMUL_SUM:
        summed = reduction(dtype, RedOpType.SUM)
        return summed if isinstance(summed, str) else summed._replace(factor=premul_factor(op))
    if kind in BITWISE:
        if dtype == torch.bool:
            return Reduction("native", LOGICAL_BITWISE[kind])
        if dtype.is_floating_point or dtype.is_complex:
            return f"{kind.name} needs an integer or bool tensor, got {dtype}"
        return Reduction("native", BITWISE[kind])
    name = NAMES.get(kind)
    if name is None:
        return f"reduce op {kind.name} is not supported (SUM, AVG, MIN, MAX, PRODUCT, BAND, BOR, BXOR, PREMUL_SUM)"
    if dtype in NARROW:
        return Reduction("narrow" if name in ("sum", "mean") else "wide", OPS[name], NARROW[dtype])
    if dtype in NUMPY:
        return Reduction("allreduce", OPS[name])
    if dtype == torch.bool:
        return "AVG of a bool tensor is not defined" if name == "mean" else Reduction("native", LOGICAL[name])
    if dtype.is_complex and name in ("min", "max"):
        return f"{kind.name} of complex numbers is not defined"
    if dtype.is_complex or dtype in NATIVE_INTEGERS:
        return Reduction("native", OPS[name])
    return f"dtype {dtype} is not supported"


def premul_factor(op) -> float:
    """The factor of a ``ReduceOp.PREMUL_SUM(factor)`` (a number or a one-element tensor)."""
    factor = op.factor
    return float(factor.item() if isinstance(factor, torch.Tensor) else factor)


def array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU ``tensor`` (bfloat16 as its uint16 bits)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.uint16)
    return tensor.numpy()


def tensor_problem(tensor) -> Optional[str]:
    """Why ``tensor`` cannot take part in a collective here, if it cannot."""
    if not isinstance(tensor, torch.Tensor):
        return f"got {type(tensor).__name__}, not a tensor"
    if tensor.device.type != "cpu":
        return f"a tensor on {tensor.device} (this backend moves CPU tensors)"
    if tensor.is_sparse or tensor.layout != torch.strided:
        return f"a {tensor.layout} tensor (dense tensors only)"
    return None


@contextmanager
def contiguous(tensors: List[torch.Tensor], written: bool = True) -> Iterator[List[torch.Tensor]]:
    """``tensors`` as contiguous tensors: themselves, or copies that are copied back after the
    block when ``written``."""
    dense = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    yield dense
    if written:
        for original, copy in zip(tensors, dense):
            if copy is not original:
                original.copy_(copy)


def describe(tensor) -> str:
    return f"{tensor.dtype}{list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
