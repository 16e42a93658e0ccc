"""Where a hybrid job's tables live: ``dedicated`` (ranks 0..K-1 serve, the rest train) or
``colocated`` (a shard on every trainer, as TorchRec's model-parallel sharding puts them), and
how their rows start (``TableInit``).

``TableInit``: a fixed table's elements are TorchRec's default uniform (or the config's
``weight_init_min``/``max``), each a function of (seed, table, index) alone, so any number of
servers or ranks makes the same table; a config's ``init_fn(tensor)`` fills a shard's rows in
place instead, a chunk of rows at a time (its values then depend on the layout, as TorchRec's);
``saved`` (``table_files.SavedTables``) gives every fixed table's rows by id instead.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mpi4py import MPI

from ..ps import Consistency, Server, start
from ..ps.init import PartInit
from ..runtime.context import Context
from ..runtime.failures import watched
from .embedding_configs import EmbeddingBagConfig, RowOptimizer, counter_uniform
from .table_files import SavedTables

LAYOUTS = ("dedicated", "colocated")
SHARDINGS = ("row_wise", "table_wise")  # TorchRec's ShardingType names; table_wise: colocated, fixed tables


class TableInit(PartInit):
    """Initial rows of ``configs``' fixed tables (see the module's docstring)."""

    def __init__(self, configs: Sequence[EmbeddingBagConfig], seed: int, saved: Optional[SavedTables] = None):
        self.configs, self.seed, self.saved = list(configs), seed, saved
        super().__init__([config.spec(seed) for config in configs], self._elements)

    def _elements(self, table: int, flat: np.ndarray) -> np.ndarray:
        config = self.configs[table]
        return counter_uniform(self.seed, config.name, flat, *config.init_range())

    def per_row(self, table: int) -> bool:
        """Whether table ``table``'s rows depend on (table, id) alone (made on first touch by
        table-wise tables): not when a config's ``init_fn`` draws them."""
        return self.saved is not None or self.configs[table].init_fn is None

    def rows(self, table: int, ids: np.ndarray) -> np.ndarray:
        if self.saved is not None:
            return self.saved.rows(self.configs[table].name, np.asarray(ids, dtype=np.int64))
        init_fn = self.configs[table].init_fn
        if init_fn is None:
            return super().rows(table, ids)
        weight = torch.empty(len(ids), self.configs[table].embedding_dim)
        out = init_fn(weight)
        return (weight if out is None else out).numpy()


def start_tables(configs: Sequence[EmbeddingBagConfig], layout: str, servers: int, consistency: Consistency,
                 sparse_optimizer: RowOptimizer, seed: int, context: Context,
                 saved: Optional[SavedTables] = None, sharding: str = "row_wise"
                 ) -> Tuple[Union[Server, object], object, int]:
    """This rank's role: (the ``Server`` on a dedicated server rank, or the trainer's table store
    (``ps.Worker`` / ``ColocatedTables`` / ``TableWiseTables``)), the trainers' communicator (None
    on a server) and the number of trainers. Collective over ``context``."""
    init = TableInit(configs, seed, saved)
    specs = init.specs
    if layout == "colocated" and sharding == "table_wise":
        from ..ps.colocated.tablewise import TableWiseTables  # each table whole on one rank, pooled there
        store = TableWiseTables(specs, optimizer=sparse_optimizer.name, lr=sparse_optimizer.lr, comm=context,
                                init=init, seed=seed)
        return store, context.comm.Dup(), context.comm.Get_size()
    if layout == "colocated":
        from ..ps.colocated import ColocatedTables  # helper "colocated"'s shards on every trainer
        store = ColocatedTables(specs, optimizer=sparse_optimizer.name, lr=sparse_optimizer.lr, comm=context,
                                init=init, seed=seed)
        return store, context.comm.Dup(), context.comm.Get_size()
    role = start(specs, init, servers=servers, consistency=consistency, optimizer=sparse_optimizer.name,
                 lr=sparse_optimizer.lr, comm=context, guard=watched(context.comm))
    serving = isinstance(role, Server)
    trainers = context.comm.Split(MPI.UNDEFINED if serving else 0, context.rank)
    return role, (None if serving else trainers), context.comm.Get_size() - servers
