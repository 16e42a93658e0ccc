"""Input checks that fail on every rank, never in a hang.

A rank whose input is bad must not raise alone: its peers would wait in the
collective forever. So every local check (arrays, out=, settings) runs before any
communication, and each rank folds its verdict and a signature of its input (dtype,
op, shape, the algorithm it would run, ...) into one small integer vector that every rank
then sees: through the node's ``SharedExchange`` where all ranks share one node and fault
tolerance is off (each rank reads every rank's vector; no message), else as a single
``MPI_Allreduce(MAX)`` over ``[v, -v]`` (the maximum and minimum of each field). Any local
problem, or any field that differs between ranks, raises the same error on every rank before
data moves. Only then (the error path) do the ranks gather what each one passed, so the
message names the real values per rank.
Cost: one exchange of a 120-byte row (about 1 us at 2 ranks), or one allreduce of 2 x (fields
+ 1) int64 values, 112 bytes for ``allreduce``'s six fields (about one small message's
latency); ``PlannedCheck`` prepares either once per call signature, for the hot paths.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import Enum
from typing import Dict, List, Optional, Sequence, Tuple, Type

import numpy as np
from mpi4py import MPI

from ..errors import ConfigurationError, InputMismatchError, TrainingError, UnsupportedInputError
from ..arrays import is_device_array
from ..runtime.context import Context
from ..runtime.settings import Setting
from .exchange import header_row
from .node_window import shared_exchange
from .ops import DTYPES, OP_NAMES, dtype_code

ALGORITHMS = ("auto", "ring", "recursive_doubling", "native", "hierarchical", "one_shot")


class ProblemKind(Enum):
    """A kind of local input problem: the error it raises and how a message words it. Its
    ``code`` is what the cross-rank check carries, so every rank can name any rank's kind."""

    NOT_AN_ARRAY = (1, UnsupportedInputError, "passed something that is not a numpy or cupy array")
    UNSUPPORTED_DTYPE = (2, UnsupportedInputError, "passed an array of an unsupported dtype "
                         f"(supported: {', '.join(d.name for d in DTYPES)})")
    NOT_CONTIGUOUS = (3, UnsupportedInputError, "passed a non-contiguous array "
                      "(make it contiguous first, e.g. numpy.ascontiguousarray)")
    UNKNOWN_OP = (4, InputMismatchError, f"asked for an unknown op (known: {', '.join(OP_NAMES)})")
    UNKNOWN_ALGORITHM = (5, InputMismatchError, f"asked for an unknown algorithm (known: {', '.join(ALGORITHMS)})")
    OUT_MISMATCH = (6, InputMismatchError, "passed an out= array whose shape, dtype or kind differs from the input")
    READ_ONLY = (7, UnsupportedInputError, "passed a read-only array to write the result into")
    OVERLAPPING = (8, InputMismatchError, "passed arrays that share memory with inplace=True")
    UNUSABLE_ARRAY = (9, UnsupportedInputError, "passed an array it cannot reduce")
    ROOT_OUT_OF_RANGE = (10, InputMismatchError, "asked for a root outside the communicator")
    OUT_OF_MEMORY = (11, MemoryError, "could not allocate the result")
    UNUSABLE_SETTING = (12, ConfigurationError, "has an unusable setting")
    HOOK_FAILED = (13, TrainingError, "had its gradient reduction (comm hook) fail")
    UNMOVABLE = (14, UnsupportedInputError, "passed an array it cannot send")
    BAD_COUNTS = (15, InputMismatchError, "passed counts that do not fit its input")
    NOT_SUPPORTED = (16, UnsupportedInputError, "asked for something this backend does not do")

    def __new__(cls, code: int, error: Type[Exception], summary: str) -> "ProblemKind":
        kind = object.__new__(cls)
        kind._value_, kind.error, kind.summary = code, error, summary
        return kind

    @property
    def code(self) -> int:
        return self.value


@dataclass
class InputProblem:
    """A local problem with a collective's input: its kind, and the detail only this rank knows."""

    kind: ProblemKind
    detail: str


@dataclass(frozen=True)
class Unusable:
    """Stands in for an array a caller could not make (e.g. a torch dtype numpy lacks):
    reported on every rank as ``UNUSABLE_ARRAY`` with ``reason``."""

    reason: str


def array_problem(x) -> Optional[InputProblem]:
    """What is wrong with ``x`` as a reduction buffer, if anything."""
    if type(x) is not np.ndarray and not is_device_array(x):
        if isinstance(x, Unusable):
            return InputProblem(ProblemKind.UNUSABLE_ARRAY, x.reason)
        return InputProblem(ProblemKind.NOT_AN_ARRAY, f"got {type(x).__name__}")
    if dtype_code(x.dtype) < 0:
        return InputProblem(ProblemKind.UNSUPPORTED_DTYPE, f"got {x.dtype}")
    if not x.flags.c_contiguous:
        return InputProblem(ProblemKind.NOT_CONTIGUOUS,
                            f"array of shape {tuple(x.shape)} with strides {tuple(x.strides)}")
    return None


