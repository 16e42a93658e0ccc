"""Input checks that fail on every rank, never in a hang.

A rank whose input is bad must not raise alone: its peers would wait in the
collective forever. So each rank folds its verdict and a signature of its input
(dtype, op, shape, ...) into one small integer vector, and a single
``MPI_Allreduce(MAX)`` over ``[v, -v]`` gives every rank the maximum and minimum of
each field. Any local problem, or any field whose minimum and maximum differ,
raises the same error on every rank before data moves.
Cost: one allreduce of 2 x (fields + 1) int64 values.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple, Type

import numpy as np
from mpi4py import MPI

from ..errors import HpcreduceError, InputMismatchError, UnsupportedInputError
from ..arrays import is_device_array
from .ops import DTYPES, OP_NAMES, dtype_code

ALGORITHMS = ("auto", "ring", "recursive_doubling", "native")


@dataclass(frozen=True)
class ProblemKind:
    """A local input problem that every rank can name from its code alone."""

    code: int
    error: Type[HpcreduceError]
    summary: str


PROBLEMS = {p.code: p for p in (
    ProblemKind(1, UnsupportedInputError, "passed something that is not a numpy or cupy array"),
    ProblemKind(2, UnsupportedInputError, "passed an array of an unsupported dtype "
                f"(supported: {', '.join(d.name for d in DTYPES)})"),
    ProblemKind(3, UnsupportedInputError, "passed a non-contiguous array "
                "(make it contiguous first, e.g. numpy.ascontiguousarray)"),
    ProblemKind(4, InputMismatchError, f"asked for an unknown op (known: {', '.join(OP_NAMES)})"),
    ProblemKind(5, InputMismatchError, f"asked for an unknown algorithm (known: {', '.join(ALGORITHMS)})"),
    ProblemKind(6, InputMismatchError, "passed an out= array whose shape, dtype or kind differs from the input"),
)}


@dataclass
class Problem:
    """A local problem: its kind, and the detail only this rank knows."""

    kind: ProblemKind
    detail: str


def problem(code: int, detail: str) -> Problem:
    return Problem(PROBLEMS[code], detail)


def array_problem(x) -> Optional[Problem]:
    """What is wrong with ``x`` as a reduction buffer, if anything."""
    if type(x) is not np.ndarray and not is_device_array(x):
        return problem(1, f"got {type(x).__name__}")
    if dtype_code(x.dtype) < 0:
        return problem(2, f"got {x.dtype}")
    if not x.flags.c_contiguous:
        return problem(3, f"array of shape {tuple(x.shape)} with strides {tuple(x.strides)}")
    return None


def choice_problem(op: str, algorithm: str) -> Optional[Problem]:
    if op not in OP_NAMES:
        return problem(4, f"got op={op!r}")
    if algorithm not in ALGORITHMS:
        return problem(5, f"got algorithm={algorithm!r}")
    return None


def out_problem(x, out) -> Optional[Problem]:
    if out is None:
        return None
    if (type(out) is not type(x) or out.shape != x.shape or out.dtype != x.dtype
            or not out.flags.c_contiguous):
        return problem(6, f"input {x.dtype}{tuple(x.shape)}, out= {getattr(out, 'dtype', '?')}"
                          f"{tuple(getattr(out, 'shape', ()))}")
    return None


def first_problem(*found: Optional[Problem]) -> Optional[Problem]:
    return next((p for p in found if p is not None), None)


def stable_hash(value: object) -> int:
    """A 31-bit hash of ``repr(value)`` that is the same in every process."""
    return zlib.crc32(repr(value).encode()) & 0x7FFFFFFF


Describe = Callable[[int], str]


def _describe_dtype(code: int) -> str:
    return DTYPES[code].name if 0 <= code < len(DTYPES) else "unsupported"


def _describe_op(code: int) -> str:
    return OP_NAMES[code] if 0 <= code < len(OP_NAMES) else "unknown"


DESCRIBE: Dict[str, Describe] = {"dtype": _describe_dtype, "op": _describe_op}


def agree(comm: MPI.Intracomm, what: str, fields: Sequence[Tuple[str, int]],
          local: Optional[Problem]) -> None:
    """Raise the same error on every rank if any rank has a problem or the fields differ."""
    size, rank = comm.Get_size(), comm.Get_rank()
    key = local.kind.code * size + rank + 1 if local is not None else 0
    values = np.array([key] + [value for _, value in fields], dtype=np.int64)
    both = np.concatenate([values, -values])
    comm.Allreduce(MPI.IN_PLACE, both, op=MPI.MAX)
    highest, lowest = both[:values.size], -both[values.size:]
    if highest[0] > 0:
        code, culprit = divmod(int(highest[0]) - 1, size)
        kind = PROBLEMS[code]
        detail = f": {local.detail}" if local is not None and culprit == rank else ""
        raise kind.error(f"{what}: rank {culprit} {kind.summary}{detail}")
    for i, (name, _) in enumerate(fields, start=1):
        if highest[i] != lowest[i]:
            show = DESCRIBE.get(name, str)
            raise InputMismatchError(
                f"{what}: ranks disagree on the {name}: from {show(int(lowest[i]))} to "
                f"{show(int(highest[i]))} across ranks (this rank: {show(int(values[i]))})")


def raise_local(what: str, local: Optional[Problem], rank: int) -> None:
    """Without the cross-rank check: raise this rank's own problem, if any."""
    if local is not None:
        raise local.kind.error(f"{what}: rank {rank} {local.kind.summary}: {local.detail}")
