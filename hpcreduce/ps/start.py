"""Start a parameter-server job: every rank learns its role and gets its server or worker.

    role = start(specs, lambda: initial_values, servers=2, consistency=Consistency("ssp", 2),
                 optimizer="adam", lr=1e-3, comm=comm)
    if isinstance(role, Server): role.serve()       # until every worker released it
    else: ... role.pull(...), role.push(...), role.clock() ... role.release()

Servers initialise their shard from ``initial``: a ``PartInit`` (``ps.init``: each server
makes only its own elements) or a callable giving whole tables by name; workers pull it. Setting up ends with one small allgather, so that a setup failure on any rank
(bad settings, initial values that lack a table) raises on every rank instead of
leaving workers waiting for a server that is not there.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, TypeVar, Union

import numpy as np

from ..errors import PSConfigError, PSTrainingError
from ..runtime.context import Comm, Context, resolve
from ..runtime.nodes import rank_nodes
from .consistency import Consistency
from .footprint import refuse_unfit
from .init import PartInit
from .layout import Layout
from .optimizers import Optimizer, make_optimizer
from .server import Server
from .shard_state import ShardState
from .tables import ParamSpec
from .worker import Worker

Initial = Callable[[], Mapping[str, np.ndarray]]
T = TypeVar("T")


def table_optimizers(specs: Sequence[ParamSpec], name: str, lr: float,
                     table_lr: Optional[Mapping[str, float]] = None) -> Dict[int, Optimizer]:
    """One optimizer per table: ``name`` with ``table_lr[table]`` or else ``lr``."""
    table_lr = dict(table_lr or {})
    unknown = sorted(set(table_lr) - {spec.name for spec in specs})
    if unknown:
        raise PSConfigError(f"learning rates given for unknown tables {unknown}")
    try:
        return {t: make_optimizer(name, table_lr.get(spec.name, lr)) for t, spec in enumerate(specs)}
    except ValueError as err:
        raise PSConfigError(str(err)) from None


def start(specs: Sequence[ParamSpec], initial: Union[Initial, PartInit], *, servers: int = 1,
          consistency: Consistency = Consistency(), optimizer: str = "sgd", lr: float = 0.1,
          table_lr: Optional[Mapping[str, float]] = None, comm: Comm = None,
          guard: Optional[Callable[[str], Any]] = None) -> Union[Server, Worker]:
    """This rank's part of a PS job over ``comm`` (a Context, an MPI intracommunicator that
    hpcreduce duplicates once, or None for ``hpcreduce.init()``'s): a ``Server`` on ranks
    0..servers-1, else a ``Worker``. Collective; raises the same kind of error on every
    rank on bad input (``PSConfigError`` naming the sizes when the servers' shards would not
    fit their nodes' memory, before anything is allocated). ``guard(what)``: wraps every blocking wait (a deadline watchdog)."""
    ctx = resolve(comm)
    layout = Layout.initial(specs, ctx.size, servers)
    optimizers = table_optimizers(layout.specs, optimizer, lr, table_lr)
    refuse_unfit(ctx.comm, layout, optimizers, False, rank_nodes(ctx.comm))

    guarded = {} if guard is None else {"guard": guard}

    def make() -> Union[Server, Worker]:
        if layout.is_server(ctx.rank):
            values = initial if isinstance(initial, PartInit) else checked(initial(), specs)
            state = ShardState.create(layout, layout.shard_of(ctx.rank), values, optimizers)
            return Server(ctx.comm, layout, state, optimizers, consistency, ctx.traffic, **guarded)
        return Worker(ctx.comm, layout, ctx.traffic, **guarded)
    return everywhere(ctx, make)


def everywhere(ctx: Context, make: Callable[[], T]) -> T:
    """``make()`` on every rank; if it fails anywhere, ``PSTrainingError`` naming the first
    rank that failed, on every rank (one small allgather)."""
    made, caught = None, None
    try:
        made = make()
    except Exception as err:  # reported on every rank below
        caught = err
    failures = ctx.comm.allgather(f"{type(caught).__name__}: {caught}" if caught else None)
    culprits = [(rank, text) for rank, text in enumerate(failures) if text]
    if culprits:
        rank, text = culprits[0]
        raise PSTrainingError(f"parameter server setup failed on rank {rank}: {text}") from caught
    return made


def checked(values: Mapping[str, np.ndarray], specs: Sequence[ParamSpec]) -> Mapping[str, np.ndarray]:
    """``values`` if it has every table with the declared shape, else a PSConfigError."""
    for spec in specs:
        if spec.name not in values:
            raise PSConfigError(f"the initial values have no table {spec.name!r}")
        shape = tuple(np.shape(values[spec.name]))
        if shape != tuple(spec.shape):
            raise PSConfigError(f"the initial value of table {spec.name!r} has shape {shape}, "
                                f"its ParamSpec says {tuple(spec.shape)}")
    return values