def choice_problem(op: str, algorithm: str) -> Optional[InputProblem]:
    if op not in OP_NAMES:
        return InputProblem(ProblemKind.UNKNOWN_OP, f"got op={op!r}")
    if algorithm not in ALGORITHMS:
        return InputProblem(ProblemKind.UNKNOWN_ALGORITHM, f"got algorithm={algorithm!r}")
    return None


def out_problem(x, out) -> Optional[InputProblem]:
    if out is None:
        return None
    if (type(out) is not type(x) or out.shape != x.shape or out.dtype != x.dtype
            or not out.flags.c_contiguous):
        return InputProblem(ProblemKind.OUT_MISMATCH, f"input {x.dtype}{tuple(x.shape)}, out= "
                            f"{getattr(out, 'dtype', '?')}{tuple(getattr(out, 'shape', ()))}")
    return read_only_problem(out, "out=")


def read_only_problem(x, label: str) -> Optional[InputProblem]:
    """``READ_ONLY`` when ``x`` (to be written into) is read-only."""
    if getattr(x.flags, "writeable", True):
        return None
    return InputProblem(ProblemKind.READ_ONLY, f"{label} {x.dtype}{tuple(x.shape)} is not writeable")


def setting_value(setting: Setting, fallback) -> Tuple[object, Optional[InputProblem]]:
    """A setting's value, or ``fallback`` and ``UNUSABLE_SETTING`` when this rank's value is unusable
    (so that it is reported on every rank instead of raised here alone)."""
    try:
        return setting.value(), None
    except ConfigurationError as err:
        return fallback, InputProblem(ProblemKind.UNUSABLE_SETTING, str(err))


def first_problem(*found: Optional[InputProblem]) -> Optional[InputProblem]:
    return next((p for p in found if p is not None), None)


def labelled(found: Optional[InputProblem], label: str) -> Optional[InputProblem]:
    """``found`` with ``label`` (which array of a list) in front of its detail."""
    return None if found is None else InputProblem(found.kind, f"{label}: {found.detail}")


def root_check(root: object, size: int) -> Tuple[Field, Optional[InputProblem]]:
    """The ``root`` field every rank compares, and ``ROOT_OUT_OF_RANGE`` when ``root`` is not a
    rank of a communicator of ``size`` ranks."""
    if isinstance(root, (int, np.integer)) and 0 <= root < size:
        return ("root", int(root), root), None
    return ("root", -1, root), InputProblem(ProblemKind.ROOT_OUT_OF_RANGE, f"root={root!r}, but the communicator "
                                                                          f"has {size} ranks (0..{size - 1})")


def array_labels(names: Optional[Sequence[str]], count: int) -> List[str]:
    """What messages call each of ``count`` arrays: its name from ``names``, else ``array i``."""
    labels = [*(names or [])][:count]
    return labels + [f"array {i}" for i in range(len(labels), count)]


def layout_fields(arrays: list, labels: Sequence[str]) -> Tuple[Field, Field]:
    """The number of ``arrays`` and their dtypes and shapes: fields every rank compares."""
    layout = [(getattr(x, "dtype", None) and x.dtype.str, tuple(getattr(x, "shape", ()))) for x in arrays]
    return (("number of arrays", len(arrays), len(arrays)),
            ("dtypes and shapes", stable_hash(layout), lambda: _described(arrays, labels)))


def _described(arrays: list, labels: Sequence[str]) -> List[str]:
    return [f"{label}: {getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}"
            for x, label in zip(arrays, labels)]


def stable_hash(value: object) -> int:
    """A 31-bit hash of ``repr(value)`` that is the same in every process."""
    return zlib.crc32(repr(value).encode()) & 0x7FFFFFFF


Field = Tuple[str, int, object]
"""(name, the integer every rank compares, the value as a message shows it: a callable is
called on the error path only, a list is compared item by item)."""


def agree(context: Context, what: str, fields: Sequence[Field], local: Optional[InputProblem]) -> None:
    """Raise the same error on every rank if any rank has a problem or the fields differ."""
    comm = context.comm
    values = field_values(fields, local.kind.code * comm.Get_size() + comm.Get_rank() + 1 if local is not None else 0)
    exchange = shared_exchange(context)
    if exchange is not None:
        rows = exchange.rows(exchange.publish(header_row(values)))
        if rows[:, 1].max() > 0 or (rows != rows[0]).any():
            raise_for_rows(comm, what, fields, local, rows)
        return
    both = check_vector(values)
    comm.Allreduce(MPI.IN_PLACE, both, op=MPI.MAX)
    # A problem anywhere makes the highest key positive; each field's max - min is >= 0, so
    # the fields all agree iff their sum is zero (the key's own max - min aside).
    if both[0] > 0 or sum(both.tolist()):
        _raise_disagreement(comm, what, fields, local, int(both[0]))


