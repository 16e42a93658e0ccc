"""Checks of a colocated call's input, on this rank, before anything moves.

Each check returns the prepared input or a problem (a sentence); the problem travels in the
count header every rank exchanges first, so a bad call raises ``PSInputError`` on every rank
(``refuse``) before any id or row is sent.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

import numpy as np
from mpi4py import MPI

from ...arrays.finite import all_finite
from ...errors import PSConfigError, PSInputError
from ...runtime.watchdog import watchdog
from ..client_checks import check_array, checked_ids, table_rows
from ..init import PartInit
from ..optimizers import OPTIMIZERS
from ..tables import ParamSpec

T = TypeVar("T")
Pulled = Dict[int, Tuple[np.ndarray, np.ndarray]]  # table -> (unique ids, inverse)
Pushed = Dict[int, Tuple[np.ndarray, np.ndarray]]  # table -> (sorted unique ids, gradients)
Lookups = Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]  # ids, bag lengths (int64), factors (float32) or None


def spec_problem(specs: Sequence[ParamSpec], optimizer: str, lr: float, init: object) -> Optional[str]:
    """What is wrong with the tables, the update rule or the initialiser (None when nothing is)."""
    if init is not None and not isinstance(init, PartInit):
        return f"init must be a ps.init.PartInit (or None for the default), got {type(init).__name__}"
    names = [getattr(spec, "name", None) for spec in specs]
    for spec in specs:
        if not isinstance(spec, ParamSpec):
            return f"tables must be ps.ParamSpec, got {type(spec).__name__}"
        if not spec.sparse:
            return (f"table {spec.name!r} is dense: the colocated layout holds sparse tables only "
                    "(dense parameters go through DistributedDataParallel)")
        problem = spec.problem()
        if problem:
            return problem
    if len(set(names)) != len(names):
        return f"table names repeat: {names}"
    if optimizer not in OPTIMIZERS:
        return f"unknown optimizer {optimizer!r}; choose from {', '.join(OPTIMIZERS)}"
    if not (isinstance(lr, (int, float)) and lr > 0 and np.isfinite(lr)):
        return f"learning rate must be a positive number, got {lr!r}"
    return None


def agree_on_setup(comm: MPI.Intracomm, problem: Optional[str], settings: Mapping[str, object]) -> None:
    """Raise the same ``PSConfigError`` on every rank when a rank's tables or update rule are bad
    or differ from rank 0's (one allgather; ``collectives.validate.agree`` is a layer above ps)."""
    with watchdog.guard("the ranks' check of ColocatedTables' setup"):
        everyone = comm.allgather((problem, {name: repr(value) for name, value in settings.items()}))
    bad = [f"rank {r}: {found}" for r, (found, _) in enumerate(everyone) if found]
    if bad:
        raise PSConfigError("ColocatedTables: " + "; ".join(bad))
    first = everyone[0][1]
    for r, (_, theirs) in enumerate(everyone):
        for name, value in first.items():
            if theirs[name] != value:
                raise PSConfigError(f"ColocatedTables: the ranks declare different {name}: {value} on rank 0, "
                                    f"{theirs[name]} on rank {r}")


def made_everywhere(comm: MPI.Intracomm, make: Callable[[], T]) -> T:
    """``make()`` on every rank; if it raised anywhere, ``PSConfigError`` on every rank naming it
    (one allgather), so a failed setup never leaves a rank waiting."""
    made, problem = None, None
    try:
        made = make()
    except Exception as error:  # an initialiser of the wrong shape, memory, ...: refused everywhere
        problem = f"{type(error).__name__}: {error}"
    with watchdog.guard("the ranks' report of ColocatedTables' shards made"):
        problems = [f"rank {r}: {p}" for r, p in enumerate(comm.allgather(problem)) if p]
    if problems:
        raise PSConfigError("ColocatedTables could not make its shards: " + "; ".join(problems))
    return made


def table_of(name, table_ids: Mapping[str, int], specs: Sequence[ParamSpec]) -> int:
    t = table_ids.get(name) if isinstance(name, str) else None
    if t is None:
        raise PSInputError(f"unknown table {name!r}; the tables are {', '.join(repr(s.name) for s in specs)}")
    return t


def mapping(call: str, given, values: str) -> None:
    if not isinstance(given, Mapping):
        raise PSInputError(f"{call} takes a mapping of table name -> {values}, got {type(given).__name__}")


def pulled(ids_by_table: Mapping[str, object], table_ids: Mapping[str, int],
           specs: Sequence[ParamSpec]) -> Pulled:
    """Each table's unique ids and the inverse that rebuilds the ids asked for."""
    mapping("pull_rows_many_async", ids_by_table, "ids")
    found: Pulled = {}
    for name, ids in ids_by_table.items():
        t = table_of(name, table_ids, specs)
        ids = checked_ids(f"pull_rows of {name!r}", ids, table_rows(specs[t]))
        ascending = len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())  # already unique (a collection's): no sort
        found[t] = (ids, np.arange(len(ids))) if ascending else np.unique(ids, return_inverse=True)
    return found


