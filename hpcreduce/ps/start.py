"""Start a parameter-server job: every rank learns its role and gets its server or worker.

    role = start(specs, lambda: initial_values, servers=2, consistency=Consistency("ssp", 2),
                 optimizer="adam", lr=1e-3, comm=comm, wire_dtype="float16")
    if isinstance(role, Server): role.serve()       # until every worker released it
    else: ... role.pull(...), role.push(...), role.clock() ... role.release()

Servers initialise their shard from ``initial``: a ``PartInit`` (``ps.init``: each server
makes only its own elements) or a callable giving whole tables by name; workers pull it. Setting
up goes through ``roles`` and ends with one small allgather, so that a setup failure on any
rank (bad settings, initial values that lack a table) raises on every rank instead of
leaving workers waiting for a server that is not there.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from ..errors import PSConfigError
from ..runtime.context import Comm, resolve
from ..runtime.nodes import rank_nodes
from .consistency import Consistency
from .init import PartInit
from .roles import Tables, initial_layout, make_role
from .server import Server
from .shard_state import ShardState
from .tables import ParamSpec
from .worker import Worker

Initial = Callable[[], Mapping[str, np.ndarray]]


def start(specs: Sequence[ParamSpec], initial: Union[Initial, PartInit], *, servers: int = 1,
          consistency: Consistency = Consistency(), optimizer: str = "sgd", lr: float = 0.1,
          table_lr: Optional[Mapping[str, float]] = None, comm: Comm = None,
          guard: Optional[Callable[[str], Any]] = None, wire_dtype: Any = None) -> Union[Server, Worker]:
    """This rank's part of a PS job over ``comm`` (a Context, an MPI intracommunicator that
    hpcreduce duplicates once, or None for ``hpcreduce.init()``'s): a ``Server`` on ranks
    0..servers-1, else a ``Worker``. Collective; raises the same kind of error on every
    rank on bad input (``PSConfigError`` naming the sizes when the servers' shards would not
    fit their nodes' memory, before anything is allocated). ``guard(what)``: wraps every
    blocking wait (a deadline watchdog). ``wire_dtype`` ``"float16"``: the workers' pushed and
    pulled values travel as float16 (half the bytes; the servers keep and update float32)."""
    ctx = resolve(comm)
    tables = Tables.of(specs, optimizer, lr, consistency, table_lr)
    layout = initial_layout(ctx, tables, servers, rank_nodes(ctx.comm))

    def shard(key: int):
        values = initial if isinstance(initial, PartInit) else checked(initial(), specs)
        return [ShardState.create(layout, key, values, tables.optimizers)]
    return make_role(ctx, layout, tables, shard, guard=guard, wire_dtype=wire_dtype)


def checked(values: Mapping[str, np.ndarray], specs: Sequence[ParamSpec]) -> Mapping[str, np.ndarray]:
    """``values`` if it has every table with the declared shape, else a PSConfigError."""
    for spec in specs:
        if spec.dynamic is not None:  # no whole table: rows start at tables.initial_rows
            continue
        if spec.name not in values:
            raise PSConfigError(f"the initial values have no table {spec.name!r}")
        shape = tuple(np.shape(values[spec.name]))
        if shape != tuple(spec.shape):
            raise PSConfigError(f"the initial value of table {spec.name!r} has shape {shape}, "
                                f"its ParamSpec says {tuple(spec.shape)}")
    return values