def field_values(fields: Sequence[Field], key: int = 0) -> List[int]:
    """``[key, codes...]``: what a rank contributes to the check (``key`` > 0: its problem)."""
    return [key] + [code for _, code, _ in fields]


def check_vector(values: Sequence[int]) -> np.ndarray:
    """``[key, codes..., -key, -codes...]``: what each rank contributes to the check's MAX."""
    vector = np.array(values, dtype=np.int64)
    return np.concatenate([vector, -vector])


def raise_for_rows(comm: MPI.Intracomm, what: str, fields: Sequence[Field], local: Optional[InputProblem],
                   rows: np.ndarray) -> None:
    """The error path after an exchange whose ``rows`` (every rank's ``header_row``) differ or
    carry a problem: the same error on every rank."""
    _raise_disagreement(comm, what, fields, local, int(rows[:, 1].max()))


class PlannedCheck:
    """``agree`` for one call signature, made once, for a rank with no local problem (the hot
    paths of ``allreduce`` and ``allreduce_many``): the same exchange or allreduce, so it meets
    ``agree`` on other ranks, with everything it sends made here. With no problem anywhere and
    every field alike, what comes back is known in advance: one bytes comparison."""

    __slots__ = ("what", "fields", "row", "send", "receive", "received", "expected")

    def __init__(self, what: str, fields: Sequence[Field]) -> None:
        values = field_values(fields)
        self.what, self.fields = what, fields
        self.row = header_row(values)
        vector = check_vector(values)
        self.received = np.empty_like(vector)
        self.send, self.receive = [vector, MPI.INT64_T], [self.received, MPI.INT64_T]
        self.expected = vector.tobytes()

    def run(self, context: Context) -> None:
        """Raise the same error on every rank if any rank has a problem or the fields differ."""
        exchange = shared_exchange(context)
        if exchange is not None:
            parity = exchange.publish(self.row)
            if not exchange.same(parity, self.row):
                raise_for_rows(context.comm, self.what, self.fields, None, exchange.rows(parity))
            return
        context.comm.Allreduce(self.send, self.receive, MPI.MAX)
        if self.received.tobytes() != self.expected:
            _raise_disagreement(context.comm, self.what, self.fields, None, int(self.received[0]))


def _raise_disagreement(comm: MPI.Intracomm, what: str, fields: Sequence[Field],
                        local: Optional[InputProblem], worst: int) -> None:
    """The error path: gather each rank's problem and values, raise one message everywhere."""
    mine = (None if local is None else (local.kind.code, local.detail), [_shown(field[2]) for field in fields])
    reports = comm.allgather(mine)
    if worst > 0:
        kind = ProblemKind((worst - 1) // comm.Get_size())
        culprits: Dict[Tuple[int, str], List[int]] = {}
        for r, (found, _) in enumerate(reports):
            if found is not None:
                culprits.setdefault(found, []).append(r)
        raise kind.error(f"{what}: " + "; ".join(f"{_ranks(ranks)} {ProblemKind(code).summary}: {detail}"
                                                 for (code, detail), ranks in culprits.items()))
    if len({len(values) for _, values in reports}) > 1:
        raise InputMismatchError(f"{what}: ranks disagree on whether the input check is on (check=, "
                                 "HPCREDUCE_CHECK)")
    for index, (name, _, _) in enumerate(fields):
        shown = [values[index] for _, values in reports]
        if len(set(map(repr, shown))) > 1:
            raise InputMismatchError(f"{what}: ranks disagree on the {name}: {_first_difference(shown)}")
    raise InputMismatchError(f"{what}: ranks disagree on "
                             + ", ".join(name for name, _, _ in fields) + " (same descriptions)")


def _shown(value: object):
    value = value() if callable(value) else value
    return [str(item) for item in value] if isinstance(value, list) else str(value)


def _first_difference(shown: list) -> str:
    """Each rank's value; for lists, the first item where they differ."""
    if not all(isinstance(value, list) for value in shown):
        return by_rank(shown)
    index = next(i for i in range(max(map(len, shown)) + 1) if len({repr(v[i:i + 1]) for v in shown}) > 1)
    return f"item {index}: " + by_rank([value[index] if index < len(value) else "nothing" for value in shown])


def by_rank(shown: Sequence[str]) -> str:
    """``rank 0 passed (3, 4), rank 1 passed (4, 3)``: ranks grouped by the value they passed."""
    groups: Dict[str, List[int]] = {}
    for rank, value in enumerate(shown):
        groups.setdefault(value, []).append(rank)
    return "; ".join(f"{_ranks(ranks)} passed {value}" for value, ranks in groups.items())


def _ranks(ranks: List[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def raise_local(what: str, local: Optional[InputProblem], rank: int) -> None:
    """Without the cross-rank check: raise this rank's own problem, if any."""
    if local is not None:
        raise local.kind.error(f"{what}: rank {rank} {local.kind.summary}: {local.detail}")