def pushed(rows_by_table: Mapping[str, Tuple[object, np.ndarray]], table_ids: Mapping[str, int],
           specs: Sequence[ParamSpec]) -> Pushed:
    """Each table's ids sorted with their gradients: unique ids, gradients of the right shape,
    dtype, finite."""
    mapping("push_rows_many_async", rows_by_table, "(unique ids, gradients)")
    found: Pushed = {}
    for name, pair in rows_by_table.items():
        t = table_of(name, table_ids, specs)
        spec = specs[t]
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise PSInputError(f"push_rows to {name!r}: give (ids, gradients), got {type(pair).__name__}")
        ids = checked_ids(f"push_rows to {name!r}", pair[0], table_rows(spec))
        check_array(f"push_rows to {name!r}: gradients", pair[1], (len(ids),) + tuple(spec.shape[1:]), spec.dtype)
        grads = pair[1]
        if not (ids[1:] > ids[:-1]).all():  # not already sorted and unique (np.unique's output is)
            order = np.argsort(ids, kind="stable")
            ids, grads = ids[order], grads[order]
        grads = np.ascontiguousarray(grads)
        if np.any(ids[1:] == ids[:-1]):
            raise PSInputError(f"push_rows to {name!r}: ids must be unique (sum the gradients of repeated rows); "
                               f"id {int(ids[1:][ids[1:] == ids[:-1]][0])} repeats")
        if not all_finite(grads):
            raise PSInputError(f"push_rows to {name!r}: the gradients hold NaN or Inf")
        found[t] = (ids, grads)
    return found


def refuse(comm: MPI.Intracomm, what: str, mine: Optional[str], headers: np.ndarray,
           described: str) -> None:
    """Raise the same ``PSInputError`` on every rank when any rank has a problem or the ranks'
    calls differ (``headers``: every rank's [problem, signature, step, ...]); else nothing."""
    if headers[:, 0].max() == 0 and (headers[:, 1:3] == headers[0, 1:3]).all():
        return
    reports: List[Tuple[Optional[str], str]] = comm.allgather((mine, described))
    bad = [f"rank {r}: {problem}" for r, (problem, _) in enumerate(reports) if problem]
    if bad:
        raise PSInputError(f"{what}: " + "; ".join(bad))
    calls = "; ".join(f"rank {r} {call}" for r, (_, call) in enumerate(reports))
    raise PSInputError(f"{what}: every rank must make the same call (same tables, same step): {calls}")


def lookups_problem(specs: Sequence[ParamSpec], lookups: Sequence[Lookups]) -> Optional[str]:
    """Why table-wise ``lookups`` cannot be pooled (None when they can): per table int64 ids
    inside it, int64 bag lengths adding up to them, float32 factors one per id (for every table
    or none)."""
    if len(lookups) != len(specs):
        return f"pool_async takes the lookups of all {len(specs)} tables, got {len(lookups)}"
    if len({factors is None for _, _, factors in lookups}) > 1:
        return "pool_async: give factors for every table or for none"
    for spec, (ids, lengths, factors) in zip(specs, lookups):
        arrays = [ids, lengths] + ([] if factors is None else [factors])
        if not all(isinstance(a, np.ndarray) and a.ndim == 1 for a in arrays) or ids.dtype != np.int64 or \
                lengths.dtype != np.int64 or (factors is not None and (factors.dtype != np.float32 or
                                                                       len(factors) != len(ids))):
            return f"table {spec.name!r}: lookups must be 1-d int64 ids, int64 bag lengths, float32 factors"
        if int(lengths.sum()) != len(ids) or (len(lengths) and int(lengths.min()) < 0):
            return f"table {spec.name!r}: bag lengths add up to {int(lengths.sum())}, not the {len(ids)} ids"
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= spec.shape[0]):
            return f"table {spec.name!r} has {spec.shape[0]} rows, the lookups hold ids outside it"
    return None


def pooled_grads_problem(specs: Sequence[ParamSpec], grads: Sequence[Optional[np.ndarray]]) -> Optional[str]:
    """Why table-wise pooled ``grads`` cannot be pushed (None when they can): one entry per table,
    None or bags x dim of the table's dtype, finite (``arrays.finite``, as every push); the last
    table's problem when several have one."""
    if len(grads) != len(specs):
        return f"push_pooled_async takes all {len(specs)} tables, got {len(grads)}"
    found = None
    for spec, grad in zip(specs, grads):
        if grad is not None and not (isinstance(grad, np.ndarray) and grad.dtype == np.dtype(spec.dtype)
                                     and grad.ndim == 2 and grad.shape[1] == spec.shape[1]):
            found = f"table {spec.name!r}: gradients must be bags x {spec.shape[1]} {np.dtype(spec.dtype)}"
        elif grad is not None and not all_finite(grad):
            found = f"table {spec.name!r}: the pooled gradients hold NaN or Inf"
    return found
