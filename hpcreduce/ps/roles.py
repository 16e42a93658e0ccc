"""Setting up a PS job's roles: the one factory behind ``ps.start``, the PS trainer's
relaunch fallback and its fault-tolerant driver.

    tables = Tables.of(specs, "adagrad", 0.1, Consistency("ssp", 2))
    layout = initial_layout(ctx, tables, servers=2, nodes=rank_nodes(ctx.comm))
    role = make_role(ctx, layout, tables, lambda key: [ShardState.create(layout, key, initial, tables.optimizers)])

``initial_layout`` puts the servers on ranks 0..K-1 and refuses, on every rank and before
anything is allocated, shards that would not fit their nodes' memory. ``make_role`` gives
each rank its role: a ``Server`` of the shard states its callback makes (with the replica of
its predecessor's shard when given: replicated), or a ``Worker``; a failure on any rank
raises ``PSTrainingError`` on every rank instead of leaving workers waiting for a server
that is not there. ``serve_shard`` is the server half alone, for a shard a recovery rebuilt.
Cost: one small allgather each (the memory check, the agreement that every rank made its role).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from ..arrays.dtypes import WIRE
from ..errors import PSConfigError, PSTrainingError
from ..runtime.context import Context
from .consistency import Consistency
from .dynamic_rows import budget_rows, held_bytes
from .footprint import refuse_unfit, refuse_unfit_problems
from .kernels import warm as warm_kernels
from .layout import Layout
from .optimizers import Optimizer, make_optimizer
from .server import Server
from .shard_state import ShardState
from .tables import ParamSpec
from .worker import Worker

T = TypeVar("T")
Guard = Callable[[str], Any]
WIRE_DTYPES = (None, *(np.dtype(name) for name in WIRE))


@dataclass(frozen=True)
class Tables:
    """What the servers serve and how: the tables, each one's update rule, the consistency."""

    specs: Tuple[ParamSpec, ...]
    optimizers: Mapping[int, Optimizer]
    consistency: Consistency

    @classmethod
    def of(cls, specs: Sequence[ParamSpec], optimizer: str, lr: float, consistency: Consistency = Consistency(),
           table_lr: Optional[Mapping[str, float]] = None) -> "Tables":
        return cls(tuple(specs), table_optimizers(specs, optimizer, lr, table_lr), consistency)


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


def initial_layout(ctx: Context, tables: Tables, servers: int, nodes: Sequence[str], *,
                   replicated: bool = False) -> Layout:
    """Collective: K = ``servers`` servers on ranks 0..K-1 (``nodes``: every rank's node;
    ``replicated``: the replication ring alternates them), the rest workers. ``PSConfigError``
    on every rank for an impossible K or shards too large for their nodes."""
    refuse_unfit_problems(ctx.comm, tables_problem(ctx.comm, tables))
    layout = Layout.initial(tables.specs, ctx.size, servers, nodes if replicated else None)
    refuse_unfit(ctx.comm, layout, tables.optimizers, replicated, nodes)
    return layout


def tables_problem(comm, tables: Tables) -> Optional[str]:
    """What is wrong with some rank's table declarations (``ParamSpec.problem``, a dynamic
    table's budget below one row), or how a rank's differ from rank 0's; the same on every
    rank (one allgather)."""
    mine = None
    for t, spec in enumerate(tables.specs):
        mine = spec.problem()
        if mine is None and spec.dynamic is not None and spec.dynamic.budget_bytes \
                and budget_rows(spec, tables.optimizers[t]) < 1:
            mine = (f"table {spec.name!r}: budget_bytes {spec.dynamic.budget_bytes} holds no row: one row "
                    f"costs {held_bytes(1, spec, tables.optimizers[t])} B with its index and admission sketch")
        if mine:
            break
    everyone = comm.allgather((mine, [repr(spec) for spec in tables.specs]))
    problem = next((problem for problem, _ in everyone if problem), None)
    if problem:
        return problem
    first = everyone[0][1]
    for rank, (_, theirs) in enumerate(everyone):
        if theirs != first:
            differs = next((i for i, (a, b) in enumerate(zip(first, theirs)) if a != b), None)
            said = (f"table {differs}: {first[differs]} on rank 0, {theirs[differs]} on rank {rank}"
                    if differs is not None else f"{len(first)} tables on rank 0, {len(theirs)} on rank {rank}")
            return f"the ranks declare different tables: {said}"
    return None


def make_role(ctx: Context, layout: Layout, tables: Tables, shards: Callable[[int], Sequence[ShardState]], *,
              guard: Optional[Guard] = None, on_progress: Optional[Callable[[Server, int], None]] = None,
              clock: int = 0, wire_dtype: Any = None) -> Union[Server, Worker]:
    """Collective: this rank's role in ``layout``. A server serves ``shards(key)[0]`` and keeps
    ``shards(key)[1]``, when given, as the replica of its predecessor's shard; a worker starts
    at ``clock``, its values travelling as ``wire_dtype`` (float16, or None: as stored)."""
    wire = wire_of(wire_dtype)

    def make() -> Union[Server, Worker]:
        if any(spec.sparse for spec in layout.specs):
            warm_kernels()  # now, not under a worker's deadline at the first request
        if layout.is_server(ctx.rank):
            own, *replica = shards(layout.shard_of(ctx.rank))
            return serve_shard(ctx, layout, tables, own, replica[0] if replica else None, guard=guard,
                               on_progress=on_progress)
        return Worker(ctx.comm, layout, ctx.traffic, guard=guard, clock=clock, wire_dtype=wire)
    return everywhere(ctx, make)


def serve_shard(ctx: Context, layout: Layout, tables: Tables, own: ShardState, replica: Optional[ShardState], *,
                guard: Optional[Guard] = None, on_progress: Optional[Callable[[Server, int], None]] = None) -> Server:
    """A ``Server`` of ``own`` on this rank of ``layout``; with ``replica``, replicating: each push
    goes to the backup (the server of the next key in the ring) before it is acknowledged, and
    ``replica`` is kept up to date from the predecessor."""
    server = Server(ctx.comm, layout, own, tables.optimizers, tables.consistency, ctx.traffic,
                    guard=guard, on_progress=on_progress)
    if replica is not None:
        backup, primary = layout.neighbours(own.shard)
        server.replicate(layout.shard_ranks[backup], layout.shard_ranks[primary], replica)
    return server


def wire_of(wire_dtype: Any) -> Optional[np.dtype]:
    """``wire_dtype`` as a Worker takes it: float16, or None for values as stored (None, float32)."""
    try:
        wanted = None if wire_dtype is None else np.dtype(wire_dtype)
    except TypeError:
        wanted = wire_dtype
    if wanted not in WIRE_DTYPES:
        raise PSConfigError(f"wire_dtype must be {', '.join(sorted(WIRE))} or None, got {wire_dtype!r}")
    return wanted if wanted == np.dtype(np.float16) else None


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
