"""How much memory the servers' shards will take, checked before any is made.

A shard holds, for each dense piece, its values and the optimizer's arrays of the same
size; for each sparse table, about rows/K rows (rendezvous hashing spreads them evenly),
each with its values, the optimizer's arrays and its id (``tables.id_dtype``). With
replication a server also holds its predecessor's shard. ``refuse_unfit`` compares what
the servers of each node will hold with the memory that node has available and raises
``PSConfigError`` on every rank, naming the sizes, before anything is allocated.
Cost: one small allgather.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ..errors import PSConfigError
from ..runtime.memory import available_bytes
from .layout import Layout
from .optimizers import Optimizer
from .tables import id_dtype, row_width

GiB = float(1 << 30)


def shard_bytes(layout: Layout, key: int, optimizers: Mapping[int, Optimizer]) -> int:
    """The bytes shard ``key`` will hold: values, optimizer state and row ids."""
    total = 0
    for piece in layout.placement.pieces_on(key):
        spec = layout.specs[piece.table]
        total += piece.size * np.dtype(spec.dtype).itemsize * (1 + len(optimizers[piece.table].state_names))
    shards = len(layout.placement.shards)
    for table, spec in enumerate(layout.specs):
        if spec.dynamic is not None:  # what its budget allows (an unbounded one: nothing to check)
            total += spec.dynamic.budget_bytes
        elif spec.sparse:
            row = row_width(spec) * np.dtype(spec.dtype).itemsize * (1 + len(optimizers[table].state_names))
            total += -(-spec.shape[0] // shards) * (row + id_dtype(spec.shape[0]).itemsize)
    return int(total)


def node_problem(layout: Layout, optimizers: Mapping[int, Optimizer], replicated: bool, rank: int,
                 nodes: Sequence[str], available: Optional[int]) -> Optional[str]:
    """Why the servers on ``rank``'s node would not fit in its ``available`` memory, or None."""
    here = [key for key, server in sorted(layout.shard_ranks.items()) if nodes[server] == nodes[rank]]
    if not here:
        return None
    copies = 2 if replicated and len(layout.shard_ranks) > 1 else 1
    need = sum(shard_bytes(layout, key, optimizers) for key in here) * copies
    what = "its shard and a replica" if copies == 2 else "its shard"
    return unfit_problem(f"the servers' memory: the {len(here)} server(s)", nodes[rank], need, available,
                         f"{what} each: values, optimizer state and row ids of {len(layout.specs)} table(s)",
                         "use more servers (--servers) or nodes, or fewer table rows (--table-rows)")


def unfit_problem(holders: str, node: str, need: int, available: Optional[int], held: str,
                  advice: str) -> Optional[str]:
    """Why ``holders`` on ``node`` holding ``need`` bytes (``held``: of what) would not fit its
    ``available`` memory (None: unknown, taken as fitting), or None. The one wording of the
    check, for PS servers and ring ranks alike."""
    if available is None or need <= available:
        return None
    return (f"the model does not fit {holders} on node {node} would hold {need / GiB:.2f} GiB ({held}), "
            f"and the node has {available / GiB:.2f} GiB available; {advice}")


def refuse_unfit_problems(comm: MPI.Intracomm, problem: Optional[str], error: type = PSConfigError) -> None:
    """``error`` on every rank with the first rank's ``problem`` there is (collective: one allgather)."""
    problems = [text for text in comm.allgather(problem) if text]
    if problems:
        raise error(problems[0])


def refuse_unfit(comm: MPI.Intracomm, layout: Layout, optimizers: Mapping[int, Optimizer],
                 replicated: bool, nodes: Sequence[str]) -> None:
    """``PSConfigError`` on every rank if the servers of some node would not fit its memory."""
    rank = comm.Get_rank()
    problem = node_problem(layout, optimizers, replicated, rank, nodes, available_bytes()) \
        if layout.is_server(rank) else None
    refuse_unfit_problems(comm, problem)
